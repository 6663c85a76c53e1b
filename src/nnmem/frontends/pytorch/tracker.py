"""Storage-level tracking of a PyTorch step with a TorchDispatchMode.

The same tracker runs over fake tensors (estimate) and real tensors (the tensor-level truth of
``nnmem measure``). It sees every op below autograd, registers each new storage an op returns, and
learns of a storage's end from a weakref callback, which CPython runs the moment the storage dies.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from nnmem.frontends.pytorch import fused
from nnmem.trace import Block, Category, LayerInfo, Op, Phase, Trace

__all__ = ["OpRules", "StepTracker"]


class OpRules(Protocol):
    """Per-op memory rules that a fake trace needs and a real one does not."""

    def workspace(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                  training: bool) -> int:
        """Transient scratch the CPU kernel allocates and frees inside the op, in bytes."""
        ...

    def output_bytes(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     out: Any) -> list[int] | None:
        """True storage bytes of each output tensor (flatten order) where the fake kernel's differ."""
        ...

    def notes_add(self, note: str) -> None:
        """Record a kernel path the trace takes that no rule models."""
        ...

    # Optional: ``fake_outputs(func, args, kwargs, out) -> out`` gives the op's outputs with the storage
    # structure of the real kernel's where the fake kernel aliases outputs that the real one returns as
    # separate storages (autograd then behaves as in the real run). Looked up with getattr.


@dataclass(slots=True)
class _BlockState:
    nbytes: int
    category: Category | None
    layer: str
    phase: Phase
    alloc_op: int
    free_op: int = -1


class StepTracker(TorchDispatchMode):
    """Records storages allocated and freed by each op while active.

    Args:
        model: the model whose layers name the ops (module paths come from ``named_modules``).
        rules: per-op kernel workspace and fake-kernel size corrections (estimates only).
    """

    def __init__(self, model: torch.nn.Module, rules: OpRules | None = None) -> None:
        super().__init__()
        self._names = {id(m): name for name, m in model.named_modules()}
        self._rules = rules
        self._blocks: list[_BlockState] = []
        self._by_storage: dict[int, int] = {}
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._ops: list[list[Any]] = []  # [name, phase, layer, alloc_bytes, free_bytes, workspace]
        self._stack: list[str] = []
        self._node_layer: dict[int, str] = {}
        self._entry_seq: list[int] = []  # autograd's sequence number when each running module started
        self._autocast: list[bool] = []  # whether CPU autocast was on when each running module started
        self._layer_out: dict[str, int] = {}
        self.phase = Phase.SETUP
        self.training = True
        self._adds: list[tuple[int, int, int | None, int | None]] = []  # (op, output block, arg 0, arg 1 blocks)

    # ---- resident storages -------------------------------------------------------------------
    def add_resident(self, tensor: torch.Tensor, category: Category, layer: str = "") -> None:
        """Register a storage that is live before the step (parameter, gradient, input ...)."""
        self._register(tensor, category, layer, Phase.SETUP, -1)

    # ---- the step ------------------------------------------------------------------------------
    def begin(self, phase: Phase) -> None:
        """Start a phase; the first call opens the step with a marker op that collects early frees."""
        self.phase = phase
        self._stack.clear()  # a recomputation that stopped early (checkpoint) leaves no layer open
        self._entry_seq.clear()
        self._autocast.clear()
        if not self._ops:
            self._ops.append(["<step start>", phase, "", 0, 0, 0])

    @contextmanager
    def layer_hooks(self) -> Iterator[None]:
        """Name forward ops after the innermost running module while the context is open."""
        pre = torch.nn.modules.module.register_module_forward_pre_hook(self._pre_hook)
        post = torch.nn.modules.module.register_module_forward_hook(self._post_hook)
        try:
            yield
        finally:
            pre.remove()
            post.remove()

    def _pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        if self.phase is not Phase.FORWARD:  # backward ops are named by their autograd node, not the stack;
            return  # checkpoint's recomputation may stop before its modules' post-hooks run
        self._stack.append(self._names.get(id(module), self._stack[-1] if self._stack else ""))
        self._entry_seq.append(torch._C._autograd._get_sequence_nr())
        self._autocast.append(torch.is_autocast_enabled("cpu"))

    def _post_hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.phase is not Phase.FORWARD:
            return
        layer = self._stack.pop() if self._stack else ""
        entry = self._entry_seq.pop() if self._entry_seq else 0
        if self._autocast:
            self._autocast.pop()
        self._name_nodes(output, layer, entry)
        if id(module) in self._names:
            nbytes = sum(t.untyped_storage().nbytes() for t in _tensors(output))
            self._layer_out[layer] = self._layer_out.get(layer, 0) + nbytes

    def _name_nodes(self, output: Any, layer: str, entry: int) -> None:
        """Name the autograd nodes the module's forward made (sequence number from ``entry`` on, reached from
        its outputs) after it, unless an inner module named them first: backward ops run inside those nodes
        and are named after the layer whose forward made them. (The tracker's dispatch mode runs below
        autograd, where an op's outputs have no ``grad_fn`` yet.)"""
        names, seen = self._node_layer, set()
        pending = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
        while pending:
            node = pending.pop()
            seq = node._sequence_nr()
            if seq < entry or seq in seen or seq >= _LEAF_SEQUENCE_NR:  # AccumulateGrad: every leaf shares one
                continue
            seen.add(seq)
            names.setdefault(seq, layer)
            pending.extend(n for n, _ in node.next_functions if n is not None)

    def _current_layer(self) -> str:
        if self.phase is Phase.BACKWARD:
            node = torch._C._current_autograd_node()
            return self._node_layer.get(node._sequence_nr(), "") if node is not None else ""
        return self._stack[-1] if self._stack else ""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        autocast = bool(self._autocast and self._autocast[-1])
        if (func in _AUTOCAST_COMPOSITES and torch.is_inference_mode_enabled()
                and (autocast or _projected_bf16_lstm(func, args))):
            return self._decompose(func, args, kwargs, autocast)
        if func in _FUSED:
            if fused.applies(func, args, autocast):
                return self._replay_fused(func, args, kwargs, autocast)
            if autocast and self._rules is not None:
                self._rules.notes_add(f"{func} under torch.autocast on a nested or strided input: its inner "
                                      f"casts are not modelled and the estimate may be higher or lower")
        out = func(*args, **kwargs)
        rules = self._rules
        fix = getattr(rules, "fake_outputs", None)
        if fix is not None:
            out = fix(func, args, kwargs, out)
        tensors = _tensors(out)
        workspace = rules.workspace(func, args, kwargs, out, self.training) if rules is not None else 0
        sizes = rules.output_bytes(func, args, kwargs, out) if rules is not None else None
        fresh = [(i, t) for i, t in enumerate(tensors) if id(t.untyped_storage()) not in self._by_storage]
        if not fresh and not workspace:
            return out  # views and in-place ops: nothing to record; frees attach to the last op
        layer = self._current_layer()
        index = len(self._ops)
        record: list[Any] = [str(func), self.phase, layer, 0, 0, workspace]
        self._ops.append(record)
        for i, tensor in fresh:
            nbytes = sizes[i] if sizes is not None else None
            record[3] += self._register(tensor, None, layer, self.phase, index, nbytes)
        if self.phase is Phase.BACKWARD and _is_accumulation(func, args, kwargs, fresh):
            out_block = self.block_of(fresh[0][1])
            if out_block is not None and not args[0]._is_view():  # see _accumulate_in_place
                self._adds.append((index, out_block, self.block_of(args[0]), self.block_of(args[1])))
        return out

    def _decompose(self, func: Any, args: Any, kwargs: dict[str, Any], autocast: bool) -> Any:
        """Run a recurrent layer's CPU kernel (a composite of ATen ops, aten/src/ATen/native/RNN.cpp) op by op
        under this tracker: under autocast, as autocast sees it in the real run; a bfloat16 LSTM with
        projections, so that each cell's products (``linear``, the projection's ``matmul``) get oneDNN's rules,
        which the layer's replay (workspace/rnn_native.py) does not size.

        The dispatcher hands an op to a dispatch mode with the keys above it excluded, autocast's among them;
        the real kernel's inner ``linear`` / ``mkldnn_rnn_layer`` calls go through autocast from the top and
        run in its dtype (each call casts its weights anew: measured, no cache hit inside the kernel), and the
        cells' float32 hidden states meet the cast gates. Seen as one op the layer was traced in float32
        inside: a GRU classifier's bfloat16 inference 27 % low. The layer's own module hook recorded whether
        autocast was on where it called the op."""
        # the C++ kernel, not torch._decomp's functional Python one (OpOverload.decompose prefers that)
        with _cpu_autocast(autocast), self:
            return func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)

    def _replay_fused(self, func: Any, args: Any, kwargs: dict[str, Any], autocast: bool) -> Any:
        """Run a fused transformer kernel's replica (:mod:`.fused`) op by op under this tracker; the encoder
        layer's inner calls with autocast on where its module saw it on (the attention kernel's are below
        autocast's cast, as in the real run)."""
        with _cpu_autocast(autocast and func is not _FUSED_MHA), self:
            return fused.run(func, args, kwargs)

    def _register(self, tensor: torch.Tensor, category: Category | None, layer: str, phase: Phase,
                  index: int, nbytes: int | None = None) -> int:
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._by_storage:
            return 0
        nbytes = storage.nbytes() if nbytes is None else nbytes
        block = len(self._blocks)
        self._blocks.append(_BlockState(nbytes, category, layer, phase, index))
        self._by_storage[key] = block
        self._refs[key] = weakref.ref(storage, functools.partial(self._on_storage_freed, key, block))
        return nbytes

    def _on_storage_freed(self, key: int, block: int, _ref: Any) -> None:
        self._freed(key, block)

    def _freed(self, key: int, block: int) -> None:
        self._by_storage.pop(key, None)
        self._refs.pop(key, None)
        state = self._blocks[block]
        state.free_op = max(len(self._ops) - 1, 0)
        if self._ops:
            self._ops[-1][4] += state.nbytes

    # ---- results -------------------------------------------------------------------------------
    def block_of(self, tensor: torch.Tensor) -> int | None:
        """The block id of a tensor's storage, if tracked and live."""
        return self._by_storage.get(id(tensor.untyped_storage()))

    def set_category(self, tensor: torch.Tensor, category: Category, layer: str | None = None) -> None:
        """Fix the category (and owning layer) of a live tracked storage: gradients, optimizer state."""
        block = self.block_of(tensor)
        if block is not None:
            self._blocks[block].category = category
            if layer is not None:
                self._blocks[block].layer = layer

    def _accumulate_in_place(self) -> None:
        """Make gradient accumulations that a real run does in place take no new block.

        Autograd sums the gradients of a tensor used more than once (a weight shared across an RNN's time
        steps, a residual branch) in its input buffer: ``old.add_(new)`` when ``old`` has no other owner,
        ``old + new`` otherwise. Under a Python dispatch mode (this tracker, fake tensors) every tensor has
        a Python owner, so the sum is always out of place. An ``add`` of two same-sized gradients in
        backward whose first operand dies right after it is such a sum; here its output takes over the
        operand's block, as the in-place add does in the real run. Not when the first operand is a view (a
        weight's gradient through ``t()``): its base shares its storage, so ``can_accumulate_inplace``
        (torch/csrc/autograd/input_buffer.cpp: ``storage().use_count() == 1``) refuses it.
        """
        merged: dict[int, int] = {}  # block folded into another → the block that carries its bytes
        for index, out_id, first, second in self._adds:
            op = self._ops[index]
            for operand in (first, second):
                if operand is None:
                    continue
                operand = merged.get(operand, operand)
                old = self._blocks[operand]
                out = self._blocks[out_id]
                if old.free_op != index or op[3] != old.nbytes or out.nbytes != old.nbytes:
                    continue
                old.free_op = out.free_op  # the in-place sum lives as long as the new block would have
                op[3] -= out.nbytes
                op[4] -= old.nbytes
                out.nbytes = 0
                merged[out_id] = operand
                break

    def finish(self, mode: str, layers: tuple[LayerInfo, ...], meta: dict[str, object]) -> Trace:
        """Freeze what was recorded into a Trace; unlabelled blocks get a category by phase."""
        self._accumulate_in_place()
        forward_end = max((i for i, r in enumerate(self._ops) if r[1] is Phase.FORWARD), default=-1)
        blocks = tuple(
            Block(i, s.nbytes, s.category or _default_category(s, mode, forward_end), s.layer, s.phase,
                  s.alloc_op, s.free_op)
            for i, s in enumerate(self._blocks)
        )
        ops = tuple(Op(i, r[0], r[1], r[2], r[3], r[4], r[5]) for i, r in enumerate(self._ops))
        layers = tuple(
            LayerInfo(x.path, x.kind, x.parameters, x.parameter_bytes, self._layer_out.get(x.path, 0),
                      x.parameter_shapes)
            for x in layers
        )
        return Trace("torch", mode, blocks, ops, layers, meta)


_ADD = torch.ops.aten.add.Tensor
_FUSED_MHA = torch.ops.aten._native_multi_head_attention.default
_FUSED = frozenset({_FUSED_MHA, torch.ops.aten._transformer_encoder_layer_fwd.default})
_AUTOCAST_COMPOSITES = frozenset(getattr(getattr(torch.ops.aten, name), overload)
                                 for name in ("gru", "rnn_tanh", "rnn_relu", "lstm") for overload in ("input", "data"))


@contextmanager
def _cpu_autocast(enabled: bool) -> Iterator[None]:
    """Autocast's key re-included inside the block where ``enabled`` (a dispatch mode runs with it excluded)."""
    if not enabled:
        yield
        return
    torch.set_autocast_enabled("cpu", True)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cpu", False)


def _projected_bf16_lstm(func: Any, args: Any) -> bool:
    """An ``lstm`` call in bfloat16 with projections (h0 narrower than c0): ATen runs it on its native cells."""
    if func not in (torch.ops.aten.lstm.input, torch.ops.aten.lstm.data):
        return False
    x, hx = args[0], args[1] if func is torch.ops.aten.lstm.input else args[2]
    return (isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 and isinstance(hx, (list, tuple))
            and len(hx) == 2 and hx[0].shape[-1] != hx[1].shape[-1])


def _is_accumulation(func: Any, args: Any, kwargs: dict[str, Any], fresh: list[Any]) -> bool:
    """An ``add`` of two tensors of one shape and dtype, alpha 1, with one fresh output: autograd's sum."""
    if func is not _ADD or len(args) != 2 or len(fresh) != 1 or kwargs.get("alpha", 1) != 1:
        return False
    a, b = args
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.dtype == b.dtype and torch._C._current_autograd_node() is not None)


def _default_category(state: _BlockState, mode: str, forward_end: int) -> Category:
    if state.phase is Phase.FORWARD:
        saved = mode == "train" and (state.free_op < 0 or state.free_op > forward_end)
        return Category.SAVED_ACTIVATIONS if saved else Category.ACTIVATIONS
    return Category.TEMPORARIES


_LEAF_SEQUENCE_NR = 2**63  # AccumulateGrad nodes carry UINT64_MAX, the highest priority in autograd's queue


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]

