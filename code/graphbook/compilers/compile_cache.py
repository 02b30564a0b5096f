"""Restart cost of torch.compile: cold, warm on-disk cache, and saved cache artifacts (Chapter 6)."""
from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from graphbook.config import BATCH_SIZES, THREADS
from graphbook.measure.compiletime import run_tagged_child
from graphbook.record.results import COMPILE_S

RESULT_MARKER = "GRAPHBOOK_RESULT "
SCENARIOS = ("cold", "warm", "artifacts")


class CompileCacheError(RuntimeError):
    """A fresh-process compile measurement failed; the child's stderr tail is in the message (Chapter 6)."""


@dataclass
class RestartSpec:
    """What the child process builds by name, compiles and calls; ``input_chw`` is one sample's shape."""

    factory: str
    input_chw: tuple[int, int, int]
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    factory_kwargs: dict = field(default_factory=dict)
    compile_kwargs: dict = field(default_factory=dict)
    threads: int = THREADS
    seed: int = 0

    def validate(self) -> "RestartSpec":
        if ":" not in self.factory:
            raise ValueError(f"factory must look like 'package.module:function', got {self.factory!r}")
        if not self.input_chw or any(int(d) < 1 for d in self.input_chw):
            raise ValueError(f"input_chw must be positive sizes, e.g. (C, H, W), got {self.input_chw!r}")
        if not self.batch_sizes or any(int(b) < 1 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes must be positive integers, got {self.batch_sizes!r}")
        if int(self.threads) < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads!r}")
        return self


def _resolve_factory(factory: str):
    """Import ``"module:function"`` and return the function (Introduced in Chapter 6)."""
    module_name, _, attr = factory.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for factory {factory!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ValueError(f"{module_name!r} has no attribute {attr!r}") from exc


def _child_main(spec_given: dict) -> dict:
    """Runs in the fresh process: build, (load artifacts), compile, first call per batch size."""
    started = time.perf_counter()
    import torch  # imported here, not at module top: the child times torch's import
    from torch._dynamo.utils import counters

    import_s = time.perf_counter() - started
    spec_dict = dict(spec_given)
    load_path = spec_dict.pop("load_artifacts", None)
    save_path = spec_dict.pop("save_artifacts", None)
    spec = RestartSpec(**{**spec_dict, "input_chw": tuple(spec_dict["input_chw"]),
                          "batch_sizes": tuple(spec_dict["batch_sizes"])}).validate()
    torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    model = _resolve_factory(spec.factory)(**spec.factory_kwargs).eval()
    inputs = {b: torch.randn(b, *spec.input_chw) for b in spec.batch_sizes}

    load_s = 0.0
    if load_path:
        t0 = time.perf_counter()
        torch.compiler.load_cache_artifacts(Path(load_path).read_bytes())
        load_s = time.perf_counter() - t0

    counters.clear()
    compiled = torch.compile(model, **spec.compile_kwargs)
    first_call_s = {}
    graphs_after = {}
    with torch.no_grad():
        for b in spec.batch_sizes:
            t0 = time.perf_counter()
            compiled(inputs[b])
            first_call_s[str(b)] = time.perf_counter() - t0
            graphs_after[str(b)] = int(counters["stats"]["unique_graphs"])
        # one more call per size, after compiling: what a compiled call costs once warm
        steady_s = {}
        for b in spec.batch_sizes:
            t0 = time.perf_counter()
            compiled(inputs[b])
            steady_s[str(b)] = time.perf_counter() - t0

    artifact_bytes = 0
    artifact_kinds: dict[str, int] = {}
    if save_path:
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            raise CompileCacheError("torch.compiler.save_cache_artifacts() returned nothing to save")
        Path(save_path).write_bytes(saved[0])
        artifact_bytes = len(saved[0])
        artifact_kinds = {kind: len(keys) for kind, keys in saved[1].artifacts.items()}
    return {
        "import_s": import_s,
        "load_artifacts_s": load_s,
        "first_call_s": first_call_s,
        "steady_call_s": steady_s,
        "graphs_after": graphs_after,
        "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
        "artifact_bytes": artifact_bytes,
        "artifact_kinds": artifact_kinds,
        "torch": torch.__version__,
    }


def fresh_process_compile(spec: RestartSpec, cache_dir: str | os.PathLike, *, load_artifacts=None,
                      save_artifacts=None, timeout: float = 1800.0) -> dict:
    """Compile ``spec`` in a new Python process whose Inductor cache is ``cache_dir``: import, first and second call
    per batch size, graphs and FX graph cache hits (Chapters 2 and 6)."""
    spec.validate()
    payload = asdict(spec)
    payload["input_chw"] = list(spec.input_chw)
    payload["batch_sizes"] = list(spec.batch_sizes)
    if load_artifacts is not None:
        if not Path(load_artifacts).is_file():
            raise FileNotFoundError(f"cache artifact file {str(load_artifacts)!r} does not exist")
        payload["load_artifacts"] = str(load_artifacts)
    if save_artifacts is not None:
        payload["save_artifacts"] = str(save_artifacts)
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    # the child must not inherit a parent's "no cache" or debug switches, or "warm" would be cold
    for var in ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCH_COMPILE_DEBUG"):
        env.pop(var, None)
    env["OMP_NUM_THREADS"] = str(spec.threads)
    cmd = [sys.executable, "-m", "graphbook.compilers.compile_cache", "--child", json.dumps(payload)]

    result, wall = run_tagged_child(
        cmd, RESULT_MARKER, env=env, timeout=timeout, error=CompileCacheError,
        timeout_message=f"fresh-process compile exceeded {timeout:.0f} s",
        failure_message=lambda proc: f"child exited with {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    result["process_wall_s"] = wall
    return result


def _restart_seconds(result: dict) -> float:
    """The restart cost of one fresh-process run: artifact loading plus every first call (Chapter 6)."""
    return float(result["load_artifacts_s"]) + float(sum(result["first_call_s"].values()))


def cache_experiment(spec: RestartSpec, *, timeout: float = 1800.0) -> list[dict]:
    """Measure cold, warm and artifacts restarts of ``spec``, each in a fresh process (Chapter 6)."""
    spec.validate()
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
                "steady_call_s": float(res["steady_call_s"][str(b)]),
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


if __name__ == "__main__":
    from graphbook.measure.compiletime import answer_as_child

    sys.exit(answer_as_child(sys.argv[1:], "graphbook.compilers.compile_cache", RESULT_MARKER, _child_main))

