"""The fresh child processes that measure a restart: a tagged JSON answer, or the seconds to a READY line.
``torch._dynamo.reset()`` leaves the on-disk Inductor cache alone, so only a new process measures a restart."""
from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence


def answer_as_child(argv: Sequence[str], module: str, tag: str, handler: Callable[[dict], dict]) -> int:
    """The child's side of :func:`run_tagged_child`: print ``tag`` + ``handler(spec)``'s JSON on one line."""
    if len(argv) != 2 or argv[0] != "--child":
        print(f"usage: python -m {module} --child SPEC_JSON (started by the book's benchmarks)", file=sys.stderr)
        return 2
    print(tag + json.dumps(handler(json.loads(argv[1]))), flush=True)
    return 0


def run_tagged_child(cmd: Sequence[str], tag: str, *, env: dict | None = None, timeout: float,
                     timeout_message: str, failure_message: Callable[[subprocess.CompletedProcess], str],
                     error: type[Exception] = RuntimeError, last: bool = True,
                     check_returncode: bool = True) -> tuple[object, float]:
    """Run ``cmd``; return ``(the JSON after tag on its last or first tagged stdout line, wall seconds)``."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise error(timeout_message) from exc
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(tag)]
    if not lines or (check_returncode and proc.returncode != 0):
        raise error(failure_message(proc))
    return json.loads((lines[-1] if last else lines[0])[len(tag):]), wall


def seconds_to_ready(cmd: Sequence[str], *, env: dict | None = None, timeout: float, what: str = "server",
                     error: type[Exception] = RuntimeError) -> float:
    """Seconds from launching ``cmd`` to its first ``READY`` line; then stop it. stdout and stderr are read by their own
    threads, so a child that goes quiet or floods stderr cannot hang the caller past ``timeout``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace")
    ready = threading.Event()
    ready_at: list[float] = []
    tail: collections.deque[str] = collections.deque(maxlen=40)

    def watch_stdout():
        for line in proc.stdout:
            if line.startswith("READY"):
                ready_at.append(time.perf_counter())
                ready.set()
        ready.set()  # EOF: the child closed stdout (exited); the caller looks at ready_at

    def drain_stderr():
        for line in proc.stderr:
            tail.append(line)

    readers = [threading.Thread(target=f, daemon=True) for f in (watch_stdout, drain_stderr)]
    for thread in readers:
        thread.start()
    try:
        ready.wait(timeout)
        if ready_at:
            return ready_at[0] - t0
        exited = ready.is_set()  # stdout ended before a READY line: the child is exiting
        if exited:
            readers[1].join(timeout=5)
        reason = ("".join(tail)[-800:] or "it exited") if exited else f"timeout after {timeout:g} s"
        raise error(f"{what} did not become ready: {reason}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        for thread in readers:
            thread.join(timeout=5)
