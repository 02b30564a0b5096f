"""The same ONNX Runtime session behind LitServe, beside the book's server (Chapter 7)."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from graphbook.config import BATCH_SIZES, THREADS
from graphbook.measure import probes
from graphbook.model.decoding import decode_batch
from graphbook.paths import REPO_ROOT
from graphbook.record import results
from graphbook.serving.batcher import _detection_json
from graphbook.serving.loadtest import binary_request, load_test, request
from graphbook.serving.runners import OrtRunner

SERVERS = ("book", "litserve")

#: What each server gives the person who runs it, as the chapter's table shows it.
OPERATOR_FEATURES = {
    "readiness": ("GET /readyz: 503 until every batch size ran once, then 200 with the warm-up times; "
                  "GET /livez separate (500 when the warm-up failed or a model call hangs)",
                  "GET /health: 503 until every worker's setup() returned, then 200 'ok'; no separate "
                  "liveness probe, and no warm-up unless setup() runs one"),
    "batching": ("joins waiting requests into a warmed-up batch size (1, 2 or 3), waiting at most "
                 "max_wait_ms for company",
                 "LitAPI(max_batch_size, batch_timeout): any size up to max_batch_size, waiting at most "
                 "batch_timeout"),
    "back-pressure": ("bounded queue: 503 with Retry-After beyond max_queue, decided from the headers; "
                      "connection cap, and a cap on bodies still arriving (max_uploads); per-request deadline; "
                      "504 when a model call hangs",
                      "no queue bound: every request waits; 504 after the request timeout (30 s by "
                      "default); max_payload_size refuses large bodies (413)"),
    "metrics": ("per answer: queue_ms, inference_ms, joined_batch_size; /readyz: queue length, calls "
                "per batch size",
                "callbacks and loggers (a Prometheus exporter is a user's Logger); nothing exported by "
                "default"),
}


def _base64_json_request(array: np.ndarray) -> tuple[bytes, dict]:
    """Body and headers of a LitServe ``/predict`` request: ``{"clips": base64, "shape": [...]}`` (Chapter 7)."""
    array = np.ascontiguousarray(array, dtype="<f4")
    body = json.dumps({"clips": base64.b64encode(array.tobytes()).decode("ascii"), "shape": list(array.shape)})
    return body.encode(), {"Content-Type": "application/json"}


def _decode_clip(payload: dict, input_chw: tuple[int, int, int]) -> np.ndarray:
    shape = tuple(int(d) for d in payload["shape"])
    return np.frombuffer(base64.b64decode(payload["clips"]), dtype="<f4").reshape(shape)


try:  # pinned in requirements.txt; imported here because LitServe pickles the API into its worker
    import litserve as _ls
except ImportError:  # pragma: no cover - a reader's environment without it can still import the rest
    _ls = None

if _ls is not None:
    class BlurBallOrtAPI(_ls.LitAPI):
        """The book's ONNX Runtime runner as a LitServe API: same session, same warm-up (Chapter 7)."""

        def __init__(self, onnx_path: str, input_chw, threads: int, threshold: float = 0.5, **lit_kwargs):
            super().__init__(**lit_kwargs)
            self.onnx_path, self.input_chw = str(onnx_path), tuple(int(d) for d in input_chw)
            self.threads, self.threshold = int(threads), float(threshold)

        def setup(self, device):
            self.runner = OrtRunner(self.onnx_path, threads=self.threads)
            rng = np.random.default_rng(0)
            for b in BATCH_SIZES:  # the same warm-up as the book's server, before /health says ok
                self.runner(rng.standard_normal((b, *self.input_chw), dtype=np.float32))

        def decode_request(self, request):
            return _decode_clip(request, self.input_chw)

        def batch(self, inputs):
            return np.concatenate(inputs) if len(inputs) > 1 else inputs[0]

        def predict(self, x):
            started = time.perf_counter()
            logits = self.runner(np.ascontiguousarray(x, dtype=np.float32))
            ms = (time.perf_counter() - started) * 1e3
            if self.max_batch_size > 1:  # batched: one entry per request (each a single clip here)
                return [(logits[i:i + 1], len(x), ms) for i in range(len(x))]
            return logits, len(x), ms

        def unbatch(self, output):
            return output

        def encode_response(self, output):
            logits, joined, ms = output
            decoded = decode_batch(logits, self.threshold)
            return {"joined_batch_size": int(joined), "inference_ms": float(ms),
                    "detections": [[_detection_json(frame.best) for frame in clip] for clip in decoded]}


def _run_litserve(onnx_path: str, input_chw, *, port: int, threads: int, max_batch_size: int,
                 batch_timeout_s: float, max_payload_size: int | None = None, **uvicorn_options) -> None:
    """Serve ``onnx_path`` with LitServe on 127.0.0.1:``port`` until stopped (the child :func:`start_server` starts)."""
    if _ls is None:
        raise ImportError("litserve is not installed: pip install -r requirements.txt")
    api = BlurBallOrtAPI(onnx_path, input_chw, threads, max_batch_size=max_batch_size,
                           batch_timeout=batch_timeout_s)
    server = _ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1, max_payload_size=max_payload_size)
    server.run(host="127.0.0.1", port=port, num_api_servers=1, generate_client_file=False, log_level="warning",
               **uvicorn_options)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(server: str, onnx_path: Path | None, input_hw, *, threads: int, max_queue: int, max_wait_ms: float,
                 timeout: float = 300.0, litserve_limits: dict | None = None, book_args=()):
    """One server in a fresh process (the book's on ``onnx_path`` or on ``book_args``): ``(process, url, ready_s)``."""
    height, width = (int(v) for v in input_hw)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    if server == "book":
        cmd = [sys.executable, str(REPO_ROOT / "code" / "serve_blurball.py"), "--port", str(port),
               "--height", str(height), "--width", str(width), "--threads", str(threads), "--max-queue", str(max_queue),
               "--max-wait-ms", str(max_wait_ms), *(["--artifact", str(onnx_path)] if onnx_path else []), *book_args]
        health = "/readyz"
    else:  # LitServe
        spec = dict(onnx_path=str(onnx_path), input_chw=[9, height, width], port=port, threads=threads,
                    max_batch_size=3, batch_timeout_s=max_wait_ms / 1e3, **(litserve_limits or {}))
        cmd = [sys.executable, "-c", "import json, sys; from graphbook.serving.litserve_compare import _run_litserve; "
               "s = json.loads(sys.argv[1]); _run_litserve(s.pop('onnx_path'), s.pop('input_chw'), **s)", json.dumps(spec)]
        health = "/health"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while True:  # until its health check answers 200
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {proc.returncode} before it was ready")
            with contextlib.suppress(OSError):
                if request(url + health, timeout=5)[0] == 200:
                    break
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"the server was not ready after {timeout:.0f} s")
            time.sleep(0.05)
    except Exception:
        stop_server(proc)
        raise
    return proc, url, time.perf_counter() - t0


def stop_server(proc) -> None:
    """Stop a server :func:`start_server` started, and every process it started (Chapter 7)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=15)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)


def compare(onnx_path: Path, input_hw, *, levels, runs: int = 3, threads: int = THREADS, max_queue: int = 8,
            max_wait_ms: float = 5.0, requests: int = 24, time_limit_s: float = 60.0, probe_mib: int = 64,
            log=print, rows: list | None = None) -> list[dict]:
    """Both servers, ``runs`` times in alternating order, at every ``(clients, overload)`` level (Chapter 7)."""
    height, width = (int(v) for v in input_hw)
    clip = np.random.default_rng(0).standard_normal((1, 9, height, width)).astype(np.float32)
    encodings = {"book": ("float32 bytes", binary_request(clip)), "litserve": ("base64 in JSON", _base64_json_request(clip))}
    rows = [] if rows is None else rows
    for run in range(1, runs + 1):
        order = list(SERVERS) if run % 2 else list(reversed(SERVERS))
        copy_gbps = probes.copy_bandwidth(nbytes=probe_mib * probes.MIB, repeats=5)["gb_per_s"]
        log(f"run {run}/{runs}: copy_ {copy_gbps:.1f} GB/s, order {', '.join(order)}")
        for position, server in enumerate(order, start=1):
            proc, url, ready_s = start_server(server, onnx_path, (height, width), threads=threads,
                                              max_queue=max_queue, max_wait_ms=max_wait_ms)
            encoding, encoded = encodings[server]
            try:
                for clients, overload in levels:
                    n = max(requests, 4 * clients)
                    report = load_test(url, clip, concurrency=clients, requests=n, time_limit_s=time_limit_s,
                                       encoded=encoded, health_path="/readyz" if server == "book" else "/health")
                    rows.append({"server": server, results.RUN: run, results.RUN_ORDER: position,
                                 "overload_level": overload, **report, "requests_planned": n,
                                 "ready_s": ready_s, "body_encoding": encoding, "body_bytes": len(encoded[0]),
                                 "max_batch_size": 3, "max_wait_ms": max_wait_ms,
                                 "max_queue": max_queue if server == "book" else "",
                                 "input_hw": f"{height}x{width}", "model": Path(onnx_path).name,
                                 results.COPY_GBPS: copy_gbps, "loadavg_1m": os.getloadavg()[0]})
                    log(f"  {server:>8} clients {clients:>2}: {report['ok']:>3}/{report['sent']} ok, "
                        f"{report['overloaded']} x 503, {report['errors']} other, "
                        f"{report['throughput_rps']:6.1f} req/s, p50 {report['p50_ms']:7.1f} ms, "
                        f"p99 {report['p99_ms']:7.1f} ms, joined batch {report['mean_joined_batch']:.2f}")
            finally:
                stop_server(proc)
    return rows


# ---- Reading a recording back: the chapter's table and sentences
LABELS = {"book": "the book's server", "litserve": "LitServe"}


def summarize(frame):
    """One row per (server, level) of a ``litserve-compare`` recording: medians and ranges across runs (Chapter 7)."""
    sums = {column: (column, "sum") for column in ("sent", "ok", "overloaded", "errors")}
    out = frame.groupby(["server", "concurrency", "overload_level"], sort=True).agg(
        runs=("run", "nunique"), rps_median=("throughput_rps", "median"), rps_min=("throughput_rps", "min"),
        rps_max=("throughput_rps", "max"), p50_ms=("p50_ms", "median"), p99_ms=("p99_ms", "median"), **sums,
        mean_batch=("mean_joined_batch", "median"), ready_s=("ready_s", "median")).reset_index()
    out = out.rename(columns={"concurrency": "clients", "overload_level": "overload"})
    return out.astype({"clients": int, "overload": bool, "runs": int, **dict.fromkeys(sums, int)})
