"""The JSON Schemas of the ``--json`` outputs: every output the CLI prints validates against its schema, and an
output that lost a key, gained one or holds a string where bytes go is rejected."""

from __future__ import annotations

import copy
import json
import re
import sys
from functools import cache
from importlib import resources
from typing import Any, get_args

import pytest
from click.testing import CliRunner

from nnmem import schemas
from nnmem._api import MODES
from nnmem.cli import cli
from nnmem.devices import DeviceKind
from nnmem.errors import ConfigError, MissingFrameworkError
from nnmem.trace import Category, Level, Phase

jsonschema = pytest.importorskip("jsonschema")

ESTIMATE = ("estimate", "mlp")
MEASURE = ("measure", "mlp")
FIT = ("fit", "mlp", "--budget", "64MiB")
FIT_EFFECTIVE = ("fit", "mlp", "--budget", "4MiB", "--effective-batch", "64")
EXPLAIN = ("explain", "mlp", "--budget", "16GiB")
WHATIF = ("whatif", "mlp", "--budget", "1MiB")
PLAN = ("plan", "mlp", "--batch", "8", "--optimizer", "adam", "--budget", "800000")
DEVICES = ("devices",)

# (schema, command line without --json): every variant whose shape differs.
CASES = [
    ("estimate", ESTIMATE),
    ("estimate", (*ESTIMATE, "--budget", "1MiB")),
    ("estimate", (*ESTIMATE, "--device", "cuda")),
    ("estimate", (*ESTIMATE, "--mode", "infer")),
    ("measure", MEASURE),
    ("measure", (*MEASURE, "--runs", "2", "--budget", "1MiB")),
    ("fit", FIT),
    ("fit", (*FIT, "--mode", "train")),
    ("fit-effective-batch", FIT_EFFECTIVE),
    ("explain", ("explain", "mlp")),
    ("explain", EXPLAIN),
    ("whatif", ("whatif", "mlp")),
    ("whatif", WHATIF),
    ("plan", PLAN),
    ("devices", DEVICES),
]


def _not_json(constant: str) -> Any:
    raise AssertionError(f"the output holds {constant}, which is not JSON (RFC 8259)")


@cache
def _stdout(*args: str) -> str:
    """The stdout of ``nnmem ARGS --json``, run once per command line."""
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, (result.exit_code, result.stderr, result.exception)
    return result.stdout


def cli_json(*args: str) -> Any:
    """A fresh parse of ``nnmem ARGS --json``, strict: NaN and infinities fail the test."""
    return json.loads(_stdout(*args), parse_constant=_not_json)


def json_path(path: tuple[str | int, ...]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


# --- every output matches its schema -------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "args"), CASES, ids=[" ".join(args) for _, args in CASES])
def test_output_matches_its_schema(name: str, args: tuple[str, ...]) -> None:
    schemas.validate(name, cli_json(*args))


def test_variants_cover_the_optional_keys() -> None:
    assert {"budget_bytes", "fits"} <= cli_json(*ESTIMATE, "--budget", "1MiB").keys()
    assert "runs_peaks" in cli_json(*MEASURE, "--runs", "2", "--budget", "1MiB")["measured"]["meta"]
    one_mode = cli_json(*FIT, "--mode", "train")
    assert "train" in one_mode and "infer" not in one_mode
    assert cli_json("explain", "mlp")["budget_bytes"] is None
    assert cli_json(*EXPLAIN)["train"]["fit"] is not None
    assert "largest_train_batch" in cli_json(*WHATIF)["baseline"]
    assert "largest_train_batch" not in cli_json("whatif", "mlp")["baseline"]


def test_every_json_command_has_a_case() -> None:
    with_json = {name for name, command in cli.commands.items() if any(p.name == "as_json" for p in command.params)}
    assert with_json == {args[0] for _, args in CASES}


# --- a broken output is rejected -----------------------------------------------------------------------------

# (schema, command line, path to a field in bytes): its key is dropped, a key is added beside it, it becomes text.
BYTES_FIELDS = [
    ("estimate", ESTIMATE, ("peak_bytes",)),
    ("estimate", ESTIMATE, ("layers", 0, "saved_bytes")),
    ("measure", MEASURE, ("measured", "parameter_bytes")),
    ("measure", MEASURE, ("rows", 0, "measured")),
    ("fit", FIT, ("train", "headroom_bytes")),
    ("fit-effective-batch", FIT_EFFECTIVE, ("peak_bytes",)),
    ("explain", EXPLAIN, ("infer", "fit", "next_peak_bytes")),
    ("whatif", WHATIF, ("techniques", 0, "saved_bytes")),
    ("plan", PLAN, ("chosen", "peak_bytes")),
    ("devices", DEVICES, (0, "usable_bytes")),
]
_IDS = [f"{name}:{json_path(path)}" for name, _, path in BYTES_FIELDS]


def _parent(data: Any, path: tuple[str | int, ...]) -> Any:
    for key in path[:-1]:
        data = data[key]
    return data


def _rejected(name: str, data: Any, where: tuple[str | int, ...]) -> str:
    with pytest.raises(ConfigError) as info:
        schemas.validate(name, data)
    message = str(info.value)
    assert "\n" not in message
    assert f"'{name}'" in message and f"https://nnmem.dev/schemas/{name}/v2.json" in message, message
    assert f"at {json_path(where)}:" in message, message
    return message


@pytest.mark.parametrize(("name", "args", "path"), BYTES_FIELDS, ids=_IDS)
def test_a_missing_key_is_rejected(name: str, args: tuple[str, ...], path: tuple[str | int, ...]) -> None:
    data = cli_json(*args)
    del _parent(data, path)[path[-1]]
    assert str(path[-1]) in _rejected(name, data, path[:-1])


@pytest.mark.parametrize(("name", "args", "path"), BYTES_FIELDS, ids=_IDS)
def test_an_unknown_key_is_rejected(name: str, args: tuple[str, ...], path: tuple[str | int, ...]) -> None:
    data = cli_json(*args)
    _parent(data, path)["surprise"] = 1
    assert "surprise" in _rejected(name, data, path[:-1])


@pytest.mark.parametrize(("name", "args", "path"), BYTES_FIELDS, ids=_IDS)
def test_a_string_where_bytes_go_is_rejected(name: str, args: tuple[str, ...], path: tuple[str | int, ...]) -> None:
    data = cli_json(*args)
    parent = _parent(data, path)
    parent[path[-1]] = str(parent[path[-1]])
    assert "is not of type 'integer'" in _rejected(name, data, path)


# (schema, command line, path to a value in a map keyed by level, category or layer).
MAP_VALUES = [
    ("estimate", ESTIMATE, ("breakdown", "parameters")),
    ("whatif", WHATIF, ("baseline", "peaks", "tensor")),
    ("explain", EXPLAIN, ("saved_per_sample", "relu1")),
    ("plan", PLAN, ("baseline", "peaks", "allocator")),
]


@pytest.mark.parametrize(("name", "args", "path"), MAP_VALUES, ids=[f"{n}:{json_path(p)}" for n, _, p in MAP_VALUES])
def test_a_string_in_a_map_of_bytes_is_rejected(name: str, args: tuple[str, ...], path: tuple[str | int, ...]) -> None:
    data = cli_json(*args)
    parent = _parent(data, path)
    parent[path[-1]] = str(parent[path[-1]])
    assert "is not of type 'integer'" in _rejected(name, data, path)


@pytest.mark.parametrize(("path", "name"), [(("peaks",), "vram"), (("breakdown",), "weights")])
def test_a_map_keyed_by_level_or_category_rejects_other_names(path: tuple[str, ...], name: str) -> None:
    data = cli_json(*ESTIMATE)
    data[path[0]][name] = 0
    assert repr(name) in _rejected("estimate", data, path)


@pytest.mark.parametrize("value", [1.0, True, -1, float("nan")], ids=["float", "bool", "negative", "nan"])
def test_bytes_are_non_negative_ints(value: Any) -> None:
    data = cli_json(*ESTIMATE)
    data["peak_bytes"] = value
    _rejected("estimate", data, ("peak_bytes",))


def test_a_measured_remainder_may_be_negative_but_not_an_estimated_one() -> None:
    """A measurement's kernel workspace is its peak less the traced tensors: below zero where the run peaked lower
    than the trace (TensorFlow's executor does); an estimate's categories are bytes held."""
    data = cli_json(*MEASURE)
    data["measured"]["breakdown"][Category.WORKSPACE.value] = -4096
    schemas.validate("measure", data)
    data["estimated"]["breakdown"][Category.WORKSPACE.value] = -4096
    with pytest.raises(ConfigError, match="less than the minimum of 0"):
        schemas.validate("measure", data)


def test_keys_that_come_together_are_checked_together() -> None:
    estimate = cli_json(*ESTIMATE, "--budget", "1MiB")
    del estimate["fits"]
    with pytest.raises(ConfigError, match="'fits' is a dependency of 'budget_bytes'"):
        schemas.validate("estimate", estimate)
    whatif = cli_json("whatif", "mlp")
    whatif["budget_bytes"] = 2**20  # a budget, but rows without their largest batches
    with pytest.raises(ConfigError, match=r"at \$\.baseline: 'largest_train_batch' is a required property"):
        schemas.validate("whatif", whatif)
    explain = cli_json(*EXPLAIN)
    explain["train"]["mode"] = "infer"
    with pytest.raises(ConfigError, match=r"at \$\.train\.mode: 'train' was expected"):
        schemas.validate("explain", explain)


def test_a_long_value_is_cut_to_one_short_line() -> None:
    data = cli_json(*ESTIMATE)
    data["model"] = ["x" * 1000]
    message = _rejected("estimate", data, ("model",))
    assert len(message) < 400, message


# --- the schemas themselves -----------------------------------------------------------------------------------


def _packaged() -> set[str]:
    return {p.name.removesuffix(".schema.json") for p in resources.files("nnmem.schemas").iterdir()
            if p.name.endswith(".schema.json")}


def test_every_name_has_a_file_and_every_file_a_name() -> None:
    assert _packaged() == set(schemas.SCHEMAS) | set(schemas.SHARED)
    assert not set(schemas.SCHEMAS) & set(schemas.SHARED)


@pytest.mark.parametrize("name", schemas.SCHEMAS + schemas.SHARED)
def test_each_schema_is_a_valid_draft_2020_12_schema(name: str) -> None:
    document = schemas.schema(name)
    jsonschema.Draft202012Validator.check_schema(document)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert re.fullmatch(rf"https://nnmem\.dev/schemas/{re.escape(name)}/v[1-9][0-9]*\.json", document["$id"])
    assert document["title"] and document["description"]


def test_schema_returns_a_fresh_copy() -> None:
    document = schemas.schema("estimate")
    pristine = copy.deepcopy(document)
    document["title"] = "changed"
    assert schemas.schema("estimate") == pristine


def test_the_names_in_the_schemas_are_nnmems_own() -> None:
    """The enums in common.schema.json repeat nnmem's registries; this keeps them one list."""
    defs = schemas.schema("common")["$defs"]
    assert defs["level"]["enum"] == [level.value for level in Level]
    assert defs["category"]["enum"] == [category.value for category in Category]
    assert defs["phase"]["enum"] == [phase.value for phase in Phase]
    assert defs["mode"]["enum"] == list(MODES)
    assert schemas.schema("devices")["items"]["properties"]["kind"]["enum"] == list(get_args(DeviceKind))


def test_an_unknown_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="expected a schema name, one of estimate, .*Received: 'estimat'"):
        schemas.schema("estimat")
    with pytest.raises(ConfigError, match="Received: 'common'"):
        schemas.validate("common", {})


def test_without_jsonschema_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    schemas._validator.cache_clear()
    monkeypatch.setitem(sys.modules, "jsonschema", None)
    try:
        with pytest.raises(MissingFrameworkError, match=re.escape("pip install 'jsonschema>=4.18'")):
            schemas.validate("devices", [])
    finally:
        schemas._validator.cache_clear()
