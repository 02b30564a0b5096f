"""The book's server beside LitServe: the same ONNX Runtime session, the same threads, the same clients.

Introduced in Chapter 7. Exports the trained BlurBall with a dynamic batch (``--model tiny``: the
two-layer stand-in, for tests), then, ``--runs`` times in an order that alternates between runs, starts
``code/serve_blurball.py --artifact`` and a LitServe server (``graphbook.serving.litserve_compare``:
``max_batch_size=3``, ``batch_timeout`` = the book's ``--max-wait-ms``) in fresh processes and sends
each the load test of ``code/bench_serving_load.py``: levels of 1, 2, 4 and 8 loopback clients, then
an overload level of 24 (bounded request count and time). Each run measures the ``copy_`` bandwidth
first, so a run taken under load can be flagged. One new results file of kind ``litserve-compare``.

    .venv/bin/python code/bench_litserve.py                       # 96x160, 3 runs (a few minutes)

Exit status: 0 ok; 1 a request got an answer other than 200 or 503, or a server did not start (the
rows measured are still written); 2 bad arguments; 3 litserve is not installed or the checkpoint is
missing.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from graphbook.record.cli import EXIT_CHECK_FAILED, EXIT_OK, add_load_test_options, make_parser, positive_int, resource_absent

PROG = "bench_litserve.py"


def parse_args(argv=None):
    p = make_parser(PROG, __doc__.splitlines()[0])
    add_load_test_options(p)
    p.add_argument("--runs", type=positive_int, default=3, help="runs, alternating the order (at least 3)")
    p.add_argument("--model", choices=("blurball", "tiny"), default="blurball",
                   help="'tiny' serves the two-layer stand-in (for tests); default the trained BlurBall")
    args = p.parse_args(argv)
    if args.runs < 3:
        p.error(f"--runs must be at least 3 (a comparison rests on repeated runs), got {args.runs}")
    if max(args.concurrency) > 64 or not 0 <= args.overload_clients <= 64:
        p.error("at most 64 clients per level")
    if max(args.concurrency) > args.max_queue:
        p.error(f"--concurrency levels must not exceed --max-queue ({args.max_queue}); only the overload level does")
    if not 0 <= args.max_wait_ms <= 1000:
        p.error(f"--max-wait-ms must be in 0..1000, got {args.max_wait_ms}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import litserve  # noqa: F401 - only its presence is checked here
    except ImportError:
        return resource_absent(PROG, "litserve is not installed: pip install -r requirements.txt")
    import torch

    from graphbook import onnx_utils
    from graphbook.record import results
    from graphbook.record.environment import fingerprint
    from graphbook.serving import litserve_compare

    if args.model == "tiny":
        from graphbook.warmup import tiny_clip_net

        model = tiny_clip_net()
    else:
        from graphbook.blurball import load_trained_blurball

        try:
            model = load_trained_blurball()
        except FileNotFoundError as exc:
            return resource_absent(PROG, str(exc))
    env = fingerprint(args.threads)
    levels = [(c, False) for c in args.concurrency] + ([(args.overload_clients, True)] if args.overload_clients else [])
    rows, failure = [], None
    with tempfile.TemporaryDirectory(prefix="graphbook-litserve-") as tmp:
        print(f"exporting {args.model} with a dynamic batch at {args.height}x{args.width}", flush=True)
        onnx_path = onnx_utils.export_dynamic_batch(model, torch.randn(2, 9, args.height, args.width),
                                                    Path(tmp) / f"{args.model}-dynamic.onnx")
        try:
            litserve_compare.compare(onnx_path, (args.height, args.width), levels=levels, runs=args.runs,
                                     threads=args.threads, max_queue=args.max_queue, max_wait_ms=args.max_wait_ms,
                                     requests=args.requests, time_limit_s=args.time_limit,
                                     log=lambda line: print(line, flush=True), rows=rows)
        except RuntimeError as exc:  # a server that did not start: keep what was measured
            failure = f"{PROG}: error: {str(exc).splitlines()[0]}"
    if not rows:
        print(failure or f"{PROG}: error: nothing was measured", file=sys.stderr)
        return 1
    errors = sum(int(r["errors"]) for r in rows)
    if errors and failure is None:
        failure = f"{PROG}: {errors} requests got an answer other than 200 or 503"
    path = results.write_run("litserve-compare", rows, env, results_dir=args.results_dir, per_run=True)
    print(f"wrote {len(rows)} rows to {path}")
    if failure:
        print(failure, file=sys.stderr)
        return EXIT_CHECK_FAILED
    return EXIT_OK

if __name__ == "__main__":
    sys.exit(main())
