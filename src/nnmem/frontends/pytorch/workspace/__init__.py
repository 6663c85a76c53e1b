"""Kernel scratch and real output sizes of PyTorch's CPU kernels, op by op, for the CPU they run on.

A fake (meta) kernel allocates only its outputs; the real CPU kernel may allocate and free scratch inside
the op (oneDNN reorders and scratchpads, im2col columns, temporaries of composite kernels). Each rule gives,
for one op overload, the peak of the allocator's running sum inside the real kernel minus the op's new
outputs, for the kernel ATen picks on this CPU (:mod:`nnmem.cpu`, docs/cpu-isa.md). Rules by op family:
:mod:`.conv`, :mod:`.rnn`, :mod:`.misc`; sizes read from ``benchmarks/calibrate_workspace.py`` (torch 2.13.0,
oneDNN 3.12) and the sources each rule names; ``tests/frontends/pytorch/test_workspace.py`` measures each.
A path no rule models gives a note (:func:`note_for`, :attr:`WorkspaceRules.notes`), not a silent zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nnmem.cpu import CpuInfo, describe
from nnmem.frontends.pytorch.workspace._common import aten
from nnmem.frontends.pytorch.workspace.conv import (
    rule_conv_nd,
    rule_conv_transpose_nd,
    rule_convolution,
    rule_convolution_backward,
)
from nnmem.frontends.pytorch.workspace.conv_select import ConvCall, conv_backend, conv_call
from nnmem.frontends.pytorch.workspace.misc import (
    rule_batch_norm_infer,
    rule_embedding_backward,
    rule_max_pool2d,
    rule_max_pool2d_backward,
    rule_native_batch_norm,
    rule_native_batch_norm_backward,
    rule_transformer_encoder_layer_fwd,
)
from nnmem.frontends.pytorch.workspace.notes import note_for
from nnmem.frontends.pytorch.workspace.rnn import (
    lstm_workspace_bytes,
    rule_gru_infer,
    rule_lstm_infer,
    rule_mkldnn_rnn_layer,
    rule_mkldnn_rnn_layer_backward,
    sizes_mkldnn_rnn_layer,
    unalias_rnn_backward,
)

__all__ = ["RULES", "ConvCall", "WorkspaceRules", "conv_backend", "conv_call", "lstm_workspace_bytes", "note_for"]

Rule = Callable[[tuple[Any, ...], dict[str, Any], Any, bool, CpuInfo], int]
SizeRule = Callable[[tuple[Any, ...], dict[str, Any], Any], "list[int] | None"]

WORKSPACE: dict[Any, Rule] = {
    aten.convolution.default: rule_convolution,
    aten.conv1d.default: rule_conv_nd,
    aten.conv2d.default: rule_conv_nd,
    aten.conv_transpose1d.default: rule_conv_transpose_nd,
    aten.conv_transpose2d.input: rule_conv_transpose_nd,
    aten.convolution_backward.default: rule_convolution_backward,
    aten.mkldnn_rnn_layer.default: rule_mkldnn_rnn_layer,
    aten.mkldnn_rnn_layer_backward.default: rule_mkldnn_rnn_layer_backward,
    aten.native_batch_norm.default: rule_native_batch_norm,
    aten.native_batch_norm_backward.default: rule_native_batch_norm_backward,
    aten.batch_norm.default: rule_batch_norm_infer,
    aten.max_pool2d.default: rule_max_pool2d,
    aten.max_pool2d_with_indices_backward.default: rule_max_pool2d_backward,
    aten.lstm.input: rule_lstm_infer,
    aten.gru.input: rule_gru_infer,
    aten.embedding_dense_backward.default: rule_embedding_backward,
    aten._transformer_encoder_layer_fwd.default: rule_transformer_encoder_layer_fwd,
}

SIZES: dict[Any, SizeRule] = {
    aten.mkldnn_rnn_layer.default: sizes_mkldnn_rnn_layer,
}

FakeFix = Callable[[tuple[Any, ...], dict[str, Any], Any], Any]

FAKE_OUTPUTS: dict[Any, FakeFix] = {
    aten.mkldnn_rnn_layer_backward.default: unalias_rnn_backward,
}


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
