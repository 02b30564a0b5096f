"""BlurBall on a CUDA GPU: the article's Section 5 matrix in one command (Chapter 5).

    .venv/bin/python code/gpu_blurball.py                       # full matrix, ~3-8 minutes
    .venv/bin/python code/gpu_blurball.py --skip-max-autotune   # the same without the slow mode

Measures, at batch 1 and 3 x 288 x 512 input: eager FP32 and FP16 (autocast); torch.compile
default, reduce-overhead and max-autotune in both precisions (first-call compile time of each, in
a fresh Inductor cache); channels-last eager in both precisions; cuDNN benchmark on and off.
Each configuration is first compared with eager FP32 (max abs diff, per-frame heatmap peaks), then
timed with CUDA events (median of --repeats after --warmup). One forward of eager FP32, eager FP16
and compile-default FP16 is profiled: total kernel count, kernel counts and times for
convolution, batch norm and the rest, and active GPU time against wall time.

Everything goes to a new file ``data/results/gpu-<device>-<date>[-N].csv`` with the environment.
Without CUDA it exits with status 3 and one line saying why; bad arguments exit 2.
Works with torch 2.11 and newer (only public APIs: torch.compile modes, autocast, profiler).
"""
from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graphbook.cli import OneLineParser, positive_int

PROG = "gpu_blurball.py"
EXIT_BAD_ARGS = 2
EXIT_NO_CUDA = 3
PRECISIONS = ("fp32", "fp16")
COMPILE_MODES = ("compile_default", "compile_reduce_overhead", "compile_max_autotune")
TORCH_MODE = {"compile_default": "default", "compile_reduce_overhead": "reduce-overhead",
              "compile_max_autotune": "max-autotune"}
PROFILED = (("fp32", "eager"), ("fp16", "eager"), ("fp16", "compile_default"))
KERNEL_CATEGORIES = ("convolution", "batch_norm", "other")
# Start max-autotune only if this much of the 8-minute budget is left (its compile is the slow one).
MAX_AUTOTUNE_BUDGET_S = 240.0
TOTAL_BUDGET_S = 480.0

VARIANT_COLUMNS = ["record", "variant", "precision", "mode", "layout", "cudnn_benchmark", "median_ms",
                   "min_ms", "max_ms", "q1_ms", "q3_ms", "repeats", "warmup", "first_call_s",
                   "max_abs_diff", "peaks_equal", "speedup_vs_eager_same_precision",
                   "speedup_vs_eager_fp32", "note"]
PROFILE_COLUMNS = ["category", "kernels", "kernel_ms", "share", "total_kernels", "active_gpu_ms",
                   "wall_ms"]
CSV_COLUMNS = VARIANT_COLUMNS + PROFILE_COLUMNS


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (Chapter 5). Bad values exit 2 with one line on stderr."""
    parser = OneLineParser(prog=PROG, description="BlurBall GPU measurement matrix (Chapter 5).")
    parser.add_argument("--repeats", type=positive_int, default=50, help="timed calls (article: 50)")
    parser.add_argument("--warmup", type=positive_int, default=20, help="untimed calls (article: 20)")
    parser.add_argument("--skip-max-autotune", action="store_true",
                        help="leave out max-autotune (its compile takes minutes)")
    parser.add_argument("--no-profile", action="store_true", help="skip the kernel profiles")
    parser.add_argument("--warm-cache", action="store_true",
                        help="compile with the on-disk Inductor cache instead of a fresh (cold) one")
    parser.add_argument("--out-dir", type=Path, default=None, help="default: data/results/")
    parser.add_argument("--weights", type=Path, default=None,
                        help="BlurBall checkpoint (authors' format); default: seeded random weights")
    return parser.parse_args(argv)


def cuda_problem() -> str | None:
    """Why this machine cannot run the GPU matrix, or None when it can (Chapter 5)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        built = torch.version.cuda
        if built is None:
            return (f"torch {torch.__version__} is a CPU-only build (no CUDA); install a CUDA build "
                    f"of torch on a machine with an NVIDIA GPU")
        return f"torch {torch.__version__} (CUDA {built}) sees no CUDA device on this machine"
    return None


def plan_matrix(skip_max_autotune: bool = False) -> list[dict]:
    """The configurations to measure, in order: eager first, max-autotune last (Chapter 5)."""
    plan = []
    for precision in PRECISIONS:
        plan.append(dict(precision=precision, mode="eager", layout="nchw", cudnn_benchmark=False))
    for precision in PRECISIONS:
        plan.append(dict(precision=precision, mode="eager", layout="channels_last", cudnn_benchmark=False))
    for precision in PRECISIONS:
        plan.append(dict(precision=precision, mode="eager", layout="nchw", cudnn_benchmark=True))
    modes = [m for m in COMPILE_MODES if not (skip_max_autotune and m == "compile_max_autotune")]
    for mode in modes:
        for precision in PRECISIONS:
            plan.append(dict(precision=precision, mode=mode, layout="nchw", cudnn_benchmark=False))
    for config in plan:
        config["variant"] = variant_name(config)
    return plan


def variant_name(config: dict) -> str:
    """``fp16_compile_default_nchw`` style name; ``+cudnn_benchmark`` when it is on."""
    name = f"{config['precision']}_{config['mode']}_{config['layout']}"
    return name + ("+cudnn_benchmark" if config.get("cudnn_benchmark") else "")


def device_slug(name: str) -> str:
    """A file-name-safe lower-case form of a GPU name: 'NVIDIA GeForce RTX 4060' -> 'nvidia-geforce-rtx-4060'."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown-gpu"


def kernel_category(op_name: str, kernel_name: str = "") -> str:
    """Article-style category of a CUDA kernel from its launching op (or its own name)."""
    op = op_name.lower()
    kernel = kernel_name.lower()
    if "conv" in op or (not op and ("conv" in kernel or "fprop" in kernel or "implicit_gemm" in kernel)):
        return "convolution"
    if "batch_norm" in op or (not op and ("batch_norm" in kernel or "bn_fw" in kernel)):
        return "batch_norm"
    return "other"


def union_length(intervals) -> float:
    """Total length covered by (start, end) intervals, overlaps counted once (active GPU time)."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def summarize_kernels(kernels: list[tuple[str, str, float, float]], wall_ms: float) -> list[dict]:
    """Profile rows from ``(launching_op, kernel_name, start_us, end_us)`` tuples (Chapter 5).

    One row per category with its kernel count, summed kernel time and share of the summed time,
    each carrying the total kernel count, the active GPU time (union of kernel intervals) and
    the host wall time of the profiled forward.
    """
    sums = {c: [0, 0.0] for c in KERNEL_CATEGORIES}
    for op, name, start, end in kernels:
        bucket = sums[kernel_category(op, name)]
        bucket[0] += 1
        bucket[1] += (end - start) / 1e3
    kernel_total = sum(v[1] for v in sums.values()) or 1.0
    active = union_length([(s, e) for _, _, s, e in kernels]) / 1e3
    return [{"category": c, "kernels": sums[c][0], "kernel_ms": sums[c][1],
             "share": sums[c][1] / kernel_total, "total_kernels": len(kernels),
             "active_gpu_ms": active, "wall_ms": wall_ms} for c in KERNEL_CATEGORIES]


def build_rows(measurements: list[dict], profiles: dict) -> list[dict]:
    """CSV rows from measurement dicts and ``{variant: [profile rows]}`` (Chapter 5).

    Adds each variant's speed-up over eager (NCHW, no cuDNN benchmark) at the same precision and
    over eager FP32; every row gets every column of :data:`CSV_COLUMNS` (empty where not applicable).
    """
    def eager_time(precision):
        for m in measurements:
            if (m["precision"], m["mode"], m["layout"], bool(m["cudnn_benchmark"])) == (
                    precision, "eager", "nchw", False) and m.get("median_ms"):
                return m["median_ms"]
        return None

    rows = []
    fp32 = eager_time("fp32")
    for m in measurements:
        row = {c: "" for c in CSV_COLUMNS}
        row.update({k: v for k, v in m.items() if k in CSV_COLUMNS})
        row["record"] = "variant"
        same = eager_time(m["precision"])
        if m.get("median_ms"):
            row["speedup_vs_eager_same_precision"] = same / m["median_ms"] if same else ""
            row["speedup_vs_eager_fp32"] = fp32 / m["median_ms"] if fp32 else ""
        rows.append(row)
    for variant, groups in profiles.items():
        source = next((m for m in measurements if m["variant"] == variant), {})
        for group in groups:
            row = {c: "" for c in CSV_COLUMNS}
            row.update({"record": "profile", "variant": variant,
                        **{k: source.get(k, "") for k in ("precision", "mode", "layout", "cudnn_benchmark")},
                        **{k: group[k] for k in PROFILE_COLUMNS}})
            rows.append(row)
    return rows


def write_results(rows: list[dict], env: dict, out_dir: Path, device_name: str,
                  date: str | None = None) -> Path:
    """Write rows to a new ``gpu-<device>-<date>[-N].csv`` in ``out_dir``; never an existing file."""
    from graphbook import results

    date = date or dt.date.today().isoformat()
    path = results.unique_path(out_dir, f"gpu-{device_slug(device_name)}-{date}")
    return results.append_rows(path, rows, env=env)


def format_table(rows: list[dict]) -> str:
    """Text table of the variant rows and the profile rows."""
    lines = [f"{'variant':42s} {'median ms':>9s} {'x same':>7s} {'x fp32':>7s} {'compile s':>9s} "
             f"{'max|diff|':>9s} {'peaks':>5s}"]
    fmt = lambda v, spec: format(v, spec) if v != "" and v is not None else " " * len(format(0.0, spec))
    for r in rows:
        if r["record"] == "variant":
            peaks = "" if r["peaks_equal"] == "" else ("same" if r["peaks_equal"] else "DIFF")
            lines.append(f"{r['variant']:42s} {fmt(r['median_ms'], '9.2f')} "
                         f"{fmt(r['speedup_vs_eager_same_precision'], '7.2f')} "
                         f"{fmt(r['speedup_vs_eager_fp32'], '7.2f')} {fmt(r['first_call_s'], '9.1f')} "
                         f"{fmt(r['max_abs_diff'], '9.1e')} {peaks:>5s} {r['note']}")
    profile_rows = [r for r in rows if r["record"] == "profile"]
    if profile_rows:
        lines.append("")
        lines.append(f"{'profiled variant':42s} {'category':12s} {'kernels':>7s} {'ms':>7s} {'share':>6s} "
                     f"{'total':>6s} {'active ms':>9s} {'wall ms':>8s}")
        for r in profile_rows:
            lines.append(f"{r['variant']:42s} {r['category']:12s} {r['kernels']:7d} {r['kernel_ms']:7.2f} "
                         f"{r['share']:6.1%} {r['total_kernels']:6d} {r['active_gpu_ms']:9.2f} {r['wall_ms']:8.2f}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The parts that need a GPU
# --------------------------------------------------------------------------------------------------

def _autocast(precision: str):
    import contextlib

    import torch

    if precision == "fp16":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def build_call(config: dict, model, x, *, fresh_cache: bool = True):
    """``(call, first_call_seconds)`` for one configuration on CUDA (Chapter 5).

    ``call()`` returns a fresh output tensor (CUDA-graph outputs are cloned before the next replay).
    """
    import copy

    import torch

    from graphbook.compiletime import compile_and_first_call

    precision, mode = config["precision"], config["mode"]
    if config["layout"] == "channels_last":
        model = copy.deepcopy(model).to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    if mode == "eager":
        def eager():
            with _autocast(precision):
                return model(x)
        return eager, 0.0

    def forward(inp):
        with _autocast(precision):
            return model(inp)

    with torch.no_grad():
        compiled, seconds = compile_and_first_call(forward, (x,), fresh_cache=fresh_cache,
                                                   mode=TORCH_MODE[mode])
    uses_graphs = mode != "compile_default"

    def call():
        if uses_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        return compiled(x)
    return call, seconds


def profile_call(call) -> list[dict]:
    """Profile one call: kernels grouped by the top-level op that launched them (Chapter 5)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    kernels = []
    device_events = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    launched_by = {}
    for event in prof.events():
        for kernel in getattr(event, "kernels", []) or []:
            top = event
            while top.cpu_parent is not None and top.cpu_parent.name.startswith("aten::"):
                top = top.cpu_parent
            launched_by.setdefault(kernel.name, []).append(top.name)
    for event in device_events:
        name = event.name
        if any(word in name for word in ("Memcpy", "Memset")):
            continue  # copies are not kernels the model launches
        owners = launched_by.get(name)
        op = owners.pop(0) if owners else ""
        kernels.append((op, name, event.time_range.start, event.time_range.end))
    return summarize_kernels(kernels, wall_ms)


def measure(args: argparse.Namespace, log=print) -> list[dict]:
    """Run the matrix on CUDA and return the CSV rows (Chapter 5). Assumes :func:`cuda_problem` is None."""
    import torch

    from graphbook import blurball
    from graphbook.timing import time_cuda

    started = time.perf_counter()
    model = blurball.build_blurball(args.weights).cuda()
    x = blurball.example_input().cuda()
    with torch.no_grad():
        reference = model(x).float()
    default_benchmark = torch.backends.cudnn.benchmark
    measurements, profiles = [], {}
    for config in plan_matrix(args.skip_max_autotune):
        entry = dict(config, note="")
        elapsed = time.perf_counter() - started
        if config["mode"] == "compile_max_autotune" and elapsed > TOTAL_BUDGET_S - MAX_AUTOTUNE_BUDGET_S:
            entry["note"] = f"skipped: {elapsed:.0f} s already used of the {TOTAL_BUDGET_S:.0f} s budget"
            measurements.append(entry)
            log(f"{config['variant']}: {entry['note']}")
            continue
        log(f"{config['variant']}: building, checking, timing ...")
        torch.backends.cudnn.benchmark = bool(config["cudnn_benchmark"])
        try:
            with torch.no_grad():
                call, first_call_s = build_call(config, model, x, fresh_cache=not args.warm_cache)
                output = call().float().clone()
                entry["max_abs_diff"] = float((output - reference).abs().max())
                entry["peaks_equal"] = bool(
                    (blurball.heatmap_peaks(output) == blurball.heatmap_peaks(reference)).all())
                timing = time_cuda(call, warmup=args.warmup, repeats=args.repeats, name=config["variant"])
                entry.update(timing.as_dict(), first_call_s=first_call_s)
                key = (config["precision"], config["mode"])
                if (not args.no_profile and key in PROFILED and config["layout"] == "nchw"
                        and not config["cudnn_benchmark"]):
                    profiles[config["variant"]] = profile_call(call)
        except Exception as exc:  # one failing mode must not lose the others' results
            entry["note"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        finally:
            torch.backends.cudnn.benchmark = default_benchmark
        measurements.append(entry)
        log(f"  {entry.get('median_ms', float('nan')):.2f} ms {entry['note']}")
    return build_rows(measurements, profiles)


def main(argv=None) -> int:
    args = parse_args(argv)
    problem = cuda_problem()
    if problem is not None:
        print(f"{PROG}: no GPU measurement: {problem}", file=sys.stderr)
        return EXIT_NO_CUDA
    if args.weights is not None and not args.weights.is_file():
        print(f"{PROG}: error: --weights {args.weights} is not a file", file=sys.stderr)
        return EXIT_BAD_ARGS
    import torch

    from graphbook.book import RESULTS_DIR
    from graphbook.environment import fingerprint

    env = fingerprint()
    env["cudnn_version"] = str(torch.backends.cudnn.version())
    env["cudnn_allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
    env["weights"] = args.weights.name if args.weights else "seeded-random"
    rows = measure(args)
    path = write_results(rows, env, args.out_dir or RESULTS_DIR, env["gpu_name"] or "cuda")
    print()
    print(format_table(rows))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
