"""nnmem.units: sizes as text ⇄ bytes."""

from __future__ import annotations

import pytest

from nnmem.errors import ConfigError
from nnmem.units import format_bytes, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16GiB", 16 * 2**30),
        ("16 GB", 16 * 10**9),  # decimal, as SI says
        ("16gib", 16 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GiB", 3 * 2**29),
        ("1KiB", 1024),
        ("1 kB", 1000),
        ("100", 100),
        ("100 B", 100),
        (" 2 TiB ", 2 * 2**40),
        (1024, 1024),
    ],
)
def test_parse_size_accepts(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected
    assert isinstance(parse_size(text), int)


@pytest.mark.parametrize("text", ["16 gigs", "", "-1GiB", "0", "0 GiB", "GiB", "1e9", "16 G B", True, False, 0, -5])
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(text)  # type: ignore[arg-type]
    assert "Received" in str(info.value) or "positive" in str(info.value)


def test_parse_size_error_names_examples() -> None:
    with pytest.raises(ConfigError, match="16GiB"):
        parse_size("16 gigs")


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_size("lots")


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (167208, "163.29 KiB"),  # the classic MLP's parameters
        (2**20, "1.00 MiB"),
        (16 * 2**30, "16.00 GiB"),
        (3 * 2**40, "3.00 TiB"),
        (-2048, "-2.00 KiB"),
        (-5, "-5 B"),
    ],
)
def test_format_bytes(n: int, expected: str) -> None:
    assert format_bytes(n) == expected


def test_format_bytes_precision() -> None:
    assert format_bytes(167208, precision=1) == "163.3 KiB"


def test_round_trip_through_text() -> None:
    for n in (1024, 512 * 2**20, 16 * 2**30):
        assert parse_size(format_bytes(n).replace(" ", "")) == n
