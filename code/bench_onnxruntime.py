"""BlurBall on ONNX Runtime (CPU): every optimization level against eager and torch.compile, in 3+ runs."""
from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import tempfile
from pathlib import Path

from graphbook.config import FULL_SIZE
from graphbook.measure import probes
from graphbook.measure.environment import fingerprint, set_threads
from graphbook.model import blurball
from graphbook.record import cli, results
from graphbook.record.cli import int_at_least, positive_int
from graphbook.record.results import COMPILE_S, EXPECTED_TO_MATCH
from graphbook.runtimes import onnx_utils as ou
from graphbook.int8 import quantization
from graphbook.method import variants
from graphbook.method.bench import build_check_time


def parse_args(argv=None) -> argparse.Namespace:
    parser = cli.make_parser("bench_onnxruntime.py", __doc__.split("\n\n")[0])
    cli.add_input_size(parser, FULL_SIZE)
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
    return [blurball.example_input(height=height, width=width, seed=100 + i) for i in range(count)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    set_threads(max(args.threads))
    env = fingerprint()
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    reference = variants.build(variants.REFERENCE, model, x, warm=False).run(x)
    builders, columns = {}, {}  # one per (variant, thread count): built and checked once, timed in every run

    def add(name, threads, build, **extra):
        variant = variants.get(name)
        builders[f"{name}@{threads}"] = build
        columns[f"{name}@{threads}"] = {"variant": name, "description": variant.description, **extra,
                                        "height": args.height, "width": args.width, "threads": threads,
                                        EXPECTED_TO_MATCH: variant.expected_to_match_eager}

    torch_names = [variants.REFERENCE] + ([] if args.no_compile else ["compile_default", "compile_freezing"])
    for name in torch_names:  # built once, timed at every thread count
        once = functools.cache(lambda name=name: variants.build(name, model, x))
        for threads in args.threads:
            add(name, threads, lambda once=once: (once().run, {COMPILE_S: once().compile_s}))
    # the level ladder, level all without its NCHWc rewrite (what that one rewrite is worth), the exporter's file
    ort_names = [f"ort_{level}" for level in ou.LEVEL_NAMES] + ["ort_all_without_nchwc", "ort_exporter_optimized_all"]
    ort_names += [] if args.no_quantize else ["ort_int8_qdq_all"]
    with contextlib.ExitStack() as stack:
        workdir = args.onnx_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ort-bench-")))
        calibration = None if args.no_quantize else calibration_frames(args.calibration_frames, args.height, args.width)
        shared: dict = {}  # one export of each kind, whatever the thread count

        def ort_build(name, threads):  # one session per thread count: ONNX Runtime fixes its pool at creation
            context = variants.BuildContext(workdir=workdir, threads=threads, calibration=calibration, cache=shared)
            built = variants.build(name, model, x, context)
            counts = quantization.qdq_counts(built.artifact) if name == "ort_int8_qdq_all" else {}
            return built.run, {COMPILE_S: built.compile_s, "quantize_linear": counts.get("QuantizeLinear"),
                               "dequantize_linear": counts.get("DequantizeLinear")}

        for name in ort_names:
            for threads in args.threads:
                add(name, threads, functools.partial(ort_build, name, threads),
                    level=name.removeprefix("ort_") if name.removeprefix("ort_") in ou.LEVEL_NAMES else "all",
                    export={"ort_exporter_optimized_all": "optimized", "ort_int8_qdq_all": "int8_qdq"}.get(name, "raw"))
        frame, failed = build_check_time(builders, x, reference, columns=columns, runs=args.runs, warmup=args.warmup,
                                         repeats=args.repeats, probe_bytes=args.probe_mib * probes.MIB,
                                         threads={key: c["threads"] for key, c in columns.items()},
                                         log=lambda line: print(line, flush=True))
    path = results.write_run("cpu-onnxruntime", frame, env, results_dir=args.results_dir, per_run=True)
    print(f"wrote {len(frame)} rows ({args.runs} runs) to {path}")
    return cli.exit_status_for("bench_onnxruntime.py", [key.split("@")[0] for key in failed])


if __name__ == "__main__":
    sys.exit(main())
