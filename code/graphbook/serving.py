"""A minimal inference server for the ball detector: warm-up before readiness, dynamic batching (Chapter 7).

Introduced in Chapter 7. Standard library only (``http.server``). The article's serving rule: warm up
batch sizes 1, 2 and 3 at start-up, compiling when compilation is on, and report ready only after that,
so no request ever pays a compile. The model can be a PyTorch module (eager or ``torch.compile``) or a
deployment artifact loaded by :func:`load_artifact`: an AOTInductor ``.pt2`` package or an ONNX Runtime
model (``.onnx`` or ORT format ``.ort``); the ONNX Runtime path never imports torch.

Requests are queued and run by one worker thread. With batching on (the default), the worker joins
requests that wait together into one model call whose batch size is one of the warmed-up sizes, waiting
at most ``max_wait_ms`` for company after the oldest request arrived (Triton's dynamic batcher works the
same way). The queue is bounded: beyond ``max_queue`` waiting requests the server answers
``503`` with ``Retry-After`` at once, and a request that waited ``queue_timeout_s`` is answered 503
instead of waiting on.

HTTP interface
--------------
``GET /livez``
    ``200 {"status": "alive"}`` while the process serves HTTP (also during warm-up); ``500`` if the
    warm-up failed (the process should be restarted).
``GET /readyz`` (and ``GET /healthz``, kept for compatibility)
    ``503 {"status": "warming_up", "warmed": [...]}`` until every batch size was warmed up, then
    ``200 {"status": "ready", "time_to_ready_s": ..., "warmup_s": {"1": ..}, "compiled": ..,
    "runtime": .., "batching": .., "queue": ..}``; ``500`` if the warm-up failed.
``POST /predict``
    The body is a batch of clips already in the model's input form, float32 ``(N, C, H, W)`` with
    ``C = 9`` (three ImageNet-normalised RGB frames, ``[f0 RGB, f1 RGB, f2 RGB]``), ``H, W`` the
    server's input size and ``N`` one of the warmed-up batch sizes. Two encodings:

    - ``Content-Type: application/octet-stream`` with headers ``X-Shape: N,C,H,W`` and
      ``X-Dtype: float32``; the body is the raw little-endian float32 bytes in C order
      (``array.astype('<f4').tobytes()``). Use this for full-size clips.
    - ``Content-Type: application/json`` with ``{"clips": <nested lists of numbers, shape (N,C,H,W)>}``
      (an optional ``"dtype": "float32"`` is accepted). Convenient for small inputs and debugging.

    ``200`` answer: ``{"batch_size": N, "joined_batch_size": M, "queue_ms": .., "inference_ms": ..,
    "detections": [[det_or_null per frame] per clip]}``, each detection ``{"x", "y", "score",
    "angle_deg", "half_length"}`` in pixels and degrees (decoded by
    :func:`graphbook.decoding.decode_batch`); ``M`` is the batch the model really ran (this request
    joined with others).

Errors are JSON ``{"error": "<message>"}`` and never stop the server: 400 malformed body or headers,
404 unknown path, 405 a method the path does not take, 411 no Content-Length, 413 body larger than
``max_body_bytes`` (rejected from its Content-Length before it is read, then the connection is closed:
a client still pushing megabytes may see the connection reset instead of the answer), 415 unsupported
Content-Type or dtype, 422 well-formed but unusable input (wrong shape, a batch size that was not
warmed up, non-numeric or non-finite values), 500 a failure inside the model, 503 not ready yet or
overloaded (with ``Retry-After``).
"""
from __future__ import annotations

import collections
import json
import math
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

DEFAULT_BATCH_SIZES = (1, 2, 3)
#: A JSON number in a clip takes up to this many bytes (sign, digits, exponent, comma); sets the body limit.
JSON_BYTES_PER_VALUE = 24
#: Dynamic batching defaults: wait at most this long for company, queue at most this many requests.
DEFAULT_MAX_WAIT_MS = 5.0
DEFAULT_MAX_QUEUE = 16
DEFAULT_QUEUE_TIMEOUT_S = 30.0
ARTIFACT_SUFFIXES = (".pt2", ".onnx", ".ort")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class RequestError(ValueError):
    """A request the server refuses; ``status`` is the HTTP status to answer with (Chapter 7).

    ``retry_after_s`` (503 only) becomes a ``Retry-After`` header: when to try again.
    """

    def __init__(self, status: int, message: str, *, retry_after_s: int | None = None):
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.retry_after_s = retry_after_s


# --------------------------------------------------------------------------------------------------
# Runners: a model behind one call, NumPy in, NumPy logits out
# --------------------------------------------------------------------------------------------------
class TorchRunner:
    """A PyTorch module (eager or ``torch.compile``) as a NumPy-in, NumPy-out callable (Chapter 7).

    With ``compile=True`` the module is wrapped in ``torch.compile`` (automatic dynamic shapes); after
    :meth:`arm` every call runs with recompilation turned into an error, so a request can never
    silently pay for a compile.
    """

    runtime = "torch"

    def __init__(self, model, *, compile: bool = False, compile_kwargs: dict | None = None):
        import torch

        self.model = model.eval()
        self.compiled = bool(compile)
        self.fn = torch.compile(model, **(compile_kwargs or {})) if compile else self.model
        self.description = "torch.compile" if compile else "eager PyTorch"
        self._armed = False

    def arm(self) -> None:
        self._armed = True

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        import torch

        from . import warmup as _warmup

        x = torch.from_numpy(batch)
        with torch.no_grad():
            if self.compiled and self._armed:
                with _warmup.no_recompiles():
                    out = self.fn(x)
            else:
                out = self.fn(x)
        return _warmup.logits_of(out).numpy()


class AotiRunner(TorchRunner):
    """An AOTInductor ``.pt2`` package loaded with ``torch._inductor.aoti_load_package`` (Chapter 7).

    The kernels were compiled when the package was built; a static package serves only the batch
    size it was exported with, a dynamic one the range it was exported for.
    """

    runtime = "aoti"

    def __init__(self, path):
        import torch

        self.path = str(path)
        self.model = None
        self.fn = torch._inductor.aoti_load_package(self.path)
        self.compiled = False
        self.description = f"AOTInductor package {Path(path).name}"
        self._armed = False


class OrtRunner:
    """An ONNX Runtime session on a ``.onnx`` or ``.ort`` model, CPU provider (Chapter 7; no torch).

    ``level`` is the graph optimization level (a model ONNX Runtime saved after optimizing needs
    ``"disabled"``; optimizing it again is wasted start-up time).
    """

    runtime = "onnxruntime"
    compiled = False

    def __init__(self, path, *, threads: int = 2, level: str = "all"):
        import onnxruntime as ort

        from .onnx_utils import session_options

        self.path = str(path)
        options = session_options(level=level, threads=threads)
        self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.input_shape = list(inp.shape)
        self.description = f"ONNX Runtime {Path(path).name} (level {level})"

    def arm(self) -> None:
        pass

    def static_batch(self) -> int | None:
        """The model's fixed batch size, or None when dimension 0 is symbolic."""
        first = self.input_shape[0] if self.input_shape else None
        return first if isinstance(first, int) else None

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: batch})[0]


def load_artifact(path, *, threads: int = 2, level: str | None = None):
    """A runner for a deployment artifact, chosen by suffix (Chapter 7).

    ``.pt2`` -> :class:`AotiRunner`; ``.onnx`` / ``.ort`` -> :class:`OrtRunner` (``level`` defaults to
    ``"all"`` for ``.onnx`` and ``"disabled"`` for ``.ort``, which holds an already optimized graph).
    Raises FileNotFoundError for a missing file and ValueError for another suffix.
    """
    path = Path(path)
    if path.suffix not in ARTIFACT_SUFFIXES:
        raise ValueError(f"artifact must end in {', '.join(ARTIFACT_SUFFIXES)}, got {str(path)!r}")
    if not path.is_file():
        raise FileNotFoundError(f"artifact {str(path)!r} does not exist")
    if path.suffix == ".pt2":
        return AotiRunner(path)
    return OrtRunner(path, threads=threads, level=level or ("disabled" if path.suffix == ".ort" else "all"))


# --------------------------------------------------------------------------------------------------
# The service: warm-up, validation, the bounded queue and the batching worker
# --------------------------------------------------------------------------------------------------
class _Pending:
    __slots__ = ("array", "enqueued", "done", "logits", "error", "joined", "started", "finished", "cancelled")

    def __init__(self, array: np.ndarray):
        self.array = array
        self.enqueued = time.perf_counter()
        self.done = threading.Event()
        self.logits = self.error = None
        self.joined = 0
        self.started = self.finished = 0.0
        self.cancelled = False


def plan_batch(sizes: list[int], allowed, *, batching: bool = True) -> int:
    """How many queued requests (FIFO) the next model call takes (Chapter 7).

    ``sizes`` are the batch sizes of the waiting requests, oldest first; ``allowed`` the warmed-up
    batch sizes. Without batching: one. With batching: the longest prefix whose total fits the largest
    allowed size, shortened until its total is itself an allowed size (each request alone is one).
    """
    if not sizes:
        return 0
    if not batching:
        return 1
    allowed = set(int(b) for b in allowed)
    limit = max(allowed)
    count, total = 0, 0
    for n in sizes:
        if total + n > limit:
            break
        count, total = count + 1, total + n
    while count > 1 and sum(sizes[:count]) not in allowed:
        count -= 1
    return max(count, 1)


class InferenceService:
    """The model side of the server: warm-up, input validation, queueing, batching, decoding (Chapter 7).

    ``model`` is a ``torch.nn.Module`` mapping float32 ``(N, channels, H, W)`` to logits ``(N, 3, H, W)``
    (or ``{0: logits}``), or a runner from :func:`load_artifact` (any callable NumPy -> NumPy with
    ``runtime``, ``compiled`` and ``arm()``). ``compile`` applies to a module only.

    One worker thread runs the model, one batch at a time. ``batching=True`` joins waiting requests
    into one call of a warmed-up size (:func:`plan_batch`), waiting at most ``max_wait_ms`` after the
    oldest waiting request arrived; ``batching=False`` runs them one by one. At most ``max_queue``
    requests wait (more are answered 503 with ``Retry-After: retry_after_s``); a request that waited
    ``queue_timeout_s`` without being run is answered 503.
    """

    def __init__(self, model, input_hw: tuple[int, int], *, channels: int = 9,
                 batch_sizes=DEFAULT_BATCH_SIZES, compile: bool = False, compile_kwargs: dict | None = None,
                 threshold: float = 0.5, max_body_bytes: int | None = None, batching: bool = True,
                 max_wait_ms: float = DEFAULT_MAX_WAIT_MS, max_queue: int = DEFAULT_MAX_QUEUE,
                 queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S, retry_after_s: int = 1):
        height, width = (int(v) for v in input_hw)
        if height < 1 or width < 1 or channels < 1:
            raise ValueError(f"input size must be positive, got channels={channels}, input_hw={input_hw}")
        self.batch_sizes = tuple(sorted({int(b) for b in batch_sizes}))
        if not self.batch_sizes or self.batch_sizes[0] < 1:
            raise ValueError(f"batch sizes must be positive integers, got {batch_sizes!r}")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        if max_wait_ms < 0 or max_queue < 1 or queue_timeout_s <= 0 or retry_after_s < 1:
            raise ValueError(f"need max_wait_ms >= 0, max_queue >= 1, queue_timeout_s > 0 and retry_after_s >= 1, "
                             f"got {max_wait_ms}, {max_queue}, {queue_timeout_s}, {retry_after_s}")
        self.input_chw = (int(channels), height, width)
        self.threshold = float(threshold)
        if hasattr(model, "arm") and hasattr(model, "runtime"):
            if compile:
                raise ValueError("compile=True applies to a torch module, not to a loaded artifact")
            self.runner = model
        else:
            self.runner = TorchRunner(model, compile=compile, compile_kwargs=compile_kwargs)
        self.model = getattr(self.runner, "model", None)
        self.compiled = bool(self.runner.compiled)
        static = self.runner.static_batch() if hasattr(self.runner, "static_batch") else None
        if static is not None and set(self.batch_sizes) != {static}:
            raise ValueError(f"{self.runner.description} has a static batch of {static}; serve batch size "
                             f"{static} only, or export it with a dynamic batch dimension")
        largest = max(self.batch_sizes) * channels * height * width
        self.max_body_bytes = int(max_body_bytes) if max_body_bytes else JSON_BYTES_PER_VALUE * largest + 4096
        self.batching = bool(batching)
        self.max_wait_s = float(max_wait_ms) / 1e3
        self.max_queue = int(max_queue)
        self.queue_timeout_s = float(queue_timeout_s)
        self.retry_after_s = int(retry_after_s)
        self.ready = threading.Event()
        self.created = time.perf_counter()
        self.warmup_s: dict[int, float] = {}
        self.time_to_ready_s: float | None = None
        self.warmup_error: str | None = None
        self.calls: list[int] = []  # batch size of every model call after warm-up (the batching record)
        self._queue: collections.deque[_Pending] = collections.deque()
        self._cond = threading.Condition()
        self._paused = False
        self._stopped = False
        self._worker: threading.Thread | None = None

    # -- start-up -------------------------------------------------------------------------------
    def warm_up(self) -> dict[int, float]:
        """Run every batch size once (the compile, when compiling); then start serving (Chapter 7)."""
        rng = np.random.default_rng(0)
        try:
            for b in self.batch_sizes:
                x = rng.standard_normal((b, *self.input_chw), dtype=np.float32)
                t0 = time.perf_counter()
                out = self.runner(x)
                self.warmup_s[b] = time.perf_counter() - t0
                if tuple(out.shape[:1]) != (b,) or tuple(out.shape[2:]) != self.input_chw[1:]:
                    raise RuntimeError(f"the model returned shape {tuple(out.shape)} for input {tuple(x.shape)}")
        except Exception as exc:  # a model that cannot run must never report ready
            self.warmup_error = f"{type(exc).__name__}: {exc}"
            raise
        self.runner.arm()
        self.time_to_ready_s = time.perf_counter() - self.created
        self._worker = threading.Thread(target=self._work, name="batcher", daemon=True)
        self._worker.start()
        self.ready.set()
        return dict(self.warmup_s)

    def liveness(self) -> tuple[int, dict]:
        if self.warmup_error:
            return 500, {"status": "failed", "error": self.warmup_error}
        return 200, {"status": "alive"}

    def health(self) -> tuple[int, dict]:
        """Readiness: 503 while warming up, 200 once every batch size ran, 500 if the warm-up failed."""
        if self.warmup_error:
            return 500, {"status": "failed", "error": self.warmup_error}
        if not self.ready.is_set():
            return 503, {"status": "warming_up", "warmed": sorted(self.warmup_s)}
        return 200, {"status": "ready", "time_to_ready_s": self.time_to_ready_s, "compiled": self.compiled,
                     "runtime": self.runner.runtime, "model": self.runner.description,
                     "warmup_s": {str(b): s for b, s in self.warmup_s.items()},
                     "batch_sizes": list(self.batch_sizes), "input_shape": list(self.input_chw),
                     "batching": self.batching, "max_wait_ms": self.max_wait_s * 1e3,
                     "queue": len(self._queue), "max_queue": self.max_queue,
                     "torch_imported": "torch" in sys.modules}

    readiness = health

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
        array = np.array(array, dtype=np.float32, order="C")  # a private, writable copy
        if not np.isfinite(array).all():
            raise RequestError(422, "clips contain NaN or infinite values")
        return array

    def submit(self, array: np.ndarray) -> _Pending:
        """Queue a validated batch; RequestError 503 (with Retry-After) when not ready or the queue is full."""
        if not self.ready.is_set():
            raise RequestError(503, "the model is still warming up; poll /readyz", retry_after_s=self.retry_after_s)
        item = _Pending(self.check_batch(array))
        with self._cond:
            if self._stopped:
                raise RequestError(503, "the server is shutting down", retry_after_s=self.retry_after_s)
            if len(self._queue) >= self.max_queue:
                raise RequestError(503, f"overloaded: {len(self._queue)} requests already wait "
                                        f"(max_queue {self.max_queue}); retry later",
                                   retry_after_s=self.retry_after_s)
            self._queue.append(item)
            self._cond.notify_all()
        return item

    def predict(self, array: np.ndarray) -> dict:
        """Queue a batch, wait for its turn (bounded), decode one detection (or None) per frame."""
        from .decoding import decode_batch

        item = self.submit(array)
        if not item.done.wait(self.queue_timeout_s + 600.0):  # the worker answers expired items itself
            item.cancelled = True
            raise RequestError(503, "no answer in time; retry later", retry_after_s=self.retry_after_s)
        if item.error is not None:
            raise item.error
        decoded = decode_batch(item.logits, self.threshold)
        detections = [[_detection_json(frame.best) for frame in clip] for clip in decoded]
        return {"batch_size": int(item.array.shape[0]), "joined_batch_size": item.joined,
                "queue_ms": (item.started - item.enqueued) * 1e3,
                "inference_ms": (item.finished - item.started) * 1e3, "detections": detections}

    def queued(self) -> int:
        """Requests waiting for the worker now."""
        with self._cond:
            return len(self._queue)

    def pause(self) -> None:
        """Stop taking requests off the queue (they keep queueing up to ``max_queue``); for tests and demos."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the worker; waiting requests are answered 503."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join(timeout=10)

    def _take(self) -> list[_Pending] | None:
        """Wait for work and return the requests of the next model call (None when stopped)."""
        with self._cond:
            while True:
                while (not self._queue or self._paused) and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return None
                if self.batching:
                    deadline = self._queue[0].enqueued + self.max_wait_s
                    while (not self._stopped and not self._paused and self._queue
                           and sum(i.array.shape[0] for i in self._queue) < max(self.batch_sizes)):
                        left = deadline - time.perf_counter()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                    if self._stopped:
                        return None
                    if self._paused or not self._queue:
                        continue
                count = plan_batch([i.array.shape[0] for i in self._queue], self.batch_sizes,
                                   batching=self.batching)
                return [self._queue.popleft() for _ in range(count)]

    def _work(self) -> None:
        while True:
            items = self._take()
            if items is None:
                break
            now = time.perf_counter()
            live = []
            for item in items:
                if item.cancelled or now - item.enqueued > self.queue_timeout_s:
                    item.error = RequestError(503, f"waited more than {self.queue_timeout_s:.0f} s in the queue; "
                                                   "retry later", retry_after_s=self.retry_after_s)
                    item.done.set()
                else:
                    live.append(item)
            if not live:
                continue
            batch = live[0].array if len(live) == 1 else np.concatenate([i.array for i in live])
            started = time.perf_counter()
            try:
                logits = self.runner(batch)
                error = None
            except Exception as exc:  # a model failure answers 500 and the worker keeps serving
                logits, error = None, RequestError(500, f"{type(exc).__name__}: {exc}")
            finished = time.perf_counter()
            self.calls.append(int(batch.shape[0]))
            offset = 0
            for item in live:
                n = item.array.shape[0]
                item.started, item.finished, item.joined = started, finished, int(batch.shape[0])
                if error is None:
                    item.logits = logits[offset:offset + n]
                else:
                    item.error = error
                offset += n
                item.done.set()
        with self._cond:  # answer whoever still waits
            while self._queue:
                item = self._queue.popleft()
                item.error = RequestError(503, "the server is shutting down", retry_after_s=self.retry_after_s)
                item.done.set()


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


_GET_PATHS = ("/livez", "/readyz", "/healthz")


class _Handler(BaseHTTPRequestHandler):
    server_version = "graphbook-serving/2"
    protocol_version = "HTTP/1.1"
    # The headers and the body leave in two writes; with Nagle's algorithm on, the body waits for the
    # client's delayed ACK of the headers (40 ms on Linux): a lone client waited 68 ms instead of 21 ms
    # (ONNX Runtime, 96x160, Chapter 7's load test).
    disable_nagle_algorithm = True

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        if getattr(self.server, "verbose", False):
            super().log_message(format, *args)

    def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, str(value))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, exc: RequestError) -> None:
        headers = {"Retry-After": exc.retry_after_s} if exc.retry_after_s else {}
        if exc.status == 405:
            headers["Allow"] = "POST" if self.path.split("?")[0] == "/predict" else "GET"
        self._send(exc.status, {"error": exc.message}, headers)

    def do_GET(self):  # noqa: N802 - http.server's naming
        service: InferenceService = self.server.service
        path = self.path.split("?")[0]
        if path == "/livez":
            self._send(*service.liveness())
        elif path in ("/readyz", "/healthz"):
            status, payload = service.health()
            self._send(status, payload, {"Retry-After": service.retry_after_s} if status == 503 else None)
        elif path == "/predict":
            self._refuse(RequestError(405, "use POST /predict with a body of clips (see the server's docs)"))
        else:
            self._send(404, {"error": f"unknown path {self.path!r}; use GET /livez, GET /readyz or POST /predict"})

    def do_POST(self):  # noqa: N802
        service: InferenceService = self.server.service
        try:
            path = self.path.split("?")[0]
            if path != "/predict":
                self.close_connection = True  # the body is not read, so the connection cannot be reused
                if path in _GET_PATHS:
                    raise RequestError(405, f"{path} takes GET, not POST")
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
            self._refuse(exc)
        except Exception as exc:  # a model failure answers 500 and the server keeps serving
            self._send(500, {"error": f"{type(exc).__name__}: {exc}"})


class InferenceServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` that carries an :class:`InferenceService` (Chapter 7).

    Use :meth:`start` to serve in a background thread and warm up in another, so ``/readyz`` answers
    503 (and ``/livez`` 200) while the warm-up runs; :meth:`stop` shuts it down. ``port=0`` picks a free
    port (:attr:`port` tells which).
    """

    daemon_threads = True
    request_queue_size = 64  # the listen backlog; the service's own queue is the bound that answers 503

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
        except Exception:  # recorded in service.warmup_error; /readyz and /livez report it as 500
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
        self.service.close()
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
    """Poll ``GET /readyz`` until 200; return ``(seconds waited, readiness payload)`` (Chapter 7).

    Connection errors count as "not up yet" (the process may still be importing torch).
    """
    import urllib.error

    start = time.perf_counter()
    last = "no answer"
    while time.perf_counter() - start < timeout:
        try:
            status, payload = request(url.rstrip("/") + "/readyz", timeout=5)
            if status == 200:
                return time.perf_counter() - start, payload
            if status == 500:
                raise RuntimeError(f"server warm-up failed: {payload.get('error')}")
            last = f"{status} {payload.get('status')}"
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            last = str(exc)
        time.sleep(poll_s)
    raise TimeoutError(f"{url} not ready after {timeout:.0f} s (last answer: {last})")


# --------------------------------------------------------------------------------------------------
# A bounded loopback load test
# --------------------------------------------------------------------------------------------------
MAX_LOAD_REQUESTS = 10_000
MAX_LOAD_SECONDS = 600.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values), q))


def load_test(url: str, array: np.ndarray, *, concurrency: int, requests: int, time_limit_s: float = 60.0,
              timeout: float = 60.0, health_every_s: float = 0.25) -> dict:
    """``concurrency`` clients POST ``array`` to a loopback server; throughput and latencies (Chapter 7).

    Bounded on purpose: only a loopback ``url`` (127.0.0.1, localhost, ::1), at most ``requests``
    requests in all (<= 10,000) and no new request after ``time_limit_s`` (<= 600 s). Each client keeps
    one HTTP/1.1 connection. Meanwhile ``/readyz`` is polled every ``health_every_s`` to show the server
    stays responsive. Returns ``concurrency``, ``sent``, ``ok``, ``overloaded`` (503), ``errors``
    (anything else), ``wall_s``, ``throughput_rps`` (answered requests per second), ``p50_ms``,
    ``p90_ms``, ``p99_ms``, ``max_ms`` (latency of the 200 answers), ``mean_joined_batch`` (batch the
    model really ran, over 200 answers), ``readyz_max_ms`` and, for every batch size the model ran,
    ``model_ms_per_clip_b<n>``: the median time of the model call (the server's ``inference_ms``) divided
    by the ``n`` clips it carried, which says what joining saved per clip.
    """
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK_HOSTS:
        raise ValueError(f"load_test only targets a loopback http:// server (127.0.0.1, localhost), got {url!r}")
    if not 1 <= concurrency <= 64:
        raise ValueError(f"concurrency must be in 1..64, got {concurrency}")
    if not 1 <= requests <= MAX_LOAD_REQUESTS:
        raise ValueError(f"requests must be in 1..{MAX_LOAD_REQUESTS}, got {requests}")
    if not 0 < time_limit_s <= MAX_LOAD_SECONDS:
        raise ValueError(f"time_limit_s must be in (0, {MAX_LOAD_SECONDS:.0f}], got {time_limit_s}")
    body, headers = binary_request(array)
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
                try:
                    conn.request("POST", "/predict", body, headers)
                    resp = conn.getresponse()
                    payload = json.loads(resp.read() or b"{}")
                    status = resp.status
                    if resp.getheader("Connection", "").lower() == "close":
                        conn.close()
                        conn = http.client.HTTPConnection(host, port, timeout=timeout)
                except (OSError, http.client.HTTPException, json.JSONDecodeError):
                    status, payload = 0, {}
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=timeout)
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
                request(url.rstrip("/") + "/readyz", timeout=10)
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
    return {"concurrency": int(concurrency), "sent": len(statuses), "ok": ok, "overloaded": statuses.count(503),
            "errors": len(statuses) - ok - statuses.count(503), "wall_s": wall,
            "throughput_rps": ok / wall if wall > 0 else float("nan"),
            "p50_ms": 1e3 * _percentile(latencies, 50), "p90_ms": 1e3 * _percentile(latencies, 90),
            "p99_ms": 1e3 * _percentile(latencies, 99),
            "max_ms": 1e3 * max(latencies) if latencies else float("nan"),
            "mean_joined_batch": float(np.mean(joined)) if joined else float("nan"),
            "readyz_max_ms": max(health_ms) if health_ms else float("nan"),
            **{f"model_ms_per_clip_b{n}": float(np.median(v)) for n, v in sorted(model_ms.items())}}
