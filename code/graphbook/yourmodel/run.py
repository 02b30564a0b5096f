"""The your-model command's steps (Chapter 8), each one guarded: a step that cannot run becomes a row with its reason
and the others go on. Everything is returned as rows of one results file; the report is written from them."""
from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd
import torch
import torch._inductor.config as inductor_config
from torch.utils.flop_counter import FlopCounterMode

from graphbook.int8.quantization import int8_settings_for
from graphbook.measure import probes
from graphbook.method import decision, variants
from graphbook.method.bench import build_check_time
from graphbook.method.decision import PRECISION_GROUPS
from graphbook.method.variants import VariantUnavailable, arguments
from graphbook.record import runs
from graphbook.record.verdict import failure_bound, fewest_samples
from graphbook.record.results import COMPILE_S, EXPECTED_TO_MATCH, RUN, RUN_ID, SAME_OUTPUT
from graphbook.yourmodel import bisect, capture, fault, recipes
from graphbook.yourmodel.spec import Check, Samples, elementwise

#: The bool column of the reader's task check (top-1, top-k or their own), which judges lower precisions.
SAME_TASK = "same_task"
TASK_SAMPLES = "task_samples"   #: the samples the task check judged, a column of every variant row

#: The cause ladder, one cause per rung; max-autotune only in a full run, bf16 only where the CPU has it.
LADDER = ("eager_fp32", "eager_fp32_channels_last", "eager_fp32_channels_last_folded",
          "compile_no_layout_optimization", "compile_default", "compile_freezing", "compile_freezing_max_autotune",
          "compile_freezing_max_autotune_bf16")
QUICK_LADDER = LADDER[:6] + ("compile_freezing_bf16",)
#: What each rung adds to the one before it.
CAUSES = {"eager_fp32_channels_last": "channels-last", "eager_fp32_channels_last_folded": "BN folded",
          "compile_no_layout_optimization": "generated code (NCHW, BN kept)",
          "compile_default": "layout optimization", "compile_freezing": "freezing",
          "compile_freezing_max_autotune": "max-autotune", "compile_freezing_max_autotune_bf16": "bf16 autocast",
          "compile_freezing_bf16": "bf16 autocast"}
#: Beside the ladder: eager bf16, the runtimes at each level, and INT8 (with the FP32 twins the verdict needs).
OTHERS = ("eager_bf16_autocast", "compile_freezing_bf16", "ort_disabled", "ort_basic", "ort_extended", "ort_layout",
          "ort_all", "ort_all_without_nchwc", "ort_exporter_optimized_all", "ort_int8_qdq_all", "openvino_fp32",
          "openvino_bf16", "openvino_int8")


def _variant_names(quick: bool) -> list[str]:
    """Every variant a run builds, the ladder first."""
    return list(dict.fromkeys((QUICK_LADDER if quick else LADDER) + OTHERS))


@dataclass
class Settings:
    """The command's choices: the factory named in recipes, the check, threads, ``quick``, the run protocol, the
    bisection's time limit, and what the recipes load."""

    factory: str
    check: Check
    threads: int = 2
    quick: bool = False
    runs: int = 3
    repeats: int = 10
    warmup: int = 3
    bisect_seconds: float = 600.0
    inputs_file: str | None = None
    shape: tuple | None = None
    batch: int = 1
    calibration: int = 0
    log: Callable[[str], object] = print


@dataclass
class Outcome:
    """The rows of the results file and the variants that failed their own check."""

    rows: pd.DataFrame
    failed: list[str] = field(default_factory=list)


class _Steps:
    """Each step timed and guarded: a failure is a row (``record="step"``) with its reason, never a traceback."""

    def __init__(self, log):
        self.rows, self.log = [], log

    @contextlib.contextmanager
    def step(self, name: str):
        start = time.perf_counter()
        self.log(f"[{name}] ...")
        status, reason = "ok", ""
        try:
            yield
        except Exception as error:  # the step's failure is a fact of this model: recorded, the run goes on
            status, reason = "failed", f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"
        seconds = time.perf_counter() - start
        self.rows.append({"record": "step", "step": name, "status": status, "reason": reason, "seconds": seconds})
        self.log(f"[{name}] {status} in {seconds:.0f} s" + (f": {reason}" if reason else ""))

    def skipped(self, name: str, why: str) -> None:
        self.rows.append({"record": "step", "step": name, "status": "skipped", "reason": why, "seconds": 0.0})
        self.log(f"[{name}] skipped: {why}")


def _macs(forward, example) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        forward(*arguments(example))
    return int(counter.get_total_flops() // 2)


def macs(model: torch.nn.Module, example) -> tuple[int, int]:
    """Multiply-accumulates of one eager forward (torch's FLOP counter), and those of them whose result nothing
    reads: eager computes them, a compiled graph drops them (dead code). Without an export, no dead work is known."""
    total = _macs(model, example)
    try:
        graph = torch.export.export(model, arguments(example), strict=False).run_decompositions({}).module()
    except Exception:   # the export step records why; the rate then counts every MAC as live
        return total, 0
    graph.graph.eliminate_dead_code()   # functional after the decompositions, so only dead work goes
    graph.recompile()
    return total, total - _macs(graph, example)


def judge(run: Callable, samples: Samples, references: list, check: Check) -> dict:
    """A variant on every check batch: element-wise against eager FP32 (:data:`SAME_OUTPUT`), and the reader's task
    check where there is one (:data:`SAME_TASK`)."""
    with torch.no_grad():
        outputs = [run(batch) for batch in samples.check]
    numeric = elementwise(outputs, references)
    row = {SAME_OUTPUT: numeric["passed"], "relative_diff": numeric["statistic"],
           "max_abs_diff": numeric["max_abs_diff"]}
    if check.task:
        task = check.judge(outputs, references)
        row.update({SAME_TASK: bool(task["passed"]), "task_failures": task["failures"],
                    TASK_SAMPLES: task["samples"], "task_statistic": task["statistic"], "task_limit": task["limit"]})
    return row


def _own_failures(verdicts: pd.DataFrame) -> list[str]:
    """Variants whose own check failed (not those left out for a failed twin or a missing task check)."""
    own = verdicts["failed_check"].isin([decision.OUTPUT_DIFFERS, decision.TASK_FAILED])
    return list(verdicts.index.get_level_values("variant")[own])


def run(model: torch.nn.Module, samples: Samples, settings: Settings, env: dict) -> Outcome:
    """Every step on ``model``; ``env`` is the machine's fingerprint, put on every row."""
    log, steps = settings.log, _Steps(settings.log)
    torch.set_num_threads(settings.threads)
    example = samples.example
    with torch.no_grad():
        references = [variants.as_float(model(*arguments(batch))) for batch in samples.check]
    rows: list[dict] = []
    graphs: list = []

    with steps.step("capture"):
        counts, graphs = capture.capture(model, example)
        rows.append({"record": "capture", **counts})
    with steps.step("fold inventory"):
        rows += [{"record": "fold", **fold} for fold in capture.fold_inventory(model, example)]

    names = _variant_names(settings.quick)
    mappings: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="graphbook-yourmodel-") as workdir, \
            variants.BuildContext(workdir=workdir, threads=settings.threads,
                                  calibration=samples.calibration or None) as context:
        with steps.step("ONNX export"):
            for export in ("raw", "optimized"):
                variants.onnx_file(model, example, context, export)
        exported = steps.rows[-1]["status"] == "ok"

        bf16, no_bf16 = probes.bf16_support()

        def builder(name: str):
            def build():
                if variants.get(name).family in ("onnxruntime", "openvino") and not exported:
                    raise VariantUnavailable("the ONNX export failed")
                if variants.get(name).precision == "bf16" and not bf16:
                    raise VariantUnavailable(no_bf16)
                traced = capture.provenance(mappings) if name == "compile_default" else contextlib.nullcontext()
                try:
                    with traced, inductor_config.patch(fx_graph_cache=False):
                        built = variants.build(name, model, example, context)
                except VariantUnavailable:
                    raise
                except Exception as error:   # a build that fails is this model's fact: a row, and the rest go on
                    raise VariantUnavailable(f"could not build: {type(error).__name__}: "
                                             f"{(str(error).splitlines() or [''])[0][:200]}") from None
                return built.run, {COMPILE_S: built.compile_s, "note": built.note}
            return build

        columns = {name: {"description": variants.get(name).description, "precision": variants.get(name).precision,
                          "family": variants.get(name).family,
                          EXPECTED_TO_MATCH: variants.get(name).expected_to_match_eager} for name in names}
        frame = None
        with steps.step("variants: build, check, time"):
            frame, _ = build_check_time({name: builder(name) for name in names}, example, references[0],
                                        columns=columns, check=lambda run: judge(run, samples, references,
                                                                                  settings.check),
                                        runs=settings.runs, warmup=settings.warmup, repeats=settings.repeats,
                                        log=lambda line: log("  " + line))
            total, dead = macs(model, example)
            frame = frame.assign(record="variant", macs=total, dead_macs=dead)

        if mappings and graphs:
            with steps.step("kernels against groups"):
                kernels = capture.kernel_rows(mappings, graphs)
                rows.append({"record": "kernels", **capture.kernels_against_groups(kernels)})
                rows += [{"record": "split group", **split} for split in capture.split_groups(kernels, graphs)]
        else:
            steps.skipped("kernels against groups", "no traced compile or no captured graph")

        with steps.step("planted fault"):
            planted = fault.plant(model, example)
            verdict = judge(lambda x: variants.as_float(planted.model(*arguments(x))), samples, references,
                            settings.check)
            passed = verdict[SAME_TASK] if settings.check.task else verdict[SAME_OUTPUT]
            rows.append({"record": "fault", "kind": planted.kind, "planted_in": planted.where, "rejected": not passed,
                         **verdict})

        analysed = _with_machine(frame, env) if frame is not None and frame["median_ms"].notna().any() else None
        verdicts = (decision.check_verdicts(analysed, task=SAME_TASK, samples=TASK_SAMPLES) if analysed is not None
                    else None)
        failed = _own_failures(verdicts) if verdicts is not None else []
        # an FP32 compile must equal eager, so a wrong one has a cause to find; a lower precision that moves an
        # answer while its FP32 twin passes is rounding, which no switch explains
        wrong_compiles = [name for name in failed if variants.get(name).family == "compile"
                          and variants.get(name).expected_to_match_eager]
        if wrong_compiles:
            with steps.step("bisection"):
                budget = settings.bisect_seconds
                for name in wrong_compiles:
                    start = time.perf_counter()
                    rows += [{"record": "bisect", "variant": name, **row} for row in bisect.bisect(
                        lambda patch, name=name: _judged_under(patch, name, model, example, context, samples,
                                                               references, settings.check),
                        time_limit=budget, log=log)]
                    budget -= time.perf_counter() - start
        else:
            steps.skipped("bisection", "no FP32 compiled variant failed its check")

    if analysed is not None:
        with steps.step("verdict"):
            rows += _verdict_rows(analysed, samples, settings)
    out = pd.concat([pd.DataFrame(rows), frame, pd.DataFrame(steps.rows)], ignore_index=True)
    return Outcome(out, failed)


def _with_machine(frame: pd.DataFrame, env: dict) -> pd.DataFrame:
    """The timed variant rows as the decision reads them: the fingerprint on every row, a run id per run, load
    flags."""
    frame = frame[frame["median_ms"].notna()]
    timed = frame.assign(**{k: v for k, v in env.items() if k not in frame}, **{RUN_ID: "r" + frame[RUN].astype(str)})
    return runs.flag_under_load(timed)


def _judged_under(patch: dict, name: str, model, example, context, samples, references, check: Check) -> dict:
    """Variant ``name`` rebuilt and judged with Inductor switches ``patch``: its own check's verdict."""
    with inductor_config.patch({**patch, "fx_graph_cache": False}):
        built = variants.build(name, model, example, context)
        verdict = judge(built.run, samples, references, check)
    own = SAME_OUTPUT if variants.get(name).expected_to_match_eager else SAME_TASK
    return {"passed": bool(verdict[own]), "relative_diff": verdict["relative_diff"]}


def _verdict_rows(analysed: pd.DataFrame, samples: Samples, settings: Settings) -> list[dict]:
    """Per precision group the decision (best, runner-up, margin, runs, decided, what was left out and why), the
    best's speed-up and share of this CPU's ceiling, and the recipe that builds it. Lower precisions are refused on
    random inputs, and without a task check."""
    machine, timed = str(analysed[runs.MACHINE].iloc[0]), analysed
    quiet = timed[~timed[runs.UNDER_LOAD]]
    speedups = runs.summarize_runs(quiet, value="speedup_vs_eager").set_index("variant")["median"] if len(quiet) else {}
    shares = (decision.executed_rates(quiet).groupby("variant")["share_of_ceiling"].median() if len(quiet)
              else pd.Series(dtype=float))
    rows = []
    for label, precisions in PRECISION_GROUPS:
        lower = "fp32" not in precisions
        judged, fewest = samples.check_samples, fewest_samples()
        refused = ("random inputs: a lower precision is judged on real data" if lower and samples.random
                   else "no task check: element-wise at FP32's tolerance judges only FP32"
                   if lower and not settings.check.task
                   else f"{judged} check samples: a pass bounds the failure rate only at "
                        f"{failure_bound(judged):.0%}; a lower precision needs {fewest}"
                   if lower and judged < fewest else "")
        candidates = [v for v in timed["variant"].unique() if variants.get(v).precision in precisions]
        row = {"record": "verdict", "precision": label, "refused": refused, TASK_SAMPLES: judged,
               "failure_bound": failure_bound(judged)}
        if not refused and candidates:
            chosen = decision.decide(timed, machine, candidates=candidates, task=SAME_TASK)
            row.update({k: v for k, v in vars(chosen).items() if k != "excluded"},
                       excluded="; ".join(f"{v}: {why}" for v, why in chosen.excluded.items()))
            if chosen.best:
                row.update(speedup=float(speedups.get(chosen.best, float("nan"))),
                           share_of_ceiling=float(shares.get(chosen.best, float("nan"))),
                           recipe=recipes.recipe(
                               chosen.best, factory=settings.factory, inputs=settings.inputs_file,
                               example=recipes.example_code(settings.inputs_file, settings.batch, settings.shape),
                               batch=settings.batch, calibration=settings.calibration, threads=settings.threads,
                               reduce_range=int8_settings_for().reduce_range))
        rows.append(row)
    return rows
