"""What the host CPU offers the kernels: model name, ISA flags, oneDNN's and ATen's effective instruction sets.

Which CPU kernel runs an op (and so how much scratch it allocates) depends on the instruction set the
libraries pick at run time, capped by the environment: ``ONEDNN_MAX_CPU_ISA`` (or ``DNNL_MAX_CPU_ISA``)
for oneDNN, ``ATEN_CPU_CAPABILITY`` for ATen's vectorised kernels. The oneDNN ladder, its bit masks and
hardware checks follow oneDNN ``src/cpu/x64/cpu_isa_traits.hpp`` (``mayiuse``) and ``cpu_isa_traits.cpp``
(``init_max_cpu_isa``, ``get_isa_info_t``), v3.12; ATen's follows ``aten/src/ATen/native/DispatchStub.cpp``
(``compute_cpu_capability``). Flags come from ``/proc/cpuinfo``; no framework is imported at module level.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["CpuInfo", "ISA_LADDER", "describe", "parse_cpuinfo", "onednn_isa", "aten_capability", "from_text",
           "schedulable_cpus"]

UNKNOWN = "unknown"

# oneDNN cpu_isa_bit_t (cpu_isa_traits.hpp); the low four bits hold the AVX10 version.
_VERSION = 0xF
_XMM, _YMM, _ZMM, _AMX_TILE = 1 << 4, 1 << 5, 1 << 6, 1 << 7
_EVEX_CORE, _AVX2, _VEX_VNNI, _VEX_VNNI_2 = 1 << 8, 1 << 9, 1 << 10, 1 << 11
_EVEX_VNNI, _EVEX_BF16, _EVEX_FP16 = 1 << 12, 1 << 13, 1 << 14
_AMX_INT8, _AMX_BF16, _AMX_FP16 = 1 << 15, 1 << 16, 1 << 17
_AVX10_1 = 1 | _AVX2 | _VEX_VNNI | _EVEX_CORE | _EVEX_VNNI | _EVEX_BF16 | _EVEX_FP16

_SSE41 = _XMM
_AVX = _YMM | _SSE41
_AVX2_ISA = _AVX2 | _AVX
_AVX2_VNNI = _VEX_VNNI | _AVX2_ISA
_AVX2_VNNI_2 = _AVX2_VNNI | _VEX_VNNI_2
_AVX512_CORE = _EVEX_CORE | _ZMM | _AVX2_ISA
_AVX512_VNNI = _EVEX_VNNI | _AVX512_CORE
_AVX512_BF16 = _EVEX_BF16 | _AVX512_VNNI
_AVX512_FP16 = _AVX10_1 | _ZMM | _YMM | _XMM  # avx10_1_512
_AVX512_AMX = _AVX512_FP16 | _AMX_INT8 | _AMX_BF16 | _AMX_TILE
_AVX512_AMX_FP16 = _AVX512_AMX | _AMX_FP16
_ALL = 0xFFFFFFFF & ~(1 << 31)  # isa_all: every bit but the prefer_ymm hint


@dataclass(frozen=True, slots=True)
class _Isa:
    name: str  # oneDNN's name, as ONEDNN_MAX_CPU_ISA takes it (lower case)
    bits: int  # cpu_isa_t mask
    public: int  # dnnl_cpu_isa_t value, the order ideep compares in (dnnl_types.h)
    flags: tuple[str, ...]  # /proc/cpuinfo flags mayiuse() needs, beyond those of the ISA below it
    below: str | None  # the ISA whose checks this one includes


# Descending, as get_isa_info_t probes (avx10_2 and avx512_core_bf16_ymm, a hint, are not detected).
ISA_LADDER: tuple[_Isa, ...] = (
    _Isa("avx512_core_amx_fp16", _AVX512_AMX_FP16, 0x1FEF, ("amx_fp16",), "avx512_core_amx"),
    _Isa("avx512_core_amx", _AVX512_AMX, 0xFEF, ("amx_tile", "amx_int8", "amx_bf16"), "avx512_core_fp16"),
    _Isa("avx512_core_fp16", _AVX512_FP16, 0x1EF, ("avx512_fp16", "avx_vnni", "avx2"), "avx512_core_bf16"),
    _Isa("avx512_core_bf16", _AVX512_BF16, 0xE7, ("avx512_bf16",), "avx512_core_vnni"),
    _Isa("avx512_core_vnni", _AVX512_VNNI, 0x67, ("avx512_vnni",), "avx512_core"),
    _Isa("avx512_core", _AVX512_CORE, 0x27, ("avx512f", "avx512bw", "avx512vl", "avx512dq"), None),
    _Isa("avx2_vnni_2", _AVX2_VNNI_2, 0x1F, ("avx_vnni_int8", "avx_ne_convert"), "avx2_vnni"),
    _Isa("avx2_vnni", _AVX2_VNNI, 0xF, ("avx_vnni",), "avx2"),
    _Isa("avx2", _AVX2_ISA, 0x7, ("avx2",), None),
    _Isa("avx", _AVX, 0x3, ("avx",), None),
    _Isa("sse41", _SSE41, 0x1, ("sse4_1",), None),
)
_BY_NAME = {isa.name: isa for isa in ISA_LADDER}
# init_max_cpu_isa: the values ONEDNN_MAX_CPU_ISA accepts besides the ladder's names, and their aliases.
_CAP_ALIASES = {"default": _ALL, "avx10_1_512": _AVX512_FP16, "avx10_1_512_amx": _AVX512_AMX,
                "avx10_1_512_amx_fp16": _AVX512_AMX_FP16}

# The flags reported in a report's meta: the ones any rule or ladder step reads.
_REPORTED = ("avx", "avx2", "fma", "f16c", "avx_vnni", "avx_vnni_int8", "avx_ne_convert", "avx512f", "avx512bw",
             "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8",
             "amx_bf16", "amx_fp16")


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """The host CPU as the kernels see it.

    Attributes:
        model: the CPU's model name (``/proc/cpuinfo`` "model name"), or ``"unknown"``.
        arch: the machine architecture, e.g. ``"x86_64"``.
        flags: the ISA flags the CPU reports (the subset nnmem reads), sorted.
        isa: oneDNN's effective ISA (``get_effective_cpu_isa``) after the ``ONEDNN_MAX_CPU_ISA`` cap, e.g.
            ``"avx512_core_bf16"``; ``"unknown"`` off x86 or when the flags could not be read.
        isa_cap: the ``ONEDNN_MAX_CPU_ISA`` value in force, or None.
        aten: ATen's CPU capability (``torch.backends.cpu.get_cpu_capability()``): ``"AVX512"``,
            ``"AVX2"``, ``"DEFAULT"`` or ``"unknown"``.
        aten_cap: the ``ATEN_CPU_CAPABILITY`` value in force, or None.

    Example:
        >>> describe().to_dict()  # doctest: +SKIP
        {'cpu': 'AMD EPYC', 'arch': 'x86_64', 'isa': 'avx512_core_bf16', 'aten': 'AVX512', 'flags': [...]}
    """

    model: str
    arch: str
    flags: tuple[str, ...]
    isa: str
    isa_cap: str | None = None
    aten: str = UNKNOWN
    aten_cap: str | None = None

    def isa_at_least(self, name: str) -> bool:
        """Whether oneDNN's effective ISA is ``name`` or above, in oneDNN's public order (as ideep compares)."""
        mine, other = _BY_NAME.get(self.isa), _BY_NAME[name]
        return mine is not None and mine.public >= other.public

    @property
    def onednn_bf16(self) -> bool:
        """ideep ``has_bf16_type_support``: ATen sends bfloat16 conv/matmul to oneDNN (avx2_vnni_2 and up)."""
        return self.isa_at_least("avx2_vnni_2")

    @property
    def onednn_fp16(self) -> bool:
        """ideep ``has_fp16_type_support``: float16 conv/matmul go to oneDNN (avx512_core_fp16 and up, or
        avx2_vnni_2 exactly)."""
        return self.isa_at_least("avx512_core_fp16") or self.isa == "avx2_vnni_2"

    @property
    def onednn_block(self) -> int:
        """Channel block of oneDNN's blocked layouts, in elements: 16 with AVX-512 (nChw16c), 8 below (nChw8c)."""
        return 16 if self.isa_at_least("avx512_core") else 8

    def meta(self) -> dict[str, str]:
        """The CPU as a report's ``meta`` keys (scalars): ``cpu``, ``cpu.isa``, ``cpu.aten``, ``cpu.flags``."""
        return {"cpu": self.model, "cpu.isa": self.isa, "cpu.aten": self.aten, "cpu.flags": " ".join(self.flags)}

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"cpu": self.model, "arch": self.arch, "isa": self.isa, "aten": self.aten,
                                  "flags": list(self.flags)}
        if self.isa_cap is not None:
            out["isa_cap"] = self.isa_cap
        if self.aten_cap is not None:
            out["aten_cap"] = self.aten_cap
        return out


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """Model name and flags of the first processor in ``/proc/cpuinfo`` text (``"unknown"``, empty if absent)."""
    model, flags = UNKNOWN, frozenset[str]()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "model name" and model == UNKNOWN:
            model = value.strip() or UNKNOWN
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
        if model != UNKNOWN and flags:
            break
    return model, flags


def _supported(isa: _Isa, flags: frozenset[str]) -> bool:
    if not all(flag in flags for flag in isa.flags):
        return False
    return isa.below is None or _supported(_BY_NAME[isa.below], flags)


def _cap_mask(cap: str | None) -> int:
    """The mask ``ONEDNN_MAX_CPU_ISA`` sets; an unknown or empty value leaves every ISA allowed (oneDNN)."""
    if not cap:
        return _ALL
    value = cap.strip().lower()
    if value in _CAP_ALIASES:
        return _CAP_ALIASES[value]
    isa = _BY_NAME.get(value)
    return isa.bits if isa is not None else _ALL


def _allowed(bits: int, mask: int) -> bool:
    """cpu_isa_traits.hpp mayiuse: every feature bit within the cap, and an AVX10 version no newer than it."""
    features = bits & ~_VERSION
    return (mask & features) == features and (mask & _VERSION) >= (bits & _VERSION)


def onednn_isa(flags: frozenset[str], cap: str | None = None) -> str:
    """oneDNN's effective ISA for these CPU flags under ``ONEDNN_MAX_CPU_ISA=cap`` (``"unknown"`` if none)."""
    mask = _cap_mask(cap)
    for isa in ISA_LADDER:
        if _allowed(isa.bits, mask) and _supported(isa, flags):
            return isa.name
    return UNKNOWN


def aten_capability(flags: frozenset[str], env: str | None = None) -> str:
    """ATen's CPU capability from the flags (DispatchStub.cpp compute_cpu_capability), capped by
    ``ATEN_CPU_CAPABILITY`` ("default", "avx2", "avx512"; other values are ignored, as ATen warns)."""
    if not flags:
        return UNKNOWN
    if {"avx512vl", "avx512bw", "avx512dq", "fma"} <= flags:
        found = "AVX512"
    elif {"avx2", "fma"} <= flags:
        found = "AVX2"
    else:
        found = "DEFAULT"
    order = ("DEFAULT", "AVX2", "AVX512")
    wanted = (env or "").strip().upper()
    if wanted in order and order.index(wanted) < order.index(found):
        return wanted
    return found


def from_text(cpuinfo: str, environ: Mapping[str, str] | None = None, arch: str = "x86_64") -> CpuInfo:
    """A :class:`CpuInfo` from ``/proc/cpuinfo`` text and an environment (the caps), without asking torch."""
    env = environ if environ is not None else {}
    model, flags = parse_cpuinfo(cpuinfo)
    isa_cap = env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or None
    aten_cap = env.get("ATEN_CPU_CAPABILITY") or None
    x86 = arch in ("x86_64", "AMD64", "i686", "i386")
    return CpuInfo(model=model, arch=arch, flags=tuple(sorted(flags.intersection(_REPORTED))),
                   isa=onednn_isa(flags, isa_cap) if x86 else UNKNOWN, isa_cap=isa_cap,
                   aten=aten_capability(flags, aten_cap) if x86 else UNKNOWN, aten_cap=aten_cap)


def describe() -> CpuInfo:
    """The host CPU under the caps in this process's environment (cached per set of caps)."""
    keys = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
    return _describe(tuple(os.environ.get(k) for k in keys))


@lru_cache(maxsize=8)
def _describe(caps: tuple[str | None, ...]) -> CpuInfo:
    environ = {k: v for k, v in zip(("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"), caps)
               if v is not None}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    info = from_text(text, environ, platform.machine() or UNKNOWN)
    aten = _torch_capability()
    if aten is not None:  # what this process's ATen actually picked (it knows the build, too)
        info = CpuInfo(info.model, info.arch, info.flags, info.isa, info.isa_cap, aten, info.aten_cap)
    return info


def _torch_capability() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return None


def schedulable_cpus() -> int:
    """CPUs this process may run on (its affinity mask; else the machine's count): the default size of
    TensorFlow's inter- and intra-op pools (``port::MaxParallelism``, ``NumSchedulableCPUs``) and of XLA:CPU's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
