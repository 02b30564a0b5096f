"""BlurBall on ONNX Runtime (CPU): every optimization level against eager and torch.compile, in 3+ runs.

    .venv/bin/python code/bench_onnxruntime.py                       # 288x512, 1 and 2 threads
    .venv/bin/python code/bench_onnxruntime.py --threads 2 --repeats 3 --no-compile
    .venv/bin/python code/bench_onnxruntime.py --runs 5                # five runs instead of three

The measurement behind Chapter 4's recorded table. BlurBall (seeded weights, batch 1) is exported
twice (exporter optimizer on; off with constants folded, so ONNX Runtime's own passes do the work),
then these variants are each checked against eager FP32 (max abs diff, heatmap peak positions) and
timed with the book's harness (warm-up, median, spread) at every requested thread count:

- eager FP32 (the reference), and torch.compile (default mode) with Inductor freezing off and on;
- the raw export at each ONNX Runtime level (disabled, basic, extended, layout, all);
- the exporter-optimized export at level "all";
- an INT8 Q/DQ model (static quantization calibrated on synthetic frames) at level "all".

Every variant is built by ``graphbook.runtimes.variants`` and judged by ``graphbook.runtimes.correctness.compare_to_reference``
ONCE (one ONNX Runtime session per thread count); then ``--runs`` independent runs (default and minimum
3) each time every (variant, thread count) once (``--warmup`` untimed calls, ``--repeats`` timed ones) in
an order that rotates between runs (round-robin), and measure the ``copy_`` bandwidth (``copy_gbps``) so
that ``graphbook.record.runs.flag_under_load`` can flag a run taken under load. Rows carry ``run``,
``run_order`` (1 = went first) and ``run_id`` ``<file stem>/r<run>``; ``speedup_vs_eager`` compares
with eager FP32 of the same run and thread count; ``compile_s`` and the check are per build (the same
in every run). A compiled variant re-enters Dynamo (from its caches) in the untimed warm-up when the
other compiled variant ran in between. All rows go to a new file ``cpu-onnxruntime-<date>[-N].csv`` under ``--results-dir`` (default
``data/results/``; ``results.write_run``, never an existing one), each with ``speedup_vs_eager`` against eager FP32 at the same thread count and the
environment columns. Exported .onnx files go to a temporary folder, removed afterwards (or are kept in
``--onnx-dir``). A variant expected
to match eager that does not is still timed but recorded with ``same_output = False``. Exit status (``graphbook.record.cli``): 0 on
success, 1 when a variant expected to match eager does not (the rows are still written), 2 for bad
arguments (one line on stderr).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

from graphbook.config import SAME_OUTPUT_ATOL
from graphbook.record import cli
from graphbook.record.cli import int_at_least, multiple_of_8, positive_int


def parse_args(argv=None) -> argparse.Namespace:
    parser = cli.make_parser("bench_onnxruntime.py", __doc__.split("\n\n")[0])
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
    parser.add_argument("--runs", type=int_at_least(3), default=3,
                        help="independent runs, each timing every variant once in a rotated order (default 3, at least 3)")
    parser.add_argument("--probe-mib", type=positive_int, default=64,
                        help="MiB per buffer of the copy_ bandwidth probe measured in every run (default 64)")
    parser.add_argument("--onnx-dir", type=cli.directory, default=None, metavar="DIR",
                        help="keep the exported .onnx files in DIR (default: a temporary folder, removed)")
    return parser.parse_args(argv)


def calibration_frames(count: int, height: int, width: int):
    """Synthetic inputs for calibration: the book's moving-ball frames with other seeds than the test input."""
    from graphbook.model import blurball

    return [blurball.example_input(height=height, width=width, seed=100 + i) for i in range(count)]


def main(argv=None) -> int:
    args = parse_args(argv)
    from graphbook.measure import probes, timing
    from graphbook.measure.environment import fingerprint, set_threads
    from graphbook.model import blurball
    from graphbook.record import results
    from graphbook.record.results import (
        COMPILE_S,
        EXPECTED_TO_MATCH,
        MAX_ABS_DIFF,
        PEAK_FRAMES,
        SAME_OUTPUT,
        SAME_PEAK_FRAMES,
        SAME_PEAKS,
        SPEEDUP_VS_EAGER,
    )
    from graphbook.runtimes import correctness, onnx_utils as ou, quantization, variants

    set_threads(max(args.threads))
    env = fingerprint()
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    reference = variants.build(variants.REFERENCE, model, x, warm=False).run(x)

    slots: list[dict] = []  # one per (variant, thread count): built and checked once, timed in every run
    failures: list[str] = []

    def add(built, *, extra: dict | None = None, thread_counts=None) -> None:
        variant = built.variant
        check = correctness.compare_to_reference(built.run(x), reference)  # correctness first, untimed
        if variant.expected_to_match_eager and not check[SAME_OUTPUT]:  # still timed: what would it buy?
            failures.append(f"{variant.name}: max abs diff {check[MAX_ABS_DIFF]:.3g} > {SAME_OUTPUT_ATOL:g}")
            print(f"{variant.name}: DOES NOT MATCH eager, max abs diff {check[MAX_ABS_DIFF]:.3g} exceeds "
                  f"{SAME_OUTPUT_ATOL:g}", file=sys.stderr)
        for threads in thread_counts or args.threads:
            slots.append({"key": f"{variant.name}@{threads}", "built": built, "threads": threads, "row": {
                "variant": variant.name, "description": variant.description, **(extra or {}),
                "height": args.height, "width": args.width, "threads": threads,
                MAX_ABS_DIFF: check[MAX_ABS_DIFF], SAME_OUTPUT: check[SAME_OUTPUT],
                EXPECTED_TO_MATCH: variant.expected_to_match_eager, SAME_PEAK_FRAMES: check[SAME_PEAK_FRAMES],
                PEAK_FRAMES: check[PEAK_FRAMES], SAME_PEAKS: check[SAME_PEAKS], COMPILE_S: built.compile_s}})
        print(f"{variant.name:>26s} built and checked: max|diff| {check[MAX_ABS_DIFF]:.2e}  "
              f"peaks {check[SAME_PEAK_FRAMES]}/{check[PEAK_FRAMES]}", flush=True)

    add(variants.build(variants.REFERENCE, model, x))
    if not args.no_compile:
        for name in ("compile_default", "compile_freezing"):
            built = variants.build(name, model, x)
            print(f"{name} first call: {built.compile_s:.1f} s", flush=True)
            add(built)

    rows: list[dict] = []
    with contextlib.ExitStack() as stack:
        workdir = args.onnx_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ort-bench-")))
        calibration = (None if args.no_quantize else
                       calibration_frames(args.calibration_frames, args.height, args.width))
        shared: dict = {}  # one export of each kind, whatever the thread count
        # the level ladder, level all without its NCHWc rewrite (what that one rewrite is worth), the exporter's file
        names = [f"ort_{level}" for level in ou.LEVEL_NAMES] + ["ort_all_without_nchwc", "ort_exporter_optimized_all"]
        names += [] if args.no_quantize else ["ort_int8_qdq_all"]
        for name in names:
            # one session per thread count: ONNX Runtime fixes its thread pool when a session is created
            for threads in args.threads:
                context = variants.BuildContext(workdir=workdir, threads=threads, calibration=calibration,
                                                cache=shared)
                built = variants.build(name, model, x, context)
                extra = {"level": "all" if name in ("ort_exporter_optimized_all", "ort_int8_qdq_all", "ort_all_without_nchwc")
                         else name.removeprefix("ort_"),
                         "export": {"ort_exporter_optimized_all": "optimized",
                                    "ort_int8_qdq_all": "int8_qdq"}.get(name, "raw")}
                if name == "ort_int8_qdq_all":
                    counts = quantization.qdq_counts(built.artifact)
                    extra.update(quantize_linear=counts["QuantizeLinear"],
                                 dequantize_linear=counts["DequantizeLinear"])
                add(built, extra=extra, thread_counts=[threads])

        # independent runs: nothing is rebuilt, the order rotates, each slot at its own thread count
        by_key = {slot["key"]: slot for slot in slots}
        timed = timing.repeated_runs({key: (lambda one=slot["built"]: one.run(x)) for key, slot in by_key.items()},
                                     runs=args.runs, warmup=args.warmup, repeats=args.repeats,
                                     probe_bytes=args.probe_mib * probes.MIB,
                                     threads={key: slot["threads"] for key, slot in by_key.items()},
                                     log=lambda line: print(line, flush=True))
        for row in timed:
            row.update(by_key[row.pop("variant")]["row"])
        for number in range(1, args.runs + 1):
            eager_ms = {r["threads"]: r["median_ms"] for r in timed
                        if r[results.RUN] == number and r["variant"] == variants.REFERENCE}
            for r in timed:
                if r[results.RUN] == number:
                    r[SPEEDUP_VS_EAGER] = eager_ms[r["threads"]] / r["median_ms"] if r["threads"] in eager_ms else ""
        keys = list(by_key)  # the file lists each run in the build order
        timed.sort(key=lambda r: (r[results.RUN], keys.index(f"{r['variant']}@{r['threads']}")))
        rows += timed

    if not rows:
        print("nothing was timed", file=sys.stderr)
        return 1
    columns = [results.RUN, "variant", "description", "level", "export", "height", "width", "threads",
               "median_ms", "min_ms", "max_ms", "q1_ms", "q3_ms", "repeats", "warmup", "device",
               SPEEDUP_VS_EAGER, MAX_ABS_DIFF, SAME_OUTPUT, EXPECTED_TO_MATCH, SAME_PEAKS, SAME_PEAK_FRAMES,
               PEAK_FRAMES, COMPILE_S, "quantize_linear", "dequantize_linear", results.RUN_ORDER, "went_first",
               "run_count", "run_started", results.COPY_GBPS]
    rows = [{c: row.get(c, "") for c in columns} for row in rows]
    path = results.write_run("cpu-onnxruntime", rows, env, results_dir=args.results_dir, per_run=True)
    print(f"wrote {len(rows)} rows ({args.runs} runs) to {path}")
    if failures:
        print("; ".join(failures), file=sys.stderr)
        return cli.EXIT_CHECK_FAILED
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
