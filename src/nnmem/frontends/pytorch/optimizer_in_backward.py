"""The optimizer step inside backward: each parameter is updated, and its gradient freed, as soon as backward
has accumulated it (PyTorch's ``register_post_accumulate_grad_hook`` recipe, one optimizer per parameter).

A step then never holds every gradient at once: at most the gradients backward is still summing, and the
update of one parameter at a time. Per-parameter optimizers give the same update as one optimizer over all of
them for element-wise optimizers (SGD, Adam, AdamW, RMSprop, Adagrad), not for ones that look across
parameters (LBFGS, gradient clipping by the global norm).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["PerParameter"]


class PerParameter:
    """One optimizer per parameter, stepped by a hook when its gradient is ready (inside :meth:`hooks`).

    It offers what the step and the tracker use of an optimizer: ``zero_grad``, ``step`` (all of them, for the
    steady-state warm-up), ``param_groups`` and ``state``.
    """

    def __init__(self, params: list[torch.nn.Parameter], build: Callable[[list[torch.nn.Parameter]], Any]) -> None:
        self.optimizers = {p: build([p]) for p in params}

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for opt in self.optimizers.values() for group in opt.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        return {p: s for opt in self.optimizers.values() for p, s in opt.state.items()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def _update(self, param: torch.Tensor) -> None:
        opt = self.optimizers[param]  # type: ignore[index]
        opt.step()
        opt.zero_grad(set_to_none=True)

    @contextmanager
    def hooks(self) -> Iterator[None]:
        """Within the block, backward updates each parameter and frees its gradient once accumulated."""
        handles = [p.register_post_accumulate_grad_hook(self._update) for p in self.optimizers]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
