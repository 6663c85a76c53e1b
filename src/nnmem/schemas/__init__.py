"""JSON Schemas (draft 2020-12) of every ``--json`` output of the ``nnmem`` command, packaged with nnmem.

One file per output, ``<name>.schema.json``, whose ``$id`` carries its version
(``https://nnmem.dev/schemas/<name>/v2.json``); the shapes they share (the report of a step, the answer of a
max-batch search, byte counts) live once in ``common.schema.json`` and are referenced by ``$ref``.
:func:`validate` checks a parsed output with the ``jsonschema`` package (``pip install 'jsonschema>=4.18'``),
strictly: NaN and infinities are not JSON numbers (RFC 8259), and an integer is written as one (``5``, not
``5.0``: nnmem's bytes are ints).
"""

from __future__ import annotations

import json
import math
from functools import cache
from importlib import resources
from typing import Any

from nnmem.errors import ConfigError, MissingFrameworkError

__all__ = ["SCHEMAS", "SHARED", "schema", "validate"]

SCHEMAS = ("estimate", "measure", "fit", "fit-effective-batch", "explain", "whatif", "plan", "devices")
"""The outputs with a schema: ``nnmem estimate --json`` is ``"estimate"``, ``nnmem fit --effective-batch B
--json`` is ``"fit-effective-batch"``; the others are named for their command."""

SHARED = ("common",)
"""Schemas the outputs' schemas refer to, not an output of their own."""

_MESSAGE_LIMIT = 200  # characters of the validator's message kept: it quotes the offending value, however large


def schema(name: str) -> dict[str, Any]:
    """The packaged schema ``name`` (one of :data:`SCHEMAS` or :data:`SHARED`), as a fresh dict.

    Example:
        >>> schema("estimate")["$id"]
        'https://nnmem.dev/schemas/estimate/v2.json'

    Raises:
        ConfigError: ``name`` is not a packaged schema.
    """
    if name not in SCHEMAS + SHARED:
        raise ConfigError(f"expected a schema name, one of {', '.join(SCHEMAS + SHARED)}. Received: {name!r}")
    text = resources.files(__name__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def validate(name: str, data: Any) -> None:
    """Check ``data``, an output of ``nnmem ... --json`` parsed by :func:`json.loads`, against schema ``name``.

    Example:
        >>> validate("estimate", json.loads(report.to_json()))  # doctest: +SKIP

    Raises:
        ConfigError: ``data`` does not match; the message names the schema, the path in ``data`` and what failed.
        MissingFrameworkError: the ``jsonschema`` package is not installed.
    """
    if name not in SCHEMAS:
        raise ConfigError(f"expected the name of an output's schema, one of {', '.join(SCHEMAS)}. Received: {name!r}")
    validator = _validator(name)
    from jsonschema.exceptions import best_match

    error = best_match(validator.iter_errors(data))
    if error is None:
        return
    message = " ".join(error.message.split())
    if len(message) > _MESSAGE_LIMIT:
        message = message[:_MESSAGE_LIMIT - 1] + "…"
    raise ConfigError(f"expected nnmem's {name!r} JSON (schema {validator.schema['$id']}); at {error.json_path}: "
                      f"{message}")


@cache
def _validator(name: str) -> Any:
    """A draft 2020-12 validator of schema ``name`` whose ``$ref`` resolve among the packaged schemas."""
    try:
        from jsonschema import Draft202012Validator, validators
        from referencing import Registry, Resource
    except ImportError as err:
        raise MissingFrameworkError("validating nnmem's JSON needs the jsonschema package (4.18 or newer): "
                                    "pip install 'jsonschema>=4.18'") from err
    base = Draft202012Validator.TYPE_CHECKER
    checker = base.redefine_many({
        "number": lambda c, x: base.is_type(x, "number") and (not isinstance(x, float) or math.isfinite(x)),
        "integer": lambda c, x: isinstance(x, int) and not isinstance(x, bool),
    })
    strict = validators.extend(Draft202012Validator, type_checker=checker)
    registry: Registry[Any] = Registry().with_resources(
        (doc["$id"], Resource.from_contents(doc)) for doc in map(schema, SCHEMAS + SHARED))
    return strict(schema(name), registry=registry)
