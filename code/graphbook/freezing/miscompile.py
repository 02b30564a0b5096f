"""The freezing miscompile taken apart: verdict, wrapper diff, the missing summand (Chapter 3)."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
from torch._inductor.dependencies import StarDep, WeakDep
from torch._inductor.scheduler import SchedulerNode

from graphbook.compilers.inductor_tools import _EXTERN_CALL, _call_body
from graphbook.config import MISCOMPILE_ATOL
from graphbook.model import blurball
from graphbook.paths import CODE_DIR

REPRO_SCRIPT = CODE_DIR / "repro_freezing_miscompile.py"      # model scale: a small HRNet
MINIMAL_SCRIPT = CODE_DIR / "repro_freezing_minimal.py"      # the same bug in a few convolutions
#: Where verdicts are remembered between chapter runs, one file per torch version and CPU capability (a
#: verdict, not a measurement, so not in data/results).
CACHE_DIR = Path(os.environ.get("GRAPHBOOK_CACHE_DIR", Path.home() / ".cache" / "graphbook"))

_DIFF_LINE = re.compile(r"max abs diff, freezing:\s+([0-9.eE+-]+|nan|inf)")


# ----------------------------------------------------------------------------------------- verdict
def run_minimal(config: dict | None = None, *, wrapper: bool = False, replace: dict[str, str] | None = None,
                renames_kept: bool | None = None, timeout: float = 300) -> dict:
    """The minimal reproducer in a fresh process, with extra Inductor ``config`` set first and, when
    ``renames_kept`` is given, the scheduler change that fixed the bug switched on or off (appendix)."""
    source = MINIMAL_SCRIPT.read_text()
    for old, new in (replace or {}).items():
        if source.count(old) != 1:
            raise ValueError(f"the edit {old!r} must match the reproducer exactly once, it matches {source.count(old)}")
        source = source.replace(old, new)
    # the child imports only what it sets: its time is the reproducer's own, and a bare run imports nothing extra
    program = f"exec(compile({source!r}, {MINIMAL_SCRIPT.name!r}, 'exec'), {{'__name__': '__main__'}})"
    if renames_kept is not None:
        program = ("from graphbook.freezing.miscompile import _renames_after_recompute\n"
                   f"with _renames_after_recompute({renames_kept!r}):\n    {program}")
    if config:
        settings = "; ".join(f"c.{key} = {value!r}" for key, value in config.items())
        program = f"import torch._inductor.config as c; {settings}\n{program}"
    env = {**os.environ, **({"TORCH_LOGS": "output_code"} if wrapper else {})}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=timeout, env=env)
    seconds = time.perf_counter() - start
    match = _DIFF_LINE.search(proc.stdout)
    if proc.returncode not in (0, 1) or match is None:
        raise RuntimeError(f"the reproducer failed (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-800:]}")
    # every line of the log carries its logging prefix: keep the code after it
    code = "\n".join(line.split("[__output_code]", 1)[1][1:] for line in proc.stderr.splitlines()
                     if "[__output_code]" in line) if wrapper else ""
    return {"present": proc.returncode == 1, "max_abs_diff": float(match.group(1)), "seconds": round(seconds, 1),
            "code": code}


@contextlib.contextmanager
def _renames_after_recompute(kept: bool):
    """The change that fixed the miscompile in torch 2.14.1 switched on (``True``) or off (``False``). Fusing
    recomputes a node's loop body, which rebuilds its reads; the rename of a read to an in-place mutation
    (``mutation_renames``) was put back by 2.13 only with fake dependencies, by 2.14.1 always. Without it
    the read points at the buffer before the in-place add, and the reader may run first."""
    original = SchedulerNode.recompute_size_and_body

    def recompute(self, *args, **kwargs):
        fake = any(isinstance(dep, (WeakDep, StarDep)) for dep in self.read_writes.reads)
        if fake or not self.mutation_renames:  # both torches handle these nodes alike
            return original(self, *args, **kwargs)
        if kept:
            original(self, *args, **kwargs)
            self.set_read_writes(self.read_writes.rename(self.mutation_renames))
            return None
        renames, self.mutation_renames = self.mutation_renames, {}
        try:
            return original(self, *args, **kwargs)
        finally:
            self.mutation_renames = renames

    with mock.patch.object(SchedulerNode, "recompute_size_and_body", recompute):
        yield


def run_minimal_variants(variants: dict[str, dict], workers: int = 2) -> dict[str, dict]:
    """:func:`run_minimal` for each named variant (keyword arguments: ``config``, ``replace``), ``workers`` fresh
    processes at a time, since each is one compile (appendix). Returns name -> result, in the given order."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(run_minimal, **kwargs) for name, kwargs in variants.items()}
        return {name: future.result() for name, future in futures.items()}


def _run_reproducer(timeout: float) -> dict:
    run = run_minimal(timeout=timeout)   # the reproducer sets its own threads (two)
    return {"present": run["present"], "torch": torch.__version__, "max_abs_diff": run["max_abs_diff"],
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "seconds": run["seconds"],
            "script": MINIMAL_SCRIPT.name}


def _cache_file() -> Path:
    # keyed by the vector ISA too: Inductor's generated code, and so the bug, can differ per ISA
    # (ATEN_CPU_CAPABILITY caps it), so a verdict found on AVX-512 must not answer for a capped run
    capability = torch.backends.cpu.get_cpu_capability().lower()
    return CACHE_DIR / f"freezing-minimal-torch-{torch.__version__.replace('+', '_')}-{capability}.json"


def freezing_bug_verdict(*, refresh: bool = False, timeout: float = 900) -> dict:
    """Whether the freezing miscompile is present in this torch: ``{present, torch, max_abs_diff, ...}`` (Chapter 3)."""
    if not refresh:
        cache = _cache_file()
        if cache.exists():
            with contextlib.suppress(OSError, ValueError):  # an unreadable cache is simply recomputed
                return {**json.loads(cache.read_text()), "source": f"cache {cache}"}
    verdict = _run_reproducer(timeout)
    with contextlib.suppress(OSError):  # a read-only home: the verdict is still returned
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        _cache_file().write_text(json.dumps(verdict, indent=1))
    return {**verdict, "source": "run now"}


# ------------------------------------------------------------------------------- the models checked
def _load_reproducer():
    """``code/repro_freezing_miscompile.py`` loaded as a module (Chapter 3)."""
    spec = importlib.util.spec_from_file_location("repro_freezing_miscompile", REPRO_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_model(name: str, height: int = 32, width: int = 64) -> tuple:
    """``(model, inputs)`` that ``code/bisect_freezing.py`` checks: ``"blurball"`` (seed 0) or the reproducer's
    small HRNet (``"repro"``), at ``height`` x ``width``."""
    if name == "repro":
        return _load_reproducer().build(height, width)
    if name != "blurball":
        raise ValueError(f"unknown model {name!r}: 'blurball' or 'repro'")

    torch.manual_seed(0)
    return blurball.build_blurball(), (blurball.example_input(height=height, width=width),)


# ------------------------------------------------------------------------------------ wrapper reading
_INPLACE = re.compile(r"torch\.ops\.mkldnn\._convolution_pointwise_\.binary\((\w+), (\w+),")
_KERNEL_CALL = re.compile(r"^\s*(cpp_fused_\w+)\(([^)]*)\)")


def _call_lines(source: str) -> list[tuple[int, str]]:
    return [(i, line.strip()) for i, line in enumerate(_call_body(source).splitlines())]


@dataclass
class InplaceCall:
    """One in-place oneDNN conv + add: ``other += conv(input)``, at position ``line`` of ``call`` (Chapter 3)."""

    line: int
    other: str
    input: str
    text: str


def _inplace_binary_calls(source: str) -> list[InplaceCall]:
    """The in-place ``_convolution_pointwise_.binary`` calls of a wrapper, in order (Chapter 3)."""
    return [InplaceCall(line, match.group(1), match.group(2), text) for line, text in _call_lines(source)
            if (match := _INPLACE.search(text))]


def _call_order(source: str, buffer: str, context: int = 0) -> list[str]:
    """The launches of ``call`` that name ``buffer`` (plus ``context`` launches around each), in order,
    numbered by launch position: the order of events on that buffer (Chapter 3)."""
    lines = _call_lines(source)
    names = {buffer}
    for _ in range(3):  # ``buf187 = buf186`` (and reinterpret/reuse lines): the same storage, another name
        for _, text in lines:
            alias = re.match(r"^(\w+) = (\w+)(?:;|$)", text)
            if alias and (alias.group(1) in names or alias.group(2) in names):
                names.update(alias.groups())
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\b")
    launches = [(i, text) for i, text in lines if _KERNEL_CALL.match(text) or _EXTERN_CALL.search(text)]
    keep = set()
    for k, (_, text) in enumerate(launches):
        if pattern.search(text):
            keep.update(range(max(0, k - context), min(len(launches), k + context + 1)))
    return [f"#{k:3d}  {_shorten(launches[k][1])}" for k in sorted(keep)]


def _shorten(text: str, width: int = 150) -> str:
    text = re.sub(r"_frozen_param\d+", "W", text)
    return text if len(text) <= width else text[:width - 3] + "..."


def inplace_launch_order(source: str) -> list[str]:
    """The launches that touch the buffer of a wrapper's first in-place conv + add, in order (appendix): the
    in-place call either comes before every generated kernel that reads the buffer, or one reads it too early."""
    calls = _inplace_binary_calls(source)
    return _call_order(source, calls[0].other) if calls else []


# ----------------------------------------------------------------------------------- the arithmetic
def _fuse_sum(module, xs, skip):
    """HighResolutionModule.forward with one summand ``skip = (output i, branch j)`` left out."""
    xs = [branch(x) for branch, x in zip(module.branches, xs)]
    fused = []
    for i, paths in enumerate(module.fuse_layers):
        terms = [xs[j] if i == j else paths[j](xs[j]) for j in range(len(xs))]
        total = sum(t for j, t in enumerate(terms) if (i, j) != skip)
        fused.append(module.relu(total))
    return fused


@dataclass
class SummandCheck:
    """Which fuse-layer summand, left out of an eager run, reproduces the compiled output (Chapter 3)."""

    stage: str
    output: int
    branch: int
    diff_without: float      # max |compiled - eager without that summand|
    diff_with: float         # max |compiled - eager| (the whole sum)
    summand_max: float       # the largest magnitude of the summand that went missing


def dropped_summand(model, x: torch.Tensor, compiled_output: torch.Tensor) -> list[SummandCheck]:
    """Left out in turn, which fuse-layer summand makes eager BlurBall equal the compiled output (appendix)?"""
    with torch.no_grad():
        full = model(x)
    diff_with = float((compiled_output - full).abs().max())
    if diff_with < MISCOMPILE_ATOL:  # the compiled output is eager's: no summand is missing (and leaving out a
        return []                    # never-read stage-4 output would "match" trivially)
    matches = []
    for stage_name in ("stage2", "stage3", "stage4"):
        module = getattr(model, stage_name)[0]
        n = len(module.branches)
        for i in range(n):
            for j in range(n):
                original = blurball.HighResolutionModule.forward
                captured = {}

                def patched(self, xs, _i=i, _j=j, _module=module):
                    if self is not _module:
                        return original(self, xs)
                    inner = [branch(t) for branch, t in zip(self.branches, xs)]
                    term = inner[_j] if _i == _j else self.fuse_layers[_i][_j](inner[_j])
                    captured["max"] = float(term.abs().max())
                    return _fuse_sum(self, xs, (_i, _j))

                blurball.HighResolutionModule.forward = patched
                try:
                    with torch.no_grad():
                        without = model(x)
                finally:
                    blurball.HighResolutionModule.forward = original
                diff = float((compiled_output - without).abs().max())
                if diff < MISCOMPILE_ATOL:
                    matches.append(SummandCheck(stage_name, i, j, diff, diff_with, captured.get("max", float("nan"))))
    return matches
