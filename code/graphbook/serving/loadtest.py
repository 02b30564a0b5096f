"""Clients of the server: one request, a binary body, and a bounded loopback load test (Chapter 7)."""
from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import numpy as np

from graphbook.measure.summaries import percentiles

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def request(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None,
            timeout: float = 60.0) -> tuple[int, dict]:
    """Send one HTTP request; return ``(status, decoded JSON)`` for any status (a small client; Chapter 7)."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, _json_or_text(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, _json_or_text(err.read())


def _json_or_text(raw: bytes) -> dict:
    """A JSON object answer as a dict; anything else (a plain ``ok``, an HTML page) as ``{"text": ...}``."""
    try:
        payload = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"text": raw.decode(errors="replace")}
    return payload if isinstance(payload, dict) else {"value": payload}


def binary_request(array: np.ndarray) -> tuple[bytes, dict]:
    """Body and headers for a binary ``/predict`` request carrying ``array`` (Chapter 7)."""
    array = np.ascontiguousarray(array, dtype="<f4")
    headers = {"Content-Type": "application/octet-stream", "X-Dtype": "float32",
               "X-Shape": ",".join(str(d) for d in array.shape)}
    return array.tobytes(), headers


def predict(url: str, array: np.ndarray, timeout: float = 120.0) -> tuple[int, dict]:
    """POST ``array`` (N, C, H, W) to ``url + '/predict'`` as raw float32 (Chapter 7)."""
    body, headers = binary_request(array)
    return request(url.rstrip("/") + "/predict", "POST", body, headers, timeout=timeout)


# ---- A bounded loopback load test
MAX_LOAD_REQUESTS = 10_000
MAX_LOAD_SECONDS = 600.0


def load_test(url: str, array: np.ndarray, *, concurrency: int, requests: int, time_limit_s: float = 60.0,
              timeout: float = 60.0, health_every_s: float = 0.25, health_path: str = "/readyz",
              encoded: tuple[bytes, dict] | None = None) -> dict:
    """``concurrency`` clients POST ``array`` to a loopback server; throughput and latencies (Chapter 7)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK_HOSTS:
        raise ValueError(f"load_test only targets a loopback http:// server (127.0.0.1, localhost), got {url!r}")
    if not 1 <= concurrency <= 64:
        raise ValueError(f"concurrency must be in 1..64, got {concurrency}")
    if not 1 <= requests <= MAX_LOAD_REQUESTS:
        raise ValueError(f"requests must be in 1..{MAX_LOAD_REQUESTS}, got {requests}")
    if not 0 < time_limit_s <= MAX_LOAD_SECONDS:
        raise ValueError(f"time_limit_s must be in (0, {MAX_LOAD_SECONDS:.0f}], got {time_limit_s}")
    body, headers = encoded if encoded is not None else binary_request(array)
    host, port = parts.hostname, parts.port or 80
    lock = threading.Lock()
    tickets = iter(range(requests))
    latencies: list[float] = []
    joined: list[int] = []
    model_ms: dict[int, list[float]] = {}
    statuses: list[int] = []
    health_ms: list[float] = []
    start = time.perf_counter()
    stop_health = threading.Event()

    def client():
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            while True:
                with lock:
                    ticket = next(tickets, None)
                if ticket is None or time.perf_counter() - start > time_limit_s:
                    return
                t0 = time.perf_counter()
                try:  # a connection closed by either side reopens on the next request
                    conn.request("POST", "/predict", body, headers)
                    resp = conn.getresponse()
                    payload = json.loads(resp.read() or b"{}")
                    status = resp.status
                except (OSError, http.client.HTTPException, json.JSONDecodeError):
                    status, payload = 0, {}
                    conn.close()
                elapsed = time.perf_counter() - t0
                with lock:
                    statuses.append(status)
                    if status == 200:
                        latencies.append(elapsed)
                        size = int(payload.get("joined_batch_size", 0))
                        joined.append(size)
                        if size > 0 and "inference_ms" in payload:
                            model_ms.setdefault(size, []).append(float(payload["inference_ms"]) / size)
        finally:
            conn.close()

    def poll_health():
        while not stop_health.wait(health_every_s):
            t0 = time.perf_counter()
            try:
                request(url.rstrip("/") + health_path, timeout=10)
            except OSError:
                pass
            health_ms.append((time.perf_counter() - t0) * 1e3)

    health = threading.Thread(target=poll_health, daemon=True)
    health.start()
    clients = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(time_limit_s + timeout + 5)
    wall = time.perf_counter() - start
    stop_health.set()
    health.join(timeout=15)
    ok = statuses.count(200)
    latencies_ms = tuple(1e3 * s for s in latencies)
    return {"concurrency": int(concurrency), "sent": len(statuses), "ok": ok, "overloaded": statuses.count(503),
            "errors": len(statuses) - ok - statuses.count(503), "wall_s": wall,
            "throughput_rps": ok / wall if wall > 0 else float("nan"),
            **percentiles(latencies_ms), "times_ms": latencies_ms,
            "mean_joined_batch": float(np.mean(joined)) if joined else float("nan"),
            "readyz_max_ms": max(health_ms) if health_ms else float("nan"),
            **{f"model_ms_per_clip_b{n}": float(np.median(v)) for n, v in sorted(model_ms.items())}}
