"""Operator fusion on a laptop CPU: the article's demo, re-written (Chapter 2)."""
from __future__ import annotations

import sys

import pandas as pd

from graphbook.config import SAME_OUTPUT_ATOL
from graphbook.measure import environment
from graphbook.record import cli, results
from graphbook.record.cli import int_at_least
from graphbook.teach import allocation, fusion_demo

DEFAULT_SIZE, DEFAULT_REPEATS = fusion_demo.DEFAULT_SIZE, fusion_demo.DEFAULT_REPEATS
DEFAULT_FEATURE_MAP, DEFAULT_RUNS = fusion_demo.DEFAULT_FEATURE_MAP, fusion_demo.DEFAULT_RUNS


def _parse(argv):
    parser = cli.make_parser("03_fusion.py", __doc__.splitlines()[0])
    parser.add_argument("--threads", type=cli.positive_int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--size", type=int_at_least(1024), default=DEFAULT_SIZE,
                        help=f"float32 elements per array in the chain (default {DEFAULT_SIZE})")
    parser.add_argument("--repeats", type=int_at_least(3), default=DEFAULT_REPEATS, help="timed runs per median (>= 3)")
    parser.add_argument("--feature-map", type=cli.positive_int, nargs=3, metavar=("C", "H", "W"),
                        default=list(DEFAULT_FEATURE_MAP),
                        help="conv+BN feature map (default {} {} {})".format(*DEFAULT_FEATURE_MAP))
    parser.add_argument("--runs", type=int_at_least(3), default=DEFAULT_RUNS,
                        help=f"independent runs of (a) and (b), each in a rotated order (default {DEFAULT_RUNS}, at least 3)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip torch.compile (the compiled chain and the compile-time part)")
    parser.add_argument("--no-allocator", action="store_true",
                        help="skip part (d), the allocator experiment in fresh processes")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run parts (a)-(c), write the report and the results; return the exit status (Chapter 2)."""
    args = _parse(argv)  # before importing torch, so that a typo fails in a fraction of a second

    environment.set_threads(args.threads)
    env = environment.fingerprint(args.threads)
    print(f"03_fusion.py: {args.threads} thread(s), N = {args.size}, {args.repeats} repeats, {args.runs} runs",
          flush=True)
    frame = fusion_demo.measure_runs(
        tuple(args.feature_map), args.size, args.repeats, runs=args.runs, compile_chain=not args.no_compile,
        progress=lambda message: print("  " + message, flush=True))
    print("  (a) BN folding and (b) chain done", flush=True)
    compile_frame = None if args.no_compile else fusion_demo.measure_compile_time(args.size, args.threads, runs=args.runs)
    print("  (c) compile time " + ("skipped" if compile_frame is None else "done"), flush=True)
    allocator = ("--no-allocator" if args.no_allocator else
                 allocation.allocator_runs(args.size, args.threads, runs=args.runs, repeats=args.repeats))
    print("  (d) allocator " + (f"skipped: {allocator}" if isinstance(allocator, str) else "done"), flush=True)
    recorded = pd.concat([compile_frame, frame, None if isinstance(allocator, str) else allocator])
    results_csv = results.write_run("fusion-demo", recorded, env, results_dir=args.results_dir, per_run=True)
    report = fusion_demo.write_report(results_csv, env, frame, compile_frame)
    print(report.read_text())
    print(f"wrote {report} and {results_csv}")
    failed = fusion_demo.failed_checks(frame, SAME_OUTPUT_ATOL)
    return cli.exit_status_for("03_fusion.py", failed)  # 1 if a version differs (its rows are written above)


if __name__ == "__main__":
    sys.exit(main())
