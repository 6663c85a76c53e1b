"""Per-layer rows shaped for a terminal: folded to a module depth, the largest first with the rest summed.

A layer's depth is the number of names in its dotted path (``blocks.0.attn.qkv``: 4; the model itself: 0).
Folding to depth d sums every row below a depth-d prefix into one row named by that prefix, so that a
12-layer transformer reads as its embeddings, its 12 blocks and its head, like torchinfo's ``depth``.
Sums are of bytes each layer owns or makes; a folded row's "output" is every output made inside it.
"""

from __future__ import annotations

from collections.abc import Sequence

from nnmem.report.model import LayerRow

__all__ = ["DEFAULT_MAX_ROWS", "default_depth", "depth_of", "fold", "largest"]

DEFAULT_MAX_ROWS = 24
"""Rows of the per-layer table at the default depth: with the other sections, one screen."""


def depth_of(path: str) -> int:
    """Names in a dotted layer path (0 for the model itself, ``""``)."""
    return path.count(".") + 1 if path else 0


def _summed(path: str, kind: str, rows: Sequence[LayerRow]) -> LayerRow:
    held: dict[str, int] = {}
    for row in rows:
        for category, nbytes in row.held.items():
            held[category] = held.get(category, 0) + nbytes
    return LayerRow(path, kind, sum(r.parameters for r in rows), sum(r.parameter_bytes for r in rows),
                    sum(r.output_bytes for r in rows), sum(r.saved_bytes for r in rows),
                    sum(r.peak_bytes for r in rows), held=held)


def fold(rows: Sequence[LayerRow], depth: int) -> tuple[LayerRow, ...]:
    """The rows with every layer deeper than ``depth`` summed into its ancestor at ``depth``, in model order.

    Args:
        rows: a report's layer rows (model order).
        depth: the deepest level kept (1: the model's direct children).

    Returns:
        One row per prefix; a prefix that held several rows is named by it, its kind says how many layers it
        sums (e.g. ``"8 layers"``).

    Example:
        >>> from nnmem.report.model import LayerRow
        >>> fc = LayerRow("blocks.0.fc", "Linear", 10, 40, 8, 8, 48)
        >>> act = LayerRow("blocks.0.act", "ReLU", 0, 0, 8, 8, 8)
        >>> block = fold([fc, act], 2)[0]
        >>> block.path, block.kind, block.peak_bytes
        ('blocks.0', '2 layers', 56)
    """
    groups: dict[str, list[LayerRow]] = {}
    for row in rows:
        prefix = ".".join(row.path.split(".")[:depth]) if row.path else ""
        groups.setdefault(prefix, []).append(row)
    out = []
    for prefix, members in groups.items():
        if len(members) == 1 and members[0].path == prefix:
            out.append(members[0])
        else:
            out.append(_summed(prefix, f"{len(members)} layers", members))
    return tuple(out)


def default_depth(rows: Sequence[LayerRow], max_rows: int = DEFAULT_MAX_ROWS) -> int:
    """The deepest depth whose folded table has at most ``max_rows`` rows (at least 1): every layer when
    they fit, else the blocks a model repeats."""
    deepest = max((depth_of(r.path) for r in rows), default=1)
    best = 1
    for depth in range(1, deepest + 1):
        if len(fold(rows, depth)) <= max_rows:
            best = depth
    return best


def largest(rows: Sequence[LayerRow], top: int) -> tuple[LayerRow, ...]:
    """The ``top`` rows with the most bytes live at the peak (then the most parameter bytes), largest first, and
    the others summed in one last row ``"(N more layers)"``."""
    ranked = sorted(rows, key=lambda r: (-r.peak_bytes, -r.parameter_bytes))
    kept, rest = ranked[:top], ranked[top:]
    if len(rest) > 1:
        return (*kept, _summed(f"({len(rest)} more layers)", "", rest))
    return tuple(kept + rest)
