"""The HTTP side of the server (Chapter 7): a hostile client's cost is bounded here. A whole request within
``request_timeout_s``, at most ``max_connections`` at once, bodies uploading bounded apart (``max_uploads``) and queued
only once whole, an oversized ``Content-Length`` refused unread; every error answer is JSON."""
from __future__ import annotations

import contextlib
import functools
import json
import math
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from graphbook.serving.batcher import InferenceService, RequestError

#: Defaults for the limits on clients (see the module docstring).
DEFAULT_REQUEST_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 64
_KNOWN_PATHS = ("/livez", "/readyz", "/healthz", "/predict")


def _decode_body(content_type: str | None, headers, body: bytes) -> np.ndarray:
    """Turn a request body into an array according to its Content-Type (Chapter 7). Raises RequestError."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "application/octet-stream":
        dtype = (headers.get("X-Dtype") or "").strip().lower()
        if dtype != "float32":
            raise RequestError(415, f"binary clips must be sent as X-Dtype: float32, got {dtype or 'no X-Dtype'!r}")
        value = headers.get("X-Shape")  # N,C,H,W
        if not value:
            raise RequestError(400, "binary requests need an X-Shape header such as 'X-Shape: 1,9,288,512'")
        try:
            shape = tuple(int(part) for part in value.split(","))
        except ValueError:
            raise RequestError(400, f"X-Shape must be comma-separated integers, got {value!r}") from None
        if not shape or any(d < 1 for d in shape):
            raise RequestError(400, f"X-Shape sizes must be positive, got {value!r}")
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


def _content_length(headers, limit: int) -> int:
    """The declared body length: 411 when missing, 400 when no plain non-negative integer, 413 above ``limit``."""
    value = headers.get("Content-Length")
    if value is None:
        raise RequestError(411, "a Content-Length header is required")
    text = value.strip()
    if not text.isascii() or not text.isdigit():  # no sign, no '1_000', no '1e3'
        raise RequestError(400, f"Content-Length must be a non-negative integer, got {value[:40]!r}")
    if len(text) > 18 or int(text) > limit:  # refuse before reading: an oversized body costs nothing
        raise RequestError(413, f"body of {text[:40]}{'...' if len(text) > 40 else ''} bytes exceeds the limit of {limit}")
    return int(text)


class _Handler(BaseHTTPRequestHandler):
    server_version = "graphbook-serving/3"
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes; with Nagle's algorithm on, the body waits for the client's delayed ACK
    # of the headers (40 ms on Linux): a lone client waited 68 ms instead of 21 ms in Chapter 7's load test.
    disable_nagle_algorithm = True

    def setup(self):
        # every single send and receive is bounded too: a backstop at twice the deadline the reaper enforces first
        self.timeout = 2 * self.server.request_timeout_s
        super().setup()

    def log_message(self, format, *args):  # the base class's parameter names
        if getattr(self.server, "verbose", False):
            super().log_message(format, *args)

    def handle_one_request(self):
        # From waiting for the request line to the last byte of the body: one deadline.
        self.server._arm_deadline(self.connection)
        try:
            super().handle_one_request()
        finally:
            self.server._disarm_deadline(self.connection)

    def send_error(self, code, message=None, explain=None):
        """http.server's own errors (bad request line, unknown method, header too long) as JSON."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # a request line it could not parse: answer with a status line
            self.request_version = "HTTP/1.1"
        short = self.responses.get(code, ("error",))[0]
        with contextlib.suppress(OSError):
            self._send(code, {"error": f"{short}: {message}" if message else short})

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
        if self.command != "HEAD":
            self.wfile.write(body)

    def _path(self) -> str:
        return self.path.split("?")[0]

    def _refuse(self, exc: RequestError) -> None:
        headers = {"Retry-After": exc.retry_after_s} if exc.retry_after_s else {}
        if exc.status == 405:
            headers["Allow"] = "POST" if self._path() == "/predict" else "GET"
        self._send(exc.status, {"error": exc.message}, headers)

    def do_GET(self):  # http.server's naming
        service: InferenceService = self.server.service
        path = self._path()
        if path == "/livez":
            self._send(*service.liveness())
        elif path in ("/readyz", "/healthz"):
            status, payload = service.health()
            self._send(status, payload, {"Retry-After": service.retry_after_s} if status == 503 else None)
        else:
            self._wrong_method()  # GET /predict: 405; an unknown path: 404

    do_HEAD = do_GET

    def _wrong_method(self):
        self.close_connection = True  # a body, if any, is not read, so the connection cannot be reused
        path = self._path()
        if path in _KNOWN_PATHS:
            takes = "POST" if path == "/predict" else "GET"
            self._refuse(RequestError(405, f"{path} takes {takes}, not {self.command}"))
        else:
            self._send(404, {"error": f"unknown path {self.path[:200]!r}; use GET /livez, GET /readyz or POST /predict"})

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _wrong_method

    def _read_body(self, length: int, *, keep: bool = True) -> tuple[bytes, int]:
        """Read up to ``length`` body bytes (kept, or dropped when not ``keep``): (the bytes kept, how many came)."""
        chunks, left = [], length
        while left:
            try:
                chunk = self.rfile.read1(min(left, 1 << 20))
            except (TimeoutError, ConnectionError):
                chunk = b""
            if not chunk:  # the client closed, or the reaper shut the connection at its deadline
                break
            if keep:
                chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), length - left

    def do_POST(self):
        if self._path() != "/predict":
            self._wrong_method()
            return
        service: InferenceService = self.server.service
        keep_alive = not self.close_connection
        self.close_connection = True  # until the whole body is read
        try:
            length = _content_length(self.headers, service.max_body_bytes)
            try:  # refused from the headers, before the body is read
                service.refuse_if_full()
                self.server._start_upload()
            except RequestError as exc:
                self.close_connection = not keep_alive
                self._refuse(exc)  # the answer leaves at once; the body, if the client sends it anyway, is read
                if self._read_body(length, keep=False)[1] < length:  # and dropped, never decoded, so the client
                    self.close_connection = True                     # can read its 503 instead of a reset
                return
            try:
                body, received = self._read_body(length)
            finally:
                self.server._end_upload()
            if received < length:
                raise RequestError(408, f"the body ended after {received} of {length} bytes "
                                        f"(request_timeout_s {self.server.request_timeout_s:g})")
            self.close_connection = not keep_alive
            self.server._disarm_deadline(self.connection)  # the model's own wait is bounded by the service
            array = _decode_body(self.headers.get("Content-Type"), self.headers, body)
            self._send(200, service.predict(array))
        except RequestError as exc:
            self._refuse(exc)
        except OSError:  # the client went away while we answered: nothing to answer
            self.close_connection = True
        except Exception as exc:  # a model failure answers 500 and the server keeps serving
            self._send(500, {"error": f"{type(exc).__name__}: {exc}"})


_BUSY = json.dumps({"error": "too many connections; retry later"}).encode()
_BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(_BUSY)).encode() + b"\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
                  + _BUSY)


class InferenceServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` that carries an :class:`InferenceService` (Chapter 7)."""

    daemon_threads = True
    request_queue_size = 64  # the listen backlog; the service's own queue is the bound that answers 503

    def __init__(self, service: InferenceService, host: str = "127.0.0.1", port: int = 0, *,
                 verbose: bool = False, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, max_uploads: int | None = None):
        if max_uploads is None:
            max_uploads = max(1, max_connections - service.max_queue)
        if request_timeout_s <= 0 or not 1 <= max_uploads <= max_connections:
            raise ValueError(f"need request_timeout_s > 0 and 1 <= max_uploads <= max_connections, "
                             f"got {request_timeout_s}, {max_uploads} and {max_connections}")
        super().__init__((host, int(port)), _Handler)
        self.service = service
        self.verbose = verbose
        self.request_timeout_s = float(request_timeout_s)
        self.max_connections = int(max_connections)
        self.max_uploads = int(max_uploads)
        self.connections = 0           #: connections being served now
        self.uploads = 0               #: connections reading a request body now
        self.refused_connections = 0   #: connections answered 503 because max_connections were busy
        self.dropped_connections = 0   #: connections shut at their deadline (stalled or idle clients)
        self._lock = threading.Lock()
        self._deadlines: dict[socket.socket, float] = {}
        self._closing = threading.Event()
        self._serving = False
        self._workers: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.port}"

    # -- connection limits ----------------------------------------------------------------------
    def process_request(self, request, client_address):
        with self._lock:
            busy = self.connections >= self.max_connections
            if not busy:
                self.connections += 1
        if busy:
            self.refused_connections += 1
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(_BUSY_RESPONSE)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self.connections -= 1
                self._deadlines.pop(request, None)

    def _start_upload(self) -> None:
        """Count one more body being read, or raise RequestError 503 when ``max_uploads`` are."""
        with self._lock:
            busy = self.uploads >= self.max_uploads
            if not busy:
                self.uploads += 1
        if busy:
            raise RequestError(503, f"too many request bodies arriving at once (max_uploads {self.max_uploads}); "
                                    "retry later", retry_after_s=self.service.retry_after_s)

    def _end_upload(self) -> None:
        with self._lock:
            self.uploads -= 1

    def handle_error(self, request, client_address):
        """A client that resets or vanishes prints no traceback (one line, when verbose)."""
        if self.verbose:
            print(f"serving: connection from {client_address[0]} failed: {sys.exc_info()[1]!r}", file=sys.stderr)

    def _arm_deadline(self, conn: socket.socket) -> None:
        with self._lock:
            self._deadlines[conn] = time.monotonic() + self.request_timeout_s

    def _disarm_deadline(self, conn: socket.socket) -> None:
        with self._lock:
            self._deadlines.pop(conn, None)

    def _reap(self) -> None:
        """Shut the reading side of every connection past its deadline (its handler then sees EOF)."""
        step = min(0.25, self.request_timeout_s / 4)
        while not self._closing.wait(step):
            now = time.monotonic()
            with self._lock:
                late = [c for c, deadline in self._deadlines.items() if deadline < now]
                for conn in late:
                    del self._deadlines[conn]
            for conn in late:
                self.dropped_connections += 1
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RD)

    # -- life cycle -----------------------------------------------------------------------------
    def start(self, *, warm_up: bool = True) -> "InferenceServer":
        """Serve in a background thread (and warm up in another, unless ``warm_up=False``)."""
        self._serving = True
        # a stop waits for the serving loop's next poll: a twentieth of a second, not socketserver's half
        serve = functools.partial(self.serve_forever, poll_interval=0.05)
        for name, target in (("serve", serve), ("reaper", self._reap)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._workers.append(thread)
        if warm_up:
            warm = threading.Thread(target=self._warm_up_quietly, name="warm-up", daemon=True)
            warm.start()
            self._workers.append(warm)
        return self

    def _warm_up_quietly(self) -> None:
        with contextlib.suppress(Exception):  # recorded in service.warmup_error; /readyz and /livez report it as 500
            self.service.warm_up()

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
        """Stop serving and the worker; safe to call twice, or before :meth:`start`."""
        self.service.close()
        self._closing.set()
        if self._serving:
            self._serving = False
            self.shutdown()
        self.server_close()
        for t in self._workers:
            t.join(timeout=5)
        self._workers.clear()
