"""Kernel scratch and real output sizes of PyTorch's CPU kernels, op by op, for the CPU they run on.

A fake (meta) kernel allocates only its outputs; the real CPU kernel may allocate and free scratch inside
the op (oneDNN reorders and scratchpads, im2col columns, temporaries of composite kernels). Each rule gives,
for one op overload, the peak of the allocator's running sum inside the real kernel minus the op's new
outputs, for the kernel ATen picks on this CPU (:mod:`nnmem.cpu`, docs/cpu-isa.md). Rules by op family:
:mod:`.attention`, :mod:`.conv`, :mod:`.matmul`, :mod:`.norm`, :mod:`.pool`, :mod:`.rnn`, :mod:`.quantized`,
:mod:`.misc`;
sizes read from ``benchmarks/calibrate_workspace.py`` (torch 2.13.0, oneDNN 3.12) and the sources each rule names;
``tests/frontends/pytorch/test_workspace.py``, ``test_workspace_attention.py`` and
``test_workspace_conv_random.py`` measure them.
A path no rule models gives a note (:func:`note_for`, :attr:`WorkspaceRules.notes`), not a silent zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nnmem.cpu import CpuInfo, describe
from nnmem.frontends.pytorch.workspace import attention, conv, matmul, misc, norm, pool, quantized, rnn, rnn_native
from nnmem.frontends.pytorch.workspace.conv_select import ConvCall, conv_backend, conv_call
from nnmem.frontends.pytorch.workspace.notes import note_for
from nnmem.frontends.pytorch.workspace.rnn import lstm_workspace_bytes

__all__ = ["RULES", "ConvCall", "WorkspaceRules", "conv_backend", "conv_call", "lstm_workspace_bytes", "note_for"]

Rule = Callable[[tuple[Any, ...], dict[str, Any], Any, bool, CpuInfo], int]
SizeRule = Callable[[tuple[Any, ...], dict[str, Any], Any], "list[int] | None"]

FakeFix = Callable[[tuple[Any, ...], dict[str, Any], Any], Any]

# Each family module registers its rules in its own WORKSPACE / SIZES / FAKE_OUTPUTS tables (op overload →
# rule); a module that registers none of one kind has no such table.
_FAMILIES = (attention, conv, matmul, misc, norm, pool, quantized, rnn, rnn_native)


def _together(first: Rule, second: Rule) -> Rule:
    """An op two families give scratch (``aten.linear``: misc's input copy, then matmul's oneDNN scratchpad
    while that copy is alive): the two add up."""
    def rule(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool, info: CpuInfo) -> int:
        return first(args, kwargs, out, training, info) + second(args, kwargs, out, training, info)
    return rule


WORKSPACE: dict[Any, Rule] = {}
for _family in _FAMILIES:
    for _op, _rule in getattr(_family, "WORKSPACE", {}).items():
        WORKSPACE[_op] = _together(WORKSPACE[_op], _rule) if _op in WORKSPACE else _rule
SIZES: dict[Any, SizeRule] = {op: rule for m in _FAMILIES for op, rule in getattr(m, "SIZES", {}).items()}
FAKE_OUTPUTS: dict[Any, FakeFix] = {op: fix for m in _FAMILIES for op, fix in getattr(m, "FAKE_OUTPUTS", {}).items()}


class WorkspaceRules:
    """The ``OpRules`` of nnmem's PyTorch tracker: a dictionary lookup per op, then a small rule.

    Args:
        cpu: the CPU the kernels run on; the host's (:func:`nnmem.cpu.describe`, under this process's
            ``ONEDNN_MAX_CPU_ISA`` / ``ATEN_CPU_CAPABILITY``) when None.

    Example:
        >>> rules = WorkspaceRules()  # one per trace
        >>> trace = trace_fake_step(model, inputs, mode="infer", ..., rules=rules)  # doctest: +SKIP
        >>> rules.notes  # the kernel paths this trace met that no rule models on this CPU
        ()
    """

    def __init__(self, cpu: CpuInfo | None = None) -> None:
        self._cpu = cpu
        self._notes: dict[str, None] = {}

    @property
    def cpu(self) -> CpuInfo:
        return self._cpu if self._cpu is not None else describe()

    @property
    def notes(self) -> tuple[str, ...]:
        """One line per kernel path met so far whose scratch no rule models on this CPU, in first-seen order."""
        return tuple(self._notes)

    def notes_add(self, note: str) -> None:
        """Add a kernel path the trace takes that no rule models (found outside the ops, e.g. from the model)."""
        self._notes.setdefault(note)

    def workspace(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, training: bool) -> int:
        """Transient scratch the real CPU kernel allocates and frees inside the op, in bytes."""
        info = self.cpu
        note = note_for(func, args, kwargs, info)
        if note is not None:
            self._notes.setdefault(note)
        rule = WORKSPACE.get(func)
        if rule is None:
            return 0
        return max(int(rule(args, kwargs, out, training, info)), 0)

    def output_bytes(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> list[int] | None:
        """Real storage bytes of each output (flatten order) where the fake kernel's sizes differ."""
        rule = SIZES.get(func)
        return None if rule is None else rule(args, kwargs, out)

    def fake_outputs(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        """The op's outputs, un-aliased where the fake kernel shares a storage the real kernel does not."""
        fix = FAKE_OUTPUTS.get(func)
        return out if fix is None else fix(args, kwargs, out)


RULES = WorkspaceRules()
