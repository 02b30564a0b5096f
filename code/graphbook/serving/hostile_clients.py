"""The same hostile clients against the book's server and LitServe, on loopback (Chapter 7)."""
from __future__ import annotations

import collections
import http.client
import os
import select
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from graphbook.config import THREADS
from graphbook.record import results
from graphbook.serving.batcher import JSON_BYTES_PER_VALUE
from graphbook.serving.http import DEFAULT_MAX_CONNECTIONS, DEFAULT_REQUEST_TIMEOUT_S
from graphbook.serving.litserve_compare import LABELS, SERVERS, _base64_json_request, start_server, stop_server
from graphbook.serving.loadtest import binary_request

FAULTS = ("garbage-request-line", "huge-content-length", "burst", "stalled-body")
#: uvicorn's own default keep-alive timeout, set explicitly so the recording names it
UVICORN_KEEP_ALIVE_S = 5
_TLS_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"
_SMALL_FAULT_CLIENTS = 8
_SETTLE_S = 0.02      # lets the server take a new connection in before the next client arrives
_ANSWER_S = 5.0       # how long a hostile client of the quick faults waits for its answer (at most hold_s)
_VALID_TIMEOUT_S = 60.0


def _raw_request(host: str, body: bytes, headers: dict, *, length: int | None = None) -> tuple[bytes, bytes]:
    """The head and body of ``POST /predict``; ``length`` overrides the declared Content-Length."""
    lines = ["POST /predict HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items()),
             f"Content-Length: {len(body) if length is None else length}", "", ""]
    return "\r\n".join(lines).encode(), body


def _send(address, raw: bytes) -> socket.socket:
    sock = socket.create_connection(address, timeout=_VALID_TIMEOUT_S)
    sock.sendall(raw)
    return sock


def _answer(sock: socket.socket, timeout: float) -> str:
    """The next answer's status on ``sock`` ("503+Retry-After" if it says when), "closed" if cut, "waiting" if none."""
    sock.settimeout(max(timeout, 0.01))
    response = http.client.HTTPResponse(sock)
    try:
        response.begin()
        response.read()
    except TimeoutError:  # socket.timeout is its alias
        return "waiting"
    except (http.client.HTTPException, OSError):
        return "closed"
    retry = response.status == 503 and response.getheader("Retry-After") is not None
    return f"{response.status}{'+Retry-After' if retry else ''}"


def _valid(address, raw: bytes) -> tuple[str, float]:
    """Send one valid request on a fresh connection: (its answer as :func:`_answer` names it, milliseconds)."""
    t0 = time.perf_counter()
    try:
        sock = _send(address, raw)
    except OSError:
        return "closed", (time.perf_counter() - t0) * 1e3
    try:
        answer = _answer(sock, _VALID_TIMEOUT_S)
    finally:
        sock.close()
    return answer, (time.perf_counter() - t0) * 1e3


def _status(answer: str) -> int:
    """The HTTP status of an answer; 0 when there was none."""
    return int(answer[:3]) if answer[:3].isdigit() else 0


def _tally(answers) -> str:
    return ", ".join(f"{answer} x{n}" for answer, n in sorted(collections.Counter(answers).items()))


def _collect(socks, seconds: float) -> tuple[list[str], list[float]]:
    """Every socket's answer within ``seconds`` in all, and when each came (perf_counter; NaN: none came)."""
    deadline = time.perf_counter() + seconds
    answers, times = [], []
    for sock in socks:
        answers.append(_answer(sock, deadline - time.perf_counter()))
        times.append(time.perf_counter() if answers[-1] != "waiting" else float("nan"))
        sock.close()
    return answers, times


def _stalled_body(address, head: bytes, body: bytes, valid: bytes, *, max_queue: int, cap: int, hold_s: float) -> dict:
    """Stalled uploads added in steps of half the queue bound (and at twice it) until a valid request fails, then
    taken away one at a time until one passes: few valid requests, so the sweep ends before the first's deadline."""
    stalled, arrived, at_issue_level, first_failing, failing_answer = [], [], None, None, ""

    def stall_until(count):
        while len(stalled) < count:
            arrived.append(time.perf_counter())
            stalled.append(_send(address, head + body[:10]))
        time.sleep(_SETTLE_S)
    for count in sorted({*range(0, cap + 1, max(1, max_queue // 2)), min(2 * max_queue, cap)}):
        stall_until(count)
        answer, ms = _valid(address, valid)
        if count <= 2 * max_queue:
            at_issue_level = (_status(answer), ms)
        if answer != "200":
            first_failing, failing_answer = count, answer
            break
    while first_failing and stalled:
        stalled.pop().close()
        arrived.pop()
        time.sleep(_SETTLE_S)
        answer, _ = _valid(address, valid)
        if answer == "200":
            break
        first_failing, failing_answer = len(stalled), answer
    stall_until(first_failing or 0)  # hold as many as first made a valid request fail
    # a stalled client the server already answered or cut before the failure would make the count too high
    early = len(select.select(stalled, [], [], 0)[0]) if stalled else 0
    answers, answered = _collect(stalled, hold_s)
    time.sleep(_SETTLE_S)
    return {"hostile_clients": len(stalled), "answers": _tally(answers), "valid_status": at_issue_level[0],
            "valid_ms": at_issue_level[1], "first_failing_stalled": first_failing, "failing_answer": failing_answer,
            "stalled_answered_early": early,
            "dropped_after_s": max((t - a for t, a in zip(answered, arrived)), default=float("nan"))}


def _burst(address, valid: bytes, clients: int) -> dict:
    answers, start = [], threading.Barrier(clients + 1)

    def client():
        start.wait()
        answers.append(_valid(address, valid)[0])
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    answer, ms = _valid(address, valid)
    for t in threads:
        t.join(2 * _VALID_TIMEOUT_S)
    return {"hostile_clients": clients, "answers": _tally(answers), "valid_status": _status(answer), "valid_ms": ms}


def limits(server: str, input_hw, max_queue: int) -> dict:
    """Each server's documented limits as this comparison sets them (Chapter 7)."""
    height, width = (int(v) for v in input_hw)
    if server == "book":
        return {"max_connections": DEFAULT_MAX_CONNECTIONS, "max_queue": max_queue,
                "max_uploads": max(1, DEFAULT_MAX_CONNECTIONS - max_queue), "request_timeout_s": DEFAULT_REQUEST_TIMEOUT_S}
    return {"limit_concurrency": DEFAULT_MAX_CONNECTIONS, "timeout_keep_alive": UVICORN_KEEP_ALIVE_S,
            "max_payload_size": JSON_BYTES_PER_VALUE * 3 * 9 * height * width + 4096}  # the book's max_body_bytes


def _measure_faults(url: str, clip: np.ndarray, encoded: tuple[bytes, dict], *, max_queue: int, max_stalled: int,
                   hold_s: float) -> list[dict]:
    """Every fault of :data:`FAULTS` against one running server; one row each (Chapter 7)."""
    parts = urlsplit(url)
    address = (parts.hostname, parts.port)
    body, headers = encoded
    head, _ = _raw_request(parts.netloc, body, headers)
    valid = head + body
    rows = []
    for fault in FAULTS:
        if fault == "stalled-body":
            row = _stalled_body(address, head, body, valid, max_queue=max_queue, cap=max_stalled, hold_s=hold_s)
        elif fault == "burst":
            row = _burst(address, valid, 3 * max_queue)
        else:
            raw = _TLS_HELLO if fault == "garbage-request-line" else _raw_request(parts.netloc, b"", headers, length=10 ** 12)[0]
            socks = [_send(address, raw) for _ in range(_SMALL_FAULT_CLIENTS)]
            time.sleep(_SETTLE_S)
            answer, ms = _valid(address, valid)
            answers, _ = _collect(socks, min(_ANSWER_S, hold_s))
            row = {"hostile_clients": len(socks), "answers": _tally(answers), "valid_status": _status(answer),
                   "valid_ms": ms}
        rows.append({"fault": fault, **row, "recovered_status": _status(_valid(address, valid)[0])})
    return rows


def compare(onnx_path: Path, input_hw, *, runs: int = 3, threads: int = THREADS, max_queue: int = 16,
            max_wait_ms: float = 5.0, max_stalled: int = 96, hold_s: float = 15.0, log=print,
            rows: list | None = None) -> list[dict]:
    """Both servers, ``runs`` times in alternating order, each in a fresh process, face every fault (Chapter 7)."""
    height, width = (int(v) for v in input_hw)
    clip = np.random.default_rng(0).standard_normal((1, 9, height, width)).astype(np.float32)
    encodings = {"book": binary_request(clip), "litserve": _base64_json_request(clip)}
    rows = [] if rows is None else rows
    for run in range(1, runs + 1):
        order = list(SERVERS) if run % 2 else list(reversed(SERVERS))
        for position, server in enumerate(order, start=1):
            limit = limits(server, (height, width), max_queue)
            proc, url, _ = start_server(server, onnx_path, (height, width), threads=threads, max_queue=max_queue,
                                        max_wait_ms=max_wait_ms, litserve_limits=None if server == "book" else limit)
            try:
                for row in _measure_faults(url, clip, encodings[server], max_queue=max_queue,
                                          max_stalled=max_stalled, hold_s=hold_s):
                    rows.append({"server": server, results.RUN: run, results.RUN_ORDER: position, **row,
                                 "stalled_cap": max_stalled, "hold_s": hold_s,
                                 "limits": ", ".join(f"{k} {v}" for k, v in limit.items()), "max_queue": max_queue,
                                 "input_hw": f"{height}x{width}", "model": Path(onnx_path).name,
                                 "loadavg_1m": os.getloadavg()[0]})
                    log(f"run {run} {server:>8} {row['fault']:>21}: {row['answers']}; valid {row['valid_status']} "
                        f"in {row['valid_ms']:.0f} ms" + (f"; first fails at {row['first_failing_stalled']} stalled"
                                                          if row["fault"] == "stalled-body" else ""))
            finally:
                stop_server(proc)
    return rows


def fault_table(frame) -> pd.DataFrame:
    """One row per (fault, server) of a ``hostile-clients`` recording (a frame, or rows), across its runs."""
    def agreed(values):
        values = [str(v) for v in values]
        return values[0] if len(set(values)) == 1 else " | ".join(values)

    def answer_ranges(tallies):  # "200 x18, 503 x30" per run -> each answer's count, as a range across runs
        runs = [dict(part.rsplit(" x", 1) for part in str(t).split(", ") if " x" in part) for t in tallies]
        counts = {label: [int(run.get(label, 0)) for run in runs] for label in sorted(set().union(*runs))}
        return ", ".join(f"{label} x{min(n)}" + (f"-{max(n)}" if max(n) > min(n) else "") for label, n in counts.items())

    def spread(values, missing="none"):
        values = pd.Series(values, dtype=float).dropna().round()
        if values.empty:
            return missing
        low, mid, high = (f"{v:.0f}" for v in (values.min(), values.median(), values.max()))
        return mid if low == high else f"{mid} ({low}-{high})"

    rows = []
    for (fault, server), part in pd.DataFrame(frame).groupby(["fault", "server"], sort=False):
        part = part.sort_values("run")
        stalled = fault == "stalled-body"
        rows.append({"fault": fault, "server": LABELS[server], "runs": int(part["run"].nunique()),
                     "hostile clients": agreed(part["hostile_clients"]), "their answers": answer_ranges(part["answers"]),
                     "valid request": agreed(part["valid_status"]), "valid ms": spread(part["valid_ms"]),
                     "first failing stalled": spread(part["first_failing_stalled"]) if stalled else "",
                     "its answer": agreed(part["failing_answer"].fillna("")) if stalled else "",
                     "stalled dropped after s": (spread(part["dropped_after_s"], missing=f"held past {part['hold_s'].max():g} s")
                                                 if stalled else ""),
                     "afterwards": agreed(part["recovered_status"])})
    order = {**{f: i for i, f in enumerate(FAULTS)}, **{LABELS[s]: i for i, s in enumerate(SERVERS)}}
    return pd.DataFrame(rows).sort_values(["fault", "server"], key=lambda column: column.map(order), ignore_index=True)
