"""The framework-neutral record of one step: which storages exist, which op allocates and frees them.

A frontend (PyTorch, Keras, ...) produces a :class:`Trace`; :mod:`nnmem.simulate` turns it into live
bytes over time. Nothing here imports a framework.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Category", "Phase", "Level", "Block", "Op", "LayerInfo", "Trace"]


class Category(str, Enum):
    """What a block of memory is for. The value is the display label and the JSON key."""

    PARAMETERS = "parameters"
    BUFFERS = "buffers"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer state"
    INPUTS = "inputs"
    SAVED_ACTIVATIONS = "saved activations"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    WORKSPACE = "kernel workspace"
    ALLOCATOR_CACHE = "allocator rounding and cache"
    FRAGMENTATION = "allocator fragmentation"


class Phase(str, Enum):
    """Where in the step an op runs."""

    SETUP = "setup"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


class Level(str, Enum):
    """Levels of memory, from DESIGN.md: what is counted as "used"."""

    TENSOR = "tensor"
    ALLOCATOR = "allocator"
    RESERVED = "reserved"
    DEVICE = "device"


@dataclass(frozen=True, slots=True)
class Block:
    """One tensor storage (or other buffer) of the step.

    Attributes:
        id: index of the block in ``Trace.blocks``.
        nbytes: size in bytes, as the framework requests it from its allocator.
        category: what the block holds.
        layer: path of the layer that owns or produced it ("" when none).
        phase: phase in which it was allocated (SETUP for blocks live before the step).
        alloc_op: index of the op that allocated it; -1 for blocks live before the step.
        free_op: index of the op after which it was freed; -1 when it outlives the step.
    """

    id: int
    nbytes: int
    category: Category
    layer: str
    phase: Phase
    alloc_op: int
    free_op: int


@dataclass(frozen=True, slots=True)
class Op:
    """One framework op of the step.

    Attributes:
        index: position in ``Trace.ops``.
        name: the framework's name of the op, e.g. ``aten.addmm.default``.
        phase: forward, backward or optimizer.
        layer: path of the innermost layer it ran for ("" when none).
        alloc_bytes: bytes of new blocks the op returns, in bytes.
        free_bytes: bytes of blocks freed after the op (before the next one), in bytes.
        workspace: transient scratch the kernel allocates and frees inside the op, in bytes
            (counted at the allocator level only).
    """

    index: int
    name: str
    phase: Phase
    layer: str
    alloc_bytes: int
    free_bytes: int
    workspace: int = 0


@dataclass(frozen=True, slots=True)
class LayerInfo:
    """Static facts about one layer (module) of the model.

    Attributes:
        path: dotted path of the layer in the model ("" for the root).
        kind: the layer's class name, for display only.
        parameters: number of parameter elements the layer owns directly.
        parameter_bytes: bytes of those parameters.
        output_bytes: bytes of the layer's forward outputs, in bytes.
        parameter_shapes: shape of each parameter the layer owns, for showing the arithmetic.
    """

    path: str
    kind: str
    parameters: int
    parameter_bytes: int
    output_bytes: int
    parameter_shapes: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class Trace:
    """Everything a simulation needs about one traced step.

    Attributes:
        framework: e.g. "torch".
        mode: "train" or "infer".
        blocks: every block of the step, indexed by ``Block.id``.
        ops: the ops in execution order.
        layers: static facts per layer, in model order.
        meta: free-form facts for the report (optimizer, batch, dtype, ...).
    """

    framework: str
    mode: str
    blocks: tuple[Block, ...]
    ops: tuple[Op, ...]
    layers: tuple[LayerInfo, ...] = ()
    meta: dict[str, object] = field(default_factory=dict)

    @property
    def resident_bytes(self) -> int:
        """Bytes live when the step starts (parameters, gradients, optimizer state, inputs)."""
        return sum(b.nbytes for b in self.blocks if b.alloc_op < 0)
