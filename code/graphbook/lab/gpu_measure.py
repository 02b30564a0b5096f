"""The BlurBall GPU measurement matrix behind ``code/gpu_blurball.py`` (Chapter 5)."""
from __future__ import annotations

import argparse
import contextlib
import copy
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from torch._inductor.utils import fresh_inductor_cache

from graphbook.lab import gpu_profiling as gp
from graphbook.measure import timing
from graphbook.paths import CODE_DIR
from graphbook.record.cli import make_parser, positive_int, resource_absent
from graphbook.runtimes import correctness

PROG = "gpu_blurball.py"
KIND = "gpu-blurball"
#: The command line the cuDNN-benchmark child process runs.
SCRIPT = CODE_DIR / "gpu_blurball.py"
PRECISIONS = ("fp32", "fp16")
COMPILE_MODES = ("compile_default", "compile_reduce_overhead", "compile_max_autotune")
TORCH_MODE = {"compile_default": "default", "compile_reduce_overhead": "reduce-overhead",
              "compile_max_autotune": "max-autotune"}
PROFILED = (("fp32", "eager"), ("fp16", "eager"), ("fp16", "compile_default"))
# Start max-autotune only if this much of the 8-minute budget is left (its compile is the slow one).
MAX_AUTOTUNE_BUDGET_S = 240.0
TOTAL_BUDGET_S = 480.0

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
    parser.add_argument("--cudnn-benchmark-child", type=Path, default=None, help=argparse.SUPPRESS)
    return gp.parse_lab_args(parser, argv, "--weights")


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
    return [dict(precision=precision, mode=mode, layout=layout, cudnn_benchmark=benchmark,
                 variant=f"{precision}_{mode}_{layout}" + ("+cudnn_benchmark" if benchmark else ""),
                 fp16_method=gp.FP16_AUTOCAST if precision == "fp16" else "",
                 process="child" if benchmark else "main")
            for mode, layout, benchmark in settings + [(m, "nchw", False) for m in modes] for precision in PRECISIONS]


def _build_rows(measurements: list[dict], profiles: dict, *, device: str = "cuda", smoke: bool = False) -> list[dict]:
    """CSV rows from measurement dicts and ``{variant: [profile rows]}`` (Chapter 5)."""
    def blank():
        return {**{c: "" for c in CSV_COLUMNS}, "device": device, "smoke": bool(smoke)}

    medians = {m["variant"]: m.get("median_ms") for m in measurements}
    fp32 = medians.get("fp32_eager_nchw")
    rows = []
    for m in measurements:
        row = blank()
        row.update({k: v for k, v in m.items() if k in CSV_COLUMNS})
        row["record"] = "variant"
        same = medians.get(f"{m['precision']}_eager_nchw")
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


def format_table(rows: list[dict]) -> str:
    """Text table of the variant rows, then of the profile rows (Chapter 5)."""
    frame = pd.DataFrame(rows).replace("", None).infer_objects()
    shown = ["variant", "median_ms", "speedup_vs_eager_same_precision", "speedup_vs_eager", "compile_s",
             "second_call_s", "max_abs_diff", "same_peaks", "note"]
    tables = [frame.loc[frame.record == kind, columns] for kind, columns in
              (("variant", shown), ("profile", ["variant"] + PROFILE_COLUMNS))]
    return "\n\n".join(t.to_string(index=False, na_rep="", float_format="{:.3g}".format) for t in tables if len(t))


# ---- The measurement (CUDA, or the CPU in --smoke)

def _build_call(config: dict, model, x, *, device: str = "cuda", fresh_cache: bool = True):
    """``(call, first_call_s, second_call_s)`` for one configuration (Chapter 5)."""
    precision, mode = config["precision"], config["mode"]
    if config["layout"] == "channels_last":
        model = copy.deepcopy(model).to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)

    def forward(inp):
        with torch.autocast(device, dtype=torch.float16) if precision == "fp16" else contextlib.nullcontext():
            return model(inp)

    sync = gp.synchronizer(device)
    if mode == "eager":
        call = lambda: forward(x)
        (first,) = gp.first_calls(call, 1, synchronize=sync)
        return call, first, ""

    graphs = TORCH_MODE[mode] in gp.CUDAGRAPH_MODES
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
        except Exception as error:  # one failing mode must not lose the others' results
            entry["note"] = gp.failure_note(error)
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
        return resource_absent(PROG, f"no GPU measurement: {cuda_problem()}")
    model, x = gp.model_and_input(args.smoke, device, args.weights)
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
    model, x = gp.model_and_input(args.smoke, device, args.weights)
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


def environment(args) -> dict:
    """The run's provenance: the lab fingerprint plus cuDNN's version and TF32 setting (Chapter 5)."""
    return gp.environment(args.smoke, args.weights.name if args.weights else "seeded-random",
                          cudnn_version=str(torch.backends.cudnn.version()),
                          cudnn_allow_tf32=bool(torch.backends.cudnn.allow_tf32))
