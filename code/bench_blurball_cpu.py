"""BlurBall on the CPU: the measurement matrix of Chapter 5, one variant at a time.

    .venv/bin/python code/bench_blurball_cpu.py                     # every variant, 2 threads
    .venv/bin/python code/bench_blurball_cpu.py --variants eager_fp32,compile_freezing --repeats 5

Batch 1, explicit threads. Variants come from ``graphbook.variants`` (any registered name may be
given to ``--variants``). Each is first checked against eager FP32 with
``graphbook.results.compare_to_reference`` (max abs diff under the one tolerance, and the per-frame
heatmap peak positions), then timed with the book's harness (warm-up, median, spread).
Achieved GFLOP/s (2 x MACs counted by hooks / median time) is compared with the matmul peak
measured in the same run, and one eager forward is profiled and grouped like the article's GPU
profile (convolution, batch norm, cast/copy, element-wise, other; by the innermost op, the rule of the
GPU profile too: ``graphbook.profiling``). All rows go to a new file ``cpu-blurball-<date>[-N].csv``
under ``--results-dir`` (default ``data/results/``; never an existing file) and a table is printed. Exit status (``graphbook.cli``): 0 ok; 1 a variant expected to match eager
differs from it by more than the tolerance (the results are still written; the variants are named on stderr); 2 bad
arguments.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from graphbook import cli
from graphbook import variants as registry
from graphbook.cli import positive_int, multiple_of_8
from graphbook.results import (COMPILE_S, EXPECTED_TO_MATCH, MAX_ABS_DIFF, SAME_OUTPUT, SAME_PEAKS,
                               SPEEDUP_VS_EAGER)

#: The variants measured by default (any name of graphbook.variants.REGISTRY may be asked for).
DEFAULT_VARIANTS = ("eager_fp32", "eager_fp32_channels_last", "eager_bf16_autocast", "compile_default",
                    "compile_freezing", "compile_freezing_bf16", "ort_exporter_optimized_all")
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
                        help="comma-separated names from graphbook.variants (default: "
                             + ", ".join(DEFAULT_VARIANTS) + ")")
    parser.add_argument("--height", type=multiple_of_8, default=288)
    parser.add_argument("--width", type=multiple_of_8, default=512)
    parser.add_argument("--no-profile", action="store_true", help="skip the eager profile")
    parser.add_argument("--peak-n", type=positive_int, default=2048, help="matmul size for the peak")
    return parser.parse_args(argv)


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of the variant rows."""
    lines = [f"{'variant':28s} {'median ms':>10s} {'IQR ms':>8s} {'x eager':>8s} {'GFLOP/s':>8s} "
             f"{'% peak':>7s} {'max|diff|':>10s} {'peaks':>6s} {'build s':>8s}"]
    for r in rows:
        if not r.get("median_ms"):
            lines.append(f"{r['variant']:28s} skipped: {r.get('note', '')}")
            continue
        share = r.get("share_of_peak")
        lines.append(f"{r['variant']:28s} {r['median_ms']:10.1f} {r['q3_ms'] - r['q1_ms']:8.1f} "
                     f"{r[SPEEDUP_VS_EAGER]:8.2f} {r['gflop_per_s']:8.1f} "
                     f"{(100 * share if share != '' else float('nan')):7.1f} {r[MAX_ABS_DIFF]:10.2e} "
                     f"{'same' if r[SAME_PEAKS] else 'DIFF':>6s} {r[COMPILE_S]:8.1f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> tuple[Path, list[str]]:
    """Measure every requested variant and write the rows to a new CSV; returns its path and the
    FP32 variants that failed their check against eager."""
    import torch

    from graphbook import blurball, probes, results
    from graphbook.environment import fingerprint, set_threads
    from graphbook.profiling import profile_eager, variant_rows
    from graphbook.timing import time_cpu

    set_threads(args.threads)
    env = fingerprint(args.threads)
    model = blurball.build_blurball()
    x = blurball.example_input(height=args.height, width=args.width)
    cost = blurball.model_cost(model, x)
    reference = registry.build(REFERENCE, model, x, warm=False).run(x)
    margin = blurball.peak_margin(reference)
    bf16_ok, bf16_reason = probes.bf16_support()

    peaks = {"fp32": probes.matmul_peak(n=args.peak_n, repeats=5)["gflop_per_s"]}
    if bf16_ok:
        peaks["bf16"] = probes.matmul_peak(n=args.peak_n, dtype=torch.bfloat16, repeats=5)["gflop_per_s"]
    common = {"batch": 1, "height": args.height, "width": args.width, "macs": cost.macs,
              "dead_macs": cost.dead_macs, "parameters": cost.parameters, "peak_margin": margin}
    measured, failed = [], []
    with registry.BuildContext(threads=args.threads) as context:
        for name in args.variants:
            variant = registry.get(name)
            base = {"record": "variant", "variant": name, "description": variant.description,
                    "precision": variant.precision, EXPECTED_TO_MATCH: variant.expected_to_match_eager, **common}
            if variant.precision == "bf16" and not bf16_ok:
                measured.append({**base, "note": f"skipped: {bf16_reason}"})
                print(f"{name}: skipped ({bf16_reason})", flush=True)
                continue
            print(f"{name}: building and checking ...", flush=True)
            built = registry.build(name, model, x, context)
            check = results.compare_to_reference(built.run(x), reference)
            note = built.note
            if variant.expected_to_match_eager and not check[SAME_OUTPUT]:
                note = (note + "; " if note else "") + "output differs from eager FP32"
                failed.append(name)
            timing = time_cpu(lambda: built.run(x), warmup=args.warmup, repeats=args.repeats, name=name)
            measured.append({**base, **timing.as_dict(), **check, COMPILE_S: built.compile_s,
                             "note": note or (bf16_reason if variant.precision == "bf16" else "")})
            print(f"  median {timing.median_ms:.1f} ms, max abs diff {check[MAX_ABS_DIFF]:.2e}, "
                  f"peaks {'same' if check[SAME_PEAKS] else 'DIFFERENT'}", flush=True)
    rows = variant_rows(measured, cost.macs, peaks)
    for precision, value in peaks.items():
        rows.append({"record": "peak", "variant": f"matmul_{precision}", "precision": precision,
                     "peak_gflop_per_s": value, "note": f"{args.peak_n}x{args.peak_n} matmul"})
    if not args.no_profile:
        for group in profile_eager(model, x):
            rows.append({"record": "profile", "variant": REFERENCE, "precision": "fp32",
                         "category": group["category"], "ops": group["ops"],
                         "profile_ms": group["ms"], "share": group["share"]})
    path = results.write_run("cpu-blurball", rows, env, results_dir=args.results_dir)
    print()
    print(format_table([r for r in rows if r["record"] == "variant"]))
    print(f"\nMACs per forward {cost.macs / 1e9:.2f} G ({cost.dead_macs / 1e9:.2f} G in never-read "
          f"stage-4 outputs); peaks: " + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()))
    print(f"bf16: {bf16_reason}")
    print(f"wrote {path}")
    return path, failed


if __name__ == "__main__":
    sys.exit(cli.run_checked("bench_blurball_cpu.py", parse_args, run))
