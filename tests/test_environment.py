"""Tests of graphbook.measure.environment's CPU description on CPUs this machine is not: fake /proc/cpuinfo
texts for x86 with and without VNNI, aarch64 Linux, Apple Silicon (sysctl) and an unknown CPU; and what else runs."""
import time

import pytest

from graphbook.measure import environment, environment as env

X86_AVX512_VNNI = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9454 96-Core Processor
stepping\t: 1
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


@pytest.mark.parametrize("text, machine, isa, expected, model", [
    (X86_AVX512_VNNI, "x86_64", "avx512_vnni", {"avx2": True, "avx512f": True, "vnni": True, "amx": False},
     "AMD EPYC 9454 96-Core Processor"),
    (X86_AVX2_ONLY, "x86_64", "avx2", {"avx2": True, "avx512f": False, "vnni": False},  # the laptop case
     "AMD EPYC 7B12"),  # the numeric "model" line is not a name
    (X86_AVX2_ONLY.replace("bmi2", "bmi2 avx_vnni"), "x86_64", "avx2+avx_vnni", {"vnni": True, "avx512f": False}, None),
    (AARCH64_LINUX, "aarch64", "neon+dotprod", {"arch": "arm", "neon": True, "dotprod": True, "i8mm": False,
                                                "bf16": False, "vnni": False}, "ARM implementer 0x41 part 0xd0c"),
    ("", "riscv64", "unknown", {"arch": "other", "vnni": None}, None),
    ("", "x86_64", "unknown", {"avx2": None, "vnni": None, "source": "unknown"}, None),  # unreadable: never assumed
])
def test_cpu_features_from_cpuinfo(text, machine, isa, expected, model):
    f = features(text, machine=machine)
    assert f["isa"] == isa and {k: f[k] for k in expected} == expected
    assert env.cpu_model(text) == model if model else isinstance(env.cpu_model(text), str)


def test_apple_silicon_through_sysctl_and_the_override_variable_simulating_another_cpu():
    answers = {"hw.optional.neon": "1", "hw.optional.arm.FEAT_DotProd": "1",
               "hw.optional.arm.FEAT_I8MM": "1", "hw.optional.arm.FEAT_BF16": "0"}
    f = features("", machine="arm64", sysctl=lambda name: answers.get(name, ""))
    assert f["source"] == "sysctl" and f["arch"] == "arm"
    assert (f["neon"], f["dotprod"], f["i8mm"], f["bf16"]) == (True, True, True, False)
    assert f["isa"] == "neon+dotprod+i8mm"
    # GRAPHBOOK_CPU_FEATURES simulates another CPU
    f = features(X86_AVX512_VNNI, environ={env.FEATURES_ENV: "avx2"})
    assert f["source"] == env.FEATURES_ENV and f["avx512f"] is False and f["vnni"] is False and f["isa"] == "avx2"
    none = features(X86_AVX512_VNNI, environ={env.FEATURES_ENV: "none"})
    assert none["avx2"] is False and none["isa"] == "x86-baseline"


def test_the_fingerprint_carries_the_isa_its_caps_the_identity_and_a_clock_and_capped_runs_get_their_own_cache():
    caps = env.isa_caps({"ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2"})
    assert caps == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert env._isa_caps_label(caps) == "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
    assert env.isa_caps({}) == {"ATEN_CPU_CAPABILITY": "", "ONEDNN_MAX_CPU_ISA": ""} and env._isa_caps_label({}) == ""
    # torch's FX graph cache ignores ATEN_CPU_CAPABILITY: capped and uncapped runs must not share it
    capped = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    folder = env.inductor_cache_dir_for_caps(capped)
    assert folder is not None and folder.endswith("_aten_cpu_capability_avx2_onednn_max_cpu_isa_avx2")
    assert env.inductor_cache_dir_for_caps({}) is None                          # nothing capped
    assert env.inductor_cache_dir_for_caps({**capped, "TORCHINDUCTOR_CACHE_DIR": "/data/mine"}) is None  # reader's choice
    default = folder.rsplit("_aten_cpu_capability", 1)[0]
    assert env.inductor_cache_dir_for_caps({**capped, "TORCHINDUCTOR_CACHE_DIR": default}) == folder
    fp = env.fingerprint(threads=1)
    assert {"cpu_model", "threads", "cpu_vendor", "cpu_family", "cpu_model_id", "cpu_microarch", "cpu_l2_kib",
            "cpu_ghz"} <= set(fp)
    assert fp["cpu_isa"] == env.cpu_features()["isa"] and fp["torch_isa"] == env.torch_isa() != ""
    assert fp["isa_caps"] == env._isa_caps_label()
    with pytest.MonkeyPatch.context() as patch:  # a run of the executor records the commit it started from
        patch.setenv(environment.EXECUTION_COMMIT_VARIABLE, "0123456789ab")
        assert environment.git_commit() == "0123456789ab"


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


def test_cpu_identity_tells_a_zen4_reads_arm_or_nothing_and_never_trusts_a_contradicted_model_number(tmp_path):
    root = _cache(tmp_path, [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32M")])
    identity = environment.cpu_identity(X86_AVX512_VNNI, root)
    assert identity == {"cpu_vendor": "AuthenticAMD", "cpu_family": 25, "cpu_model_id": 17, "cpu_stepping": 1,
                        "cpu_microarch": "Zen 4", "cpu_l1d_kib": 32, "cpu_l2_kib": 1024, "cpu_l3_kib": 32768}
    arm = environment.cpu_identity("CPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0c\nCPU revision\t: 1\n",
                                   tmp_path / "none")
    assert (arm["cpu_vendor"], arm["cpu_family"], arm["cpu_model_id"]) == ("ARM implementer 0x41", 8, 0xD0C)
    blank = environment.cpu_identity("", tmp_path / "missing")  # nothing to read
    assert blank["cpu_family"] is None and blank["cpu_l2_kib"] is None
    assert environment.cpu_identity(MASKED_XEON_CPUINFO, tmp_path)["cpu_microarch"] == "unknown"
    assert environment.microarchitecture("GenuineIntel", 6, 167) == "Rocket Lake"
    assert environment.microarchitecture("AuthenticAMD", 25, 0x01) == "Zen 3"
    assert environment.microarchitecture("AuthenticAMD", 26, 2) == "Zen 5"
    assert environment.microarchitecture("GenuineIntel", None, None) == "unknown"


def test_others_load_sums_every_process_but_this_one_and_its_descendants(monkeypatch):
    class Fake:
        def __init__(self, pid, percent, gone=False):
            self.pid, self.percent, self.gone = pid, percent, gone

        def cpu_percent(self, interval):
            if self.gone:
                raise environment.psutil.NoSuchProcess(self.pid)
            return self.percent

        def children(self, recursive):
            return [Fake(11, 0.0)]

    # this process (pid 10) and its child (11) are busy; pid 20 uses half a core; pid 21 ended meanwhile
    processes = [Fake(10, 300.0), Fake(11, 100.0), Fake(20, 50.0), Fake(21, 0.0, gone=True)]
    monkeypatch.setattr(environment.psutil, "Process", lambda: Fake(10, 0.0))
    monkeypatch.setattr(environment.psutil, "process_iter", lambda: processes)
    with environment.others_load(interval_s=0.01) as found:
        time.sleep(0.05)
    assert found == {"others_cores_mean": 0.5, "others_cores_max": 0.5}


@pytest.mark.parametrize("text, flags", [
    ("flags\t: fpu avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_int8 sse4_2\n",
     "amx_int8 amx_tile avx2 avx512_bf16 avx512_vnni avx512f"),
    ("flags\t: fpu sse4_2\n", ""),                               # none of the kernel-choice flags
    ("processor\t: 0\n", "unknown"),                            # no flag line: never read as "none"
])
def test_a_recording_names_every_flag_that_can_change_a_kernel_choice(text, flags):
    assert env._kernel_flags(text) == flags


def test_the_boot_is_read_from_the_kernel_or_unknown(tmp_path):
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text("0f2c3fbc-boot\n")
    (tmp_path / "stat").write_text("cpu  1 2 3 4\nbtime 1796682307\n")
    assert env._boot_identity(tmp_path) == {"boot_id": "0f2c3fbc-boot", "boot_time": "2026-12-07T22:25:07+00:00"}
    assert env._boot_identity(tmp_path / "absent") == {"boot_id": "unknown", "boot_time": "unknown"}


def test_cpu_seconds_count_steal_apart_from_busy_and_never_twice(monkeypatch):
    times = {"user": 10.0, "nice": 0.0, "system": 5.0, "idle": 80.0, "iowait": 1.0, "irq": 0.0, "softirq": 0.0,
             "steal": 4.0, "guest": 3.0, "guest_nice": 0.0}

    class Times:
        def _asdict(self):
            return dict(times)

    monkeypatch.setattr(env.psutil, "cpu_times", lambda: Times())
    # a guest's time is inside user already; idle and iowait are not busy; steal is neither
    assert env.cpu_seconds() == {"busy": 15.0, "steal": 4.0, "total": 100.0}
