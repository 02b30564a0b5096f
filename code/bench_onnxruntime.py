"""BlurBall on ONNX Runtime (CPU): every optimization level against eager and torch.compile, one run.

    .venv/bin/python code/bench_onnxruntime.py                       # 288x512, 1 and 2 threads
    .venv/bin/python code/bench_onnxruntime.py --threads 2 --repeats 3 --no-compile

The measurement behind Chapter 4's recorded table. BlurBall (seeded weights, batch 1) is exported
twice (exporter optimizer on; off with constants folded, so ONNX Runtime's own passes do the work),
then these variants are each checked against eager FP32 (max abs diff, heatmap peak positions) and
timed with the book's harness (warm-up, median, spread) at every requested thread count:

- eager FP32 (the reference), and torch.compile (default mode) with Inductor freezing off and on;
- the raw export at each ONNX Runtime level (disabled, basic, extended, layout, all);
- the exporter-optimized export at level "all";
- an INT8 Q/DQ model (static quantization calibrated on synthetic frames) at level "all".

All rows go to a new file ``data/results/cpu-onnxruntime-<date>[-N].csv`` (never an existing one),
each with a ``ratio_to_eager`` against eager FP32 at the same thread count and the environment
columns. Exported .onnx files go to a temporary folder (or ``--workdir``). A FP32 variant that
disagrees with eager is still timed but recorded with ``verified_fp32 = False``. Exit status: 0 on
success, 2 for bad arguments (one line on stderr), 1 when a FP32 variant disagrees with eager.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graphbook.cli import OneLineParser, positive_int, multiple_of_8

# A FP32 variant further than this from eager is reported as not matching (verified = False).
FP32_TOLERANCE = 1e-3


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineParser(prog="bench_onnxruntime.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--height", type=multiple_of_8, default=288)
    parser.add_argument("--width", type=multiple_of_8, default=512)
    parser.add_argument("--threads", type=positive_int, nargs="+", default=[1, 2],
                        help="intra-op thread counts to time (torch and ONNX Runtime alike)")
    parser.add_argument("--warmup", type=positive_int, default=1)
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--calibration-frames", type=positive_int, default=4,
                        help="synthetic frames used to calibrate the INT8 model")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (saves minutes)")
    parser.add_argument("--no-quantize", action="store_true", help="skip the INT8 Q/DQ model")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="folder for the exported .onnx files (default: a temporary folder)")
    parser.add_argument("--out-dir", type=Path, default=None, help="results folder (default data/results)")
    return parser.parse_args(argv)


def calibration_frames(count: int, height: int, width: int):
    """Synthetic inputs for calibration: the book's moving-ball frames with other seeds than the test input."""
    from graphbook import blurball

    return [blurball.example_input(height=height, width=width, seed=100 + i) for i in range(count)]


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from graphbook import blurball, onnx_utils as ou, results, timing
    from graphbook.book import RESULTS_DIR
    from graphbook.environment import fingerprint, set_threads

    run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    set_threads(max(args.threads))
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    with torch.no_grad():
        reference = model(x)

    rows: list[dict] = []
    failures: list[str] = []
    eager_ms: dict[int, float] = {}

    def record(variant: str, description: str, run, *, fp32: bool, extra: dict | None = None,
               thread_counts=None) -> None:
        output = run()  # correctness first: one untimed run compared with eager FP32
        diff = ou.max_abs_diff(reference, output)
        same, total = ou.peaks_agree(reference, output)
        verified = (diff <= FP32_TOLERANCE) if fp32 else ""
        if fp32 and not verified:  # still timed, so the table shows what the mismatch would buy
            failures.append(f"{variant}: max abs diff {diff:.3g} > {FP32_TOLERANCE}")
            print(f"{variant}: DOES NOT MATCH eager, max abs diff {diff:.3g} exceeds {FP32_TOLERANCE}",
                  file=sys.stderr)
        for threads in thread_counts or args.threads:
            set_threads(threads)
            result = timing.time_cpu(run, warmup=args.warmup, repeats=args.repeats, name=variant)
            if variant == "eager_fp32":
                eager_ms[threads] = result.median_ms
            rows.append({"run_id": run_id, "variant": variant, "description": description,
                         **(extra or {}), "height": args.height, "width": args.width,
                         **{k: v for k, v in result.as_dict().items() if k != "name"},
                         "threads": threads, "max_abs_diff": diff, "verified_fp32": verified,
                         "peaks_same": same, "peaks_total": total})
            print(f"{variant:>24s} threads={threads} median {result.median_ms:9.1f} ms "
                  f"(min {result.min_ms:.1f}, max {result.max_ms:.1f})  max|diff| {diff:.2e}  "
                  f"peaks {same}/{total}", flush=True)

    def eager():
        with torch.no_grad():
            return model(x)

    record("eager_fp32", "eager PyTorch, FP32", eager, fp32=True)

    if not args.no_compile:
        import torch._inductor.config as inductor_config

        for variant, freezing, description in [
                ("compile_default", False, "torch.compile, default mode, freezing off"),
                ("compile_freezing", True, "torch.compile, default mode, Inductor freezing on")]:
            with inductor_config.patch(freezing=freezing), torch.no_grad():
                torch._dynamo.reset()
                compiled = torch.compile(model)
                start = time.perf_counter()
                compiled(x)
                compile_s = time.perf_counter() - start
                print(f"{variant} first call: {compile_s:.1f} s", flush=True)
                record(variant, description, lambda c=compiled: c(x), fp32=True, extra={"compile_s": compile_s})
            torch._dynamo.reset()

    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ort-bench-")))
        raw = ou.export_onnx(model, x, workdir / "blurball_raw.onnx", optimize=False, fold_constants=True)
        optimized = ou.export_onnx(model, x, workdir / "blurball_optimized.onnx")
        feed = x.numpy()
        for level in ou.LEVEL_NAMES:
            # one session per thread count: ONNX Runtime fixes its thread pool when a session is created
            sessions = {t: ou.make_session(raw, level=level, threads=t) for t in args.threads}
            _timed_sessions(record, f"ort_{level}", f"ONNX Runtime, raw export, level {level}", sessions,
                            feed, args, extra={"level": level, "export": "raw"})
        sessions = {t: ou.make_session(optimized, level="all", threads=t) for t in args.threads}
        _timed_sessions(record, "ort_exporter_optimized_all", "ONNX Runtime, exporter-optimized export, level all",
                        sessions, feed, args, extra={"level": "all", "export": "optimized"})
        if not args.no_quantize:
            quantized = ou.quantize_qdq(optimized, workdir / "blurball_int8_qdq.onnx",
                                        calibration_frames(args.calibration_frames, args.height, args.width))
            counts = ou.qdq_counts(quantized)
            sessions = {t: ou.make_session(quantized, level="all", threads=t) for t in args.threads}
            _timed_sessions(record, "ort_int8_qdq_all", "ONNX Runtime, INT8 Q/DQ (static, min-max), level all",
                            sessions, feed, args, fp32=False,
                            extra={"level": "all", "export": "int8_qdq",
                                   "quantize_linear": counts["QuantizeLinear"],
                                   "dequantize_linear": counts["DequantizeLinear"]})

    if not rows:
        print("nothing was timed", file=sys.stderr)
        return 1
    for row in rows:
        row["ratio_to_eager"] = eager_ms[row["threads"]] / row["median_ms"] if row["threads"] in eager_ms else ""
    columns = ["run_id", "variant", "description", "level", "export", "height", "width", "threads",
               "median_ms", "min_ms", "max_ms", "q1_ms", "q3_ms", "repeats", "warmup", "device",
               "ratio_to_eager", "max_abs_diff", "verified_fp32", "peaks_same", "peaks_total", "compile_s",
               "quantize_linear", "dequantize_linear"]
    rows = [{c: row.get(c, "") for c in columns} for row in rows]
    out_dir = args.out_dir or RESULTS_DIR
    path = results.unique_path(out_dir, f"cpu-onnxruntime-{dt.date.today().isoformat()}")
    results.append_rows(path, rows, env=fingerprint())
    print(f"wrote {len(rows)} rows to {path}")
    if failures:
        print("; ".join(failures), file=sys.stderr)
        return 1
    return 0


def _timed_sessions(record, variant, description, sessions, feed, args, *, fp32=True, extra=None):
    """Record one ONNX Runtime variant: one session per thread count, each timed at its own count."""
    from graphbook import onnx_utils as ou

    for threads, session in sessions.items():
        record(variant, description, lambda s=session: ou.run_session(s, feed), fp32=fp32, extra=extra,
               thread_counts=[threads])


if __name__ == "__main__":
    sys.exit(main())
