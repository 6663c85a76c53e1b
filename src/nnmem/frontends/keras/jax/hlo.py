"""Read the HLO text of a compiled XLA executable (``compiled.as_text()``): computations, shapes, convolutions.

Only what the scratch rules need: each computation's instructions in schedule order, array shapes and
element sizes, a convolution's geometry (``dim_labels``, ``window``, ``feature_group_count``) and the
module header's ``input_output_alias`` entries. Syntax: XLA's HLO text format (``xla/hlo/ir/hlo_instruction.cc``
``ToString``, ``xla/hlo/parser/hlo_parser.cc``). Pure text: no jax import.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["ITEMSIZE", "NO_BUFFER", "Conv", "Instruction", "Module", "conv", "nbytes", "only_reinterpreted", "parse",
           "shape", "through_reinterpret"]

ITEMSIZE = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "f16": 2, "bf16": 2, "s16": 2,
            "u16": 2, "s8": 1, "u8": 1, "pred": 1}
"""Bytes per element of each HLO primitive type."""
NO_BUFFER = frozenset({"parameter", "bitcast", "get-tuple-element", "tuple", "constant", "after-all"})
"""Opcodes that write no buffer of their own."""
_REINTERPRET = frozenset({"bitcast", "reshape", "copy", "transpose"})
_ARRAY = re.compile(r"\b(" + "|".join(ITEMSIZE) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^(ENTRY )?%([\w.\-]+) \(.*\{\s*$")
_NAME = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_ALIAS_ENTRY = re.compile(r"\{[\d,\s]*\}:\s*\(\d+,")


@dataclass(frozen=True, slots=True)
class Instruction:
    """One HLO instruction: ``[ROOT ]%name = type opcode(rest``."""

    name: str
    type: str
    opcode: str
    rest: str
    root: bool

    @property
    def operands(self) -> list[str]:
        return _NAME.findall(self.rest.split("metadata=")[0])

    @property
    def called(self) -> str | None:
        """The computation a fusion or call runs (``calls=%...``)."""
        found = _CALLS.search(self.rest)
        return found.group(1) if found else None


@dataclass(frozen=True, slots=True)
class Module:
    """An HLO module: its computations (instructions in schedule order) and the header's aliases."""

    computations: dict[str, list[Instruction]]
    entry: str
    aliases: int
    """Entries of ``input_output_alias``: outputs that take over a (donated) parameter's buffer."""
    types: dict[str, str]
    """Each instruction's result type, by name, over all computations."""

    @property
    def entry_body(self) -> list[Instruction]:
        return self.computations.get(self.entry, [])


def parse(hlo: str) -> Module:
    """The module of ``compiled.as_text()``."""
    comps: dict[str, list[Instruction]] = {}
    current, entry = "", ""
    for line in hlo.splitlines():
        if (head := _COMPUTATION.match(line)) is not None:
            current = head.group(2)
            comps[current] = []
            entry = current if head.group(1) else entry
        elif line.startswith("}"):
            current = ""
        elif current and (m := _INSTRUCTION.match(line)) is not None:
            comps[current].append(Instruction(m.group(2), m.group(3), m.group(4), m.group(5), bool(m.group(1))))
    header = hlo.split("\n", 1)[0]
    aliases = len(_ALIAS_ENTRY.findall(header.split("input_output_alias=", 1)[1])) if \
        "input_output_alias=" in header else 0
    types = {i.name: i.type for body in comps.values() for i in body}
    return Module(comps, entry, aliases, types)


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def shape(text: str) -> tuple[list[int], int] | None:
    """The first array type in ``text``: its dims and its bytes per element."""
    found = _ARRAY.search(text)
    return (_dims(found.group(2)), ITEMSIZE[found.group(1)]) if found else None


def nbytes(text: str) -> int | None:
    """Bytes of the first array type in ``text``."""
    found = shape(text)
    return math.prod(found[0]) * found[1] if found else None


@dataclass(frozen=True, slots=True)
class Conv:
    """A convolution's geometry, read from its HLO text."""

    lhs: list[int]  # input dims, in the order of ``lhs_labels``
    lhs_labels: str  # e.g. "b01f": batch, spatial 0, 1, features
    out: list[int]
    out_labels: str
    window: list[int]  # kernel size per spatial dim
    pads: list[int] | None  # total padding per spatial dim; None when the window does not pad
    groups: int
    item: int  # bytes per element

    def dim(self, label: str) -> int:
        return self.lhs[self.lhs_labels.index(label)]


def conv(ins: Instruction, types: dict[str, str]) -> Conv | None:
    """The geometry of a ``convolution`` instruction; None where its text lacks a shape or ``dim_labels``."""
    lhs, out = shape(types.get(ins.operands[0], "")), shape(ins.type)
    labels = re.search(r"dim_labels=(\w+)_\w+->(\w+)", ins.rest)
    window = re.search(r"window=\{([^}]*)\}", ins.rest)
    if lhs is None or out is None or labels is None:
        return None
    size = re.search(r"size=([\dx]+)", window.group(1)) if window else None
    pad = re.search(r"pad=([\d_x\-]+)", window.group(1)) if window else None
    groups = re.search(r"feature_group_count=(\d+)", ins.rest)
    return Conv(lhs[0], labels.group(1), out[0], labels.group(2),
                [int(k) for k in size.group(1).split("x")] if size else [],
                [sum(int(p) for p in s.split("_")) for s in pad.group(1).split("x")] if pad else None,
                int(groups.group(1)) if groups else 1, lhs[1])


def through_reinterpret(name: str, named: dict[str, Instruction]) -> Instruction | None:
    """The instruction that produces ``name``, looking through bitcasts, reshapes, copies and transposes."""
    ins = named.get(name)
    while ins is not None and ins.opcode in _REINTERPRET and ins.operands:
        ins = named.get(ins.operands[0])
    return ins


def only_reinterpreted(ins: Instruction, body: list[Instruction]) -> bool:
    """Whether ``ins`` has users in ``body`` and each of them only reinterprets its result."""
    users = [u.opcode for u in body if ins.name in u.operands]
    return bool(users) and all(u in _REINTERPRET for u in users)
