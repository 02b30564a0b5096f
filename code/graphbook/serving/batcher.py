"""The model side of the server: warm-up, validation, the bounded queue and the batching worker (Chapter 7)."""
from __future__ import annotations

import collections
import itertools
import sys
import threading
import time

import numpy as np

from graphbook.config import BATCH_SIZES
from graphbook.model.decoding import decode_batch
from graphbook.serving.runners import TorchRunner


#: A JSON number in a clip takes up to this many bytes (sign, digits, exponent, comma); sets the body limit.
JSON_BYTES_PER_VALUE = 24
#: Dynamic batching defaults: wait at most this long for company, queue at most this many requests.
DEFAULT_MAX_WAIT_MS = 5.0
DEFAULT_MAX_QUEUE = 16
DEFAULT_QUEUE_TIMEOUT_S = 30.0
#: A model call that runs longer than this is hung: its requests get 504 and /livez says so.
DEFAULT_INFERENCE_TIMEOUT_S = 60.0


class RequestError(ValueError):
    """A request the server refuses; ``status`` is the HTTP status to answer with (Chapter 7)."""

    def __init__(self, status: int, message: str, *, retry_after_s: int | None = None):
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.retry_after_s = retry_after_s


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


def _plan_batch(sizes: list[int], allowed, *, batching: bool = True) -> int:
    """How many queued requests (FIFO) the next model call takes: the longest prefix of a warmed size, at least one."""
    if not sizes:
        return 0
    totals = itertools.accumulate(sizes) if batching else ()
    return max((count for count, total in enumerate(totals, start=1) if total in allowed), default=1)


class InferenceService:
    """The model side of the server: warm-up, input validation, queueing, batching, decoding (Chapter 7)."""

    def __init__(self, model, input_hw: tuple[int, int], *, channels: int = 9,
                 batch_sizes=BATCH_SIZES, compile: bool = False,
                 threshold: float = 0.5, max_body_bytes: int | None = None, batching: bool = True,
                 max_wait_ms: float = DEFAULT_MAX_WAIT_MS, max_queue: int = DEFAULT_MAX_QUEUE,
                 queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S,
                 inference_timeout_s: float = DEFAULT_INFERENCE_TIMEOUT_S, retry_after_s: int = 1):
        height, width = (int(v) for v in input_hw)
        if height < 1 or width < 1 or channels < 1:
            raise ValueError(f"input size must be positive, got channels={channels}, input_hw={input_hw}")
        self.batch_sizes = tuple(sorted({int(b) for b in batch_sizes}))
        if not self.batch_sizes or self.batch_sizes[0] < 1:
            raise ValueError(f"batch sizes must be positive integers, got {batch_sizes!r}")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        if max_wait_ms < 0 or max_queue < 1 or queue_timeout_s <= 0 or inference_timeout_s <= 0 or retry_after_s < 1:
            raise ValueError("need max_wait_ms >= 0, max_queue >= 1, queue_timeout_s > 0, inference_timeout_s > 0 "
                             f"and retry_after_s >= 1, got {max_wait_ms}, {max_queue}, {queue_timeout_s}, "
                             f"{inference_timeout_s}, {retry_after_s}")
        self.input_chw = (int(channels), height, width)
        self.threshold = float(threshold)
        if hasattr(model, "arm") and hasattr(model, "runtime"):
            if compile:
                raise ValueError("compile=True applies to a torch module, not to a loaded artifact")
            self.runner = model
        else:
            self.runner = TorchRunner(model, compile=compile)
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
        self.inference_timeout_s = float(inference_timeout_s)
        self.retry_after_s = int(retry_after_s)
        self.ready = threading.Event()
        self.created = time.perf_counter()
        self.warmup_s: dict[int, float] = {}
        self.time_to_ready_s: float | None = None
        self.warmup_error: str | None = None
        #: model calls after warm-up, per batch size, since start (a counter: it never grows in length)
        self.calls_by_size: collections.Counter[int] = collections.Counter()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._busy_since: float | None = None
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
        self.time_to_ready_s = time.perf_counter() - self.created
        self._worker = threading.Thread(target=self._work, name="batcher", daemon=True)
        self._worker.start()
        self.ready.set()
        return dict(self.warmup_s)

    def _hung_for(self) -> float | None:
        """Seconds the current model call has run beyond ``inference_timeout_s``'s reach, or None."""
        since = self._busy_since
        running = 0.0 if since is None else time.perf_counter() - since
        return running if running > self.inference_timeout_s else None

    def liveness(self) -> tuple[int, dict]:
        """``/livez``: 500 when the warm-up failed or a model call hangs (restart me), else 200."""
        if self.warmup_error:
            return 500, {"status": "failed", "error": self.warmup_error}
        hung = self._hung_for()
        if hung is not None:
            return 500, {"status": "hung", "error": f"a model call has run {hung:.0f} s "
                                                    f"(inference_timeout_s {self.inference_timeout_s:g})"}
        return 200, {"status": "alive"}

    def health(self) -> tuple[int, dict]:
        """Readiness: 503 while warming up (or hung), 200 once every batch size ran, 500 if the warm-up failed."""
        if self.warmup_error:
            return 500, {"status": "failed", "error": self.warmup_error}
        if not self.ready.is_set():
            return 503, {"status": "warming_up", "warmed": sorted(self.warmup_s)}
        if self._hung_for() is not None:
            return 503, {"status": "hung", "error": "a model call runs past inference_timeout_s"}
        return 200, {"status": "ready", "time_to_ready_s": self.time_to_ready_s, "compiled": self.compiled,
                     "runtime": self.runner.runtime, "model": self.runner.description,
                     "warmup_s": {str(b): s for b, s in self.warmup_s.items()},
                     "batch_sizes": list(self.batch_sizes), "input_shape": list(self.input_chw),
                     "batching": self.batching, "max_wait_ms": self.max_wait_s * 1e3,
                     "queue": len(self._queue), "max_queue": self.max_queue,
                     "calls_by_size": {str(b): n for b, n in sorted(self.calls_by_size.items())},
                     "torch_imported": "torch" in sys.modules}

    # -- admission ------------------------------------------------------------------------------
    def _busy(self, message: str) -> RequestError:
        """A 503 that says when to retry."""
        return RequestError(503, message, retry_after_s=self.retry_after_s)

    def _expired(self) -> RequestError:
        return self._busy(f"waited more than {self.queue_timeout_s:g} s in the queue; retry later")

    def _refusal(self) -> RequestError | None:
        """Why a new request cannot be taken now (call with the lock held), or None."""
        if not self.ready.is_set():
            return self._busy("the model is still warming up; poll /readyz")
        if self._stopped:
            return self._busy("the server is shutting down")
        if self._hung_for() is not None:
            return self._busy("the model is not answering (a call runs past inference_timeout_s); "
                              "retry on another replica")
        if len(self._queue) >= self.max_queue:
            return self._busy(f"overloaded: {len(self._queue)} requests already wait "
                              f"(max_queue {self.max_queue}); retry later")
        return None

    def refuse_if_full(self) -> None:
        """Raise the RequestError (503) a request arriving now would get; hold no place (Chapter 7)."""
        with self._cond:
            refusal = self._refusal()
        if refusal is not None:
            raise refusal

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
        item = _Pending(self.check_batch(array))
        with self._cond:
            refusal = self._refusal()
            if refusal is not None:
                raise refusal
            self._queue.append(item)
            self._cond.notify_all()
        return item

    def predict(self, array: np.ndarray) -> dict:
        """Queue a batch, wait for its turn (bounded), decode one detection (or None) per frame."""
        item = self.submit(array)
        # Every wait is bounded: queue_timeout_s in the queue (the worker answers an expired request
        # itself, unless it is stuck in a call), then inference_timeout_s for the model call.
        while not item.done.wait(0.05):
            now = time.perf_counter()
            if item.started and now - item.started > self.inference_timeout_s:
                item.cancelled = True
                raise RequestError(504, f"the model did not answer within {self.inference_timeout_s:g} s "
                                        "(inference_timeout_s)")
            if not item.started and now - item.enqueued > self.queue_timeout_s:
                item.cancelled = True
                raise self._expired()
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
        """Take requests off the queue again after :meth:`pause`."""
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

    # -- the worker -----------------------------------------------------------------------------
    def _drop_expired(self) -> None:
        """Answer the queued requests that waited too long or were given up (lock held)."""
        now = time.perf_counter()
        keep = collections.deque()
        for item in self._queue:
            if item.cancelled or now - item.enqueued > self.queue_timeout_s:
                item.error = self._expired()
                item.done.set()
            else:
                keep.append(item)
        self._queue = keep

    def _take(self) -> list[_Pending] | None:
        """Wait for work and return the requests of the next model call (None when stopped)."""
        def sizes():
            return [i.array.shape[0] for i in self._queue]

        with self._cond:
            while True:
                self._cond.wait_for(lambda: self._stopped or (self._queue and not self._paused))
                if self.batching and not self._stopped:  # company, until max_wait_s after the oldest arrived
                    left = self._queue[0].enqueued + self.max_wait_s - time.perf_counter()
                    self._cond.wait_for(lambda: self._stopped or self._paused or sum(sizes()) >= max(self.batch_sizes),
                                        timeout=max(left, 0.0))
                if self._stopped:
                    return None
                if self._paused:
                    continue
                self._drop_expired()
                if self._queue:
                    return [self._queue.popleft() for _ in range(_plan_batch(sizes(), self.batch_sizes,
                                                                             batching=self.batching))]

    def _work(self) -> None:
        self.runner.arm()  # in the worker's own thread: what the runner switches is per thread
        while True:
            items = self._take()
            if items is None:
                break
            batch = items[0].array if len(items) == 1 else np.concatenate([i.array for i in items])
            started = time.perf_counter()
            for item in items:
                item.started = started
            self._busy_since = started
            try:
                logits = self.runner(batch)
                error = None
            except Exception as exc:  # a model failure answers 500 and the worker keeps serving
                logits, error = None, RequestError(500, f"{type(exc).__name__}: {exc}")
            finally:
                self._busy_since = None
            finished = time.perf_counter()
            self.calls_by_size[int(batch.shape[0])] += 1
            ends = np.cumsum([item.array.shape[0] for item in items])
            for item, end in zip(items, ends, strict=True):
                item.finished, item.joined = finished, int(batch.shape[0])
                item.logits, item.error = (None, error) if error else (logits[end - item.array.shape[0]:end], None)
                item.done.set()
        with self._cond:  # answer whoever still waits
            while self._queue:
                item = self._queue.popleft()
                item.error = self._busy("the server is shutting down")
                item.done.set()


def _detection_json(det) -> dict | None:
    if det is None:
        return None
    return {"x": float(det.x), "y": float(det.y), "score": float(det.score),
            "angle_deg": float(det.angle_deg), "half_length": float(det.half_length)}
