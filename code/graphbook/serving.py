"""A minimal inference server for the ball detector, with warm-up before readiness (Chapter 7).

Introduced in Chapter 7. Standard library only (``http.server``). The article's serving rule: warm up
batch sizes 1, 2 and 3 at start-up, compiling when compilation is on, and report ready only after that,
so no request ever pays a compile.

HTTP interface
--------------
``GET /healthz``
    ``503 {"status": "warming_up"}`` until the warm-up finished, then
    ``200 {"status": "ready", "time_to_ready_s": ..., "warmup_s": {"1": ..}, "compiled": ..}``.
``POST /predict``
    The body is a batch of clips already in the model's input form, float32 ``(N, C, H, W)`` with
    ``C = 9`` (three ImageNet-normalised RGB frames, ``[f0 RGB, f1 RGB, f2 RGB]``), ``H, W`` the
    server's input size and ``N`` one of the warmed-up batch sizes. Two encodings:

    - ``Content-Type: application/octet-stream`` with headers ``X-Shape: N,C,H,W`` and
      ``X-Dtype: float32``; the body is the raw little-endian float32 bytes in C order
      (``array.astype('<f4').tobytes()``). Use this for full-size clips.
    - ``Content-Type: application/json`` with ``{"clips": <nested lists of numbers, shape (N,C,H,W)>}``
      (an optional ``"dtype": "float32"`` is accepted). Convenient for small inputs and debugging.

    ``200`` answer: ``{"batch_size": N, "inference_ms": .., "detections": [[det_or_null per frame]
    per clip]}``, each detection ``{"x", "y", "score", "angle_deg", "half_length"}`` in pixels and
    degrees (decoded by :func:`graphbook.decoding.decode_batch`).

Errors are JSON ``{"error": "<message>"}`` and never stop the server: 400 malformed body or headers,
404 unknown path, 411 no Content-Length, 413 body larger than ``max_body_bytes`` (rejected from its
Content-Length before it is read, then the connection is closed: a client still pushing megabytes
may see the connection reset instead of the answer), 415 unsupported Content-Type or dtype, 422 well-formed but unusable input (wrong shape, a
batch size that was not warmed up, non-numeric or non-finite values), 500 a failure inside the model,
503 not ready yet.
"""
from __future__ import annotations

import json
import math
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import torch

from . import warmup as _warmup

DEFAULT_BATCH_SIZES = (1, 2, 3)
#: A JSON number in a clip takes up to this many bytes (sign, digits, exponent, comma); sets the body limit.
JSON_BYTES_PER_VALUE = 24


class RequestError(ValueError):
    """A request the server refuses; ``status`` is the HTTP status to answer with (Chapter 7)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = int(status)
        self.message = message


class InferenceService:
    """The model side of the server: warm-up, input validation, inference and decoding (Chapter 7).

    ``model`` maps float32 ``(N, channels, H, W)`` to logits ``(N, 3, H, W)`` (or ``{0: logits}``).
    With ``compile=True`` the model is wrapped in ``torch.compile`` (automatic dynamic shapes), and
    after warm-up every request runs with recompilation turned into an error, so a request can never
    silently pay for a compile. Inference is serialised by a lock: one batch at a time.
    """

    def __init__(self, model: torch.nn.Module, input_hw: tuple[int, int], *, channels: int = 9,
                 batch_sizes=DEFAULT_BATCH_SIZES, compile: bool = False, compile_kwargs: dict | None = None,
                 threshold: float = 0.5, max_body_bytes: int | None = None):
        height, width = (int(v) for v in input_hw)
        if height < 1 or width < 1 or channels < 1:
            raise ValueError(f"input size must be positive, got channels={channels}, input_hw={input_hw}")
        self.batch_sizes = tuple(sorted({int(b) for b in batch_sizes}))
        if not self.batch_sizes or self.batch_sizes[0] < 1:
            raise ValueError(f"batch sizes must be positive integers, got {batch_sizes!r}")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        self.input_chw = (int(channels), height, width)
        self.threshold = float(threshold)
        self.model = model.eval()
        self.compiled = bool(compile)
        self.runner = torch.compile(model, **(compile_kwargs or {})) if compile else self.model
        largest = max(self.batch_sizes) * channels * height * width
        self.max_body_bytes = int(max_body_bytes) if max_body_bytes else JSON_BYTES_PER_VALUE * largest + 4096
        self.ready = threading.Event()
        self.created = time.perf_counter()
        self.warmup_s: dict[int, float] = {}
        self.time_to_ready_s: float | None = None
        self.warmup_error: str | None = None
        self._lock = threading.Lock()

    # -- start-up -------------------------------------------------------------------------------
    def warm_up(self) -> dict[int, float]:
        """Run every batch size once (the compile, when compiling); then mark the service ready."""
        with self._lock:
            try:
                self.warmup_s = _warmup.warm_up(self.runner, self.input_chw, self.batch_sizes)
            except Exception as exc:  # a model that cannot run must never report ready
                self.warmup_error = f"{type(exc).__name__}: {exc}"
                raise
        self.time_to_ready_s = time.perf_counter() - self.created
        self.ready.set()
        return self.warmup_s

    def health(self) -> tuple[int, dict]:
        if self.warmup_error:
            return 500, {"status": "failed", "error": self.warmup_error}
        if not self.ready.is_set():
            return 503, {"status": "warming_up"}
        return 200, {"status": "ready", "time_to_ready_s": self.time_to_ready_s, "compiled": self.compiled,
                     "warmup_s": {str(b): s for b, s in self.warmup_s.items()},
                     "batch_sizes": list(self.batch_sizes), "input_shape": list(self.input_chw)}

    # -- requests -------------------------------------------------------------------------------
    def check_batch(self, array: np.ndarray) -> np.ndarray:
        """Validate a decoded request array; return it as contiguous float32 (raises RequestError)."""
        if array.dtype.kind not in "fiu" or array.dtype == np.bool_:
            raise RequestError(422, f"clips must be numbers, got values of type {array.dtype}")
        if array.ndim != 4 or tuple(array.shape[1:]) != self.input_chw:
            want = "(N, " + ", ".join(str(d) for d in self.input_chw) + ")"
            raise RequestError(422, f"clips must have shape {want}, got {tuple(array.shape)}")
        if array.shape[0] not in self.batch_sizes:
            raise RequestError(422, f"batch size {array.shape[0]} was not warmed up; send one of "
                                    f"{', '.join(str(b) for b in self.batch_sizes)} clips per request")
        array = np.array(array, dtype=np.float32, order="C")  # a private, writable copy for torch
        if not np.isfinite(array).all():
            raise RequestError(422, "clips contain NaN or infinite values")
        return array

    def predict(self, array: np.ndarray) -> dict:
        """Run the model on a validated batch and decode one detection (or None) per frame."""
        from .decoding import decode_batch

        if not self.ready.is_set():
            raise RequestError(503, "the model is still warming up; poll /healthz")
        batch = torch.from_numpy(self.check_batch(array))
        with self._lock, torch.no_grad():
            t0 = time.perf_counter()
            if self.compiled:
                with _warmup.no_recompiles():
                    out = self.runner(batch)
            else:
                out = self.runner(batch)
            inference_ms = (time.perf_counter() - t0) * 1e3
        logits = _warmup.logits_of(out)
        decoded = decode_batch(logits, self.threshold)
        detections = [[_detection_json(frame.best) for frame in clip] for clip in decoded]
        return {"batch_size": int(batch.shape[0]), "inference_ms": inference_ms, "detections": detections}


def _detection_json(det) -> dict | None:
    if det is None:
        return None
    return {"x": float(det.x), "y": float(det.y), "score": float(det.score),
            "angle_deg": float(det.angle_deg), "half_length": float(det.half_length)}


def parse_shape_header(value: str | None) -> tuple[int, ...]:
    """Parse ``X-Shape: N,C,H,W`` into a tuple of positive ints (raises RequestError 400; Chapter 7)."""
    if not value:
        raise RequestError(400, "binary requests need an X-Shape header such as 'X-Shape: 1,9,288,512'")
    try:
        shape = tuple(int(part) for part in value.replace("x", ",").split(","))
    except ValueError:
        raise RequestError(400, f"X-Shape must be comma-separated integers, got {value!r}") from None
    if not shape or any(d < 1 for d in shape):
        raise RequestError(400, f"X-Shape sizes must be positive, got {value!r}")
    return shape


def decode_body(content_type: str | None, headers, body: bytes) -> np.ndarray:
    """Turn a request body into an array according to its Content-Type (Chapter 7). Raises RequestError."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "application/octet-stream":
        dtype = (headers.get("X-Dtype") or "").strip().lower()
        if dtype != "float32":
            raise RequestError(415, f"binary clips must be sent as X-Dtype: float32, got {dtype or 'no X-Dtype'!r}")
        shape = parse_shape_header(headers.get("X-Shape"))
        expected = math.prod(shape) * 4
        if len(body) != expected:
            raise RequestError(400, f"X-Shape {','.join(map(str, shape))} needs {expected} bytes of float32, "
                                    f"the body has {len(body)}")
        return np.frombuffer(body, dtype="<f4").reshape(shape)
    if kind == "application/json":
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RequestError(400, f"body is not valid JSON: {exc}") from None
        if not isinstance(payload, dict) or "clips" not in payload:
            raise RequestError(400, 'JSON body must be an object with a "clips" field')
        dtype = payload.get("dtype", "float32")
        if dtype != "float32":
            raise RequestError(415, f'only "dtype": "float32" is supported, got {dtype!r}')
        try:
            array = np.asarray(payload["clips"])
        except (ValueError, TypeError) as exc:  # ragged nesting
            raise RequestError(422, f"clips must be a rectangular nested list of numbers: {exc}") from None
        return array
    raise RequestError(415, f"Content-Type must be application/octet-stream or application/json, got {kind or 'none'!r}")


class _Handler(BaseHTTPRequestHandler):
    server_version = "graphbook-serving/1"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        if getattr(self.server, "verbose", False):
            super().log_message(format, *args)

    def _send(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 - http.server's naming
        if self.path.split("?")[0] == "/healthz":
            status, payload = self.server.service.health()
            self._send(status, payload)
        else:
            self._send(404, {"error": f"unknown path {self.path!r}; use GET /healthz or POST /predict"})

    def do_POST(self):  # noqa: N802
        service: InferenceService = self.server.service
        try:
            if self.path.split("?")[0] != "/predict":
                self.close_connection = True  # the body is not read, so the connection cannot be reused
                raise RequestError(404, f"unknown path {self.path!r}; use POST /predict")
            length_header = self.headers.get("Content-Length")
            if length_header is None:
                self.close_connection = True
                raise RequestError(411, "a Content-Length header is required")
            try:
                length = int(length_header)
            except ValueError:
                self.close_connection = True
                raise RequestError(400, f"Content-Length must be an integer, got {length_header!r}") from None
            if length < 0:
                self.close_connection = True
                raise RequestError(400, f"Content-Length must not be negative, got {length}")
            if length > service.max_body_bytes:
                self.close_connection = True  # refuse before reading: an oversized body costs nothing
                raise RequestError(413, f"body of {length} bytes exceeds the limit of {service.max_body_bytes}")
            body = self.rfile.read(length)
            array = decode_body(self.headers.get("Content-Type"), self.headers, body)
            self._send(200, service.predict(array))
        except RequestError as exc:
            self._send(exc.status, {"error": exc.message})
        except Exception as exc:  # a model failure answers 500 and the server keeps serving
            self._send(500, {"error": f"{type(exc).__name__}: {exc}"})


class InferenceServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` that carries an :class:`InferenceService` (Chapter 7).

    Use :meth:`start` to serve in a background thread and warm up in another, so ``/healthz`` answers
    503 while the warm-up runs; :meth:`stop` shuts it down. ``port=0`` picks a free port
    (:attr:`port` tells which).
    """

    daemon_threads = True

    def __init__(self, service: InferenceService, host: str = "127.0.0.1", port: int = 0, *, verbose: bool = False):
        super().__init__((host, int(port)), _Handler)
        self.service = service
        self.verbose = verbose
        self._workers: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.port}"

    def start(self, *, warm_up: bool = True) -> "InferenceServer":
        serve = threading.Thread(target=self.serve_forever, name="serve", daemon=True)
        serve.start()
        self._workers.append(serve)
        if warm_up:
            warm = threading.Thread(target=self._warm_up_quietly, name="warm-up", daemon=True)
            warm.start()
            self._workers.append(warm)
        return self

    def _warm_up_quietly(self) -> None:
        try:
            self.service.warm_up()
        except Exception:  # recorded in service.warmup_error; /healthz reports it as 500
            pass

    def wait_until_ready(self, timeout: float = 600.0) -> float:
        """Block until the warm-up finished; return the time to ready in seconds (raises on failure)."""
        deadline = time.perf_counter() + timeout
        while not self.service.ready.wait(0.05):
            if self.service.warmup_error:
                raise RuntimeError(f"warm-up failed: {self.service.warmup_error}")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"server not ready after {timeout:.0f} s")
        return float(self.service.time_to_ready_s)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        for t in self._workers:
            t.join(timeout=5)


def request(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None,
            timeout: float = 60.0) -> tuple[int, dict]:
    """Send one HTTP request; return ``(status, decoded JSON)`` for any status (a small client; Chapter 7)."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return err.code, {"error": raw.decode(errors="replace")}


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


def wait_for_ready(url: str, timeout: float = 600.0, poll_s: float = 0.1) -> tuple[float, dict]:
    """Poll ``GET /healthz`` until 200; return ``(seconds waited, health payload)`` (Chapter 7).

    Connection errors count as "not up yet" (the process may still be importing torch).
    """
    import urllib.error

    start = time.perf_counter()
    last = "no answer"
    while time.perf_counter() - start < timeout:
        try:
            status, payload = request(url.rstrip("/") + "/healthz", timeout=5)
            if status == 200:
                return time.perf_counter() - start, payload
            if status == 500:
                raise RuntimeError(f"server warm-up failed: {payload.get('error')}")
            last = f"{status} {payload.get('status')}"
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            last = str(exc)
        time.sleep(poll_s)
    raise TimeoutError(f"{url} not ready after {timeout:.0f} s (last answer: {last})")
