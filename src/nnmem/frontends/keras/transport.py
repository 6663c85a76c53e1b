"""A Keras model's way into the measuring child: its config and custom classes (built afresh there, random
initial weights, compiled like the caller's), and ``.keras`` files loaded in safe mode (no Lambda code runs).

The child rebuilds rather than unpickles: a model pickled with its weights arrives with its variables
re-pointed at the loaded arrays, outside the allocator the step is measured on.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext, suppress
from pathlib import Path
from typing import Any

import keras

from nnmem.errors import MeasureError, ModelLoadError, first_line

__all__ = ["load_file", "model_payload", "model_from_payload"]


def model_payload(model: Any) -> bytes:
    """The model's config, the classes it needs, whether its optimizer has state, the model's own dtype policy
    and the rematerialization scope its layers were built in, pickled for the child."""
    import cloudpickle

    try:
        config = keras.saving.serialize_keras_object(model)
        policy = str(model.dtype_policy.name)
        payload = cloudpickle.dumps((config, _custom_objects(model), _optimizer_built(model), policy,
                                     _remat(model)))
    except Exception as err:
        raise MeasureError(f"the Keras model cannot be sent to the measuring child process ({first_line(err, 200)}): "
                           "give custom layers and models a get_config() (keras.saving.register_keras_serializable), "
                           "or measure a MODEL spec 'file.py:factory'") from err
    return payload  # type: ignore[no-any-return]


def _remat(model: Any) -> dict[str, Any] | None:
    """The ``keras.RematScope`` arguments the model's layers were built under (a layer keeps its scope from
    construction, and a config does not carry it), or None."""
    for layer in model._flatten_layers(include_self=True, recursive=True):
        scope = getattr(layer, "_remat_mode", None)
        if scope is not None:
            return {"mode": scope.mode, "output_size_threshold": scope.output_size_threshold,
                    "layer_names": list(scope.layer_names)}
    return None


def _custom_objects(model: Any) -> dict[str, Any]:
    """The model's own layer and model classes (not Keras's), by class name and by registered name."""
    objects: dict[str, Any] = {}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        cls = type(layer)
        if cls.__module__.split(".")[0] == "keras":
            continue
        objects[cls.__name__] = cls
        objects[keras.saving.get_registered_name(cls)] = cls
    return objects


def _optimizer_built(model: Any) -> bool:
    optimizer = getattr(model, "optimizer", None)
    return bool(optimizer is not None and getattr(optimizer, "built", False))


def model_from_payload(payload: bytes) -> Any:
    """Build the model of :func:`_model_payload` afresh: from its config, compiled as the caller's was, its
    optimizer's state built only where the caller's optimizer had state. It is built under the caller's model's
    dtype policy (a model built under ``mixed_float16`` compiles with loss scaling, as the caller's did) and
    rematerialization scope."""
    import cloudpickle

    config, objects, optimizer_built, policy, remat = cloudpickle.loads(payload)
    config = dict(config)
    compile_config = config.pop("compile_config", None)
    previous = keras.config.dtype_policy()
    with suppress(ValueError, TypeError):  # a policy Keras cannot set globally: the layers' configs carry theirs
        keras.config.set_dtype_policy(policy)
    try:
        with keras.saving.custom_object_scope(objects), (keras.RematScope(**remat) if remat else nullcontext()):
            model = keras.saving.deserialize_keras_object(config, custom_objects=objects)
            if compile_config:
                if type(model).compile is keras.Model.compile:
                    model.compile(**keras.saving.deserialize_keras_object(compile_config))
                else:  # a custom compile: Keras's own loading calls it the same way (or warns)
                    model.compile_from_config(compile_config)
    except Exception as err:
        raise MeasureError("the measuring child process cannot rebuild the Keras model from its config "
                           f"({first_line(err, 200)}): "
                           "register custom classes with keras.saving.register_keras_serializable and give them "
                           "a get_config(), or measure a MODEL spec 'file.py:factory'") from err
    finally:
        keras.config.set_dtype_policy(previous)
    if optimizer_built and getattr(model, "optimizer", None) is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    return model


def load_file(path: str) -> Any:
    """Load a ``.keras`` file with ``safe_mode=True``: a Lambda layer's code is refused, not run."""
    if not Path(path).is_file():
        raise ModelLoadError(f"model file not found: {path}")
    try:
        with warnings.catch_warnings():  # Keras warns that a saved optimizer's slots are rebuilt; they are
            warnings.simplefilter("ignore")
            return keras.saving.load_model(path, safe_mode=True, compile=True)
    except ValueError as err:
        text = str(err)
        if "safe_mode" in text or "Lambda" in text or "lambda" in text:
            raise ModelLoadError(f"refusing to load {path}: it contains a Lambda layer whose code would run on "
                                 "load (Keras safe_mode). Rebuild the model in a factory 'file.py:factory' "
                                 "you trust instead") from err
        raise ModelLoadError(f"cannot load {path}: {first_line(err)}") from err
    except Exception as err:
        raise ModelLoadError(f"cannot load {path}: {type(err).__name__}: {err}") from err
