"""Restart cost of torch.compile: cold, warm on-disk cache, and saved cache artifacts, each a fresh process of the
restart paths' one child (Chapters 2 and 6)."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphbook.config import BATCH_SIZES, THREADS
from graphbook.measure.compiletime import run_tagged_child
from graphbook.record.results import COMPILE_S
from graphbook.startup.restart_child import RESULT_MARKER, RestartPathError

SCENARIOS = ("cold", "warm", "artifacts")


@dataclass
class RestartSpec:
    """What the child builds by name (``"package.module:function"``), compiles and calls on ``input_chw`` samples."""

    factory: str
    input_chw: tuple[int, ...]
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    factory_kwargs: dict = field(default_factory=dict)
    backend: str = "inductor"
    threads: int = THREADS
    seed: int = 0


def run_child(spec: dict, env_extra: dict | None = None, *, cache_dir=None, timeout: float = 1800.0) -> dict:
    """:mod:`graphbook.startup.restart_child` on ``spec`` in a fresh process whose Inductor cache is ``cache_dir``."""
    # a parent's "no cache" or debug switches would make "warm" cold
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_FORCE_DISABLE_CACHES",
                                                           "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCH_COMPILE_DEBUG",
                                                           "TORCHINDUCTOR_VEC_ISA_OK")}
    env.update(env_extra or {}, OMP_NUM_THREADS=str(spec["threads"]))
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    cmd = [sys.executable, "-m", "graphbook.startup.restart_child", "--child",
           json.dumps({**spec, "launched_at": time.time()})]
    return start_child(cmd, env, spec.get("name") or spec.get("what") or "fresh-process compile", "child", timeout)


def start_child(cmd, env, name: str, what: str, timeout: float) -> dict:
    """Run one fresh process to its GRAPHBOOK_RESULT line; RestartPathError with its stderr tail otherwise."""
    result, wall = run_tagged_child(
        cmd, RESULT_MARKER, env=env, timeout=timeout, error=RestartPathError,
        timeout_message=f"{name}: {what} exceeded {timeout:.0f} s",
        failure_message=lambda proc: f"{name}: {what} exited with {proc.returncode}: "
                                     f"{(proc.stderr or proc.stdout)[-1500:]}")
    return {**result, "process_wall_s": wall}


def fresh_process_compile(spec: RestartSpec, cache_dir: str | os.PathLike, *, load_artifacts=None,
                          save_artifacts=None, timeout: float = 1800.0) -> dict:
    """Compile ``spec`` in a new process whose Inductor cache is ``cache_dir``: its timings, graphs and cache hits."""
    if load_artifacts is not None and not Path(load_artifacts).is_file():
        raise FileNotFoundError(f"cache artifact file {str(load_artifacts)!r} does not exist")
    with tempfile.TemporaryDirectory(prefix="graphbook-compile-") as work:
        inputs = np.random.default_rng(spec.seed)
        for b in spec.batch_sizes:
            np.save(Path(work) / f"input-b{b}.npy", inputs.standard_normal((b, *spec.input_chw), dtype=np.float32))
        return run_child({"runtime": "compile", "factory": spec.factory, "factory_kwargs": spec.factory_kwargs,
                          "backend": spec.backend, "batch_sizes": list(spec.batch_sizes), "work": work,
                          "out_dir": str(Path(work) / "out"), "threads": spec.threads, "seed": spec.seed,
                          "steady_runs": 1, "load_artifacts": str(load_artifacts) if load_artifacts else None,
                          "save_artifacts": str(save_artifacts) if save_artifacts else None},
                         cache_dir=cache_dir, timeout=timeout)


def _restart_seconds(result: dict) -> float:
    """The restart cost of one fresh-process run: artifact loading plus every first call (Chapter 6)."""
    return float(result["load_artifacts_s"]) + float(sum(result["first_call_s"].values()))


def cache_experiment(spec: RestartSpec, *, timeout: float = 1800.0) -> list[dict]:
    """Measure cold, warm and artifacts restarts of ``spec``, each in a fresh process (Chapter 6)."""
    with tempfile.TemporaryDirectory(prefix="graphbook-cache-") as workdir:
        first_dir = Path(workdir) / "cache-cold-then-warm"
        artifact_file = Path(workdir) / "cache-artifacts.bin"
        runs = {
            "cold": fresh_process_compile(spec, first_dir, save_artifacts=artifact_file, timeout=timeout),
            "warm": fresh_process_compile(spec, first_dir, timeout=timeout),
            "artifacts": fresh_process_compile(spec, Path(workdir) / "cache-from-artifacts",
                                               load_artifacts=artifact_file, timeout=timeout),
        }
    cold_restart = _restart_seconds(runs["cold"])
    rows = []
    for scenario in SCENARIOS:
        res = runs[scenario]
        restart = _restart_seconds(res)
        for b in spec.batch_sizes:
            rows.append({
                "scenario": scenario,
                "batch_size": int(b),
                COMPILE_S: float(res["first_call_s"][str(b)]),   # the first call of a size is its compile
                "graphs_after": int(res["graphs_after"][str(b)]),
                "load_artifacts_s": float(res["load_artifacts_s"]),
                "restart_s": restart,
                "speedup_vs_cold": cold_restart / restart if restart > 0 else float("inf"),
                "process_wall_s": float(res["process_wall_s"]),
                "import_s": float(res["import_s"]),
                "fxgraph_cache_hit": int(res["fxgraph_cache_hit"]),
                "fxgraph_cache_miss": int(res["fxgraph_cache_miss"]),
                "artifact_bytes": int(runs["cold"]["artifact_bytes"]),
                "artifact_kinds": runs["cold"]["artifact_kinds"],
            })
    return rows
