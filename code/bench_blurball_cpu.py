"""BlurBall on the CPU: the measurement matrix of Chapter 5, one variant at a time."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

from graphbook.config import FULL_SIZE
from graphbook.measure import probes
from graphbook.measure.environment import fingerprint, set_threads
from graphbook.model import blurball, model_cost, synthetic_clips
from graphbook.paths import TRAINED_CHECKPOINT
from graphbook.record import cli, results
from graphbook.record import runs as runs_lib
from graphbook.record.cli import int_at_least, positive_int
from graphbook.record.results import (
    BALL_AGREE_FRAMES,
    BALL_FRAMES,
    COMPILE_S,
    EXPECTED_TO_MATCH,
    MAX_ABS_DIFF,
    SAME_BALL,
    SAME_PEAKS,
    SPEEDUP_VS_EAGER,
)
from graphbook.model import ball
from graphbook.method import variants as registry
from graphbook.method.bench import build_check_time
from graphbook.runtimes.openvino_runtime import describe_runtime
from graphbook.method.variants import VariantUnavailable
from graphbook.serving.decisions import lower_precision_worker
from graphbook.runtimes.profiling import profile_eager, with_rates

#: The variants measured by default (any name of graphbook.method.variants.REGISTRY may be asked for).
DEFAULT_VARIANTS = ("eager_fp32", "eager_fp32_channels_last", "eager_bf16_autocast", "compile_default",
                    "compile_freezing", "compile_bf16", "compile_freezing_bf16", "compile_freezing_max_autotune",
                    "compile_freezing_max_autotune_bf16", "ort_exporter_optimized_all",
                    "ort_int8_qdq_all", "openvino_fp32", "openvino_bf16", "openvino_int8")
REFERENCE = registry.REFERENCE


def _variant_list(text: str) -> list[str]:
    names = list(cli.comma_choices(registry.REGISTRY, "variant")(text))
    return names if REFERENCE in names else [REFERENCE, *names]  # everything is checked against eager FP32


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options; bad values exit 2 with one line on stderr (Chapter 5)."""
    parser = cli.make_parser("bench_blurball_cpu.py", "BlurBall CPU measurement matrix (Chapter 5).")
    cli.add_run_protocol_options(parser, repeats=10, warmup=3)
    cli.add_input_size(parser, FULL_SIZE)
    parser.add_argument("--variants", type=_variant_list, default=list(DEFAULT_VARIANTS),
                        help="comma-separated names from graphbook.method.variants (default: "
                             + ", ".join(DEFAULT_VARIANTS) + ")")
    parser.add_argument("--no-profile", action="store_true", help="skip the eager profile")
    parser.add_argument("--peak-n", type=positive_int, default=2048, help="matmul size for the peak")
    parser.add_argument("--probe-mib", type=positive_int, default=64,
                        help="MiB per buffer of the copy_ bandwidth probe measured in every run (default 64)")
    parser.add_argument("--weights", default=None,
                        help="BlurBall checkpoint, or 'random' for seeded random weights (default: the book's "
                             "trained checkpoint, so the decoded ball means something)")
    parser.add_argument("--ball-clips", type=int_at_least(0), default=16,
                        help="hard held-out clips on which every variant's decoded ball is compared with eager "
                             "FP32's (default 16; 0 skips the check)")
    parser.add_argument("--calibration-clips", type=positive_int, default=16,
                        help="training clips the INT8 Q/DQ model is calibrated on (default 16, as bench_int8.py)")
    args = parser.parse_args(argv)
    if args.weights not in (None, "random") and not Path(args.weights).is_file():
        parser.error(f"--weights file {args.weights!r} does not exist")
    return args


def _weights(args: argparse.Namespace) -> Path | None:
    """The checkpoint the matrix runs (None: seeded random weights)."""
    return None if args.weights == "random" else Path(args.weights or TRAINED_CHECKPOINT)


def main(argv: list[str] | None = None) -> int:
    """Parse, refuse when the checkpoint is absent (exit 3), run, and the exit status of ``graphbook.record.cli``."""
    args = parse_args(argv)
    weights = _weights(args)
    if weights is not None and not weights.is_file():
        return cli.resource_absent("bench_blurball_cpu.py", f"checkpoint {weights} is missing; recreate it with "
                                   "`python code/train_blurball.py --seed 0`, or pass --weights random")
    _, failed = run(args)
    return cli.exit_status_for("bench_blurball_cpu.py", failed)


def run(args: argparse.Namespace) -> tuple[Path, list[str]]:
    """Build and check every requested variant once, time them all in ``args.runs`` rotated runs
    (``graphbook.method.bench``), write one new CSV. Returns its path and the variants that failed their check."""
    set_threads(args.threads)
    env = fingerprint(args.threads)
    weights = _weights(args)
    model = blurball.build_blurball(weights)
    x = blurball.example_input(height=args.height, width=args.width)
    # lower precisions are judged where it matters: the trained model's decoded ball on clips it never saw
    ball_clips = []
    if args.ball_clips and weights is not None:
        try:
            ball_clips = synthetic_clips.check_clips(args.ball_clips, args.height, args.width)
        except ValueError as why:  # a frame too small for a synthetic ball: the matrix still runs, unchecked on clips
            print(f"decoded-ball check skipped at {args.height}x{args.width}: {why}", flush=True)
    calibration = None  # training clips, never the held-out ones; made only when an INT8 variant is asked for
    if any(registry.get(name).needs_calibration for name in args.variants):
        calibration = ball.clip_inputs(synthetic_clips.calibration_clips(args.calibration_clips, args.height,
                                                                         args.width))
    cost = model_cost.model_cost(model, x)
    reference_run = registry.build(REFERENCE, model, x, warm=False).run
    reference = reference_run(x)
    reference_logits = [reference_run(blurball.imagenet_normalize(synthetic_clips.frames_to_tensor([clip])))
                        for clip in ball_clips]
    bf16_ok, bf16_reason = probes.bf16_support()
    common = {"record": "variant", "batch": 1, "height": args.height, "width": args.width, "macs": cost.macs,
              "dead_macs": cost.dead_macs, "parameters": cost.parameters, "peak_margin": blurball.peak_margin(reference),
              "weights": "trained" if weights is not None else "random"}
    columns = {name: {"description": registry.get(name).description, "precision": registry.get(name).precision,
                      EXPECTED_TO_MATCH: registry.get(name).expected_to_match_eager, **common} for name in args.variants}
    # once per invocation (not a timing): these rows keep the file's own run id
    # FP32 always; bf16 too when a bf16 variant is asked for, so the two profiles' shares can be compared
    profiled = [(REFERENCE, "fp32", None)] + ([("eager_bf16_autocast", "bf16", torch.bfloat16)] if bf16_ok and any(
        registry.get(name).precision == "bf16" for name in args.variants) else [])
    profile = None if args.no_profile else pd.concat([
        pd.DataFrame(profile_eager(model, x, autocast_dtype=dtype)).assign(record="profile", variant=variant,
                                                                          precision=precision)
        for variant, precision, dtype in profiled]).rename(columns={"ms": "profile_ms"})

    def builder(name, context):
        def build():
            variant = registry.get(name)
            if variant.precision == "bf16" and not bf16_ok:
                raise VariantUnavailable(bf16_reason)
            one = registry.build(name, model, x, context)
            note = one.note or (bf16_reason if variant.precision == "bf16" else "")
            if variant.family == "openvino":  # what OpenVINO really executed: a bf16 hint is not a bf16 run
                graph = describe_runtime(one.run.compiled)
                note += (f"; executed {graph['layers']} layers ("
                         + ", ".join(f"{p} {n}" for p, n in graph["by_precision"].items())
                         + f"), {graph['fused_layers']} of them fused from {graph['fused_ops']} operations")
            return one.run, {COMPILE_S: one.compile_s, "note": note}
        return build

    def ball_kept(run) -> dict:  # every frame's decoded ball in eager FP32's place: what a lower precision must keep
        if not ball_clips:
            return {}
        check = ball.check(run, ball_clips, reference_logits)
        return check if check[SAME_BALL] else {**check, "note": (
            f"decoded ball differs from eager FP32 on {check[BALL_FRAMES] - check[BALL_AGREE_FRAMES]} "
            f"of {check[BALL_FRAMES]} held-out frames")}

    def matmul_peaks() -> dict:  # the compute reference of each run, beside its copy_ bandwidth
        peaks = {"matmul_fp32": probes.matmul_peak(n=args.peak_n, repeats=5)["gflop_per_s"]}
        if bf16_ok:
            peaks["matmul_bf16"] = probes.matmul_peak(n=args.peak_n, dtype=torch.bfloat16, repeats=5)["gflop_per_s"]
        return peaks

    with registry.BuildContext(threads=args.threads, calibration=calibration) as context:
        frame, failed = build_check_time(
            {name: builder(name, context) for name in args.variants}, x, reference, columns=columns, check=ball_kept,
            runs=args.runs, warmup=args.warmup, repeats=args.repeats, probe_bytes=args.probe_mib * probes.MIB,
            probes=matmul_peaks, log=lambda line: print(line, flush=True))
    frame = with_rates(frame, cost.macs, note=f"{args.peak_n}x{args.peak_n} matmul")
    path = results.write_run("cpu-blurball", pd.concat([profile, frame]), env, results_dir=args.results_dir,
                             per_run=True)
    table = frame[frame["record"] == "variant"]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table[["run", "variant", "median_ms", SPEEDUP_VS_EAGER, "gflop_per_s", "share_of_matmul_rate",
                     MAX_ABS_DIFF, SAME_PEAKS, COMPILE_S, "note"]].to_string(index=False, float_format="{:.3g}".format))
    recorded = results.load("cpu-blurball", path.parent)
    recorded = runs_lib.flag_under_load(recorded[(recorded[results.SOURCE_FILE] == path.name)
                                                 & (recorded["record"] == "variant")])
    print(f"\nacross the {args.runs} runs (median, min..max ms):")
    for row in runs_lib.summarize_runs(recorded).itertuples():
        print(f"  {row.variant:28s} {row.median:10.1f}  {row.min:.1f}..{row.max:.1f}")
    flagged = recorded.loc[recorded[runs_lib.UNDER_LOAD], [results.RUN_ID, runs_lib.LOAD_REASON]].drop_duplicates()
    for row in flagged.itertuples(index=False):
        print(f"  {row[0]} looks taken under load: {row[1]}")
    if ball_clips:  # what these runs alone say about a lower precision (Chapter 7 decides on every recorded run)
        print("lower precision, from these runs: " + _lower_precision_line(lower_precision_worker(recorded, here=env)))
    print(f"\nMACs per forward {cost.macs / 1e9:.2f} G ({cost.dead_macs / 1e9:.2f} G in never-read stage-4 outputs)")
    print(f"bf16: {bf16_reason}\nwrote {path}")
    return path, failed


def _lower_precision_line(worker) -> str:
    """The lower-precision decision of these runs in one line, variants by their labels."""
    if worker is None or worker["lower"].best is None:
        return "undecided (no lower-precision variant kept the ball with a correct FP32 twin)"
    lower, fp32 = worker["lower"], worker["fp32"]
    low = f"{registry.get(lower.best).label} at {lower.best_median_ms:.1f} ms"
    high = f"{registry.get(fp32.best).label} at {fp32.best_median_ms:.1f} ms" if fp32.best else "no FP32 variant"
    line = f"serve {low}, faster than {high}" if worker["faster_than_fp32"] else f"keep FP32 ({high}); {low}"
    return line + ("" if lower.decided else ", undecided over these runs")


if __name__ == "__main__":
    sys.exit(main())
