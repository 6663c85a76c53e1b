"""Keras tests run once per backend, each in its own process: ``KERAS_BACKEND=<name> pytest tests/frontends/keras``.

Keras fixes its backend at import, so a plain ``pytest`` (no KERAS_BACKEND) collects nothing here;
``make test`` runs this folder three times, for torch, jax and tensorflow.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # before TensorFlow is first imported
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

collect_ignore_glob = [] if os.environ.get("KERAS_BACKEND") in ("torch", "jax", "tensorflow") else ["*.py"]
