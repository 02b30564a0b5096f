"""Tests of graphbook.measure.environment's CPU description on CPUs this machine is not: fake /proc/cpuinfo
texts for x86 with and without VNNI, aarch64 Linux, Apple Silicon (sysctl) and an unknown CPU."""
import pytest

from graphbook.measure import environment, environment as env

X86_AVX512_VNNI = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9454 96-Core Processor
flags\t\t: fpu sse sse2 avx fma avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni avx_vnni
"""

X86_AVX2_ONLY = """processor\t: 0
vendor_id\t: AuthenticAMD
model\t\t: 49
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse sse2 avx fma f16c avx2 bmi2
"""

AARCH64_LINUX = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
"""


def features(text, machine="x86_64", **kwargs):
    return env.cpu_features(text, machine, environ=kwargs.pop("environ", {}), **kwargs)


def test_x86_with_avx512_vnni():
    f = features(X86_AVX512_VNNI)
    assert f["arch"] == "x86" and f["source"] == "/proc/cpuinfo"
    assert f["avx2"] and f["avx512f"] and f["avx512_vnni"] and f["vnni"] is True
    assert f["amx"] is False and f["isa"] == "avx512_vnni"
    assert env.cpu_model(X86_AVX512_VNNI) == "AMD EPYC 9454 96-Core Processor"


def test_x86_avx2_without_vnni_is_the_laptop_case():
    f = features(X86_AVX2_ONLY)
    assert f["avx2"] is True and f["avx512f"] is False and f["vnni"] is False
    assert f["isa"] == "avx2"
    assert env.cpu_model(X86_AVX2_ONLY) == "AMD EPYC 7B12"  # the numeric "model" line is not a name


def test_x86_avx_vnni_without_avx512():
    f = features(X86_AVX2_ONLY.replace("bmi2", "bmi2 avx_vnni"))
    assert f["vnni"] is True and f["avx512f"] is False and f["isa"] == "avx2+avx_vnni"


def test_aarch64_linux_reads_features_and_cpu_part():
    f = features(AARCH64_LINUX, machine="aarch64")
    assert f["arch"] == "arm" and "avx2" not in f
    assert f["neon"] is True and f["dotprod"] is True and f["i8mm"] is False and f["bf16"] is False
    assert f["vnni"] is False and f["isa"] == "neon+dotprod"
    assert env.cpu_model(AARCH64_LINUX) == "ARM implementer 0x41 part 0xd0c"


def test_apple_silicon_through_sysctl():
    answers = {"hw.optional.neon": "1", "hw.optional.arm.FEAT_DotProd": "1",
               "hw.optional.arm.FEAT_I8MM": "1", "hw.optional.arm.FEAT_BF16": "0"}
    f = features("", machine="arm64", sysctl=lambda name: answers.get(name, ""))
    assert f["source"] == "sysctl" and f["arch"] == "arm"
    assert (f["neon"], f["dotprod"], f["i8mm"], f["bf16"]) == (True, True, True, False)
    assert f["isa"] == "neon+dotprod+i8mm"


def test_unknown_cpu_is_unknown_not_x86():
    f = features("", machine="riscv64")
    assert f["arch"] == "other" and f["isa"] == "unknown" and f["vnni"] is None
    assert "avx2" not in f and "neon" not in f
    # an x86 machine whose flags cannot be read: features unknown (None), never assumed
    g = features("", machine="x86_64")
    assert g["avx2"] is None and g["vnni"] is None and g["isa"] == "unknown" and g["source"] == "unknown"
    assert isinstance(env.cpu_model(""), str) and env.cpu_model("")


def test_override_variable_simulates_another_cpu():
    f = features(X86_AVX512_VNNI, environ={env.FEATURES_ENV: "avx2"})
    assert f["source"] == env.FEATURES_ENV and f["avx512f"] is False and f["vnni"] is False and f["isa"] == "avx2"
    none = features(X86_AVX512_VNNI, environ={env.FEATURES_ENV: "none"})
    assert none["avx2"] is False and none["isa"] == "x86-baseline"


def test_isa_caps_read_the_environment():
    caps = env.isa_caps({"ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2"})
    assert caps == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert env.isa_caps({}) == {"ATEN_CPU_CAPABILITY": "", "ONEDNN_MAX_CPU_ISA": ""}


def test_fingerprint_carries_the_instruction_set():
    fp = env.fingerprint(threads=1)
    assert {"cpu_model", "cpu_isa", "torch_isa", "threads"} <= set(fp)
    assert fp["cpu_isa"] == env.cpu_features()["isa"]
    assert fp["torch_isa"] == env.torch_isa() != ""


@pytest.mark.parametrize("text", [X86_AVX512_VNNI, X86_AVX2_ONLY, AARCH64_LINUX, "", "garbage without colons"])
def test_cpu_model_never_raises(text):
    assert isinstance(env.cpu_model(text), str)


def test_isa_caps_label_for_the_fingerprint():
    assert env._isa_caps_label({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}) == \
        "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
    assert env._isa_caps_label({}) == ""
    assert env.fingerprint(threads=1)["isa_caps"] == env._isa_caps_label()


def test_a_capped_process_gets_its_own_inductor_cache():
    """torch's FX graph cache ignores ATEN_CPU_CAPABILITY: capped and uncapped runs must not share it."""
    capped = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    folder = env.inductor_cache_dir_for_caps(capped)
    assert folder is not None and folder.endswith("_aten_cpu_capability_avx2_onednn_max_cpu_isa_avx2")
    assert env.inductor_cache_dir_for_caps({}) is None                          # nothing capped
    assert env.inductor_cache_dir_for_caps({**capped, "TORCHINDUCTOR_CACHE_DIR": "/data/mine"}) is None  # reader's choice
    default = folder.rsplit("_aten_cpu_capability", 1)[0]
    assert env.inductor_cache_dir_for_caps({**capped, "TORCHINDUCTOR_CACHE_DIR": default}) == folder


ZEN4_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9B14
stepping\t: 1
flags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16
"""
MASKED_XEON_CPUINFO = """vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 1
flags\t\t: avx2 avx512f avx512_vnni amx_tile amx_int8
"""


def _cache(tmp_path, entries):
    for i, (level, kind, size) in enumerate(entries):
        folder = tmp_path / f"index{i}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")
    return tmp_path


def test_cpu_identity_tells_a_zen4_by_family_model_and_caches(tmp_path):
    root = _cache(tmp_path, [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32M")])
    identity = environment.cpu_identity(ZEN4_CPUINFO, root)
    assert identity == {"cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model_id": 17, "cpu_stepping": 1,
                        "cpu_microarch": "Zen 4", "cpu_l1d_kib": 32, "cpu_l2_kib": 1024, "cpu_l3_kib": 32768}


def test_a_model_number_that_contradicts_the_flags_names_no_microarchitecture(tmp_path):
    # a hypervisor reports model 167 (a desktop Rocket Lake, no AMX) for a server CPU with AMX
    assert environment.cpu_identity(MASKED_XEON_CPUINFO, tmp_path)["cpu_microarch"] == "unknown"
    assert environment.microarchitecture("GenuineIntel", 6, 167) == "Rocket Lake"
    assert environment.microarchitecture("AuthenticAMD", 25, 0x01) == "Zen 3"
    assert environment.microarchitecture("AuthenticAMD", 26, 2) == "Zen 5"
    assert environment.microarchitecture("GenuineIntel", None, None) == "unknown"


def test_cpu_identity_on_arm_and_with_nothing_to_read(tmp_path):
    arm = environment.cpu_identity("CPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0c\nCPU revision\t: 1\n",
                                   tmp_path)
    assert (arm["cpu_vendor"], arm["cpu_family"], arm["cpu_model_id"]) == ("ARM implementer 0x41", 8, 0xD0C)
    blank = environment.cpu_identity("", tmp_path / "missing")
    assert blank["cpu_family"] is None and blank["cpu_l2_kib"] is None


def test_the_fingerprint_carries_the_identity_and_a_measured_clock():
    env = environment.fingerprint(1)
    assert {"cpu_vendor", "cpu_family", "cpu_model_id", "cpu_microarch", "cpu_l2_kib", "cpu_ghz"} <= set(env)


@pytest.mark.slow  # asks git
def test_a_run_of_the_executor_records_the_commit_it_started_from(monkeypatch):
    from graphbook.measure import environment

    monkeypatch.setenv(environment.EXECUTION_COMMIT_VARIABLE, "0123456789ab")
    assert environment.git_commit() == "0123456789ab"
    monkeypatch.delenv(environment.EXECUTION_COMMIT_VARIABLE)
    assert environment.git_commit() != "0123456789ab"
