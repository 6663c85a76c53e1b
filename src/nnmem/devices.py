"""Catalog of accelerators: memory, bandwidth and the memory tensors can never use.

Memory sizes. Vendors write "80GB" for what is 80 GiB of HBM on a GPU, and the driver then keeps part of
it (ECC, page tables), so ``memory_bytes`` is the total that ``nvidia-smi`` reports as "FB Memory Total"
(in MiB, times 2**20), which is what a process can address. Example: A100 80GB -> 81920 MiB; H100 80GB
-> 81559 MiB; H200 "141 GB" -> 143771 MiB (~140.4 GiB); B200 "180 GB" -> 183359 MiB. Apple and TPU
sizes are exact GiB.

``context_bytes`` is an estimate, in bytes, of device memory a PyTorch process holds outside the caching
allocator: the CUDA context with its module images plus cuBLAS and cuDNN handles (measured the usual
way as ``nvidia-smi`` used minus ``torch.cuda.memory_reserved()`` after a first matmul and conv, CUDA 12
with lazy module loading). It grows with newer architectures (more kernels per image): about 300 MiB on
Volta/Turing, 400 MiB on Ampere/Ada, 500 MiB on Hopper, 600 MiB on Blackwell. The cuBLAS workspace is
*not* included: it comes from the caching allocator (see ``nnmem.allocators.cuda_caching.cublas_workspace_bytes``).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any, Literal

from nnmem.errors import ConfigError

__all__ = ["Device", "get_device", "list_devices"]

_MiB = 2**20
_GiB = 2**30

DeviceKind = Literal["cuda", "apple", "tpu", "cpu"]


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator model.

    Attributes:
        name: catalog name, e.g. ``"A100-80GB"``.
        kind: ``"cuda"``, ``"apple"``, ``"tpu"`` or ``"cpu"``.
        memory_bytes: total device memory a process can address, in bytes (see the module docstring).
        context_bytes: memory held outside the framework allocator (context, library handles), in bytes.
        bandwidth_gbps: peak memory bandwidth, in GB/s (10**9 bytes per second), from the datasheet.
        compute_capability: CUDA ``(major, minor)``, or ``None`` for non-CUDA devices.
        source: where ``memory_bytes`` and ``bandwidth_gbps`` come from.
        notes: caveats worth showing next to the numbers.

    Example:
        >>> get_device("a100 80gb").usable_bytes
        85479915520
    """

    name: str
    kind: DeviceKind
    memory_bytes: int
    context_bytes: int
    bandwidth_gbps: float
    compute_capability: tuple[int, int] | None
    source: str
    notes: str = ""

    @property
    def usable_bytes(self) -> int:
        """Memory left for the framework's allocator: ``memory_bytes - context_bytes``, in bytes."""
        return self.memory_bytes - self.context_bytes

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, with ``usable_bytes``."""
        return {"name": self.name, "kind": self.kind, "memory_bytes": self.memory_bytes,
                "context_bytes": self.context_bytes, "usable_bytes": self.usable_bytes,
                "bandwidth_gbps": self.bandwidth_gbps,
                "compute_capability": list(self.compute_capability) if self.compute_capability else None,
                "source": self.source, "notes": self.notes}


# Context estimates per CUDA architecture (major version of the compute capability), in bytes.
_CONTEXT_BY_MAJOR = {7: 300 * _MiB, 8: 400 * _MiB, 9: 500 * _MiB, 10: 600 * _MiB, 12: 600 * _MiB}
_SMI = "nvidia-smi FB Memory Total"


def _cuda(name: str, mib: int, gbps: float, cc: tuple[int, int], datasheet: str, notes: str = "") -> Device:
    return Device(
        name=name,
        kind="cuda",
        memory_bytes=mib * _MiB,
        context_bytes=_CONTEXT_BY_MAJOR[cc[0]],
        bandwidth_gbps=gbps,
        compute_capability=cc,
        source=f"memory: {_SMI} ({mib} MiB); bandwidth: {datasheet}",
        notes=notes,
    )


# Metal's MTLDevice.recommendedMaxWorkingSetSize is what the GPU may keep resident; Apple does not
# document the ratio, but it is observed at ~2/3 of RAM up to 36 GB and ~3/4 above (llama.cpp/ggml
# reports). PyTorch MPS caps allocations relative to it (PYTORCH_MPS_HIGH_WATERMARK_RATIO).
_APPLE_NOTE = (
    "unified memory shared with macOS and other apps; usable = Metal recommendedMaxWorkingSetSize, "
    "observed ~{pct}% of RAM (Apple does not document the ratio)"
)


def _apple(name: str, gib: int, gbps: float, spec: str) -> Device:
    ratio_pct = 67 if gib <= 36 else 75
    usable = gib * _GiB * ratio_pct // 100
    return Device(
        name=name,
        kind="apple",
        memory_bytes=gib * _GiB,
        context_bytes=gib * _GiB - usable,
        bandwidth_gbps=gbps,
        compute_capability=None,
        source=f"Apple tech specs, {spec}",
        notes=_APPLE_NOTE.format(pct=ratio_pct),
    )


def _tpu(name: str, gib: int, gbps: float, doc: str) -> Device:
    return Device(
        name=name,
        kind="tpu",
        memory_bytes=gib * _GiB,
        context_bytes=256 * _MiB,
        bandwidth_gbps=gbps,
        compute_capability=None,
        source=f"Google Cloud TPU docs, {doc}",
        notes="per chip; context is an estimate of runtime-reserved HBM, check "
        "jax.devices()[0].memory_stats()['bytes_limit']",
    )


_ECC = "ECC on (default) takes ~1/16 of GDDR; nvidia-smi total already excludes it"
_CATALOG: tuple[Device, ...] = (
    _cuda("T4", 15360, 320, (7, 5), "NVIDIA T4 Tensor Core GPU datasheet (16 GB GDDR6)", _ECC),
    _cuda("V100-16GB", 16160, 900, (7, 0), "NVIDIA Tesla V100 datasheet (SXM2, 16 GB HBM2)"),
    _cuda("V100-32GB", 32768, 900, (7, 0), "NVIDIA Tesla V100 datasheet (SXM2, 32 GB HBM2)"),
    _cuda("A10", 23028, 600, (8, 6), "NVIDIA A10 Tensor Core GPU datasheet (24 GB GDDR6)", _ECC),
    _cuda("A100-40GB", 40960, 1555, (8, 0), "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40 GB HBM2)"),
    _cuda("A100-80GB", 81920, 2039, (8, 0), "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB HBM2e)"),
    _cuda("L4", 23034, 300, (8, 9), "NVIDIA L4 Tensor Core GPU datasheet (24 GB GDDR6)", _ECC),
    _cuda("L40S", 46068, 864, (8, 9), "NVIDIA L40S datasheet (48 GB GDDR6 with ECC)", _ECC),
    _cuda("H100-80GB", 81559, 3350, (9, 0), "NVIDIA H100 Tensor Core GPU datasheet (SXM5 80 GB HBM3)"),
    _cuda(
        "H200",
        143771,
        4800,
        (9, 0),
        "NVIDIA H200 Tensor Core GPU datasheet (SXM 141 GB HBM3e)",
        "vendor's 141 GB is decimal-ish; the driver exposes 143771 MiB (~140.4 GiB)",
    ),
    _cuda(
        "B200",
        183359,
        8000,
        (10, 0),
        "NVIDIA HGX B200 datasheet (180 GB HBM3e per GPU)",
        "driver exposes 183359 MiB (~179 GiB)",
    ),
    _cuda("RTX-3090", 24576, 936, (8, 6), "NVIDIA GeForce RTX 3090 specifications (24 GB GDDR6X)"),
    _cuda("RTX-4090", 24564, 1008, (8, 9), "NVIDIA GeForce RTX 4090 specifications (24 GB GDDR6X)"),
    _cuda("RTX-5090", 32607, 1792, (12, 0), "NVIDIA GeForce RTX 5090 specifications (32 GB GDDR7)"),
    _apple("M1-16GB", 16, 68.25, "MacBook Pro 13-inch M1 (2020), LPDDR4X"),
    _apple("M2-Max-96GB", 96, 400, "MacBook Pro M2 Max (2023)"),
    _apple("M2-Ultra-192GB", 192, 800, "Mac Studio M2 Ultra (2023)"),
    _apple("M3-Max-128GB", 128, 400, "MacBook Pro M3 Max 16-core CPU (2023)"),
    _apple("M4-Max-128GB", 128, 546, "MacBook Pro M4 Max 16-core CPU (2024)"),
    _tpu("TPU-v4", 32, 1200, "https://cloud.google.com/tpu/docs/v4 (32 GiB HBM2, 1200 GBps per chip)"),
    _tpu("TPU-v5e", 16, 819, "https://cloud.google.com/tpu/docs/v5e (16 GiB HBM2, 819 GBps per chip)"),
)


def _normalize(name: str) -> str:
    """Case- and punctuation-blind key: ``"a100_80gb"``, ``"A100 80GB"`` -> ``"a10080gb"``."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


_BY_KEY = {_normalize(d.name): d for d in _CATALOG}


def list_devices() -> tuple[Device, ...]:
    """Every device in the catalog, in display order."""
    return _CATALOG


def get_device(name: str) -> Device:
    """Look a device up by name, ignoring case, spaces, ``-`` and ``_``.

    Args:
        name: e.g. ``"A100-80GB"``, ``"a100_80gb"`` or ``"h100 80gb"``.

    Raises:
        ConfigError: no such device; the message lists close matches.

    Example:
        >>> get_device("h200").memory_bytes
        150754820096
    """
    device = _BY_KEY.get(_normalize(str(name)))
    if device is not None:
        return device
    close = difflib.get_close_matches(_normalize(str(name)), list(_BY_KEY), n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(_BY_KEY[k].name for k in close)}?" if close else ""
    raise ConfigError(
        f"expected a device name from the catalog. Received: {name!r}.{hint} "
        "Fix: run `nnmem devices` to list them, or pass a memory size."
    )
