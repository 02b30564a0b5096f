"""The physical limits of a machine, measured in the same run as the work: copy bandwidth, matmul rate, clock.
Their ratio is the roofline's ridge point: work with fewer FLOPs per byte is limited by memory, more by compute."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper
from torch.utils import benchmark

from graphbook.config import THREADS

MIB = 1024 ** 2
MIN_BLOCKS = 3  # the fewest blocks a median and a spread are taken from
#: The shortest block worth one clock reading: the reading's own cost (about 70 ns) is under 1e-4 of it, the Timer's
#: overhead target. A call this long is its own block; shorter calls are grouped by the Timer into longer blocks.
MIN_BLOCK_S = 1e-3


def blocked_times(fn, repeats: int, *, warmup: int = 1, threads: int | None = None) -> list[float]:
    """Seconds per call of ``fn()`` at ``threads`` after ``warmup`` untimed calls (at least one): ``repeats`` single
    calls (at least ``MIN_BLOCKS``) where a call lasts ``MIN_BLOCK_S`` or more, else blocks of many calls sized and
    timed by torch.utils.benchmark's Timer."""
    previous = torch.get_num_threads()
    threads = threads or previous
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)  # GPU work ends before a reading

    def seconds() -> float:
        sync()
        start = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - start

    torch.set_num_threads(threads)
    try:
        for _ in range(max(warmup, 1) - 1):
            fn()
        first_s = seconds()  # the last warm-up call sizes the measurement
        if first_s >= MIN_BLOCK_S:
            return [seconds() for _ in range(max(repeats, MIN_BLOCKS))]
    finally:
        torch.set_num_threads(previous)
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    measured = timer.blocked_autorange(min_run_time=max(repeats * first_s, MIN_BLOCK_S))
    times = list(measured.times)
    # The Timer sizes its blocks by its own overhead, which differs between machines: where one block of ten calls
    # already fills the run time, a spread needs more blocks of the same size.
    while len(times) < MIN_BLOCKS:
        times += timer.timeit(measured.number_per_run).times
    return times


def timed(fn, repeats: int) -> dict:
    """``fn`` read by :func:`blocked_times`: the median, fastest and slowest reading and the readings, in ms."""
    ms = [s * 1e3 for s in blocked_times(fn, repeats)]
    return {"median_ms": float(np.median(ms)), "min_ms": min(ms), "max_ms": max(ms), "times_ms": tuple(ms)}


def _positive_int(label: str, value, lowest: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
        raise ValueError(f"{label} must be an integer >= {lowest}, got {value!r}")
    return value


def copy_bandwidth(nbytes: int = 256 * MIB, repeats: int = 5) -> dict:
    """Memory bandwidth of ``dst.copy_(src)``, counting read and write (``2 * nbytes`` per copy), decimal GB/s."""
    _positive_int("nbytes", nbytes, 4)
    _positive_int("repeats", repeats)
    elements = nbytes // 4
    src = torch.rand(elements)
    dst = torch.zeros(elements)  # zeros, not empty: touch every page now
    result = timed(lambda: dst.copy_(src), repeats)
    moved = 2 * elements * 4
    return {"gb_per_s": moved / (result["median_ms"] * 1e-3) / 1e9, "bytes_moved": moved, **result,
            "nbytes": elements * 4}


def matmul_peak(n: int = 2048, dtype=torch.float32, repeats: int = 5) -> dict:
    """GFLOP/s of one ``n x n`` matrix product (``2 * n**3`` FLOPs): a practical peak, a little below the vendor's."""
    a = torch.rand(n, n, dtype=dtype)
    b = torch.rand(n, n, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    result = timed(lambda: torch.mm(a, b, out=out), repeats)
    flops = 2 * n ** 3
    return {"gflop_per_s": flops / (result["median_ms"] * 1e-3) / 1e9, "flops": flops, **result, "n": n,
            "dtype": str(dtype).replace("torch.", "")}


def bf16_support() -> tuple[bool, str]:
    """Whether this CPU runs bf16 convolutions natively (AVX512-BF16 or AMX), and why: emulated bf16 proves nothing."""
    if not torch.backends.mkldnn.is_available():
        return False, "torch was built without oneDNN (mkldnn)"
    try:
        supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False, "this torch build cannot report oneDNN bfloat16 support"
    if not supported:
        return False, "the CPU lacks native bfloat16 instructions (AVX512-BF16 / AMX), so bf16 would be emulated"
    return True, f"oneDNN reports native bfloat16 ({torch.backends.cpu.get_cpu_capability()})"


# -- The clock and the compute ceiling --
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
    """The working core clock in GHz from a C chain of dependent adds, the fastest of ``trials`` runs (an interrupted
    run reads low, never high); None without a C compiler or a chain for this architecture."""
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


def fp32_ceiling(env: dict) -> dict:
    """The theoretical FP32 peak from the fingerprint ``env``: threads x FLOPs per cycle x measured clock. A measured
    FP32 rate above it is a bug, or a kernel that does less work than counted."""
    per_cycle = FP32_FLOPS_PER_CYCLE.get(str(env.get("cpu_microarch") or ""))
    basis = f"{env.get('cpu_microarch')} (vendor manuals)" if per_cycle else ""
    if per_cycle is None:  # an unknown core: two FMA units of its widest vector, an upper bound
        isa = str(env.get("cpu_isa") or "")
        per_cycle = next((n for prefixes, n in ((("amx", "avx512"), 64), (("avx2",), 32), (("neon", "arm"), 16))
                          if isa.startswith(prefixes)), None)
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
    """The theoretical peak for ``precision`` ("fp32", "bf16" or "int8"), same keys as :func:`fp32_ceiling`. None where
    the CPU has no narrower instructions (or is unknown): no honest peak can then be stated."""
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
    """The best dense FP32 GEMM rate of torch, NumPy and ONNX Runtime here: no one library is the peak."""
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
