"""BlurBall on the CPU: the measurement matrix of Chapter 5, one variant at a time.

    .venv/bin/python code/bench_blurball_cpu.py                     # every variant, 2 threads
    .venv/bin/python code/bench_blurball_cpu.py --variants eager_fp32,compile_freezing --repeats 5
    .venv/bin/python code/bench_blurball_cpu.py --runs 5                   # five runs instead of three

Batch 1, explicit threads, the book's trained checkpoint (``--weights random`` for seeded random
weights; the time of a forward does not depend on the weights, the decoded ball does). Variants come
from ``graphbook.runtimes.variants`` (any registered name may be given to ``--variants``; the default set
includes the lower precisions: compiled bf16 without freezing, ONNX Runtime's INT8 Q/DQ model, and
OpenVINO in FP32, BF16 and INT8). Each is first checked against eager FP32 with
``graphbook.runtimes.correctness.compare_to_reference`` (max abs diff under the one tolerance, and the per-frame
heatmap peak positions) and, on ``--ball-clips`` hard held-out clips (``graphbook.model.synthetic_clips.check_clips``),
with ``graphbook.runtimes.correctness.ball_check`` (the decoded ball of every frame in eager FP32's place: with its FP32
twin's check, what a lower precision must pass; column ``same_ball``), then timed with the book's harness
(warm-up, median, spread). The INT8 model is calibrated on ``--calibration-clips`` training clips, never the held-out
ones. A variant this machine cannot build (no OpenVINO wheel, no native BF16) is a row whose note says why.

Every variant is built (and compiled) once; then ``--runs`` independent runs (default and minimum 3)
each time every variant once (``--warmup`` untimed calls, then ``--repeats`` timed ones), in an order
that rotates between runs (round-robin: run 2 starts with the second variant...), so no variant
always goes first. Each run also measures its own physical references: the ``copy_`` bandwidth
(``copy_gbps``, which ``graphbook.record.runs.flag_under_load`` uses to flag a run taken under load) and the
matmul peaks. Rows carry ``run`` (1, 2, 3...), ``run_order`` (1 = went first) and ``run_id``
``<file stem>/r<run>``, so ``graphbook.record.runs.summarize_runs`` counts each run on its own and a chapter
decides on the median across runs. The build cost (``compile_s``) and the correctness check are per
build: the same in every run's rows. A compiled variant of ``graphbook.runtimes.variants`` re-enters Dynamo
(from the in-memory and on-disk caches) on the first call of its block when another compiled variant
ran in between: that happens in the untimed warm-up.
Achieved GFLOP/s (2 x MACs counted by hooks / median time) is compared with the matmul peak
measured in the same run, and one eager forward is profiled (once per invocation) and grouped like the article's GPU
profile (convolution, batch norm, cast/copy, element-wise, other; by the innermost op, the rule of the
GPU profile too: ``graphbook.teach.profiling``). All rows go to a new file ``cpu-blurball-<date>[-N].csv``
under ``--results-dir`` (default ``data/results/``; never an existing file) and a table is printed. Exit
status (``graphbook.record.cli``): 0 ok; 1 a variant expected to match eager differs from it by more than the
tolerance (the results are still written; the variants are named on stderr); 2 bad arguments; 3 the
checkpoint is missing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from graphbook.record import cli
from graphbook.record.cli import int_at_least, multiple_of_8, positive_int
from graphbook.record.results import (
    BALL_AGREE_FRAMES,
    BALL_FRAMES,
    COMPILE_S,
    EXPECTED_TO_MATCH,
    MAX_ABS_DIFF,
    SAME_BALL,
    SAME_OUTPUT,
    SAME_PEAKS,
    SPEEDUP_VS_EAGER,
)
from graphbook.runtimes import variants as registry

#: The variants measured by default (any name of graphbook.runtimes.variants.REGISTRY may be asked for).
DEFAULT_VARIANTS = ("eager_fp32", "eager_fp32_channels_last", "eager_bf16_autocast", "compile_default",
                    "compile_freezing", "compile_bf16", "compile_freezing_bf16", "ort_exporter_optimized_all",
                    "ort_int8_qdq_all", "openvino_fp32", "openvino_bf16", "openvino_int8")
#: Fastest ball (px per frame) of the clips the trained checkpoint was trained and scored on (as bench_int8.py).
MAX_SPEED = 30.0
VARIANTS = {name: registry.get(name).description for name in DEFAULT_VARIANTS}
REFERENCE = registry.REFERENCE


def _variant_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in registry.REGISTRY]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {unknown or [text]}; choose from {', '.join(registry.REGISTRY)}")
    if REFERENCE not in names:  # everything is checked and reported against eager FP32
        names.insert(0, REFERENCE)
    return list(dict.fromkeys(names))


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options; bad values exit 2 with one line on stderr (Chapter 5)."""
    parser = cli.make_parser("bench_blurball_cpu.py", "BlurBall CPU measurement matrix (Chapter 5).")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch and ORT intra-op threads")
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed calls per variant")
    parser.add_argument("--warmup", type=positive_int, default=3, help="untimed calls per variant")
    parser.add_argument("--variants", type=_variant_list, default=list(DEFAULT_VARIANTS),
                        help="comma-separated names from graphbook.runtimes.variants (default: "
                             + ", ".join(DEFAULT_VARIANTS) + ")")
    parser.add_argument("--height", type=multiple_of_8, default=288)
    parser.add_argument("--width", type=multiple_of_8, default=512)
    parser.add_argument("--no-profile", action="store_true", help="skip the eager profile")
    parser.add_argument("--peak-n", type=positive_int, default=2048, help="matmul size for the peak")
    parser.add_argument("--runs", type=int_at_least(3), default=3,
                        help="independent runs, each timing every variant once in a rotated order (default 3, at least 3)")
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


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of the variant rows."""
    lines = [f"{'run':>3s} {'variant':28s} {'median ms':>10s} {'IQR ms':>8s} {'x eager':>8s} {'GFLOP/s':>8s} "
             f"{'%matmul':>7s} {'max|diff|':>10s} {'peaks':>6s} {'build s':>8s}"]
    for r in rows:
        if not r.get("median_ms"):
            lines.append(f"{r.get('run', ''):>3} {r['variant']:28s} skipped: {r.get('note', '')}")
            continue
        share = r.get("share_of_matmul_rate")
        lines.append(f"{r.get('run', ''):>3} {r['variant']:28s} {r['median_ms']:10.1f} {r['q3_ms'] - r['q1_ms']:8.1f} "
                     f"{r[SPEEDUP_VS_EAGER]:8.2f} {r['gflop_per_s']:8.1f} "
                     f"{(100 * share if share != '' else float('nan')):7.1f} {r[MAX_ABS_DIFF]:10.2e} "
                     f"{'same' if r[SAME_PEAKS] else 'DIFF':>6s} {r[COMPILE_S]:8.1f}")
    return "\n".join(lines)


def _weights(args: argparse.Namespace) -> Path | None:
    """The checkpoint the matrix runs (None: seeded random weights)."""
    from graphbook.paths import TRAINED_CHECKPOINT

    return None if args.weights == "random" else Path(args.weights or TRAINED_CHECKPOINT)


def main(argv=None) -> int:
    """Parse, refuse when the checkpoint is absent (exit 3), run, and the exit status of ``graphbook.record.cli``."""
    args = parse_args(argv)
    weights = _weights(args)
    if weights is not None and not weights.is_file():
        return cli.resource_absent("bench_blurball_cpu.py", f"checkpoint {weights} is missing; recreate it with "
                                   "`python code/train_blurball.py --seed 0`, or pass --weights random")
    _, failed = run(args)
    return cli.exit_status_for("bench_blurball_cpu.py", failed)


def run(args: argparse.Namespace) -> tuple[Path, list[str]]:
    """Build every requested variant once, then time them all in ``args.runs`` rotated runs; write the
    rows to a new CSV. Returns its path and the FP32 variants that failed their check against eager."""
    import torch

    from graphbook.measure import probes
    from graphbook.measure.environment import fingerprint, set_threads
    from graphbook.measure.timing import repeated_runs
    from graphbook.model import blurball, model_cost, synthetic_clips
    from graphbook.record import results, runs as runs_lib
    from graphbook.runtimes import correctness
    from graphbook.runtimes.variants import VariantUnavailable
    from graphbook.teach.profiling import profile_eager, variant_rows

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
        calibration = [blurball.imagenet_normalize(synthetic_clips.frames_to_tensor(
            [synthetic_clips.training_clip(0, k, args.height, args.width, max_speed=MAX_SPEED)]))
            for k in range(args.calibration_clips)]
    cost = model_cost.model_cost(model, x)
    reference_run = registry.build(REFERENCE, model, x, warm=False).run
    reference = reference_run(x)

    def built_reference(clip):
        return reference_run(blurball.imagenet_normalize(synthetic_clips.frames_to_tensor([clip])))
    margin = blurball.peak_margin(reference)
    bf16_ok, bf16_reason = probes.bf16_support()
    common = {"batch": 1, "height": args.height, "width": args.width, "macs": cost.macs,
              "dead_macs": cost.dead_macs, "parameters": cost.parameters, "peak_margin": margin,
              "weights": "trained" if weights is not None else "random"}
    reference_logits = None
    rows: list[dict] = []
    if not args.no_profile:  # once per invocation (not a timing): these rows keep the file's own run id
        for group in profile_eager(model, x):
            rows.append({"record": "profile", "variant": REFERENCE, "precision": "fp32",
                         "category": group["category"], "ops": group["ops"],
                         "profile_ms": group["ms"], "share": group["share"]})
    bases, skipped, built, failed = {}, {}, {}, []
    with registry.BuildContext(threads=args.threads, calibration=calibration) as context:
        for name in args.variants:  # build and check each variant ONCE; the runs reuse it
            variant = registry.get(name)
            bases[name] = {"record": "variant", "variant": name, "description": variant.description,
                           "precision": variant.precision, EXPECTED_TO_MATCH: variant.expected_to_match_eager,
                           **common}
            if variant.precision == "bf16" and not bf16_ok:
                skipped[name] = f"skipped: {bf16_reason}"
                print(f"{name}: skipped ({bf16_reason})", flush=True)
                continue
            print(f"{name}: building and checking ...", flush=True)
            try:
                one = registry.build(name, model, x, context)
            except VariantUnavailable as why:  # a missing package or CPU feature: a skipped row says why
                skipped[name] = f"unavailable: {why}"
                print(f"{name}: unavailable ({why})", flush=True)
                continue
            check = correctness.compare_to_reference(one.run(x), reference)
            note = one.note
            if variant.family == "openvino":  # what OpenVINO really executed: a bf16 hint is not a bf16 run
                from graphbook.runtimes.openvino_runtime import describe_runtime

                graph = describe_runtime(one.run.compiled)
                note += (f"; executed {graph['layers']} layers ("
                         + ", ".join(f"{p} {n}" for p, n in graph["by_precision"].items())
                         + f"), {graph['fused_layers']} of them fused from {graph['fused_ops']} operations")
            if variant.expected_to_match_eager and not check[SAME_OUTPUT]:
                note = (note + "; " if note else "") + "output differs from eager FP32"
                failed.append(name)
            if ball_clips:
                if reference_logits is None:  # eager's logits once, for every variant's comparison
                    reference_logits = [built_reference(c) for c in ball_clips]
                check.update(correctness.ball_check(one.run, ball_clips, reference_logits))
                if not check[SAME_BALL]:
                    note = (note + "; " if note else "") + (
                        f"decoded ball differs from eager FP32 on {check[BALL_FRAMES] - check[BALL_AGREE_FRAMES]} "
                        f"of {check[BALL_FRAMES]} held-out frames")
            built[name] = one
            bases[name].update({**check, COMPILE_S: one.compile_s,
                                "note": note or (bf16_reason if variant.precision == "bf16" else "")})
        timed = [name for name in args.variants if name in built]

        def matmul_peaks() -> dict:  # the compute reference of each run, beside its copy_ bandwidth
            peaks = {"peak_fp32": probes.matmul_peak(n=args.peak_n, repeats=5)["gflop_per_s"]}
            if bf16_ok:
                peaks["peak_bf16"] = probes.matmul_peak(n=args.peak_n, dtype=torch.bfloat16, repeats=5)["gflop_per_s"]
            return peaks

        timed_rows = repeated_runs({name: (lambda one=built[name]: one.run(x)) for name in timed}, runs=args.runs,
                                   warmup=args.warmup, repeats=args.repeats, probe_bytes=args.probe_mib * probes.MIB,
                                   probes=matmul_peaks, log=lambda line: print(line, flush=True))
        for number in range(1, args.runs + 1):
            this_run = [r for r in timed_rows if r[results.RUN] == number]
            peaks = {key.removeprefix("peak_"): value for key, value in this_run[0].items() if key.startswith("peak_")}
            per_run = {key: this_run[0][key] for key in (results.RUN, "run_count", "run_started", results.COPY_GBPS,
                                                         "went_first")}
            measured = [{**bases[r["variant"]], **{k: v for k, v in r.items() if not k.startswith("peak_")}}
                        for r in this_run]
            measured += [{**bases[name], **per_run, "note": why} for name, why in skipped.items()]
            measured.sort(key=lambda r: args.variants.index(r["variant"]))  # registry order in the file
            rows += variant_rows(measured, cost.macs, peaks)
            for precision, value in peaks.items():
                rows.append({"record": "peak", "variant": f"matmul_{precision}", "precision": precision,
                             "peak_gflop_per_s": value, "note": f"{args.peak_n}x{args.peak_n} matmul", **per_run})
    path = results.write_run("cpu-blurball", rows, env, results_dir=args.results_dir, per_run=True)
    variant_table = [r for r in rows if r["record"] == "variant"]
    print()
    print(format_table(variant_table))
    frame = results.load("cpu-blurball", path.parent)
    frame = runs_lib.flag_under_load(frame[(frame[results.SOURCE_FILE] == path.name) & (frame["record"] == "variant")])
    summary = runs_lib.summarize_runs(frame)
    print(f"\nacross the {args.runs} runs (median, min..max ms):")
    for row in summary.itertuples():
        print(f"  {row.variant:28s} {row.median:10.1f}  {row.min:.1f}..{row.max:.1f}")
    flagged = frame.loc[frame[runs_lib.UNDER_LOAD], [results.RUN_ID, runs_lib.LOAD_REASON]].drop_duplicates()
    for row in flagged.itertuples(index=False):
        print(f"  {row[0]} looks taken under load: {row[1]}")
    if ball_clips:  # what these runs alone say about a lower precision (Chapter 7 decides on every recorded run)
        from graphbook.serving.decisions import lower_precision_worker

        print(f"lower precision, from these runs: {lower_precision_worker(frame, here=env)}")
    print(f"\nMACs per forward {cost.macs / 1e9:.2f} G ({cost.dead_macs / 1e9:.2f} G in never-read "
          f"stage-4 outputs); peaks (last run): " + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()))
    print(f"bf16: {bf16_reason}")
    print(f"wrote {path}")
    return path, failed


if __name__ == "__main__":
    sys.exit(main())
