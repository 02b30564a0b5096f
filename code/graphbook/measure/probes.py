"""The two physical limits of a machine, measured in the same run as the work (Chapter 1).

- :func:`copy_bandwidth` -- how many bytes per second memory can move: ``dst.copy_(src)`` into a
  preallocated tensor (a STREAM-style "copy"), counting the bytes read *and* the bytes written.
- :func:`matmul_peak` -- how many floating-point operations per second the cores can do: one large
  square matrix product, counted as ``2 * n**3`` FLOPs (a multiply and an add per term).

Their ratio is the roofline's ridge point (FLOPs per byte): work with fewer FLOPs per byte than that
is limited by memory, work with more by compute.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper
from torch.utils import benchmark

from graphbook.config import THREADS

MIB = 1024 ** 2


def blocked_times(fn, repeats: int, *, warmup: int = 1, threads: int | None = None) -> list[float]:
    """Seconds per call of ``fn()`` in blocks timed by torch.utils.benchmark: the book's one timer (Chapter 1).

    The Timer runs at ``threads`` (default: the count in force; it would otherwise use one). ``warmup`` calls
    through it warm up and size the measurement; ``blocked_autorange`` then times blocks for about ``repeats``
    calls' worth of time (a block is one call for anything slower than a few milliseconds).
    """
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads or torch.get_num_threads())
    first_s = timer.timeit(max(warmup, 1)).mean
    return timer.blocked_autorange(min_run_time=repeats * first_s).times


def timed(fn, repeats: int) -> dict:
    """:func:`blocked_times` as the probes report it: median, min and max in ms."""
    seconds = blocked_times(fn, repeats)
    return {"median_ms": float(np.median(seconds)) * 1e3, "min_ms": min(seconds) * 1e3, "max_ms": max(seconds) * 1e3}


def _positive_int(label: str, value, lowest: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
        raise ValueError(f"{label} must be an integer >= {lowest}, got {value!r}")
    return value


def copy_bandwidth(nbytes: int = 256 * MIB, repeats: int = 5, device: str = "cpu") -> dict:
    """Memory bandwidth from ``dst.copy_(src)`` with both tensors allocated up front (Chapter 1).

    ``nbytes`` is the size of *one* buffer (float32, rounded down to whole elements); each copy moves
    ``2 * nbytes`` (read + write). Use buffers far larger than the last-level cache, or the number is
    cache bandwidth. Returns ``gb_per_s`` (decimal GB, 1e9 bytes), ``bytes_moved`` (per copy),
    ``median_ms``, ``min_ms``, ``max_ms``, ``nbytes`` and ``device``. The touch before timing makes
    the operating system map every page first, so page faults are not counted as bandwidth.
    """
    _positive_int("nbytes", nbytes, 4)
    _positive_int("repeats", repeats)
    elements = nbytes // 4
    src = torch.rand(elements, device=device)
    dst = torch.zeros(elements, device=device)  # zeros, not empty: touch every page now
    result = timed(lambda: dst.copy_(src), repeats)
    moved = 2 * elements * 4
    return {"gb_per_s": moved / (result["median_ms"] * 1e-3) / 1e9, "bytes_moved": moved, **result,
            "nbytes": elements * 4, "device": str(device)}


def matmul_peak(n: int = 2048, dtype=None, device: str = "cpu", repeats: int = 5) -> dict:
    """Compute throughput from one ``n x n`` by ``n x n`` matrix product (Chapter 1).

    FLOPs per product are ``2 * n**3``. ``dtype`` defaults to torch.float32. The BLAS library's
    matmul is the fastest dense kernel on most machines, so this is a practical peak, usually a
    little below the vendor's theoretical one. Returns ``gflop_per_s``, ``flops``, ``median_ms``,
    ``min_ms``, ``max_ms``, ``n``, ``dtype`` and ``device``.
    """
    _positive_int("n", n)
    _positive_int("repeats", repeats)
    dtype = torch.float32 if dtype is None else dtype
    a = torch.rand(n, n, device=device, dtype=dtype)
    b = torch.rand(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    result = timed(lambda: torch.mm(a, b, out=out), repeats)
    flops = 2 * n ** 3
    return {"gflop_per_s": flops / (result["median_ms"] * 1e-3) / 1e9, "flops": flops, **result, "n": n, "dtype": str(dtype).replace("torch.", ""), "device": str(device)}


def bf16_support() -> tuple[bool, str]:
    """Whether this CPU runs bfloat16 convolutions natively, and why (Chapter 5).

    Native means oneDNN reports AVX512-BF16 or AMX; otherwise bf16 is emulated, and neither a bf16
    peak nor a bf16 speedup would mean anything.
    """
    if not torch.backends.mkldnn.is_available():
        return False, "torch was built without oneDNN (mkldnn)"
    try:
        supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False, "this torch build cannot report oneDNN bfloat16 support"
    if not supported:
        return False, "the CPU lacks native bfloat16 instructions (AVX512-BF16 / AMX), so bf16 would be emulated"
    return True, f"oneDNN reports native bfloat16 ({torch.backends.cpu.get_cpu_capability()})"


# --------------------------------------------------------------------------------------------------
# The clock and the compute ceiling
# --------------------------------------------------------------------------------------------------
#: A chain of dependent integer adds of a register: each waits for the one before, and a register add takes
#: one cycle on every x86 and ARM core the book runs on, so adds per second is the core's clock while it
#: runs. (Adds of a constant would not do: recent Intel cores fold chains of them at register renaming.)
_CLOCK_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#define ADD4 "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
#elif defined(__aarch64__)
#define ADD4 "add %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1\n\tadd %0, %0, %1\n\t"
#else
#error "no dependent-add chain for this architecture"
#endif
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000000L;
    unsigned long x = 0, one = argc > 2 ? strtoul(argv[2], 0, 10) : 1;  /* a register, not an immediate */
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        __asm__ volatile(ADD4 ADD4 ADD4 ADD4 : "+r"(x) : "r"(one));
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
    printf("%.6f %lu\n", 16.0 * n / s / 1e9, x);
    return 0;
}
"""
_CLOCK_CACHE: dict = {}


def measured_clock_ghz(trials: int = 9, adds: int = 2_000_000) -> float | None:
    """The core clock while it works, in GHz: a timed chain of dependent adds (Chapter 1).

    A C program (built once per process with the system's C compiler) runs ``16 * adds`` adds that each
    wait for the one before; at one add per cycle, adds per second is the clock, turbo included. The
    fastest of ``trials`` short runs (about 10 ms each) is the least disturbed one: on a loaded machine a
    run that the scheduler interrupts reads low, never high. None where no C compiler is found or the
    architecture has no chain here (the fingerprint then records no clock, never a guess).
    """
    key = (trials, adds)
    if key in _CLOCK_CACHE:
        return _CLOCK_CACHE[key]
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    ghz = None
    if compiler:
        with tempfile.TemporaryDirectory(prefix="graphbook-clock-") as work:
            source, binary = Path(work) / "clock.c", Path(work) / "clock"
            source.write_text(_CLOCK_SOURCE)
            built = subprocess.run([compiler, "-O1", "-o", str(binary), str(source)], capture_output=True, timeout=60)
            if built.returncode == 0:
                readings = []
                for _ in range(trials):
                    out = subprocess.run([str(binary), str(adds)], capture_output=True, text=True, timeout=60)
                    if out.returncode == 0 and out.stdout.split():
                        readings.append(float(out.stdout.split()[0]))
                ghz = max(readings) if readings else None
    _CLOCK_CACHE[key] = ghz
    return ghz


#: FP32 floating-point operations one core can start per cycle: FMA units x FP32 lanes per unit x 2 (a
#: multiply and an add). From the vendors' optimization manuals; Zen 4 runs AVX-512 on two 256-bit units.
FP32_FLOPS_PER_CYCLE = {
    "Skylake-SP / Cascade Lake": 64, "Ice Lake-SP": 64, "Sapphire Rapids": 64, "Emerald Rapids": 64,
    "Granite Rapids": 64, "Zen / Zen 2": 32, "Zen 3": 32, "Zen 3+": 32, "Zen 4": 32, "Zen 5": 64,
    "Tiger Lake": 32, "Alder Lake": 32, "Raptor Lake": 32, "Rocket Lake": 32, "Coffee Lake": 32, "Kaby Lake": 32,
}


def _flops_per_cycle_from_isa(isa: str) -> int | None:
    """FP32 FLOPs per cycle per core implied by the widest vector FMA the CPU offers, two FMA units (Chapter 1).

    The fallback when the microarchitecture is unknown (a hypervisor that hides the model number): AVX-512
    -> 2 x 16 lanes x 2 = 64, AVX2 -> 32, NEON -> 2 x 4 x 2 = 16. An upper bound: some cores have one
    512-bit unit, or split 512-bit work over two 256-bit ones.
    """
    isa = str(isa or "")
    if isa.startswith(("amx", "avx512")):
        return 64
    if isa.startswith("avx2"):
        return 32
    if isa.startswith(("neon", "arm")):
        return 16
    return None


def fp32_ceiling(env: dict) -> dict:
    """The machine's theoretical FP32 peak from its own facts: threads x FLOPs per cycle x measured clock (Chapter 1).

    ``env`` is a fingerprint (:func:`graphbook.measure.environment.fingerprint`): ``threads`` (the cores the
    work may use), ``cpu_microarch`` (FLOPs per cycle from :data:`FP32_FLOPS_PER_CYCLE`, else from the
    instruction set, :func:`_flops_per_cycle_from_isa`) and ``cpu_ghz``. Returns ``gflop_per_s`` (None when a
    fact is missing), ``flops_per_cycle``, ``ghz``, ``threads`` and ``basis`` (where the FLOPs per cycle came
    from). A measured FP32 rate above this is a bug to find or a kernel that does less work than counted.
    """
    per_cycle = FP32_FLOPS_PER_CYCLE.get(str(env.get("cpu_microarch") or ""))
    basis = f"{env.get('cpu_microarch')} (vendor manuals)" if per_cycle else ""
    if per_cycle is None:
        per_cycle = _flops_per_cycle_from_isa(env.get("cpu_isa"))
        width = {64: "AVX-512", 32: "AVX2", 16: "NEON"}.get(per_cycle, "")
        basis = (f"two {width} FMA units assumed from the instruction set ({env.get('cpu_isa')}): the "
                 "microarchitecture is not identified") if per_cycle else ""
    return _ceiling(env, per_cycle, basis)


def _ceiling(env: dict, per_cycle, basis: str) -> dict:
    ghz, threads = env.get("cpu_ghz"), env.get("threads")
    try:
        value = float(threads) * per_cycle * float(ghz) if per_cycle and ghz and threads else None
    except (TypeError, ValueError):
        value = None
    return {"gflop_per_s": value, "flops_per_cycle": per_cycle, "ghz": ghz, "threads": threads, "basis": basis}


#: Microarchitectures whose vector units multiply bf16 pairs into FP32 sums (AVX512-BF16 ``vdpbf16ps``): two
#: products per FP32 lane, so twice the FP32 FMA rate on the same units.
_BF16_DOT_ARCHS = {"Zen 4", "Zen 5", "Cooper Lake"}
#: Microarchitectures with AVX512-VNNI (``vpdpbusd``): four u8 x s8 products per 32-bit lane, four times the FP32
#: rate. Intel's AMX cores have it too, but their tile unit is far faster (below).
_VNNI_ARCHS = {"Cascade Lake", "Cooper Lake", "Ice Lake-SP", "Tiger Lake", "Rocket Lake", "Zen 4", "Zen 5"}
#: AMX tile multiply per core and cycle (Intel's optimization manual): 1,024 bf16 FLOPs, 2,048 int8 operations.
_AMX_PER_CYCLE = {"bf16": 1024, "int8": 2048}


def precision_ceiling(env: dict, precision: str) -> dict:
    """The machine's theoretical peak for ``precision`` ("fp32", "bf16" or "int8"), like :func:`fp32_ceiling` (Chapter 5).

    bf16 and int8 have their own ceilings because the CPU has instructions that do more products per cycle in
    the narrower type: AVX512-BF16's dot products twice the FP32 FMA rate, AVX512-VNNI four times (int8
    operations, a multiply and an add each), Intel's AMX tiles far more (:data:`_AMX_PER_CYCLE`). Where the
    CPU has none of these, or its microarchitecture is unknown, the ceiling is None: the narrow type then runs
    through wider instructions and no honest peak can be stated. Same keys as :func:`fp32_ceiling`.
    """
    if precision == "fp32":
        return fp32_ceiling(env)
    if precision not in _AMX_PER_CYCLE:
        raise ValueError(f"precision must be fp32, bf16 or int8, got {precision!r}")
    fp32 = fp32_ceiling(env)
    arch = str(env.get("cpu_microarch") or "")
    if str(env.get("cpu_isa") or "") == "amx" or arch in ("Sapphire Rapids", "Emerald Rapids", "Granite Rapids"):
        per_cycle, basis = _AMX_PER_CYCLE[precision], f"AMX tiles ({precision}, Intel's optimization manual)"
    elif precision == "bf16" and arch in _BF16_DOT_ARCHS and fp32["flops_per_cycle"]:
        per_cycle, basis = 2 * fp32["flops_per_cycle"], f"{arch}: AVX512-BF16 dot products, twice the FP32 rate"
    elif precision == "int8" and arch in _VNNI_ARCHS and fp32["flops_per_cycle"]:
        per_cycle, basis = 4 * fp32["flops_per_cycle"], f"{arch}: VNNI dot products, four times the FP32 rate"
    else:
        per_cycle, basis = None, f"no {precision} instructions known for this CPU ({arch or 'unknown'})"
    return _ceiling(env, per_cycle, basis)


def gemm_rates(n: int = 2048, threads: int = THREADS, repeats: int = 5) -> list[dict]:
    """The best dense FP32 matrix product several libraries reach here, in GFLOP/s (Chapter 1).

    One library's GEMM is not the machine's peak (PyTorch's x86 wheels call MKL, which takes a narrower
    path on AMD CPUs), so the book measures three on the same ``n x n`` product, at ``threads`` threads:
    PyTorch's ``torch.mm``, NumPy's ``@`` (its own BLAS) and ONNX Runtime's ``MatMul`` (its MLAS kernels).
    Returns one dict per library that is installed: ``library``, ``gflop_per_s``, ``median_ms``.
    """
    _positive_int("n", n)
    flops = 2 * n ** 3
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    b = np.random.default_rng(1).random((n, n), dtype=np.float32)
    rows = []

    def add(library, fn):
        median_ms = timed(fn, repeats)["median_ms"]
        rows.append({"library": library, "gflop_per_s": flops / (median_ms * 1e-3) / 1e9, "median_ms": median_ms})

    ta, tb, out = torch.from_numpy(a), torch.from_numpy(b), torch.empty(n, n)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        add("PyTorch torch.mm", lambda: torch.mm(ta, tb, out=out))
    finally:
        torch.set_num_threads(previous)
    add("NumPy @", lambda: a @ b)
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 9)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    add("ONNX Runtime MatMul (MLAS)", lambda: session.run(None, {"a": a, "b": b}))
    return rows
