"""INT8 scored where it matters: a matrix of ONNX Runtime static-quantization choices for BlurBall."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

from graphbook.config import SMALL_SIZE
from graphbook.measure import environment
from graphbook.model import blurball, synthetic_clips
from graphbook.paths import TRAINED_CHECKPOINT
from graphbook.record import results
from graphbook.record.cli import (EXIT_CHECK_FAILED, EXIT_OK, add_input_size, add_threads, int_at_least, make_parser,
                                  positive_int, resource_absent)
from graphbook.int8 import int8_decision, int8_matrix, quantization
from graphbook.runtimes import onnx_utils

PROG = "bench_int8.py"

SMOKE = {"height": 32, "width": 64, "calibration_clips": 2, "eval_clips": 2, "repeats": 3, "debug_clips": 1}


def parse_args(argv=None) -> argparse.Namespace:
    parser = make_parser(PROG, __doc__.split("\n\n")[0])
    add_input_size(parser, SMALL_SIZE)  # the training size
    add_threads(parser, "ONNX Runtime intra-op threads")
    parser.add_argument("--repeats", type=int_at_least(3), default=15,
                        help="timed round-robin calls per model (at least 3: a median)")
    parser.add_argument("--calibration-clips", type=positive_int, default=16,
                        help="training clips the quantizer calibrates on")
    parser.add_argument("--eval-clips", type=positive_int, default=64, help="held-out clips every model is scored on")
    parser.add_argument("--debug-clips", type=positive_int, default=4,
                        help="held-out clips the Q/DQ debugging helpers run on")
    parser.add_argument("--top", type=positive_int, default=10, help="worst tensors kept, per kind (activation, weight)")
    parser.add_argument("--checkpoint", type=Path, default=None, help="BlurBall weights (default: the book's checkpoint)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run (32x64, 2 configurations, 2+2 clips) that exercises every step")
    parser.add_argument("--workdir", type=Path, default=None, help="folder for the .onnx files (default: temporary)")
    args = parser.parse_args(argv)
    if args.smoke:  # the smoke sizes, where the command line does not give its own
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    if args.debug_clips > args.eval_clips:
        parser.error(f"--debug-clips ({args.debug_clips}) cannot exceed --eval-clips ({args.eval_clips})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    checkpoint = args.checkpoint or TRAINED_CHECKPOINT
    if not Path(checkpoint).is_file():
        return resource_absent(PROG, f"trained BlurBall checkpoint not found: {checkpoint} "
                                     "(recreate it with `python code/train_blurball.py --seed 0`)")

    environment.set_threads(args.threads)
    features = environment.cpu_features()
    settings = quantization.int8_settings_for(features)
    configs = quantization.design(settings.reduce_range, smoke=args.smoke)
    print(f"reduce_range={settings.reduce_range} ({settings.reason}) CPU {features.get('isa', 'unknown')}; "
          f"{len(configs)} INT8 configurations at {args.height}x{args.width}, {args.threads} threads", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench_int8_") as tmp:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        model = blurball.load_trained_blurball(checkpoint)
        example = torch.zeros(1, 3 * blurball.FRAMES_IN, args.height, args.width)
        fp32_path = onnx_utils.export_onnx(model, example, workdir / "blurball_fp32.onnx")
        calibration = synthetic_clips.calibration_clips(args.calibration_clips, args.height, args.width)
        held_out = synthetic_clips.held_out_clips(args.eval_clips, args.height, args.width,
                                                  max_speed=synthetic_clips.TRAINED_MAX_SPEED)
        run = int8_matrix.run_matrix(fp32_path, configs, int8_matrix.clip_inputs(calibration), held_out,
                                     workdir=workdir, threads=args.threads, repeats=args.repeats,
                                     log=lambda message: print(message, flush=True))
        errors = []
        baseline = run.paths.get(quantization.BASELINE_NAME)
        if baseline is not None:
            debug_inputs = int8_matrix.clip_inputs(held_out[:args.debug_clips])
            errors = int8_matrix.tensor_errors(fp32_path, baseline, debug_inputs, workdir=workdir / "debug",
                                               top=args.top)
            for row in errors:
                row.update({"config": quantization.BASELINE_NAME, "height": args.height, "width": args.width,
                            "debug_clips": args.debug_clips, "smoke": args.smoke})

    env = {**environment.fingerprint(args.threads), "reduce_range_reason": settings.reason,
           "vnni": features.get("vnni"), "smoke": args.smoke}
    written = [results.write_run(int8_matrix.KIND_MATRIX, run.rows, env, results_dir=args.results_dir)]
    if errors:
        written.append(results.write_run(int8_matrix.KIND_TENSOR_ERRORS, errors, env, results_dir=args.results_dir))
    for path in written:
        print(f"wrote {path}")

    frame = pd.DataFrame(run.rows)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(int8_decision.matrix_table(frame).to_string(index=False))
    made = int8_decision.recommend_int8_config(frame)
    print(f"recommended: {made['chosen']['config']}" + (f" (keep FP32: {made['keep_fp32']})" if made["keep_fp32"] else ""))
    if run.failures:  # recorded with their error in the status column; named here
        print(f"{PROG}: configurations that could not be built or run: "
              + "; ".join(f"{name} ({message})" for name, message in run.failures.items()), file=sys.stderr)
        return EXIT_CHECK_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
