"""Where BlurBall's CPU speed-up comes from (Chapter 5): a ladder of single FP32 causes applied by hand, each
checked against eager, up to Inductor. Rungs alternate call by call, so each step is a ratio under the same load."""
from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from graphbook.record import recording, runs as runs_mod
from graphbook.method.variants import own_code
from graphbook.method.folding import fold_all_conv_bn
from graphbook.teach.plots import speedup_waterfall

EAGER = "eager"
DEAD_SKIPPED = "dead outputs skipped"
CHANNELS_LAST = "channels-last"
BN_FOLDED = "BN folded"
INDUCTOR = "Inductor"
#: The rungs in order; each applies one more cause than the one before.
RUNGS = (EAGER, DEAD_SKIPPED, CHANNELS_LAST, BN_FOLDED, INDUCTOR)
#: The cause each rung adds, as the waterfall labels it.
CAUSES = {DEAD_SKIPPED: "dead-code elimination", CHANNELS_LAST: "channels-last layout",
          BN_FOLDED: "batch norm folded", INDUCTOR: "Inductor's generated code"}
#: Inductor with one of its own causes switched off, timed beside the rungs.
INDUCTOR_WITHOUT = {"Inductor without layout optimization": {"layout_optimization": False},
                    "Inductor without generated code": {"fallback_by_default": True}}


def compiled_runner(model: nn.Module, options: dict, compile: Callable) -> Callable:
    """A runner ``x -> logits`` of ``compile`` applied to the model's own copy, under Inductor ``options``."""
    compiled = compile(own_code(model))

    def run(x):
        with torch.no_grad(), torch._inductor.config.patch(options):
            return compiled(x)
    return run


# >>> taught on chapters/05_blurball_measurements.ipynb: edit it there, then run scripts/export_taught_code.py
class FirstFusedOutputOnly(nn.Module):
    """An HRNet stage that computes only fused output 0, the only one BlurBall's head reads."""

    def __init__(self, stage: nn.Module):
        super().__init__()
        self.branches = stage.branches
        self.fuse_paths = stage.fuse_layers[0]
        self.relu = stage.relu

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        xs = [branch(x) for branch, x in zip(self.branches, xs)]
        total = xs[0]
        for j in range(1, len(xs)):
            total = total + self.fuse_paths[j](xs[j])
        return [self.relu(total)]


def skip_dead_outputs(model: nn.Module) -> nn.Module:
    """A copy of BlurBall whose last stage computes only the output its head reads.

    The released model computes all four fused outputs of stage 4 and reads one
    (:data:`graphbook.model.blurball.DEAD_MODULE_PREFIXES`); this copy skips the other three, which is exactly
    what dead-code elimination removes from a captured graph. The logits are unchanged.
    """
    pruned = copy.deepcopy(model)
    pruned.stage4[0] = FirstFusedOutputOnly(pruned.stage4[0])
    return pruned


def channels_last_runner(module: nn.Module) -> Callable:
    module = module.to(memory_format=torch.channels_last)

    def run(x):
        with torch.no_grad():
            return module(x.contiguous(memory_format=torch.channels_last)).contiguous()
    return run


def plain_runner(module: nn.Module) -> Callable:
    def run(x):
        with torch.no_grad():
            return module(x)
    return run


def build_rungs(model: nn.Module, example: torch.Tensor, *, compile: Callable = torch.compile) -> dict[str, Callable]:
    """Runners ``x -> logits`` for every rung and every Inductor switch, in ladder order.

    ``model`` is a :class:`graphbook.model.blurball.BlurBallHeatmap` in eval mode and ``example`` an input (the
    folding traces the dataflow with it). Compiled runners compile
    on their first call; call each once (that is the correctness check) before timing. ``compile`` wraps
    each compiled rung's own copy of the model (``torch.compile``; a test passes a stand-in).
    """
    pruned = skip_dead_outputs(model)
    folded, _ = fold_all_conv_bn(pruned, (example,))
    runners = {EAGER: plain_runner(model), DEAD_SKIPPED: plain_runner(pruned),
               CHANNELS_LAST: channels_last_runner(copy.deepcopy(pruned)),
               BN_FOLDED: channels_last_runner(folded),
               INDUCTOR: compiled_runner(model, {"freezing": False}, compile)}
    for name, options in INDUCTOR_WITHOUT.items():
        runners[name] = compiled_runner(model, {"freezing": False, **options}, compile)
    return runners
# <<< end of the code taught on chapters/05_blurball_measurements.ipynb


@dataclass
class Step:
    """One rung of the ladder measured across runs."""

    rung: str
    cause: str
    median_ms: float
    step: float        # median over runs of (previous rung's time / this rung's), >1 = faster
    step_min: float
    step_max: float
    cumulative: float  # product of the steps so far


#: ONNX Runtime's optimization levels as a ladder (Chapter 4): each level adds its rewrites to the one before.
ORT_RUNGS = ("eager_fp32", "ort_disabled", "ort_basic", "ort_extended", "ort_layout", "ort_all")
ORT_CAUSES = {"ort_disabled": "ORT's own kernels (no rewrite)", "ort_basic": "basic: BN folded, constants",
              "ort_extended": "extended: activations fused", "ort_layout": "layout: NCHWc convolutions",
              "ort_all": "all: the rest"}


def ladder(frame, machine: str | None = None, *, rungs=RUNGS, causes=None, value: str = "median_ms",
           run: str = "run_id") -> tuple[list[Step], dict]:
    """The steps of a ladder from one machine's runs, and ``total``, ``product`` and ``residual`` (total / product). A
    ladder never mixes machines: with several in ``frame``, ``machine`` must say which."""
    rungs = list(rungs)
    causes = causes if causes is not None else (ORT_CAUSES if rungs == list(ORT_RUNGS) else CAUSES)
    data = runs_mod.single_machine(frame, machine)
    pivot = data.pivot_table(index=run, columns="variant", values=value, aggfunc="median")
    missing = [r for r in rungs if r not in pivot.columns]
    if missing:
        raise ValueError(f"the runs have no rung(s) {missing}; they have {list(pivot.columns)}")
    pivot = pivot[rungs].dropna()
    if pivot.empty:
        raise ValueError("no run measured every rung")
    first, last = rungs[0], rungs[-1]
    steps, cumulative = [Step(first, "baseline", float(pivot[first].median()), 1.0, 1.0, 1.0, 1.0)], 1.0
    for before, rung in zip(rungs, rungs[1:]):
        per_run = list(pivot[before] / pivot[rung])
        middle = statistics.median(per_run)
        cumulative *= middle
        steps.append(Step(rung, causes.get(rung, rung), float(pivot[rung].median()), middle, min(per_run),
                          max(per_run), cumulative))
    totals = list(pivot[first] / pivot[last])
    total = statistics.median(totals)
    return steps, {"total": total, "total_min": min(totals), "total_max": max(totals), "product": cumulative,
                   "residual": total / cumulative, "runs": len(pivot),
                   "machine": str(data[runs_mod.MACHINE].iloc[0])}


def recorded_ladder(recorded=None, *, here=None, height: int = 288):
    """``(steps, summary, quiet_rows)`` from the deciding machine's quiet recorded runs at ``height`` (of
    ``recorded``, default: the reference recording's attribution runs), or None. ``summary["switches"]`` has the median time of
    every variant timed in those runs."""
    recorded = recording.load("attribution") if recorded is None else recorded
    if not len(recorded) or not (recorded["height"] == height).any():
        return None
    flagged = runs_mod.flag_under_load(recorded[recorded["height"] == height])
    machine = runs_mod.deciding_machine(flagged, here=here)
    if machine is None:
        return None
    quiet = runs_mod.single_machine(flagged[~flagged[runs_mod.UNDER_LOAD]], machine)
    steps, summary = ladder(quiet, machine)
    summary["switches"] = runs_mod.summarize_runs(quiet).set_index("variant")["median"].to_dict()
    return steps, summary, quiet


def draw_ladder(steps: list[Step], summary: dict, ax=None, title: str = ""):
    """A ladder as a speed-up waterfall: one bar per cause, the total beside them."""
    return speedup_waterfall([s.cause for s in steps[1:]], [s.step for s in steps[1:]], summary["total"],
                             step_ranges=[(s.step_min, s.step_max) for s in steps[1:]],
                             total_range=(summary["total_min"], summary["total_max"]), ax=ax, title=title)
