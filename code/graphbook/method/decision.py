"""The fastest correct path per precision, from one machine's recorded runs (Chapters 5, 7, 8): each variant's own
check, its FP32 twin, and a record of the decision. Facts only: a page writes the sentences. Machines are never
pooled."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from graphbook.config import FULL_SIZE
from graphbook.measure.probes import fp32_ceiling, precision_ceiling
from graphbook.method import variants
from graphbook.record import recording, results, runs, verdict

#: Why a variant failed its check (``failed_check``); empty when it passed.
OUTPUT_DIFFERS = "output differs from eager FP32"
TASK_FAILED = "task check failed"          # BlurBall's: the decoded ball moved
NO_TASK_CHECK = "no task check recorded"
TWIN_FAILED = "FP32 twin failed"
TWIN_MISSING = "FP32 twin not recorded"


def _own_check(name: str, group: pd.DataFrame, task: str) -> str:
    """One variant's own check over one machine's runs, as :data:`failed_check` (empty when it passed): FP32 on the
    output, a lower precision on the ``task`` column (BlurBall's decoded ball, ``same_ball``)."""
    if variants.get(name).expected_to_match_eager:
        return "" if group[results.SAME_OUTPUT].astype(bool).all() else OUTPUT_DIFFERS
    checked = group[group[task].notna()] if task in group else group.iloc[:0]
    if checked.empty:
        return NO_TASK_CHECK
    return "" if checked[task].astype(bool).all() else TASK_FAILED


def check_verdicts(rows: pd.DataFrame, *, task: str = results.SAME_BALL,
                   samples: str = results.BALL_FRAMES) -> pd.DataFrame:
    """Per machine and variant: ``check_passed`` in every run, ``failed_check`` (why not), the largest
    ``max_abs_diff``, and the ``check_samples`` the task check judged in a run (the ``samples`` column) with the
    ``failure_bound`` a pass on that many gives (:func:`graphbook.record.verdict.failure_bound`). A lower precision
    passes only when it passes the ``task`` check *and* its FP32 twin passes on the same machine: rounding can hide
    a wrong output it inherits."""
    own = {key: (_own_check(key[1], group, task), float(group.get(results.MAX_ABS_DIFF, pd.Series(dtype=float)).max()),
                 float(pd.to_numeric(group.get(samples, pd.Series(dtype=float)), errors="coerce").min()))
           for key, group in rows.groupby([runs.MACHINE, "variant"], sort=False)}
    verdicts = {}
    for (machine, name), (failed, diff, judged_samples) in own.items():
        twin = variants.FP32_TWINS.get(name)
        if not failed and twin is not None and own.get((machine, twin), ("missing",))[0]:
            failed = TWIN_FAILED if (machine, twin) in own else TWIN_MISSING
        judged = judged_samples == judged_samples   # a count the rows recorded: NaN where the check counts none
        verdicts[machine, name] = {"check_passed": not failed, "failed_check": failed, "max_abs_diff": diff,
                                   "check_samples": int(judged_samples) if judged else pd.NA,
                                   "failure_bound": verdict.failure_bound(int(judged_samples)) if judged else pd.NA}
    frame = pd.DataFrame.from_dict(verdicts, orient="index")
    frame.index.names = [runs.MACHINE, "variant"]
    return frame


@dataclass(frozen=True)
class Decision:
    """The fastest variant that passed its check, among ``candidates`` on one machine's quiet runs."""

    machine: str
    best: str | None
    best_median_ms: float
    runner_up: str | None
    runner_up_median_ms: float
    margin: float                  # the runner-up's median over the best's (> 1: the best is ahead)
    runs: int                      # quiet runs of the best
    won_runs: int                  # runs in which the best was ahead of the runner-up
    decided: bool                  # the book's rule called the best faster than the runner-up
    excluded: dict = field(default_factory=dict)   # variant -> the check it failed
    outcome: str = verdict.CANT_TELL   # faster, within 5 % or can't tell at this noise (graphbook.record.verdict)
    lead: float = float("nan")         # the runner-up's time over the best's, from the paired runs
    lead_low: float = float("nan")     # its 95 % interval
    lead_high: float = float("nan")
    detectable_lead: float = float("nan")   # the lead these runs detect at least 80 % of the time
    noise_from: str = "no comparison"


def decide(rows: pd.DataFrame, machine: str, *, candidates=None, task: str = results.SAME_BALL) -> Decision:
    """The :class:`Decision` over ``machine``'s rows (flagged for load) among ``candidates`` (default: all)."""
    mine = rows[rows[runs.MACHINE] == machine]
    verdicts = check_verdicts(mine, task=task)   # over every variant: a lower precision's twin is judged too
    mine = mine.drop(columns="check_passed", errors="ignore").join(verdicts[["check_passed"]],
                                                                   on=[runs.MACHINE, "variant"])
    if candidates is not None:
        mine = mine[mine["variant"].isin(list(candidates))]
    pick = runs.choose_best(mine, correct="check_passed", skip_under_load=True).iloc[0]
    excluded = {v: verdicts.loc[(machine, v), "failed_check"] for v in pick["excluded"]}
    return Decision(machine, pick["best"], float(pick["best_median"]), pick["runner_up"],
                    float(pick["runner_up_median"]), float(pick["margin"]), int(pick["runs"]), int(pick["won_runs"]),
                    bool(pick["decided"]), excluded, pick["outcome"], float(pick["lead"]), float(pick["lead_low"]),
                    float(pick["lead_high"]), float(pick["detectable_lead"]), pick["noise_from"])


def full_size_rows(recorded: pd.DataFrame | None = None,
                   machine: str | None = None) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The variant rows at :data:`FULL_SIZE`, flagged for load and joined with ``check_passed``, and the
    verdicts of ``machine`` (default: the deciding one) from ``recorded`` (default: the reference recording's);
    ``(None, None)`` when nothing is recorded."""
    recorded = recording.load("cpu-blurball") if recorded is None else recorded
    if recorded.empty:
        return None, None
    full = ((recorded.record == "variant") & (recorded.height == FULL_SIZE[0])
            & (recorded.width == FULL_SIZE[1]) & recorded.variant.isin(list(variants.REGISTRY)))  # not the retired
    if not full.any():
        return None, None
    rows = runs.flag_under_load(recorded[full])
    verdicts = check_verdicts(rows)
    machine = machine or runs.deciding_machine(rows) or rows[runs.MACHINE].iloc[0]
    return rows.join(verdicts[["check_passed"]], on=[runs.MACHINE, "variant"]), verdicts.loc[machine]


def run_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per recorded run: file, date, machine, torch, eager FP32's median and its load flag."""
    def eager_ms(group):
        eager = group[group.variant == variants.REFERENCE]
        return float(eager.median_ms.iloc[0]) if len(eager) else float("nan")

    out = []
    for _, group in rows.groupby("run_id", sort=False):
        first = group.iloc[0]
        loaded = bool(first[runs.UNDER_LOAD])
        out.append({"recorded file": first.source_file, "date (UTC)": str(first.date)[:16].replace("T", " "),
                    "machine": first[runs.MACHINE], "torch": first.torch, "eager FP32 (ms)": round(eager_ms(group)),
                    "under load?": "yes: " + str(first[runs.LOAD_REASON]) if loaded else "no"})
    return pd.DataFrame(out)


#: The precisions the best-path table groups, with the name each group goes by.
PRECISION_GROUPS = (("FP32", ("fp32",)), ("lower precision (bf16, INT8)", ("bf16", "int8")))


def best_per_precision(machine_rows: pd.DataFrame) -> pd.DataFrame:
    """Per precision group, one machine's :class:`Decision` with the best's speed-up over eager FP32, executed GFLOP/s
    and its share of the ceilings (NaN where nothing passed)."""
    machine = str(machine_rows[runs.MACHINE].iloc[0])
    quiet = machine_rows[~machine_rows[runs.UNDER_LOAD]]
    speedups = runs.summarize_runs(quiet, by="variant", value=results.SPEEDUP_VS_EAGER).set_index("variant")["median"]
    rated = executed_rates(quiet).groupby("variant")[["executed_gflop_per_s", "share_of_ceiling",
                                                      "share_of_fp32_ceiling"]].median()
    out = []
    for label, precisions in PRECISION_GROUPS:
        candidates = [v for v in variants.REGISTRY if variants.get(v).precision in precisions]
        chosen = decide(machine_rows, machine, candidates=candidates)
        best = chosen.best
        out.append({"precision": label, **vars(chosen),
                    "speedup": float(speedups.get(best, float("nan"))) if best else float("nan"),
                    **{k: float(rated.loc[best, k]) if best in rated.index else float("nan") for k in rated.columns}})
    return pd.DataFrame(out)


#: FP32 variants allowed above their machine's ceiling, each with the measured reason (none so far: a
#: rate above the ceiling means the work was miscounted, or an algorithm did fewer multiplications).
EXPLAINED_ABOVE_CEILING: dict[str, str] = {}


def executed_rates(frame):
    """Recorded BlurBall rows with the rate of the work each variant really executes, against its ceiling. Eager
    executes the never-read stage-4 outputs too; every other family runs a graph without them, so its rate counts live
    MACs only."""
    out = frame.copy()
    eager = out["variant"].map(lambda v: getattr(variants.REGISTRY.get(v), "family", "") == "eager")
    out["executed_macs"] = out["macs"] - out["dead_macs"].where(~eager, 0)
    out["executed_gflop_per_s"] = 2 * out["executed_macs"] / (out["median_ms"] * 1e-3) / 1e9
    records = out.to_dict("records")
    precisions = [str(r.get("precision") or "fp32") for r in records]
    out["ceiling_gflop_per_s"] = [precision_ceiling(r, p if p in ("bf16", "int8") else "fp32")["gflop_per_s"]
                                  for r, p in zip(records, precisions)]
    out["share_of_ceiling"] = out["executed_gflop_per_s"] / out["ceiling_gflop_per_s"].astype(float)
    out["fp32_ceiling_gflop_per_s"] = [fp32_ceiling(r)["gflop_per_s"] for r in records]
    out["share_of_fp32_ceiling"] = out["executed_gflop_per_s"] / out["fp32_ceiling_gflop_per_s"].astype(float)
    return out


def above_ceiling(frame):
    """The FP32 rows of :func:`executed_rates` faster than their machine's ceiling, less the explained ones."""
    rated = executed_rates(frame) if "share_of_ceiling" not in frame.columns else frame
    fp32 = rated["precision"].astype(str).eq("fp32") if "precision" in rated.columns else True
    over = rated[fp32 & (rated["share_of_ceiling"].astype(float) > 1.0)]
    return over[~over["variant"].isin(list(EXPLAINED_ABOVE_CEILING))]
