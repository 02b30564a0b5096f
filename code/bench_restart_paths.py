"""Restart paths of BlurBall side by side, each in fresh processes (Chapter 6)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pandas as pd

from graphbook.config import FULL_SIZE
from graphbook.measure.environment import fingerprint
from graphbook.paths import TRAINED_CHECKPOINT
from graphbook.record import results
from graphbook.record.cli import add_input_size, add_threads, comma_choices, int_at_least, make_parser, positive_int
from graphbook.startup import restart_paths
from graphbook.startup.restart_paths import PATH_NAMES


def parse_args(argv=None):
    p = make_parser("bench_restart_paths.py", __doc__.splitlines()[0])
    p.add_argument("--paths", type=comma_choices(PATH_NAMES, "restart path"), default=PATH_NAMES,
                   help="comma-separated restart paths (default: all)")
    add_input_size(p, FULL_SIZE)
    p.add_argument("--repeats", type=positive_int, default=3, help="fresh starts per path (default 3)")
    p.add_argument("--steady-runs", type=positive_int, default=5, help="calls timed after the first (default 5)")
    p.add_argument("--server-repeats", type=int_at_least(0), default=3,
                   help="also time serve_blurball.py to ready from the .pt2, .onnx and .ort artifacts this many "
                        "times (a serving-ready results file; 0 skips it; default 3)")
    add_threads(p)
    p.add_argument("--weights", type=Path, default=None,
                   help="checkpoint (default: the book's trained BlurBall, data/checkpoints/blurball_synthetic.pt)")
    p.add_argument("--workdir", type=Path, default=None, help="keep the artifacts here (default: a temporary folder)")
    p.add_argument("--timeout", type=positive_int, default=1800, help="seconds per fresh process")
    args = p.parse_args(argv)
    if any(n in args.paths for n in ("compile-warm", "compile-artifacts")) and "compile-cold" not in args.paths:
        p.error("compile-warm and compile-artifacts need compile-cold in --paths (it fills their cache)")
    if args.weights is not None and not args.weights.is_file():
        p.error(f"--weights file {str(args.weights)!r} does not exist")
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        p.error(f"--workdir {str(args.workdir)!r} is not empty")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    weights = args.weights or TRAINED_CHECKPOINT
    if not weights.is_file():
        print(f"bench_restart_paths.py: error: checkpoint {weights} is missing; "
              "recreate it with `python code/train_blurball.py --seed 0`", file=sys.stderr)
        return 3
    env = fingerprint(args.threads)
    server_rows: list[dict] = []
    try:
        rows = restart_paths.run_restart_paths(weights, input_hw=(args.height, args.width), repeats=args.repeats,
                                               threads=args.threads, paths=args.paths, steady_runs=args.steady_runs,
                                               workdir=args.workdir, timeout=args.timeout,
                                               progress=lambda m: print(m, flush=True),
                                               server_repeats=args.server_repeats, server_rows=server_rows)
    except restart_paths.RestartPathError as exc:
        print(f"bench_restart_paths.py: error: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
        return 1
    try:
        out = results.write_run(restart_paths.KIND, rows, env, results_dir=args.results_dir)
        print(f"wrote {len(rows)} rows to {out}")
        if server_rows:
            out = results.write_run("serving-ready", server_rows, env, results_dir=args.results_dir)
            print(f"wrote {len(server_rows)} server rows to {out}")
    except Exception as exc:  # never lose a long run: keep its rows where the user can find them
        keep = Path(tempfile.mkstemp(prefix="restart-paths-rows-", suffix=".json")[1])
        keep.write_text(json.dumps({"env": env, "rows": rows, "server_rows": server_rows}, default=str))
        print(f"bench_restart_paths.py: error: could not write the results ({type(exc).__name__}: {exc}); "
              f"the rows are in {keep}", file=sys.stderr)
        return 1

    summary = restart_paths.summarize(pd.DataFrame(rows))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary[["path", "starts", "first_output_median_s", "first_output_min_s", "first_output_max_s",
                       "speedup_vs_cold", "steady_median_ms", "build_s", "artifact_mb", "same_output"]]
              .to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    wrong = summary[~summary["same_output"]]["path"].tolist()
    if wrong:
        print(f"bench_restart_paths.py: paths whose output differed from eager FP32: {', '.join(wrong)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
