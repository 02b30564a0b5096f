"""What TVM's build choices cost on a CPU: targets, a census of the generated code, busy cores (Chapter 3)."""
from __future__ import annotations

import re
import time
from typing import Callable, Iterable

from graphbook.measure import timing

GENERIC = "tvm_generic"            #: untuned, target ``llvm`` without ``mcpu`` (generic x86-64)
HOST = "tvm_host"                  #: untuned, target ``llvm`` with the host CPU's ``mcpu``
TUNED = "tvm_tuned"                #: MetaSchedule-tuned for the host target (``--trials``)
EAGER = "eager"                    #: eager PyTorch at the book's thread count (the reference)
EAGER_1_THREAD = "eager_1_thread"  #: eager PyTorch at one intra-op thread
#: speed-up column -> the eager variant of the same run it divides by
SPEEDUP_BASELINES = {"speedup_vs_eager": EAGER, "speedup_vs_eager_1_thread": EAGER_1_THREAD}
_VECTOR_WIDTHS = (4, 8, 16)
_PARALLEL_LAUNCH = re.compile(r"\bcall\b[^\n]*@TVMBackendParallelLaunch\(")


def targets(threads: int) -> dict:
    """The untuned builds' targets, ``{GENERIC: Target, HOST: Target}``, with ``num-cores`` ``threads`` (Chapter 3)."""
    import tvm

    host = tvm.target.Target.from_device(tvm.cpu()).export()
    return {GENERIC: tvm.target.Target({"kind": "llvm", "num-cores": threads}),
            HOST: tvm.target.Target({**host, "num-cores": threads})}


def _code_census(llvm_ir: str) -> dict:
    """What LLVM IR text holds: calls into TVM's thread pool (none: one thread), lines using N-wide float vectors,
    and lines calling a masked gather (LLVM's vectorization of a loop whose accesses are not contiguous)."""
    lines = llvm_ir.splitlines()
    return {"parallel_launches": len(_PARALLEL_LAUNCH.findall(llvm_ir)),
            "ir_lines_gather": sum("@llvm.masked.gather" in line for line in lines),
            **{f"ir_lines_f32x{width}": sum(f"<{width} x float>" in line for line in lines)
               for width in _VECTOR_WIDTHS}}


def _modules(module) -> Iterable:
    yield module
    for imported in module.imports:
        yield from _modules(imported)


def generated_code(executable) -> dict:
    """:func:`_code_census` of every LLVM module a ``tvm.compile`` result holds (Chapter 3)."""
    texts = [m.inspect_source("ll") for m in _modules(executable.mod) if m.kind == "llvm"]
    return _code_census("\n".join(texts))


def timed_with_cores(fn: Callable[[], object], *, warmup: int, repeats: int, threads: int | None = None) -> dict:
    """:func:`graphbook.measure.timing.time_cpu`'s columns plus ``busy_cores`` (Chapter 3)."""
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    result = timing.time_cpu(fn, warmup=warmup, repeats=repeats, threads=threads)
    busy = (time.process_time() - cpu_start) / (time.perf_counter() - wall_start)
    return {**result.as_dict(), "busy_cores": round(busy, 2)}


def tune(mod, target, *, trials: int, build_timeout: int, work_dir: str):
    """MetaSchedule-tune ``mod`` for ``target`` in ``trials`` trials: ``(executable, {"tune_s", "trials", "tasks"})``"""
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    # MetaSchedule tunes TIR functions: legalize and fuse first (the passes tvm.compile runs), so each fused
    # kernel is one task.
    fused = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FoldConstant(),
        relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)
    start = time.perf_counter()
    database = ms.relax_integration.tune_relax(
        fused, params={}, target=target, work_dir=work_dir, max_trials_global=trials,
        num_trials_per_iter=min(16, trials), cost_model="random",
        builder=ms.builder.LocalBuilder(max_workers=1, timeout_sec=build_timeout),
        runner=ms.runner.LocalRunner(timeout_sec=60), database="json", seed=0)
    tune_s = time.perf_counter() - start
    tasks = len(ms.relax_integration.extract_tasks(fused, target))
    executable = ms.relax_integration.compile_relax(database, fused, target, params=None)
    return executable, {"tune_s": round(tune_s, 1), "trials": trials, "tasks": tasks}
