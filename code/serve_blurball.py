"""Serve the BlurBall ball detector over HTTP, warming up batch sizes 1, 2, 3 before reporting ready.
Usage, the HTTP interface and the exit statuses: docs/serving.md."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
import warnings
from pathlib import Path

_STARTED = time.perf_counter()  # before the book's imports: READY's seconds count them
from graphbook import paths, serving
from graphbook.config import BATCH_SIZES, FULL_SIZE
from graphbook.record.cli import add_threads, make_parser, positive_int, positive_int_list


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {value}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    p = make_parser("serve_blurball.py", "Serve BlurBall over HTTP (GET /livez, GET /readyz or /healthz, POST /predict).",
                    results_dir=False)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=_port, default=8080, help="port (0 picks a free one; default 8080)")
    p.add_argument("--weights", type=Path, default=None,
                   help="checkpoint to load (default: data/checkpoints/blurball_synthetic.pt if present, "
                        "else seeded random weights)")
    p.add_argument("--model", choices=("blurball", "tiny"), default="blurball",
                   help="'tiny' serves a two-layer stand-in with the same input contract (for demos and tests)")
    p.add_argument("--height", type=positive_int, default=FULL_SIZE[0])
    p.add_argument("--width", type=positive_int, default=FULL_SIZE[1])
    p.add_argument("--batch-sizes", type=positive_int_list, default=BATCH_SIZES,
                   help="comma-separated batch sizes to warm up (default 1,2,3)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model; the warm-up compiles it")
    p.add_argument("--load-artifacts", type=Path, default=None,
                   help="torch.compiler cache artifacts to load before warming up")
    p.add_argument("--save-artifacts", type=Path, default=None,
                   help="write torch.compiler cache artifacts here after the warm-up")
    p.add_argument("--artifact", type=Path, default=None,
                   help="serve a deployment artifact instead of the checkpoint: .pt2 (AOTInductor), "
                        ".onnx or .ort (ONNX Runtime)")
    p.add_argument("--no-batching", action="store_true", help="run requests one by one (no dynamic batching)")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long the batcher waits for company after the oldest request (default 5)")
    p.add_argument("--max-queue", type=positive_int, default=16,
                   help="requests allowed to wait; more are answered 503 with Retry-After (default 16)")
    add_threads(p)
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--verbose", action="store_true", help="log every request")
    args = p.parse_args(argv)
    if args.model == "blurball" and (args.height % 8 or args.width % 8):
        p.error(f"BlurBall needs height and width divisible by 8, got {args.height}x{args.width}")
    if not 0 < args.threshold < 1:
        p.error(f"--threshold must be in (0, 1), got {args.threshold}")
    if args.weights is not None and not args.weights.is_file():
        p.error(f"--weights file {str(args.weights)!r} does not exist")
    if args.load_artifacts is not None and not args.load_artifacts.is_file():
        p.error(f"--load-artifacts file {str(args.load_artifacts)!r} does not exist")
    if (args.load_artifacts or args.save_artifacts) and not args.compile:
        p.error("--load-artifacts/--save-artifacts only make sense with --compile")
    if args.artifact is not None:
        if args.artifact.suffix not in (".pt2", ".onnx", ".ort"):
            p.error(f"--artifact must end in .pt2, .onnx or .ort, got {str(args.artifact)!r}")
        if not args.artifact.is_file():
            p.error(f"--artifact file {str(args.artifact)!r} does not exist")
        if args.compile or args.weights is not None or args.model != "blurball":
            p.error("--artifact replaces --compile, --weights and --model (the artifact is the model)")
    if not 0 <= args.max_wait_ms <= 1000:
        p.error(f"--max-wait-ms must be in 0..1000, got {args.max_wait_ms}")
    return args


def build_model(args):
    if args.model == "tiny":
        from graphbook.measure.warmup import tiny_clip_net

        return tiny_clip_net(), "tiny stand-in"
    from graphbook.model.blurball import build_blurball

    weights = args.weights or (paths.TRAINED_CHECKPOINT if paths.TRAINED_CHECKPOINT.is_file() else None)
    return build_blurball(weights), (str(weights) if weights else "seeded random weights")


def _load_cache_artifacts(torch, path: Path) -> None:
    """Load torch.compiler cache artifacts, or raise ValueError in one line for a file that holds none."""
    # torch 2.13 does not raise on a corrupt file: it logs a traceback and loads nothing
    log = logging.getLogger("torch.compiler._cache")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as exc:  # older torch versions raise instead
        info, reason = None, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    else:
        reason = "no artifact could be read from it"
    finally:
        log.setLevel(level)
    if info is None:
        raise ValueError(f"--load-artifacts {str(path)!r} is not a torch.compiler cache artifact file ({reason})")


def build_service(args):
    """The InferenceService the arguments ask for, and a description of its model."""
    options = dict(batch_sizes=args.batch_sizes, threshold=args.threshold, batching=not args.no_batching,
                   max_wait_ms=args.max_wait_ms, max_queue=args.max_queue)
    if args.artifact is not None:  # ONNX Runtime never imports torch
        runner = serving.load_artifact(args.artifact, threads=args.threads)
        return serving.InferenceService(runner, (args.height, args.width), **options), runner.description
    import torch

    from graphbook.measure.environment import set_threads

    set_threads(args.threads)
    if args.load_artifacts:
        _load_cache_artifacts(torch, args.load_artifacts)
    try:
        with warnings.catch_warnings():  # torch.load's advice on a bad file would be a second line
            warnings.simplefilter("ignore")
            model, source = build_model(args)
    except Exception as exc:  # a corrupt or foreign checkpoint: torch.load raises many kinds
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"the checkpoint cannot be loaded ({type(exc).__name__}: {first[:200]})") from None
    return serving.InferenceService(model, (args.height, args.width), compile=args.compile, **options), source


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        service, source = build_service(args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:  # a configuration or file it cannot serve: 2;
        print(f"serve_blurball.py: error: {(str(exc).splitlines() or [type(exc).__name__])[0]}", file=sys.stderr)
        return 1 if isinstance(exc, RuntimeError) else 2  # the model itself failed to build: 1
    try:
        server = serving.InferenceServer(service, args.host, args.port, verbose=args.verbose)
    except OSError as exc:
        print(f"serve_blurball.py: error: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    print(f"serving {args.model if args.artifact is None else 'artifact'} ({source}) on {server.url}; warming up batch sizes "
          f"{','.join(map(str, args.batch_sizes))}{' with torch.compile' if args.compile else ''}", flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # an orchestrator's stop: shut down as on Ctrl-C
    server.start()
    try:
        server.wait_until_ready(timeout=3600)
    except (RuntimeError, TimeoutError) as exc:
        print(f"serve_blurball.py: error: {exc}", file=sys.stderr)
        server.stop()
        return 1
    if args.save_artifacts:
        import torch

        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            args.save_artifacts.write_bytes(saved[0])
    print(f"READY {time.perf_counter() - _STARTED:.3f} s after start "
          f"(warm-up {service.time_to_ready_s:.3f} s)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
