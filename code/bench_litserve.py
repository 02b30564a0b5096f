"""The book's server beside LitServe: the same ONNX Runtime session, the same threads, the same clients."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from graphbook.measure.environment import fingerprint
from graphbook.measure.warmup import tiny_clip_net
from graphbook.model.blurball import load_trained_blurball
from graphbook.record import cli, results
from graphbook.runtimes import onnx_utils
from graphbook.serving import hostile_clients, litserve_compare

PROG = "bench_litserve.py"


def parse_args(argv=None):
    p = cli.make_parser(PROG, __doc__.splitlines()[0])
    cli.add_load_test_options(p)
    p.add_argument("--runs", type=cli.int_at_least(3), default=3, help="runs, alternating the order (at least 3)")
    p.add_argument("--model", choices=("blurball", "tiny"), default="blurball",
                   help="'tiny' serves the two-layer stand-in (for tests); default the trained BlurBall")
    p.add_argument("--faults", action="store_true", help="hostile clients instead of the load test")
    p.add_argument("--max-stalled", type=cli.positive_int, default=96,
                   help="with --faults: stalled uploads to try at most (default 96, at most 256)")
    p.add_argument("--hold", type=cli.positive_float, default=15.0,
                   help="with --faults: seconds to hold the stalled uploads, to see them dropped (default 15, at most 120)")
    args = p.parse_args(argv)
    if args.max_stalled > 256 or args.hold > 120:
        p.error(f"--max-stalled must be at most 256 and --hold at most 120 s, got {args.max_stalled} and {args.hold:g}")
    if args.faults and args.max_queue > 21:  # the burst of three times the queue stays within 64 clients
        p.error(f"--max-queue must be at most 21 with --faults, got {args.max_queue}")
    cli.check_load_test(p, args, queue_bound=not args.faults)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import litserve  # noqa: F401 - only its presence is checked here
    except ImportError:
        return cli.resource_absent(PROG, "litserve is not installed: pip install -r requirements.txt")

    if args.model == "tiny":
        model = tiny_clip_net()
    else:
        try:
            model = load_trained_blurball()
        except FileNotFoundError as exc:
            return cli.resource_absent(PROG, str(exc))
    env = fingerprint(args.threads)
    levels = [(c, False) for c in args.concurrency] + ([(args.overload_clients, True)] if args.overload_clients else [])
    rows, failure = [], None
    with tempfile.TemporaryDirectory(prefix="graphbook-litserve-") as tmp:
        print(f"exporting {args.model} with a dynamic batch at {args.height}x{args.width}", flush=True)
        onnx_path = onnx_utils.export_dynamic_batch(model, torch.randn(2, 9, args.height, args.width),
                                                    Path(tmp) / f"{args.model}-dynamic.onnx")
        options = dict(runs=args.runs, threads=args.threads, max_queue=args.max_queue, max_wait_ms=args.max_wait_ms,
                       log=lambda line: print(line, flush=True), rows=rows)
        try:
            if args.faults:
                hostile_clients.compare(onnx_path, (args.height, args.width), max_stalled=args.max_stalled,
                                        hold_s=args.hold, **options)
            else:
                litserve_compare.compare(onnx_path, (args.height, args.width), levels=levels, requests=args.requests,
                                         time_limit_s=args.time_limit, **options)
        except RuntimeError as exc:  # a server that did not start: keep what was measured
            failure = f"{PROG}: error: {str(exc).splitlines()[0]}"
    if not rows:
        print(failure or f"{PROG}: error: nothing was measured", file=sys.stderr)
        return 1
    if args.faults:
        broken = [f"{r['fault']} in run {r['run']}" for r in rows if r["server"] == "book" and
                  (r["recovered_status"] != 200 or (r["fault"] == "stalled-body" and r["valid_status"] != 200))]
        problem = f"the book's server refused a valid request it should serve: {', '.join(broken)}" if broken else None
    else:
        errors = sum(int(r["errors"]) for r in rows)
        problem = f"{errors} requests got an answer other than 200 or 503" if errors else None
    failure = failure or (f"{PROG}: {problem}" if problem else None)
    kind = "hostile-clients" if args.faults else "litserve-compare"
    path = results.write_run(kind, rows, env, results_dir=args.results_dir, per_run=True)
    print(f"wrote {len(rows)} rows to {path}")
    if args.faults:
        print(hostile_clients.fault_table(rows).to_string(index=False))
    if failure:
        print(failure, file=sys.stderr)
        return cli.EXIT_CHECK_FAILED
    return cli.EXIT_OK

if __name__ == "__main__":
    sys.exit(main())
