"""Device catalog: lookups, errors, and invariants every entry must satisfy."""

from __future__ import annotations

import pytest

from nnmem.devices import Device, get_device, list_devices
from nnmem.errors import ConfigError


@pytest.mark.parametrize("spelling", ["A100-80GB", "a100-80gb", "A100_80GB", "a100 80gb", " a10080GB "])
def test_lookup_tolerates_case_and_separators(spelling: str) -> None:
    assert get_device(spelling).name == "A100-80GB"


def test_a100_80gb_is_80_gib_as_nvidia_smi_reports() -> None:
    assert get_device("A100-80GB").memory_bytes == 81920 * 2**20 == 80 * 2**30


def test_h200_uses_the_driver_total() -> None:
    assert get_device("h200").memory_bytes == 143771 * 2**20


def test_unknown_name_suggests_close_matches_and_the_cli() -> None:
    with pytest.raises(ConfigError) as info:
        get_device("a100-8gb")
    message = str(info.value)
    assert "A100-80GB" in message
    assert "nnmem devices" in message
    assert "'a100-8gb'" in message


def test_unknown_name_without_close_match_still_names_the_cli() -> None:
    with pytest.raises(ConfigError, match="nnmem devices"):
        get_device("zzzzzz")


def test_catalog_names_are_unique_and_resolve_to_themselves() -> None:
    names = [d.name for d in list_devices()]
    assert len(names) == len(set(names))
    for device in list_devices():
        assert get_device(device.name) is device


@pytest.mark.parametrize("device", list_devices(), ids=lambda d: d.name)
def test_every_device_is_well_formed(device: Device) -> None:
    assert device.source.strip()
    assert isinstance(device.memory_bytes, int) and isinstance(device.context_bytes, int)
    assert 0 < device.context_bytes < device.memory_bytes
    assert 0 < device.usable_bytes < device.memory_bytes
    assert device.bandwidth_gbps > 0
    assert device.kind in ("cuda", "apple", "tpu", "cpu")
    assert (device.compute_capability is not None) == (device.kind == "cuda")


def test_catalog_covers_the_required_families() -> None:
    names = {d.name for d in list_devices()}
    required = {
        "T4",
        "V100-16GB",
        "V100-32GB",
        "A10",
        "A100-40GB",
        "A100-80GB",
        "L4",
        "L40S",
        "H100-80GB",
        "H200",
        "B200",
        "RTX-3090",
        "RTX-4090",
        "RTX-5090",
        "TPU-v4",
        "TPU-v5e",
    }
    assert required <= names
    assert any(d.kind == "apple" for d in list_devices())


def test_tpu_chip_memory() -> None:
    assert get_device("tpu-v4").memory_bytes == 32 * 2**30
    assert get_device("TPU_v5e").memory_bytes == 16 * 2**30


def test_apple_usable_is_metal_working_set_fraction() -> None:
    m2 = get_device("M2-Max-96GB")
    assert m2.usable_bytes == 96 * 2**30 * 75 // 100


def test_device_is_frozen() -> None:
    with pytest.raises(AttributeError):
        get_device("T4").memory_bytes = 1  # type: ignore[misc]
