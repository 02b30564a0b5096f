"""What the GPU scripts need to measure right the first time on a lab machine (Chapter 5)."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import pandas as pd
import torch
from torch._inductor.utils import is_big_gpu
from torch.profiler import ProfilerActivity, profile

from graphbook.measure.compiletime import run_tagged_child
from graphbook.measure.environment import fingerprint
from graphbook.measure.warmup import tiny_clip_net
from graphbook.method.variants import VariantUnavailable
from graphbook.model import blurball
from graphbook.paths import DATA_DIR
from graphbook.record import results
from graphbook.runtimes.profiling import CATEGORIES, cpu_op_units, device_kind as _device_kind, is_annotation, op_category

#: Inductor marks CUDA-graph modes by these ``torch.compile`` mode names.
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")
#: Inductor's threshold in ``is_big_gpu`` (torch 2.5 to 2.13): fewer SMs and max-autotune's Triton
#: GEMM/convolution templates are skipped.
INDUCTOR_MIN_SMS = 68
#: How ``fp16`` was obtained: these two are not comparable, so every row says which.
FP16_AUTOCAST = "autocast"
FP16_HALF = "model.half()"
FP16_ONNX = "fp16 onnx graph"
#: A ``--smoke`` run: the stand-in model at this size, timed this many calls, the whole pipeline on a CPU.
SMOKE = dict(height=32, width=64, repeats=2, warmup=1)

_SKIPPED_DEVICE_EVENTS = ("Memcpy", "Memset")


# ---- What both GPU scripts share: options, model, provenance, rows, files
def parse_lab_args(parser: argparse.ArgumentParser, argv, *file_options: str) -> argparse.Namespace:
    """Add ``--smoke`` and parse; smoke rows need their own ``--results-dir``, each of ``file_options`` a file."""
    parser.add_argument("--smoke", action="store_true",
                        help="run the whole pipeline on the CPU with a tiny model and sizes (needs --results-dir)")
    args = parser.parse_args(argv)
    child = getattr(args, "cudnn_benchmark_child", None) is not None  # a child process writes no file
    if args.smoke and not child and args.results_dir.resolve() == (DATA_DIR / "results").resolve():
        parser.error("--smoke needs --results-dir (smoke rows must not reach data/results)")
    for option in file_options:
        path = getattr(args, option.removeprefix("--").replace("-", "_"))
        if path is not None and not path.is_file():
            parser.error(f"{option} {path} is not a file")
    if args.smoke:
        args.repeats, args.warmup = SMOKE["repeats"], SMOKE["warmup"]
    return args


def lab_input(smoke: bool, seed: int = blurball.DEFAULT_SEED):
    """BlurBall's example input at the article's size, or at the smoke run's."""
    size = dict(height=SMOKE["height"], width=SMOKE["width"]) if smoke else {}
    return blurball.example_input(seed=seed, **size)


def model_and_input(smoke: bool, device: str = "cuda", weights=None):
    """BlurBall (eval mode) and its input on ``device``, or in a smoke run the book's stand-in and a small input."""
    if smoke:
        return tiny_clip_net(), lab_input(True)
    return blurball.build_blurball(weights).to(device), lab_input(False).to(device)


def environment(smoke: bool, weights: str = "seeded-random", **extra) -> dict:
    """The run's provenance: the fingerprint, the GPU's SM count, the weights and ``extra`` fields."""
    on_gpu = torch.cuda.is_available() and not smoke
    return {**fingerprint(), "gpu_sm_count": int(torch.cuda.get_device_properties(0).multi_processor_count)
            if on_gpu else None, "weights": "smoke stand-in model" if smoke else weights, "smoke": bool(smoke),
            "device": "cpu" if smoke else "cuda", **extra}


def lab_builder(build: Callable[[], tuple[Callable[[], object], dict]]) -> Callable[[], tuple[Callable, dict]]:
    """A ``build_check_time`` builder from ``build() -> (call, columns)``, ``call()`` on its own input; an error becomes
    the rows' note ``skipped: failed: <type>: <first line>``, so one failing variant loses no other's results."""
    def builder():
        try:
            call, columns = build()
        except VariantUnavailable:
            raise
        except Exception as error:  # a lab run records what worked and says what did not
            first_line = str(error).splitlines()[0] if str(error) else ""
            raise VariantUnavailable(f"failed: {type(error).__name__}: {first_line}"[:300]) from error
        return (lambda _x: call()), columns
    return builder


def failed_variants(frame: pd.DataFrame) -> list[str]:
    """Variants whose build or run raised, or that were expected to match eager FP32 and did not (never FP16)."""
    failed = frame["note"].fillna("").str.match(r"(skipped: )?failed") | (
        frame["expected_to_match_eager"].eq(True) & frame["same_output"].eq(False))
    return list(frame.loc[failed, "variant"].unique())


def write_results(kind: str, frame: pd.DataFrame, env: dict, results_dir: Path | None, device_name: str) -> Path:
    """Write a run's frame to a new ``<kind>-<device>-<date>[-N].csv``, one run id per timed run (Chapters 4 and 5)."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(device_name).lower()).strip("-") or "unknown-gpu"  # "nvidia-h100-80gb-hbm3"
    return results.write_run(kind, frame, env, results_dir=results_dir, tag=slug, per_run=True)


def synchronizer(device: str) -> Callable[[], object]:
    """What waits for ``device``'s queued work: CUDA's synchronize, nothing on the CPU."""
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


# ---- Profiles
def _kernels_from_events(events: Iterable, device: str = "cuda") -> list[tuple[str, str, float, float]]:
    """``(innermost_op, kernel_name, start_us, end_us)`` for each kernel in profiler events (Chapter 5)."""
    events = list(events)
    if device == "cpu":
        return [(u["name"], u["name"], u["start_us"], u["start_us"] + u["us"]) for u in cpu_op_units(events)]
    owners = {}
    for event in events:
        # Owners are the ops themselves (linked to nothing); runtime calls such as cudaLaunchKernel are
        # linked to their op and carry CUPTI's own correlation ids, which may equal an op's id.
        if (_device_kind(event) == "CPU" and not is_annotation(event)
                and not getattr(event, "linked_correlation_id", 0)):
            owners.setdefault(getattr(event, "id", None), event)
    out = []
    for event in events:
        if _device_kind(event) != "CUDA" or is_annotation(event):
            continue
        if any(word in str(event.name) for word in _SKIPPED_DEVICE_EVENTS):
            continue  # copies the runtime makes, not kernels the model launches
        owner = owners.get(getattr(event, "linked_correlation_id", None))
        out.append((owner.name if owner is not None else "", event.name,
                    event.time_range.start, event.time_range.end))
    return out


def _summarize_kernels(kernels: list[tuple[str, str, float, float]], wall_ms: float) -> list[dict]:
    """Profile rows from ``(launching_op, kernel_name, start_us, end_us)`` tuples (Chapter 5)."""
    sums = {c: [0, 0.0] for c in CATEGORIES}
    for op, name, start, end in kernels:
        bucket = sums[op_category(op, name)]
        bucket[0] += 1
        bucket[1] += (end - start) / 1e3
    kernel_total = sum(v[1] for v in sums.values()) or 1.0
    active_us, reached = 0.0, float("-inf")  # the kernels' intervals, overlaps counted once: active GPU time
    for start, end in sorted((s, e) for _, _, s, e in kernels):
        active_us += max(0.0, end - max(start, reached))
        reached = max(reached, end)
    return [{"category": c, "kernels": sums[c][0], "kernel_ms": sums[c][1],
             "share": sums[c][1] / kernel_total, "total_kernels": len(kernels),
             "active_gpu_ms": active_us / 1e3, "wall_ms": wall_ms} for c in CATEGORIES]


def profile_call(call: Callable[[], object], device: str = "cuda") -> list[dict]:
    """Profile one call (after one untimed call) and summarise its kernels by category (Chapter 5)."""
    sync = synchronizer(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    call()
    sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        call()
        sync()
        wall_ms = (time.perf_counter() - start) * 1e3
    return _summarize_kernels(_kernels_from_events(prof.events(), device), wall_ms)


# ---- First calls, streams, autotune
def first_calls(call: Callable[[], object], n_calls: int, *, synchronize: Callable[[], object],
                clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of each of the first ``n_calls`` calls, the device synchronized before the clock stops."""
    seconds = []
    synchronize()
    for _ in range(n_calls):
        start = clock()
        call()
        synchronize()
        seconds.append(clock() - start)
    return seconds


def stream_handle(stream) -> int:
    """The raw handle of a dedicated CUDA stream; refuses the default stream (Chapter 4)."""
    handle = int(getattr(stream, "cuda_stream", stream))
    if handle == 0:
        raise ValueError("got the default CUDA stream (handle 0); create one with torch.cuda.Stream()")
    return handle


def autotune_verdict() -> dict:
    """SM count and Inductor's ``is_big_gpu`` verdict of GPU 0 for a max-autotune row (Chapter 5)."""
    if not torch.cuda.is_available():
        return {"sm_count": None, "inductor_is_big_gpu": None}
    sms = int(torch.cuda.get_device_properties(0).multi_processor_count)
    try:
        verdict = bool(is_big_gpu(0))
    except Exception:  # a torch without the helper: apply its documented threshold
        verdict = sms >= INDUCTOR_MIN_SMS
    return {"sm_count": sms, "inductor_is_big_gpu": verdict}


# ---- Child processes (cuDNN benchmark rows)
CHILD_TAG = "GRAPHBOOK_CHILD_ROWS "


def emit_child_rows(rows: list[dict], stream=None) -> None:
    """Print rows for the parent process on one tagged line (Chapter 5)."""
    print(CHILD_TAG + json.dumps(rows, default=str), file=stream or sys.stdout, flush=True)


def run_child(argv: Sequence[str], *, timeout: float = 900, env: dict | None = None) -> list[dict]:
    """Run ``python argv...`` in a fresh process and return the rows it emitted (Chapter 5)."""
    rows, _ = run_tagged_child(
        [sys.executable, *argv], CHILD_TAG, env=dict(os.environ, **(env or {})), timeout=timeout,
        last=False, check_returncode=False,
        timeout_message=f"the child process took over {timeout:.0f} s",
        failure_message=lambda proc: "the child process failed (exit {}): {}".format(
            proc.returncode, " | ".join(proc.stderr.strip().splitlines()[-3:])))
    return rows
