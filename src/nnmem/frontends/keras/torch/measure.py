"""Interim: the real run still lives in trace.py until the split lands."""

from nnmem.frontends.keras.torch.trace import *  # noqa: F401,F403
