"""Threads and the environment fingerprint that every measurement carries: a number without the machine,
threads and library versions that produced it cannot be compared with anything."""
from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import getpass
import os
import platform
import re
import subprocess
import tempfile
import threading
from pathlib import Path

import onnxruntime as ort
import psutil
import torch

from graphbook.measure.probes import measured_clock_ghz
from graphbook.paths import REPO_ROOT


def set_threads(threads: int) -> int:
    """Pin torch's intra-op thread count and return it; below 1 is refused, not silently "all cores"."""
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    torch.set_num_threads(threads)
    return torch.get_num_threads()


def cpu_model(cpuinfo_text: str | None = None) -> str:
    """The CPU's name on any architecture (cpuinfo, ARM implementer/part, sysctl...), never an exception."""
    fields = _cpuinfo_fields(cpuinfo_text)
    for key in ("model name", "model", "hardware"):
        value = fields.get(key, "")
        if value and not value.isdigit():  # x86 also has a numeric "model" line
            return value
    if "cpu part" in fields:
        return f"ARM implementer {fields.get('cpu implementer', '?')} part {fields['cpu part']}"
    if cpuinfo_text is None:
        brand = _sysctl("machdep.cpu.brand_string")
        if brand:
            return brand
    return _platform_names()[0] or platform.machine() or "unknown"


@functools.cache
def _platform_names() -> tuple[str, str]:
    """(processor, platform): Python runs uname(1) for them at every call, so ask once per process."""
    return platform.processor(), platform.platform(terse=True)


#: Microarchitecture names by (vendor, family, model), for the CPUs the book has met and their neighbours.
#: A hypervisor may report another model number than the host's; the name is then "unknown", never a guess.
_MICROARCH = {
    ("GenuineIntel", 6, 85): "Skylake-SP / Cascade Lake", ("GenuineIntel", 6, 106): "Ice Lake-SP",
    ("GenuineIntel", 6, 108): "Ice Lake-SP", ("GenuineIntel", 6, 143): "Sapphire Rapids",
    ("GenuineIntel", 6, 207): "Emerald Rapids", ("GenuineIntel", 6, 173): "Granite Rapids",
    ("GenuineIntel", 6, 174): "Granite Rapids", ("GenuineIntel", 6, 175): "Sierra Forest",
    ("GenuineIntel", 6, 140): "Tiger Lake", ("GenuineIntel", 6, 151): "Alder Lake", ("GenuineIntel", 6, 183): "Raptor Lake",
    ("GenuineIntel", 6, 167): "Rocket Lake", ("GenuineIntel", 6, 158): "Coffee Lake", ("GenuineIntel", 6, 142): "Kaby Lake",
}
_AMX_ARCHS = {"Sapphire Rapids", "Emerald Rapids", "Granite Rapids"}
_AMD_FAMILIES = {23: ("Zen / Zen 2", None), 26: ("Zen 5", None)}
_ZEN3_ZEN4 = ((range(0x00, 0x10), "Zen 3"), (range(0x10, 0x20), "Zen 4"), (range(0x20, 0x30), "Zen 3"),
              (range(0x40, 0x50), "Zen 3+"), (range(0x50, 0x60), "Zen 3"), (range(0x60, 0x80), "Zen 4"),
              (range(0xA0, 0xB0), "Zen 4"))


def microarchitecture(vendor: str, family: int | None, model: int | None) -> str:
    """The microarchitecture of an x86 CPU from its CPUID vendor, family and model, or "unknown"."""
    if family is None or model is None:
        return "unknown"
    if vendor == "AuthenticAMD":
        if family == 25:
            return next((name for models, name in _ZEN3_ZEN4 if model in models), "unknown")
        return _AMD_FAMILIES.get(family, ("unknown", None))[0]
    return _MICROARCH.get((vendor, family, model), "unknown")


def _int_or_none(text: str | None, base: int = 10) -> int | None:
    try:
        return int(str(text).strip(), base)
    except (TypeError, ValueError):
        return None


def _cache_kib(sysfs_root: Path) -> dict:
    """L1d, L2 (per core) and L3 (shared) sizes of cpu0 in KiB from sysfs, None if unread."""
    sizes = {"cpu_l1d_kib": None, "cpu_l2_kib": None, "cpu_l3_kib": None}
    for index in sorted(sysfs_root.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        factor = {"K": 1, "M": 1024, "G": 1024 * 1024}.get(size[-1:])
        value = _int_or_none(size[:-1] if factor else size)
        key = "cpu_l1d_kib" if (level, kind) == ("1", "Data") else {"2": "cpu_l2_kib", "3": "cpu_l3_kib"}.get(level)
        if value is not None and key:
            sizes[key] = value * (factor or 1)
    return sizes


def cpu_identity(cpuinfo_text: str | None = None, cache_root: str | Path | None = None) -> dict:
    """Vendor, family, model, stepping, microarchitecture and cache sizes; None where unreadable. "AMD EPYC" names CPUs
    whose speed differs by 2x (Zen 4 and Zen 5), so the name alone identifies no machine."""
    fields = _cpuinfo_fields(cpuinfo_text)
    if "vendor_id" in fields:
        vendor = fields["vendor_id"]
        family, model = _int_or_none(fields.get("cpu family")), _int_or_none(fields.get("model"))
        stepping = _int_or_none(fields.get("stepping"))
        arch = microarchitecture(vendor, family, model)
        if "amx_tile" in fields.get("flags", "").split() and arch not in _AMX_ARCHS:
            arch = "unknown"  # a hypervisor reported a model number whose CPU has no AMX
    elif "cpu implementer" in fields:
        vendor = f"ARM implementer {fields['cpu implementer']}"
        family = _int_or_none(fields.get("cpu architecture"))
        model = _int_or_none(fields.get("cpu part"), 16)
        stepping = _int_or_none(fields.get("cpu revision"))
        arch = "unknown"
    else:
        vendor, family, model, stepping = (_sysctl("machdep.cpu.vendor") if cpuinfo_text is None else "") or "unknown", \
            None, None, None
        arch = "unknown"
    root = Path(cache_root) if cache_root is not None else Path("/sys/devices/system/cpu/cpu0/cache")
    return {"cpu_vendor": vendor, "cpu_family": family, "cpu_model_id": model, "cpu_stepping": stepping,
            "cpu_microarch": arch, **_cache_kib(root)}


def _cpuinfo_fields(text: str | None) -> dict[str, str]:
    """First value of each ``key : value`` line of ``text`` (None: this machine's /proc/cpuinfo), keys lower-cased."""
    if text is None:
        try:
            text = Path("/proc/cpuinfo").read_text()
        except OSError:
            text = ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            fields.setdefault(key.strip().lower(), value.strip())
    return fields


def _sysctl(name: str) -> str:
    """``sysctl -n name``, or "" where there is no sysctl or no such key."""
    if platform.system() not in ("Darwin", "FreeBSD"):
        return ""
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# Instruction-set features the book cares about, and the /proc/cpuinfo flag names that show them.
X86_FEATURES = {"avx2": ("avx2",), "avx512f": ("avx512f",), "avx512_vnni": ("avx512_vnni",),
                "avx_vnni": ("avx_vnni",), "amx": ("amx_tile", "amx_int8")}
ARM_FEATURES = {"neon": ("asimd", "neon"), "dotprod": ("asimddp",), "i8mm": ("i8mm",), "bf16": ("bf16",)}
_MAC_SYSCTL = {"neon": "hw.optional.neon", "dotprod": "hw.optional.arm.FEAT_DotProd",
               "i8mm": "hw.optional.arm.FEAT_I8MM", "bf16": "hw.optional.arm.FEAT_BF16"}
FEATURES_ENV = "GRAPHBOOK_CPU_FEATURES"


def cpu_features(cpuinfo_text: str | None = None, machine: str | None = None, *,
                 sysctl=None, environ=None) -> dict:
    """The instruction-set features this CPU offers, x86 and ARM alike: True, False or None (unread, never a guess).
    ``GRAPHBOOK_CPU_FEATURES`` (e.g. ``avx2``) overrides detection, to see the book choose as on another CPU."""
    environ = os.environ if environ is None else environ
    machine = platform.machine() if machine is None else machine
    lowered = machine.lower()
    arch = ("x86" if lowered in ("x86_64", "amd64", "i386", "i686", "x86")
            else "arm" if lowered in ("aarch64", "arm64") or lowered.startswith("armv8") else "other")
    names = X86_FEATURES if arch == "x86" else ARM_FEATURES if arch == "arm" else {}
    result: dict = {"arch": arch, "machine": machine, "source": "unknown"}
    override = environ.get(FEATURES_ENV, "").strip()
    if override:
        have = {f.strip().lower() for f in override.split(",") if f.strip() and f.strip().lower() != "none"}
        result["source"] = FEATURES_ENV
        if arch == "other":  # the override names the family itself
            arch = "x86" if have & set(X86_FEATURES) else "arm" if have & set(ARM_FEATURES) else "other"
            names = X86_FEATURES if arch == "x86" else ARM_FEATURES if arch == "arm" else {}
            result["arch"] = arch
        values = {feature: feature in have for feature in names}
    else:
        fields = _cpuinfo_fields(cpuinfo_text)
        flag_line = fields.get("flags") or fields.get("features")
        if flag_line is not None and names:
            flags = set(flag_line.split())
            values = {feature: any(f in flags for f in aliases) for feature, aliases in names.items()}
            result["source"] = "/proc/cpuinfo"
        else:
            values = {feature: None for feature in names}
            read = sysctl or (_sysctl if cpuinfo_text is None else (lambda name: ""))
            if arch == "arm":  # Apple Silicon: one sysctl key per feature, "1" or "0"
                found = {feature: read(key).strip() for feature, key in _MAC_SYSCTL.items()}
                if any(found.values()):
                    values = {feature: (found[feature] == "1") if found[feature] else None for feature in names}
                    result["source"] = "sysctl"
            elif arch == "x86":  # an Intel Mac: the CPUID feature words, cpuinfo's names upper-case without "_"
                flags = set((read("machdep.cpu.features") + " " + read("machdep.cpu.leaf7_features")).lower().split())
                if flags:
                    values = {feature: any(a.replace("_", "") in flags for a in aliases)
                              for feature, aliases in names.items()}
                    result["source"] = "sysctl"
    result.update(values)
    if arch == "x86":
        vnni = [values.get("avx512_vnni"), values.get("avx_vnni")]
        result["vnni"] = True if any(vnni) else (None if None in vnni else False)
    else:
        result["vnni"] = None if arch == "other" else False
    result["isa"] = _isa_label(arch, values)
    result["torch_isa"] = torch_isa()
    return result


def _isa_label(arch: str, values: dict) -> str:
    """The most telling feature names, joined by "+": the instruction set in a fingerprint column."""
    if not values or all(v is None for v in values.values()):
        return "unknown"
    if arch == "x86":
        if values.get("amx"):
            return "amx"
        if values.get("avx512f"):
            return "avx512_vnni" if values.get("avx512_vnni") else "avx512"
        if values.get("avx2"):
            return "avx2+avx_vnni" if values.get("avx_vnni") else "avx2"
        return "x86-baseline"
    present = [name for name in ("neon", "dotprod", "i8mm", "bf16") if values.get(name)]
    return "+".join(present) or "arm-baseline"


def torch_isa() -> str:
    """The instruction set PyTorch dispatches to, e.g. "AVX512" (``ATEN_CPU_CAPABILITY`` caps it); "" without torch."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # an absent or old torch is recorded as "", not fatal
        return ""


def isa_caps(environ=None) -> dict:
    """``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA`` (or ``DNNL_MAX_CPU_ISA``), "" when unset."""
    environ = os.environ if environ is None else environ
    return {"ATEN_CPU_CAPABILITY": environ.get("ATEN_CPU_CAPABILITY", ""),
            "ONEDNN_MAX_CPU_ISA": environ.get("ONEDNN_MAX_CPU_ISA", environ.get("DNNL_MAX_CPU_ISA", ""))}


def _isa_caps_label(environ=None) -> str:
    """The caps in force as one field ("" if none): oneDNN's cap changes conv speed where ``torch_isa`` shows none."""
    return " ".join(f"{k}={v}" for k, v in isa_caps(environ).items() if v)


def inductor_cache_dir_for_caps(environ=None) -> str | None:
    """A separate Inductor cache for an ISA-capped process: torch 2.13's FX graph cache does not key on the vector
    ISA, and AVX-512 code reused with AVX2 vectors left every second block unwritten. None when not capped."""
    environ = os.environ if environ is None else environ
    label = _isa_caps_label(environ)
    if not label:
        return None
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = "unknown_user"
    default = os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    chosen = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and os.path.abspath(chosen) != os.path.abspath(default):
        return None
    return default + "_" + re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_").lower()


#: Set by ``scripts/execute_notebooks.py`` for the pages it executes: the commit the whole run started
#: from. The pages it writes in turn would otherwise make every later page read "+dirty".
EXECUTION_COMMIT_VARIABLE = "GRAPHBOOK_EXECUTION_COMMIT"


def git_commit(root: Path = REPO_ROOT) -> str:
    """Short commit hash, ``+dirty`` if files changed; under ``scripts/execute_notebooks.py`` its run's commit."""
    if os.environ.get(EXECUTION_COMMIT_VARIABLE):
        return os.environ[EXECUTION_COMMIT_VARIABLE]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        if not sha:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def fingerprint(threads: int | None = None) -> dict:
    """Everything a measurement needs to be compared later: date, commit, CPU and clock, ISAs, threads, versions."""
    features, ghz = cpu_features(), measured_clock_ghz()
    gpu = {"gpu_name": "", "gpu_driver": "", "cuda_version": ""}  # GPU 0's, empty strings without CUDA
    try:
        if torch.cuda.is_available():
            gpu["gpu_name"], gpu["cuda_version"] = torch.cuda.get_device_name(0), str(torch.version.cuda or "")
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
            gpu["gpu_driver"] = out.splitlines()[0] if out else ""
    except (OSError, subprocess.SubprocessError, RuntimeError):
        pass
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "cpu_model": cpu_model(),
        **cpu_identity(),
        "cpu_ghz": round(ghz, 2) if ghz is not None else None,
        "cpu_isa": features["isa"],
        "torch_isa": features["torch_isa"],
        "isa_caps": _isa_caps_label(),
        "cpu_cores": os.cpu_count() or 0,
        "threads": int(threads if threads is not None else torch.get_num_threads()),
        **gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "platform": _platform_names()[1],
    }


#: The CPU flags that can change which kernel torch, oneDNN or ONNX Runtime picks: a recording names each one present.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni")


def _kernel_flags(cpuinfo_text: str | None = None) -> str:
    """The :data:`KERNEL_FLAGS` and ``amx_*`` flags this CPU reports, space-separated; "unknown" with no flag line."""
    line = _cpuinfo_fields(cpuinfo_text).get("flags")
    if line is None:
        return "unknown"
    flags = set(line.split())
    return " ".join(sorted(f for f in flags if f in KERNEL_FLAGS or f.startswith("amx_")))


def _boot_identity(root: str | Path = "/proc") -> dict:
    """This boot's id (new at every boot, unlike ``/etc/machine-id``, which comes with the machine's image) and the
    boot time, UTC; "unknown" where the kernel does not say."""
    root = Path(root)
    try:
        boot_id = (root / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = "unknown"
    try:
        seconds = next(int(line.split()[1]) for line in (root / "stat").read_text().splitlines()
                       if line.startswith("btime "))
        booted = _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).isoformat(timespec="seconds")
    except (OSError, StopIteration, ValueError, IndexError):
        booted = "unknown"
    return {"boot_id": boot_id or "unknown", "boot_time": booted}


def machine_record() -> dict:
    """What a recording's invocation says of the machine beyond :func:`fingerprint`: the boot, the kernel-choice
    flags, the microcode and the memory."""
    microcode = _cpuinfo_fields(None).get("microcode") or "unknown"
    return {**_boot_identity(), "cpu_flags": _kernel_flags(), "microcode": microcode,
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)}


#: The programs whose versions a page quotes: the browser Chapter 4 measures in, and the C++ compiler Inductor's
#: CPU code and the ahead-of-time loader are built with.
TOOLS = {"chromium": ("chromium", "chromium-browser", "google-chrome"), "c++ compiler": ("g++", "c++", "clang++")}


def tool_versions() -> dict:
    """The first line of ``--version`` of each of :data:`TOOLS` (``$CXX`` first for the compiler), "unknown" where
    none is installed."""
    found = {}
    for tool, names in TOOLS.items():
        names = ((os.environ["CXX"],) if tool == "c++ compiler" and os.environ.get("CXX") else ()) + names
        found[tool] = "unknown"
        for name in names:
            try:
                done = subprocess.run([name, "--version"], capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.SubprocessError):
                continue
            if done.returncode == 0 and done.stdout.strip():
                found[tool] = done.stdout.strip().splitlines()[0]
                break
    return found

def cpu_seconds() -> dict:
    """The machine's CPU seconds since boot, summed over its CPUs: ``busy``, ``steal`` (time the hypervisor gave
    another guest; None where the kernel does not count it) and ``total``. Two readings bound a span."""
    times = psutil.cpu_times()._asdict()
    for counted_in_user in ("guest", "guest_nice"):   # Linux counts a guest's time in user and nice already
        times.pop(counted_in_user, None)
    total, steal = sum(times.values()), times.get("steal")
    idle = times["idle"] + times.get("iowait", 0.0)
    return {"busy": total - idle - (steal or 0.0), "steal": steal, "total": total}


#: The most CPU, in cores, that processes outside a page's own execution may use on average while it runs: a quiet
#: machine's background stays far below it, a concurrent test run or benchmark far above.
QUIET_OTHERS_CORES = 0.25


@contextlib.contextmanager
def others_load(interval_s: float = 2.0):
    """While the block runs, the CPU used by processes other than this one and its descendants, sampled every
    ``interval_s``: yields a dict that holds ``others_cores_mean`` and ``others_cores_max`` once the block ends."""
    me = psutil.Process()
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> float:
        ours = {me.pid, *(child.pid for child in me.children(recursive=True))}
        percent = 0.0
        for process in psutil.process_iter():  # cached Process objects: cpu_percent counts since its last call
            if process.pid not in ours:
                with contextlib.suppress(psutil.Error):
                    percent += process.cpu_percent(None)
        return percent / 100

    def loop():
        sample()  # the baseline of every process's counter
        while not stop.wait(interval_s):
            samples.append(sample())

    found: dict = {}
    sampler = threading.Thread(target=loop, daemon=True)
    sampler.start()
    try:
        yield found
    finally:
        stop.set()
        sampler.join()
        samples.append(sample())  # the last stretch, shorter than an interval
        found.update(others_cores_mean=round(sum(samples) / len(samples), 3), others_cores_max=round(max(samples), 3))
