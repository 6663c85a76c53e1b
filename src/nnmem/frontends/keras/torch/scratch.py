"""The op rules of the Keras torch backend: kernel scratch and real output sizes, op by op.

Keras on torch runs aten ops on PyTorch's own CPU kernels, as a PyTorch model does, so its rules are
PyTorch's: oneDNN reorders and primitive scratchpads, temporaries of ATen composite kernels, each rule
citing its ATen / oneDNN source (:mod:`nnmem.frontends.pytorch.workspace`). No rule is Keras-specific:
a Keras layer reaches the CPU kernels only through these aten ops.
"""

from __future__ import annotations

from nnmem.frontends.pytorch.workspace import WorkspaceRules

__all__ = ["rules"]


def rules() -> WorkspaceRules:
    """A fresh rule set for one fake step (a real step needs none); its ``notes`` name the kernel paths this
    CPU takes that no rule models."""
    return WorkspaceRules()
