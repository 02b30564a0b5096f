"""The BlurBall GPU measurement matrix behind ``code/gpu_blurball.py`` (Chapter 5)."""
from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from torch._inductor.utils import fresh_inductor_cache

from graphbook.lab import gpu_profiling as gp
from graphbook.measure import timing
from graphbook.measure.environment import fingerprint
from graphbook.model import blurball
from graphbook.paths import CODE_DIR, DATA_DIR
from graphbook.record import results
from graphbook.record.cli import EXIT_RESOURCE_ABSENT, make_parser, positive_int
from graphbook.runtimes import correctness

PROG = "gpu_blurball.py"
#: The committed results: a smoke run (a CPU stand-in) must never write there.
BOOK_RESULTS = (DATA_DIR / "results").resolve()
KIND = "gpu-blurball"
#: The command line the cuDNN-benchmark child process runs.
SCRIPT = CODE_DIR / "gpu_blurball.py"
EXIT_NO_CUDA = EXIT_RESOURCE_ABSENT
PRECISIONS = ("fp32", "fp16")
COMPILE_MODES = ("compile_default", "compile_reduce_overhead", "compile_max_autotune")
TORCH_MODE = {"compile_default": "default", "compile_reduce_overhead": "reduce-overhead",
              "compile_max_autotune": "max-autotune"}
PROFILED = (("fp32", "eager"), ("fp16", "eager"), ("fp16", "compile_default"))
KERNEL_CATEGORIES = gp.KERNEL_CATEGORIES
# Start max-autotune only if this much of the 8-minute budget is left (its compile is the slow one).
MAX_AUTOTUNE_BUDGET_S = 240.0
TOTAL_BUDGET_S = 480.0
SMOKE = dict(height=32, width=64, repeats=2, warmup=1)

# Column names are graphbook.record.results' canonical ones: compile_s is the synchronized first call (the
# compile for compiled modes), second_call_s the CUDA-graph recording call.
VARIANT_COLUMNS = ["record", "variant", "precision", "fp16_method", "mode", "layout", "cudnn_benchmark",
                   "process", "median_ms", "min_ms", "max_ms", "q1_ms", "q3_ms", "repeats", "warmup",
                   "compile_s", "second_call_s", "sm_count", "inductor_is_big_gpu", "expected_to_match_eager",
                   "max_abs_diff", "relative_diff", "same_output", "same_peak_frames", "peak_frames", "same_peaks",
                   "speedup_vs_eager_same_precision", "speedup_vs_eager", "note"]
PROFILE_COLUMNS = ["category", "kernels", "kernel_ms", "share", "total_kernels", "active_gpu_ms",
                   "wall_ms"]
CSV_COLUMNS = VARIANT_COLUMNS + PROFILE_COLUMNS + ["device", "smoke"]


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (Chapter 5). Bad values exit 2 with one line on stderr."""
    parser = make_parser(PROG, "BlurBall GPU measurement matrix (Chapter 5).")
    parser.add_argument("--repeats", type=positive_int, default=50, help="timed calls (article: 50)")
    parser.add_argument("--warmup", type=positive_int, default=20, help="untimed calls (article: 20)")
    parser.add_argument("--skip-max-autotune", action="store_true",
                        help="leave out max-autotune (its compile takes minutes)")
    parser.add_argument("--no-profile", action="store_true", help="skip the kernel profiles")
    parser.add_argument("--warm-cache", action="store_true",
                        help="compile with the on-disk Inductor cache instead of a fresh (cold) one")
    parser.add_argument("--weights", type=Path, default=None,
                        help="BlurBall checkpoint (authors' format); default: seeded random weights")
    parser.add_argument("--smoke", action="store_true",
                        help="run the whole pipeline on the CPU with a tiny model and sizes (needs --results-dir)")
    parser.add_argument("--cudnn-benchmark-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke and args.results_dir.resolve() == BOOK_RESULTS and args.cudnn_benchmark_child is None:
        parser.error("--smoke needs --results-dir (smoke rows must not reach data/results)")
    if args.weights is not None and not args.weights.is_file():
        parser.error(f"--weights {args.weights} is not a file")
    if args.smoke:
        args.repeats, args.warmup = SMOKE["repeats"], SMOKE["warmup"]
    return args


def cuda_problem() -> str | None:
    """Why this machine cannot run the GPU matrix, or None when it can (Chapter 5)."""
    if not torch.cuda.is_available():
        built = torch.version.cuda
        if built is None:
            return (f"torch {torch.__version__} is a CPU-only build (no CUDA); install a CUDA build "
                    f"of torch on a machine with an NVIDIA GPU")
        return f"torch {torch.__version__} (CUDA {built}) sees no CUDA device on this machine"
    return None


def plan_matrix(skip_max_autotune: bool = False) -> list[dict]:
    """The configurations to measure, in order: eager first, max-autotune last (Chapter 5)."""
    modes = [m for m in COMPILE_MODES if not (skip_max_autotune and m == "compile_max_autotune")]
    settings = [("eager", "nchw", False), ("eager", "channels_last", False), ("eager", "nchw", True)]
    plan = [dict(precision=precision, mode=mode, layout=layout, cudnn_benchmark=benchmark)
            for mode, layout, benchmark in settings + [(m, "nchw", False) for m in modes] for precision in PRECISIONS]
    for config in plan:
        config["variant"] = _variant_name(config)
        config["fp16_method"] = gp.FP16_AUTOCAST if config["precision"] == "fp16" else ""
        config["process"] = "child" if config["cudnn_benchmark"] else "main"
    return plan


def _variant_name(config: dict) -> str:
    """``fp16_compile_default_nchw`` style name; ``+cudnn_benchmark`` when it is on (Chapter 5)."""
    name = f"{config['precision']}_{config['mode']}_{config['layout']}"
    return name + ("+cudnn_benchmark" if config.get("cudnn_benchmark") else "")


summarize_kernels = gp.summarize_kernels


def _build_rows(measurements: list[dict], profiles: dict, *, device: str = "cuda", smoke: bool = False) -> list[dict]:
    """CSV rows from measurement dicts and ``{variant: [profile rows]}`` (Chapter 5)."""
    def eager_time(precision):
        for m in measurements:
            if (m["precision"], m["mode"], m["layout"], bool(m["cudnn_benchmark"])) == (
                    precision, "eager", "nchw", False) and m.get("median_ms"):
                return m["median_ms"]
        return None

    def blank():
        return {**{c: "" for c in CSV_COLUMNS}, "device": device, "smoke": bool(smoke)}

    rows = []
    fp32 = eager_time("fp32")
    for m in measurements:
        row = blank()
        row.update({k: v for k, v in m.items() if k in CSV_COLUMNS})
        row["record"] = "variant"
        same = eager_time(m["precision"])
        if m.get("median_ms"):
            row["speedup_vs_eager_same_precision"] = same / m["median_ms"] if same else ""
            row["speedup_vs_eager"] = fp32 / m["median_ms"] if fp32 else ""
        rows.append(row)
    for variant, groups in profiles.items():
        source = next((m for m in measurements if m["variant"] == variant), {})
        for group in groups:
            row = blank()
            row.update({"record": "profile", "variant": variant,
                        **{k: source.get(k, "") for k in ("precision", "fp16_method", "mode", "layout",
                                                          "cudnn_benchmark", "process")},
                        **{k: group[k] for k in PROFILE_COLUMNS}})
            rows.append(row)
    return rows


def failed_variants(rows: list[dict]) -> list[str]:
    """Variants that failed (Chapter 5): their build or run raised (note ``failed: ...``), or an FP32
    variant, expected to match eager FP32, did not (``same_output`` False). FP16 variants are recorded
    with their difference, never expected to match."""
    return [r["variant"] for r in rows if r["record"] == "variant"
            and (str(r["note"]).startswith("failed") or (r["expected_to_match_eager"] is True
                                                         and r["same_output"] is False))]


def write_results(rows: list[dict], env: dict, results_dir: Path | None, device_name: str) -> Path:
    """Write rows to a new ``gpu-blurball-<device>-<date>[-N].csv``; never an existing file (Chapter 5)."""
    return results.write_run(KIND, rows, env, results_dir=results_dir, tag=gp.device_slug(device_name))


def format_table(rows: list[dict]) -> str:
    """Text table of the variant rows, then of the profile rows (Chapter 5)."""
    frame = pd.DataFrame(rows).replace("", None).infer_objects()
    shown = ["variant", "median_ms", "speedup_vs_eager_same_precision", "speedup_vs_eager", "compile_s",
             "second_call_s", "max_abs_diff", "same_peaks", "note"]
    tables = [frame.loc[frame.record == kind, columns] for kind, columns in
              (("variant", shown), ("profile", ["variant"] + PROFILE_COLUMNS))]
    return "\n\n".join(t.to_string(index=False, na_rep="", float_format="{:.3g}".format) for t in tables if len(t))


# ---- The measurement (CUDA, or the CPU in --smoke)

def _autocast(precision: str, device: str):
    return torch.autocast(device, dtype=torch.float16) if precision == "fp16" else contextlib.nullcontext()


def _sync(device: str):
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _build_call(config: dict, model, x, *, device: str = "cuda", fresh_cache: bool = True):
    """``(call, first_call_s, second_call_s)`` for one configuration (Chapter 5)."""
    precision, mode = config["precision"], config["mode"]
    if config["layout"] == "channels_last":
        model = copy.deepcopy(model).to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)

    def forward(inp):
        with _autocast(precision, device):
            return model(inp)

    sync = _sync(device)
    if mode == "eager":
        call = lambda: forward(x)
        (first,) = gp.first_calls(call, 1, synchronize=sync)
        return call, first, ""

    graphs = gp.uses_cuda_graphs(TORCH_MODE[mode])
    mark = torch.compiler.cudagraph_mark_step_begin if graphs and device == "cuda" else None
    torch._dynamo.reset()
    with fresh_inductor_cache() if fresh_cache else contextlib.nullcontext():
        compiled = torch.compile(forward, mode=TORCH_MODE[mode])
        times = gp.first_calls(lambda: compiled(x), 2 if graphs else 1, synchronize=sync, before_each=mark)

    def call():
        if mark is not None:
            mark()
        return compiled(x)
    return call, times[0], (times[1] if graphs else "")


def _load_model_and_input(args, device: str):
    """The model and input for a run: BlurBall at 288 x 512, or the smoke stand-in at 32 x 64 (Chapter 5)."""
    if args.smoke:
        return (gp.smoke_model(), blurball.example_input(height=SMOKE["height"], width=SMOKE["width"]))
    return blurball.build_blurball(args.weights).to(device), blurball.example_input().to(device)


def _measure_configs(configs, model, x, reference, args, *, device: str, log=print, started=None,
                    profiles: dict | None = None) -> list[dict]:
    """Check, time (and profile) each configuration in this process; one entry per configuration (Chapter 5)."""
    started = started if started is not None else time.perf_counter()
    measurements = []
    for config in configs:
        entry = dict(config, note="", expected_to_match_eager=config["precision"] == "fp32")
        elapsed = time.perf_counter() - started
        if config["mode"] == "compile_max_autotune":
            entry.update(gp.autotune_verdict() if device == "cuda" else {"sm_count": "", "inductor_is_big_gpu": ""})
            if elapsed > TOTAL_BUDGET_S - MAX_AUTOTUNE_BUDGET_S and not args.smoke:
                entry["note"] = f"skipped: {elapsed:.0f} s already used of the {TOTAL_BUDGET_S:.0f} s budget"
                measurements.append(entry)
                log(f"{config['variant']}: {entry['note']}")
                continue
        log(f"{config['variant']}: building, checking, timing ...")
        try:
            with torch.no_grad():
                call, first_s, second_s = _build_call(config, model, x, device=device,
                                                     fresh_cache=not args.warm_cache)
                output = call().float().clone()
                entry.update(correctness.compare_to_reference(output, reference))
                entry.pop("reference_scale", None)
                result = timing.time_cpu(call, warmup=args.warmup, repeats=args.repeats)  # the Timer syncs CUDA
                entry.update(result.as_dict(), compile_s=first_s, second_call_s=second_s)
                key = (config["precision"], config["mode"])
                if (profiles is not None and not args.no_profile and key in PROFILED
                        and config["layout"] == "nchw" and not config["cudnn_benchmark"]):
                    profiles[config["variant"]] = gp.profile_call(call, device)
        except Exception as exc:  # one failing mode must not lose the others' results
            entry["note"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        measurements.append(entry)
        log(f"  {entry.get('median_ms', float('nan')):.2f} ms {entry['note']}")
    return measurements


def _child_argv(args, reference_path: Path) -> list[str]:
    """The command line of the child process that measures the ``+cudnn_benchmark`` rows (Chapter 5)."""
    argv = [str(SCRIPT), "--cudnn-benchmark-child", str(reference_path),
            "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
    if args.smoke:
        argv.append("--smoke")
    if args.weights is not None:
        argv += ["--weights", str(args.weights)]
    if args.warm_cache:
        argv.append("--warm-cache")
    return argv


def run_cudnn_benchmark_child(args) -> int:
    """Child process: turn cuDNN benchmark on before any convolution, measure the benchmark rows (Chapter 5)."""
    torch.backends.cudnn.benchmark = True  # before the model exists: no convolution has run in this process
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and cuda_problem() is not None:
        print(f"{PROG}: no GPU measurement: {cuda_problem()}", file=sys.stderr)
        return EXIT_NO_CUDA
    model, x = _load_model_and_input(args, device)
    reference = torch.load(args.cudnn_benchmark_child).to(device)
    configs = [c for c in plan_matrix(True) if c["process"] == "child"]
    entries = _measure_configs(configs, model, x, reference, args, device=device, log=lambda *_: None)
    for entry in entries:
        entry["cudnn_benchmark_in_force"] = bool(torch.backends.cudnn.benchmark)
    gp.emit_child_rows(entries)
    return 0


def measure(args: argparse.Namespace, log=print) -> list[dict]:
    """Run the matrix and return the CSV rows (Chapter 5)."""
    device = "cpu" if args.smoke else "cuda"
    started = time.perf_counter()
    torch.backends.cudnn.benchmark = False
    model, x = _load_model_and_input(args, device)
    model = model.eval()
    with torch.no_grad():
        reference = model(x).float()
    plan = plan_matrix(args.skip_max_autotune)
    profiles: dict = {}
    main_rows = _measure_configs([c for c in plan if c["process"] == "main"], model, x, reference, args,
                                device=device, log=log, started=started, profiles=profiles)
    child_configs = [c for c in plan if c["process"] == "child"]
    with tempfile.TemporaryDirectory(prefix="gpu-blurball-") as tmp:
        reference_path = Path(tmp) / "reference.pt"
        torch.save(reference.cpu(), reference_path)
        log("cuDNN benchmark rows: measuring in a separate process ...")
        try:
            child_rows = gp.run_child(_child_argv(args, reference_path))
            for row in child_rows:
                if not row.pop("cudnn_benchmark_in_force", False):
                    row["note"] = "failed: the child process did not have cudnn.benchmark on"
        except RuntimeError as error:
            child_rows = [dict(c, note=f"failed: {error}"[:300]) for c in child_configs]
    by_variant = {r["variant"]: r for r in main_rows + child_rows}
    measurements = [by_variant[c["variant"]] for c in plan if c["variant"] in by_variant]
    return _build_rows(measurements, profiles, device=device, smoke=args.smoke)


def environment(args, device: str) -> dict:
    """The run's provenance: the fingerprint plus cuDNN, SM count, weights and the smoke flag (Chapter 5)."""
    return {**fingerprint(), "cudnn_version": str(torch.backends.cudnn.version()),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "gpu_sm_count": int(torch.cuda.get_device_properties(0).multi_processor_count) if device == "cuda" else "",
            "weights": "smoke stand-in model" if args.smoke else args.weights.name if args.weights else "seeded-random"}
