"""The BlurBall server under load on loopback: throughput and latency against concurrency, batching off and on."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from graphbook import serving
from graphbook.measure.compiletime import stop_process
from graphbook.measure.environment import fingerprint
from graphbook.measure.warmup import tiny_clip_net
from graphbook.model.blurball import build_blurball
from graphbook.paths import TRAINED_CHECKPOINT
from graphbook.record import results
from graphbook.record.cli import add_load_test_options, check_load_test, comma_choices, make_parser
from graphbook.runtimes import onnx_utils

SCRIPT = Path(__file__).resolve().parent / "serve_blurball.py"
RUNTIMES = ("eager", "onnxruntime")


def parse_args(argv=None):
    p = make_parser("bench_serving_load.py", __doc__.splitlines()[0])
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


def start_server(artifact: Path | None, args, batching: bool):
    """Start serve_blurball.py from ``artifact`` (None: the checkpoint, eager); return (process, url, seconds to READY)."""
    if artifact is not None:
        model = ["--artifact", str(artifact)]
    else:
        model = ["--model", "tiny"] if args.model == "tiny" else ["--weights", str(_trained_checkpoint())]
    cmd = [sys.executable, str(SCRIPT), *model, "--port", "0", "--height", str(args.height),
           "--width", str(args.width), "--threads", str(args.threads), "--max-queue", str(args.max_queue),
           "--max-wait-ms", str(args.max_wait_ms)] + ([] if batching else ["--no-batching"])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    match = re.search(r"on (http://\S+);", first)
    ready = proc.stdout.readline()
    if not match or not ready.startswith("READY"):
        proc.kill()
        raise RuntimeError(f"server did not start: {(first + ready + proc.stderr.read())[-600:]}")
    return proc, match.group(1), time.perf_counter() - t0


def _trained_checkpoint():
    """The trained BlurBall's checkpoint, or None (with a message) when it is missing."""
    weights = TRAINED_CHECKPOINT
    if weights.is_file():
        return weights
    print(f"bench_serving_load.py: error: checkpoint {weights} is missing; "
          "recreate it with `python code/train_blurball.py --seed 0`", file=sys.stderr)
    return None


def _export_dynamic_batch(args, folder: Path) -> Path:
    """The served model (trained BlurBall or the stand-in) as ONNX with a dynamic batch dimension."""
    if args.model == "tiny":
        model = tiny_clip_net()
    else:
        model = build_blurball(_trained_checkpoint())
    print(f"exporting {args.model} with a dynamic batch at {args.height}x{args.width}", flush=True)
    return onnx_utils.export_dynamic_batch(model, torch.randn(2, 9, args.height, args.width),
                                           folder / f"{args.model}-dynamic.onnx")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    env = fingerprint(args.threads)
    rows = []
    if args.artifact is None and args.model == "blurball" and _trained_checkpoint() is None:
        return 3  # serve_blurball.py would fall back to random weights: not the book's model
    with tempfile.TemporaryDirectory(prefix="graphbook-load-") as tmp:
        if args.artifact is not None:
            servers = [(args.artifact.suffix.lstrip("."), args.artifact)]
        else:
            servers = [(runtime, None if runtime == "eager" else _export_dynamic_batch(args, Path(tmp)))
                       for runtime in args.runtimes]
        clip = np.random.default_rng(0).standard_normal((1, 9, args.height, args.width)).astype(np.float32)
        levels = [(c, False) for c in args.concurrency] + ([(args.overload_clients, True)] if args.overload_clients else [])
        for served, artifact in servers:
            for batching in (False, True):
                try:
                    proc, url, ready_s = start_server(artifact, args, batching)
                except RuntimeError as exc:
                    print(f"bench_serving_load.py: error: {exc}", file=sys.stderr)
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
                    stop_process(proc)
    errors = sum(r["errors"] for r in rows)
    return results.write_and_report(
        "serving-load", rows, env, results_dir=args.results_dir, wrote="wrote {n} rows to {path}",
        failure=f"bench_serving_load.py: {errors} requests got an answer other than 200 or 503" if errors else None)


if __name__ == "__main__":
    sys.exit(main())
