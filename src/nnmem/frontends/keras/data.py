"""The data a Keras step runs on: the caller's arrays, zeros of given shapes, or zeros of the model's own
declared input (and output, for the target) shapes. Only shapes and dtypes matter for memory."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from nnmem.errors import ConfigError

__all__ = ["step_data", "example_data", "zeros", "unpack", "rebatch", "batch_zeros", "materialize"]


def unpack(inputs: Any) -> Any:
    """Our API passes inputs as a tuple of positional arguments; Keras takes x (one array, or a list)."""
    if isinstance(inputs, tuple):
        return inputs[0] if len(inputs) == 1 else list(inputs)
    return inputs


def zeros(batch: int, shapes: tuple[tuple[int, ...], ...]) -> Any:
    """float32 zeros of (batch, *shape) for each shape: one array, or a list for several inputs."""
    arrays = [batch_zeros((batch, *s), "float32") for s in shapes]  # views: materialize() before running
    return arrays[0] if len(arrays) == 1 else arrays


def step_data(model: Any, inputs: Any, target: Any, input_shape: tuple[tuple[int, ...], ...] | None,
              batch: int | None, mode: str) -> tuple[Any, Any, str | None]:
    """Inputs (and target) for a Keras step: as given, zeros of ``input_shape``, or zeros of the model's own
    declared shapes (with a note saying so)."""
    if inputs is not None:
        return inputs, target, None
    if input_shape:
        return zeros(batch or 1, input_shape), target, None
    return example_data(model, batch or 1, mode, target)


def example_data(model: Any, batch: int, mode: str, target: Any) -> tuple[Any, Any, str]:
    """Zero inputs (and a zero target) of ``batch`` from a Keras model's own input and output shapes."""
    model_inputs = getattr(model, "inputs", None)
    try:
        shapes = [tuple(t.shape) for t in model_inputs] if model_inputs else []
    except (AttributeError, ValueError):
        shapes = []
    if not shapes or any(d is None for s in shapes for d in s[1:]):
        raise ConfigError("the Keras model does not declare its input shape: give inputs, or --input-shape D1,D2,...")
    x = [batch_zeros((batch, *s[1:]), str(t.dtype)) for s, t in zip(shapes, model_inputs or [])]
    if mode == "train" and target is None:
        out = model.outputs[0]
        loss = str(getattr(model, "loss", "") or "")
        if "sparse" in loss.lower():  # class indices, one per sample (and per position)
            target = batch_zeros((batch, *tuple(out.shape)[1:-1]), "int32")
        else:
            target = batch_zeros((batch, *tuple(out.shape)[1:]), "float32")
    note = (f"inputs: zeros of the model's declared input shape{'s' if len(x) > 1 else ''} at batch {batch}"
            + ("; target: zeros shaped for the compiled loss" if mode == "train" else ""))
    return (x[0] if len(x) == 1 else x), target, note


def _np_dtype(a: Any) -> Any:
    name = keras.backend.standardize_dtype(a.dtype)
    return "float32" if name == "bfloat16" else name


def batch_zeros(shape: tuple[int, ...], dtype: Any) -> Any:
    """Zeros of ``shape`` as a read-only view of one sample's zeros (stride 0 along the leading batch axis): the
    traces read only shapes and dtypes, so a batch search at a GPU's batch sizes allocates one sample's worth."""
    one = np.zeros((1, *shape[1:]), dtype=dtype)
    return np.broadcast_to(one, shape)


def materialize(value: Any) -> Any:
    """Real arrays for a step that runs (a measurement): :func:`batch_zeros` views copied out, other leaves kept."""
    if value is None:
        return None
    return keras.tree.map_structure(
        lambda a: np.array(a) if isinstance(a, np.ndarray) and not a.flags.writeable else a, value)


def rebatch(value: Any, batch: int) -> Any:
    """Zeros shaped like ``value`` (an array or a structure of arrays) with the leading dimension ``batch``
    (:func:`batch_zeros`)."""
    if value is None:
        return None
    return keras.tree.map_structure(lambda a: batch_zeros((batch, *a.shape[1:]), _np_dtype(a)), value)
