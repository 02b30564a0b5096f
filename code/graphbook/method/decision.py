"""The recorded BlurBall CPU matrix as Chapter 5 and the appendix "Machines and runs" read it. Every verdict
is judged on one machine's own runs; machines are never pooled."""
from __future__ import annotations

import pandas as pd

from graphbook.config import FULL_SIZE
from graphbook.record import results, runs
from graphbook.method import variants
from graphbook.measure.probes import fp32_ceiling, precision_ceiling


def _own_check(name: str, group: pd.DataFrame) -> tuple[bool, str]:
    """One variant's own check over one machine's runs: FP32 on the logits, a lower precision on the decoded
    ball (older random-weight files cannot pass it)."""
    if variants.get(name).expected_to_match_eager:
        passed = bool(group[results.SAME_OUTPUT].astype(bool).all())
        return passed, "same output as eager FP32" if passed else "output differs from eager FP32"
    checked = group[group[results.SAME_BALL].notna()] if results.SAME_BALL in group else group.iloc[:0]
    if checked.empty:
        return False, "no decoded-ball check recorded (random-weight runs)"
    frames = int(checked[results.BALL_FRAMES].min())
    moved = frames - int(checked[results.BALL_AGREE_FRAMES].min())
    if bool(checked[results.SAME_BALL].astype(bool).all()):
        return True, f"decoded ball kept on {frames} held-out frames"
    return False, f"decoded ball moved on {moved} of {frames} held-out frames"


def check_verdicts(rows: pd.DataFrame) -> pd.DataFrame:
    """Per machine and variant: ``check_passed`` in every run, the ``check`` phrase, the largest ``max_abs_diff``. A
    lower precision passes only when it keeps the decoded ball *and* its FP32 twin passes on the same machine: the
    book's one rule, which Chapter 7's serving decision applies too."""
    own = {key: (*_own_check(key[1], group), float(group[results.MAX_ABS_DIFF].max()))
           for key, group in rows.groupby([runs.MACHINE, "variant"], sort=False)}
    verdicts = {}
    for (machine, name), (passed, why, diff) in own.items():
        twin = variants.FP32_TWINS.get(name)
        if twin is not None and not own.get((machine, twin), (False,))[0]:
            twin_says = "differs from eager FP32" if (machine, twin) in own else "was not recorded on this machine"
            why = (f"{why}, but " if passed else f"{why}; ") + f"its FP32 twin {variants.get(twin).label} {twin_says}"
            passed = False
        verdicts[machine, name] = {"check_passed": passed, "check": ("passed: " if passed else "FAILED: ") + why,
                                   "max_abs_diff": diff}
    frame = pd.DataFrame.from_dict(verdicts, orient="index")
    frame.index.names = [runs.MACHINE, "variant"]
    return frame


def full_size_rows(recorded: pd.DataFrame | None = None,
                   machine: str | None = None) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The variant rows at :data:`FULL_SIZE`, flagged for load and joined with ``check_passed``, and the
    verdicts of ``machine`` (default: the deciding one); ``(None, None)`` when nothing is recorded."""
    recorded = results.load("cpu-blurball") if recorded is None else recorded
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


def machine_verdict(rows: pd.DataFrame, machine: str) -> tuple[str, str | None]:
    """A sentence on what ``machine``'s recorded runs allow the book to say, and the variant it decides for
    (None when its quiet runs are too few or disagree)."""
    mine = rows[rows[runs.MACHINE] == machine]
    flags = mine.groupby("run_id", sort=False)[runs.UNDER_LOAD].first()
    n_quiet, n_loaded = int((~flags).sum()), int(flags.sum())
    head = f"{runs.named(machine)}: {runs.count(len(flags), 'recorded run')}" + (
        f", {n_loaded} flagged under load (not used)." if n_loaded else ".")
    failed = sorted(set(mine.variant[~mine.check_passed.astype(bool)]))
    excluded = (" Left out because they failed their check: " + ", ".join(variants.get(v).label for v in failed)
                + ".") if failed else ""
    best = runs.choose_best(mine, correct="check_passed", skip_under_load=True)
    best = best.iloc[0] if len(best) else None
    if best is None or best["best"] is None:
        return head + " No variant passed its check." + excluded, None
    lead = (f"{variants.get(best['best']).label} ({best['best_median']:.0f} ms, median of its quiet runs) "
            f"against {variants.get(best['runner_up']).label} ({best['runner_up_median']:.0f} ms), "
            f"ahead in {best['won_runs']} of {runs.count(int(best['runs']), 'quiet run')}")
    if n_quiet < runs.MIN_RUNS:
        return (head + f" Fewer than {runs.MIN_RUNS} quiet runs, so no best variant is declared; the quiet runs "
                f"have {lead}." + excluded, None)
    if not best["decided"]:
        return head + f" The quiet runs do not agree on an order ({lead}): no best variant." + excluded, None
    return head + f" Best correct variant: {lead}." + excluded, best["best"]


#: The precisions the best-path table groups, with the name each group goes by.
PRECISION_GROUPS = (("FP32", ("fp32",)), ("lower precision (bf16, INT8)", ("bf16", "int8")))


def best_per_precision(machine_rows: pd.DataFrame) -> pd.DataFrame:
    """Per precision, one machine's fastest variant that passed its check: speed-up, executed GFLOP/s and its
    share of the ceilings; a group where nothing passed says so."""
    quiet = machine_rows[~machine_rows[runs.UNDER_LOAD]]
    speedups = runs.summarize_runs(quiet, by="variant", value=results.SPEEDUP_VS_EAGER).set_index("variant")
    rated = executed_rates(quiet)
    out = []
    for label, precisions in PRECISION_GROUPS:
        candidates = [v for v in variants.REGISTRY if variants.get(v).precision in precisions]
        pick = runs.choose_best(machine_rows, correct="check_passed", candidates=candidates, skip_under_load=True)
        pick = pick.iloc[0] if len(pick) and pick.iloc[0]["best"] is not None else None
        if pick is None:
            out.append({"precision": label, "best correct variant": "none passed its check"})
            continue
        mine = rated[rated.variant == pick["best"]]
        out.append({"precision": label, "best correct variant": variants.get(pick["best"]).label,
                    "median (ms)": pick["best_median"], "quiet runs": int(pick["runs"]),
                    "speed-up over eager FP32": f"{speedups['median'][pick['best']]:.2f}×",
                    "executed GFLOP/s": float(mine.executed_gflop_per_s.median()),
                    "share of its precision's ceiling (%)": 100 * float(mine.share_of_ceiling.astype(float).median()),
                    "share of the FP32 ceiling (%)": 100 * float(mine.share_of_fp32_ceiling.astype(float).median()),
                    "decided": bool(pick["decided"])})
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
