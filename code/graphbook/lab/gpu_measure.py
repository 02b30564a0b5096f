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
from graphbook.method.bench import build_check_time
from graphbook.method.variants import VariantUnavailable, own_code
from graphbook.paths import CODE_DIR
from graphbook.record.cli import make_parser, positive_int, resource_absent

PROG = "gpu_blurball.py"
KIND = "gpu-blurball"
#: The command line the cuDNN-benchmark child process runs.
SCRIPT = CODE_DIR / "gpu_blurball.py"
PRECISIONS = ("fp32", "fp16")
COMPILE_MODES = ("compile_default", "compile_reduce_overhead", "compile_max_autotune")
TORCH_MODE = {"compile_default": "default", "compile_reduce_overhead": "reduce-overhead",
              "compile_max_autotune": "max-autotune"}
PROFILED = ("fp32_eager_nchw", "fp16_eager_nchw", "fp16_compile_default_nchw")
# Start max-autotune only if this much of the 8-minute budget is left (its compile is the slow one).
MAX_AUTOTUNE_BUDGET_S = 240.0
TOTAL_BUDGET_S = 480.0
PROFILE_COLUMNS = ["category", "kernels", "kernel_ms", "share", "total_kernels", "active_gpu_ms", "wall_ms"]


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
                 fp16_method=gp.FP16_AUTOCAST if precision == "fp16" else None,
                 process="child" if benchmark else "main")
            for mode, layout, benchmark in settings + [(m, "nchw", False) for m in modes] for precision in PRECISIONS]


def format_table(frame: pd.DataFrame) -> str:
    """Text table of the variant rows, then of the profile rows (Chapter 5)."""
    shown = ["run", "variant", "median_ms", "speedup_vs_eager_same_precision", "speedup_vs_eager", "compile_s",
             "second_call_s", "max_abs_diff", "same_peaks", "note"]
    tables = [frame[frame.record == kind].reindex(columns=columns) for kind, columns in
              (("variant", shown), ("profile", ["variant"] + PROFILE_COLUMNS))]
    return "\n\n".join(t.to_string(index=False, na_rep="", float_format="{:.3g}".format) for t in tables if len(t))


# ---- The measurement (CUDA, or the CPU in --smoke)
def _build_call(config: dict, model, x, *, device: str = "cuda", fresh_cache: bool = True):
    """``(call, first_call_s, second_call_s)`` of one configuration, a compiled mode on its own model copy."""
    if config["layout"] == "channels_last":
        model = copy.deepcopy(model).to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    mode = TORCH_MODE.get(config["mode"])
    module = model if mode is None else torch.compile(own_code(model), mode=mode)
    graphs = mode in gp.CUDAGRAPH_MODES
    mark = torch.compiler.cudagraph_mark_step_begin if graphs and device == "cuda" else (lambda: None)
    fp16 = torch.autocast(device, dtype=torch.float16) if config["precision"] == "fp16" else contextlib.nullcontext()

    def call():
        mark()
        with torch.no_grad(), fp16:
            return module(x)
    with fresh_inductor_cache() if fresh_cache else contextlib.nullcontext():
        times = gp.first_calls(call, 2 if graphs else 1, synchronize=gp.synchronizer(device))
    return call, times[0], (times[1] if graphs else None)


def _measure(configs, model, x, reference, args, *, device: str, log=print, profiles: list | None = None):
    """Build and check each configuration in this process, then time them all in the run protocol (Chapter 5)."""
    started = time.perf_counter()

    def builder(config):
        def build():
            elapsed = time.perf_counter() - started
            if config["mode"] == "compile_max_autotune" and elapsed > TOTAL_BUDGET_S - MAX_AUTOTUNE_BUDGET_S \
                    and not args.smoke:
                raise VariantUnavailable(f"{elapsed:.0f} s already used of the {TOTAL_BUDGET_S:.0f} s budget")
            call, first_s, second_s = _build_call(config, model, x, device=device, fresh_cache=not args.warm_cache)
            if profiles is not None and not args.no_profile and config["variant"] in PROFILED:
                profiles.append(pd.DataFrame(gp.profile_call(call, device)).assign(**config, record="profile"))
            return call, {"compile_s": first_s, "second_call_s": second_s}
        return gp.lab_builder(build)
    columns = {c["variant"]: dict(c, record="variant", expected_to_match_eager=c["precision"] == "fp32",
                                  **(gp.autotune_verdict() if c["mode"] == "compile_max_autotune" else {}))
               for c in configs}
    return build_check_time({c["variant"]: builder(c) for c in configs}, x, reference, columns=columns, log=log,
                            warmup=args.warmup, repeats=args.repeats)[0]


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
    frame = _measure([c for c in plan_matrix(True) if c["process"] == "child"], model, x, reference, args,
                     device=device, log=lambda *_: None)
    if not torch.backends.cudnn.benchmark:
        frame["note"] = "failed: the child process did not have cudnn.benchmark on"
    gp.emit_child_rows(frame.to_dict("records"))
    return 0


def measure(args: argparse.Namespace, log=print) -> pd.DataFrame:
    """The kernel profiles, then the variant rows run by run, with speed-ups over the same run's eager (Chapter 5)."""
    device = "cpu" if args.smoke else "cuda"
    torch.backends.cudnn.benchmark = False
    model, x = gp.model_and_input(args.smoke, device, args.weights)
    with torch.no_grad():
        reference = model(x).float()
    plan, profiles = plan_matrix(args.skip_max_autotune), []
    main = _measure([c for c in plan if c["process"] == "main"], model, x, reference, args, device=device, log=log,
                    profiles=profiles)
    with tempfile.TemporaryDirectory(prefix="gpu-blurball-") as tmp:
        torch.save(reference.cpu(), Path(tmp) / "reference.pt")
        log("cuDNN benchmark rows: measuring in a separate process ...")
        try:
            child = pd.DataFrame(gp.run_child(_child_argv(args, Path(tmp) / "reference.pt")))
        except RuntimeError as error:
            child = pd.DataFrame([dict(c, record="variant", note=f"failed: {error}"[:300]) for c in plan
                                  if c["process"] == "child"])
    frame = pd.concat([*profiles, main, child]).sort_values("run", kind="stable", na_position="first",
                                                            ignore_index=True)
    eager = frame["median_ms"].where(frame["variant"] == frame["precision"] + "_eager_nchw")
    return frame.assign(
        speedup_vs_eager_same_precision=eager.groupby([frame["run"], frame["precision"]]).transform("max")
        / frame["median_ms"],
        speedup_vs_eager=eager.where(frame["precision"] == "fp32").groupby(frame["run"]).transform("max")
        / frame["median_ms"])


def environment(args) -> dict:
    """The run's provenance: the lab fingerprint plus cuDNN's version and TF32 setting (Chapter 5)."""
    return gp.environment(args.smoke, args.weights.name if args.weights else "seeded-random",
                          cudnn_version=str(torch.backends.cudnn.version()),
                          cudnn_allow_tf32=bool(torch.backends.cudnn.allow_tf32))
