"""Gradient accumulation against a budget: the fewest micro-batch steps that fit an effective batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Accumulation", "fewest_micro_steps"]


@dataclass(frozen=True)
class Accumulation:
    """How an effective batch fits a budget with gradient accumulation.

    Attributes:
        effective_batch: the batch per optimizer step asked for.
        micro_steps: the fewest micro-batches it fits in (1: no accumulation needed; 0: not even a micro-batch
            of 1 fits).
        micro_batch: ``effective_batch // micro_steps``.
        peak_bytes: the step's peak at that split, in bytes (from a trace).
        budget_bytes: the budget.
        largest_plain: the largest batch without accumulation.
        largest_micro: the largest micro-batch with accumulation (a full set of gradients lives through it);
            0 where it was not searched (the whole batch fits without accumulation).
    """

    effective_batch: int
    micro_steps: int
    micro_batch: int
    peak_bytes: int
    budget_bytes: int
    largest_plain: int
    largest_micro: int

    def to_dict(self) -> dict[str, Any]:
        return {"effective_batch": self.effective_batch, "micro_steps": self.micro_steps,
                "micro_batch": self.micro_batch, "peak_bytes": self.peak_bytes, "budget_bytes": self.budget_bytes,
                "largest_plain_batch": self.largest_plain, "largest_micro_batch": self.largest_micro}


def fewest_micro_steps(effective: int, largest_plain: int, largest_micro: int) -> int:
    """The fewest equal micro-batches ``effective`` splits into that fit: 1 when the whole batch fits, else the
    smallest divisor k >= 2 whose micro-batch ``effective // k`` is at most ``largest_micro``; 0 when none is.

    Example:
        >>> fewest_micro_steps(256, 40, 100)  # 256 = 4 x 64; 2 x 128 does not fit
        4
    """
    if effective <= largest_plain:
        return 1
    for k in range(2, effective + 1):
        if effective % k == 0 and effective // k <= largest_micro:
            return k
    return 0
