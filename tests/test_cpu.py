"""nnmem.cpu: /proc/cpuinfo parsing, oneDNN's ISA ladder and ATen's capability, with the environment caps."""

from __future__ import annotations

import pytest

from nnmem import cpu

_COMMON = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
           "syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology cpuid pni pclmulqdq ssse3 fma cx16 "
           "pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm abm")


def _cpuinfo(model: str, flags: str) -> str:
    return (f"processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel name\t: {model}\n"
            f"stepping\t: 8\nflags\t\t: {_COMMON} {flags}\nbogomips\t: 4000.00\n\nprocessor\t: 1\n"
            f"model name\t: {model}\nflags\t\t: {_COMMON} {flags}\n")


# Sapphire Rapids (Xeon Platinum 8480+): AVX-512 with FP16, AMX for bf16/int8, no AMX-FP16.
SPR = _cpuinfo("Intel(R) Xeon(R) Platinum 8480+",
               "bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb "
               "avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx_vnni avx512_bf16 wbnoinvd "
               "avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg "
               "avx512_vpopcntdq la57 rdpid movdiri movdir64b fsrm md_clear serialize tsxldtrk amx_bf16 "
               "avx512_fp16 amx_tile amx_int8 flush_l1d arch_capabilities")
# AMD EPYC (Zen 4) as a VM reports it: AVX-512 with VNNI and BF16, no FP16, no AMX.
EPYC = _cpuinfo("AMD EPYC",
                "bmi1 avx2 smep bmi2 erms avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd "
                "sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx512_bf16 clzero xsaveerptr "
                "avx512vbmi umip pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg "
                "avx512_vpopcntdq rdpid fsrm")
# Coffee Lake (Core i7-8700): AVX2 and FMA only.
AVX2_ONLY = _cpuinfo("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz",
                     "bmi1 avx2 smep bmi2 erms invpcid mpx rdseed adx smap clflushopt xsaveopt xsavec xgetbv1")
# Alder Lake (P-cores with AVX-512 fused off): AVX2 with AVX-VNNI.
ADL = _cpuinfo("12th Gen Intel(R) Core(TM) i7-12700", "bmi1 avx2 smep bmi2 erms clflushopt clwb sha_ni avx_vnni")
# Sierra Forest: AVX2 with AVX-VNNI-INT8 and AVX-NE-CONVERT (oneDNN avx2_vnni_2: bf16 and fp16 conversions).
SRF = _cpuinfo("Intel(R) Xeon(R) 6780E", "bmi1 avx2 bmi2 avx_vnni avx_vnni_int8 avx_ne_convert")
ARM = ("processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp "
       "asimdhp cpuid asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n")


@pytest.mark.parametrize(("text", "model", "isa", "aten", "bf16", "fp16"), [
    (SPR, "Intel(R) Xeon(R) Platinum 8480+", "avx512_core_amx", "AVX512", True, True),
    (EPYC, "AMD EPYC", "avx512_core_bf16", "AVX512", True, False),
    (AVX2_ONLY, "Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz", "avx2", "AVX2", False, False),
    (ADL, "12th Gen Intel(R) Core(TM) i7-12700", "avx2_vnni", "AVX2", False, False),
    (SRF, "Intel(R) Xeon(R) 6780E", "avx2_vnni_2", "AVX2", True, True),
], ids=["spr", "epyc", "avx2", "adl", "srf"])
def test_parses_cpuinfo(text: str, model: str, isa: str, aten: str, bf16: bool, fp16: bool) -> None:
    info = cpu.from_text(text)
    assert (info.model, info.isa, info.aten) == (model, isa, aten)
    assert (info.onednn_bf16, info.onednn_fp16) == (bf16, fp16)
    assert info.onednn_block == (16 if aten == "AVX512" else 8)
    assert "avx2" in info.flags and "sse4_1" not in info.flags  # only the flags a rule reads


@pytest.mark.parametrize(("text", "cap", "isa"), [
    (SPR, "AVX512_CORE_BF16", "avx512_core_bf16"),
    (SPR, "avx512_core_fp16", "avx512_core_fp16"),
    (SPR, "AVX10_1_512", "avx512_core_fp16"),  # oneDNN's alias
    (SPR, "AVX512_CORE_VNNI", "avx512_core_vnni"),
    (SPR, "AVX512_CORE", "avx512_core"),
    (SPR, "AVX2", "avx2"),
    (SPR, "AVX2_VNNI", "avx2_vnni"),  # SPR has AVX-VNNI
    (EPYC, "AVX2_VNNI", "avx2"),  # capped at a level the CPU lacks: the highest one below the cap
    (EPYC, "AVX512_CORE_AMX", "avx512_core_bf16"),  # a cap above the CPU changes nothing
    (EPYC, "DEFAULT", "avx512_core_bf16"),
    (EPYC, "no-such-isa", "avx512_core_bf16"),  # oneDNN ignores a value it does not know
    (AVX2_ONLY, "SSE41", "sse41"),
])
def test_onednn_cap(text: str, cap: str, isa: str) -> None:
    assert cpu.from_text(text, {"ONEDNN_MAX_CPU_ISA": cap}).isa == isa
    assert cpu.from_text(text, {"DNNL_MAX_CPU_ISA": cap}).isa == isa


def test_caps_are_reported_and_lower_support() -> None:
    info = cpu.from_text(SPR, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "ATEN_CPU_CAPABILITY": "avx2"})
    assert (info.onednn_bf16, info.onednn_fp16, info.aten) == (True, False, "AVX2")
    assert info.to_dict() == {"cpu": "Intel(R) Xeon(R) Platinum 8480+", "arch": "x86_64", "isa": "avx512_core_bf16",
                              "aten": "AVX2", "flags": list(info.flags), "isa_cap": "AVX512_CORE_BF16",
                              "aten_cap": "avx2"}
    avx2 = cpu.from_text(SPR, {"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert (avx2.onednn_bf16, avx2.onednn_fp16, avx2.onednn_block) == (False, False, 8)


@pytest.mark.parametrize(("text", "env", "aten"), [
    (SPR, "default", "DEFAULT"), (SPR, "AVX2", "AVX2"), (SPR, "avx512", "AVX512"),
    (AVX2_ONLY, "avx512", "AVX2"),  # never above what the CPU has
    (EPYC, "zvector", "AVX512"),  # a value ATen does not know is ignored (ATen warns)
])
def test_aten_cap(text: str, env: str, aten: str) -> None:
    assert cpu.from_text(text, {"ATEN_CPU_CAPABILITY": env}).aten == aten


@pytest.mark.parametrize("text", [ARM, "", "garbage\nwithout colons\n"])
def test_unknown_cpus_do_not_crash(text: str) -> None:
    info = cpu.from_text(text, arch="aarch64" if text == ARM else "x86_64")
    assert info.isa == "unknown" and info.aten == "unknown"
    assert not info.onednn_bf16 and not info.onednn_fp16 and not info.isa_at_least("avx2")
    assert info.to_dict()["cpu"] == "unknown"


def test_host_matches_what_torch_reports() -> None:
    """The host's description agrees with ATen's capability and with ideep's type checks (which read oneDNN's
    effective ISA, so the ladder and the ONEDNN_MAX_CPU_ISA cap are checked on this CPU)."""
    torch = pytest.importorskip("torch")
    info = cpu.describe()
    assert info.aten == torch.backends.cpu.get_cpu_capability()
    if info.isa == "unknown" or not torch.backends.mkldnn.is_available():
        pytest.skip(f"no oneDNN ISA on this host ({info.arch})")
    assert info.onednn_bf16 == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert info.onednn_fp16 == torch.ops.mkldnn._is_mkldnn_fp16_supported()
    assert cpu.describe() is info  # cached per set of caps
