"""The BlurBall server under load on loopback: throughput and latency against concurrency, batching off and on."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from graphbook import serving
from graphbook.measure.environment import fingerprint
from graphbook.measure.warmup import tiny_clip_net
from graphbook.model.blurball import load_trained_blurball
from graphbook.paths import TRAINED_CHECKPOINT
from graphbook.record import results
from graphbook.record.cli import add_load_test_options, check_load_test, comma_choices, make_parser, resource_absent
from graphbook.runtimes import onnx_utils
from graphbook.serving.litserve_compare import start_server, stop_server

PROG = "bench_serving_load.py"
RUNTIMES = ("eager", "onnxruntime")


def parse_args(argv=None):
    p = make_parser(PROG, __doc__.splitlines()[0])
    add_load_test_options(p)
    p.add_argument("--runtimes", type=comma_choices(RUNTIMES, "runtime"), default=RUNTIMES,
                   help="comma-separated: eager (the checkpoint in PyTorch), onnxruntime (its dynamic-batch "
                        "ONNX export); default both")
    p.add_argument("--model", choices=("blurball", "tiny"), default="blurball",
                   help="'tiny' loads a two-layer stand-in (for tests); default the trained BlurBall")
    p.add_argument("--artifact", type=Path, default=None,
                   help="serve only this .onnx/.ort/.pt2 (dynamic batch 1-3) instead of --runtimes")
    args = p.parse_args(argv)
    check_load_test(p, args)
    if args.artifact is not None and (args.artifact.suffix not in (".onnx", ".ort", ".pt2") or not args.artifact.is_file()):
        p.error(f"--artifact {str(args.artifact)!r} must be an existing .onnx, .ort or .pt2 file")
    return args


def _export_dynamic_batch(model, args, folder: Path) -> Path:
    """The served model (trained BlurBall or the stand-in) as ONNX with a dynamic batch dimension."""
    print(f"exporting {args.model} with a dynamic batch at {args.height}x{args.width}", flush=True)
    return onnx_utils.export_dynamic_batch(model, torch.randn(2, 9, args.height, args.width),
                                           folder / f"{args.model}-dynamic.onnx")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    model, eager_args = tiny_clip_net(), ["--model", "tiny"]
    if args.artifact is None and args.model == "blurball":
        try:  # serve_blurball.py would fall back to random weights: not the book's model
            model, eager_args = load_trained_blurball(), ["--weights", str(TRAINED_CHECKPOINT)]
        except FileNotFoundError as exc:
            return resource_absent(PROG, str(exc))
    env = fingerprint(args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphbook-load-") as tmp:
        if args.artifact is not None:
            servers = [(args.artifact.suffix.lstrip("."), args.artifact)]
        else:
            servers = [(runtime, None if runtime == "eager" else _export_dynamic_batch(model, args, Path(tmp)))
                       for runtime in args.runtimes]
        clip = np.random.default_rng(0).standard_normal((1, 9, args.height, args.width)).astype(np.float32)
        levels = [(c, False) for c in args.concurrency] + ([(args.overload_clients, True)] if args.overload_clients else [])
        for served, artifact in servers:
            for batching in (False, True):
                try:
                    proc, url, ready_s = start_server("book", artifact, (args.height, args.width), threads=args.threads,
                                                      max_queue=args.max_queue, max_wait_ms=args.max_wait_ms,
                                                      book_args=([] if artifact else eager_args)
                                                      + ([] if batching else ["--no-batching"]))
                except RuntimeError as exc:
                    print(f"{PROG}: error: {exc}", file=sys.stderr)
                    return 1
                try:
                    _, ready = serving.request(url + "/readyz")
                    for clients, overload in levels:
                        requests = max(args.requests, 4 * clients)
                        report = serving.load_test(url, clip, concurrency=clients, requests=requests,
                                                   time_limit_s=args.time_limit)
                        row = {"served": served, "batching": batching, "overload_level": overload, **report,
                               "requests_planned": requests, "max_queue": args.max_queue,
                               "max_wait_ms": args.max_wait_ms, "input_hw": f"{args.height}x{args.width}",
                               "model": ready.get("model", ""), "runtime": ready.get("runtime", ""),
                               "server_ready_s": ready_s, "loadavg_1m": os.getloadavg()[0]}
                        rows.append(row)
                        print(f"{served:>11} batching {'on ' if batching else 'off'} clients {clients:>2}: "
                              f"{report['ok']:>3}/{report['sent']} ok, {report['overloaded']} x 503, "
                              f"{report['throughput_rps']:6.1f} req/s, p50 {report['p50_ms']:7.1f} ms, "
                              f"p99 {report['p99_ms']:7.1f} ms, joined batch {report['mean_joined_batch']:.2f}, "
                              f"/readyz max {report['readyz_max_ms']:.0f} ms, model ms per clip "
                              + ", ".join(f"b{k.rsplit('_b', 1)[1]} {v:.1f}" for k, v in report.items()
                                          if k.startswith("model_ms_per_clip_b")), flush=True)
                finally:
                    stop_server(proc)
    errors = sum(r["errors"] for r in rows)
    return results.write_and_report(
        "serving-load", rows, env, results_dir=args.results_dir, wrote="wrote {n} rows to {path}",
        failure=f"{PROG}: {errors} requests got an answer other than 200 or 503" if errors else None)


if __name__ == "__main__":
    sys.exit(main())
