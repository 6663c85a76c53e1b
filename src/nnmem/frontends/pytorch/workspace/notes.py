"""Why an op call's kernel scratch is not modelled on a CPU: one line for a report, or None.

Dispatches to the note of the op's family: :func:`.conv_select.conv_note`, :func:`.rnn.recurrent_note`,
:func:`.attention.attention_note`, :func:`.matmul.matmul_note`.
"""

from __future__ import annotations

from typing import Any

from nnmem.cpu import CpuInfo
from nnmem.frontends.pytorch.workspace.attention import attention_note
from nnmem.frontends.pytorch.workspace.conv import CONV_CALLS
from nnmem.frontends.pytorch.workspace.conv_select import conv_note
from nnmem.frontends.pytorch.workspace.matmul import matmul_note
from nnmem.frontends.pytorch.workspace.rnn import RECURRENT, recurrent_note


def note_for(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], info: CpuInfo) -> str | None:
    """Why the scratch of this op call is not modelled on this CPU, or None when it is (or needs none).

    Args:
        func: the op overload, e.g. ``torch.ops.aten.convolution.default``.
        args, kwargs: its arguments (real or fake tensors: only shapes, dtypes and layouts are read).
        info: the CPU it runs on (:func:`nnmem.cpu.describe`).

    Returns:
        One line for a report, e.g. "float16 convolution through oneDNN (ISA avx512_core_fp16): kernel
        scratch not modelled; the allocator level may be higher".
    """
    parse = CONV_CALLS.get(func)
    if parse is not None:
        call = parse(args, kwargs)
        return None if call is None else conv_note(call, info)
    if func in RECURRENT:
        return recurrent_note(func, args, info)
    return attention_note(func, args, kwargs, info) or matmul_note(func, args, info, kwargs)
