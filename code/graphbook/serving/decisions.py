"""The deployment decisions of Chapter 7, each from one machine's recorded runs (Chapter 7)."""
from __future__ import annotations

from typing import Mapping

from graphbook.freezing import miscompile
from graphbook.record import results, runs
from graphbook.method import variants
from graphbook.method import decision

#: Lower precisions are judged by a different check (peaks and decoded balls, not the FP32 tolerance).
_NOT_FP32 = "bf16|int8|fp16|matmul"
#: The restart paths a CPU worker could take, as the decision names them.
RESTART_NAMES = (("a cold compile", "compile-cold"), ("a warm cache", "compile-warm"),
                 ("the .pt2 from Python", "aoti-static"), ("the .pt2 from C++", "aoti-cpp"),
                 ("ONNX Runtime", "ort-raw"), ("OpenVINO", "openvino"),
                 ("OpenVINO with its model cache", "openvino-cached"))
#: The lower precisions a CPU worker could serve, judged on the decoded ball (Chapter 5), never on logits.
LOWER_PRECISIONS = ("bf16", "int8")


def _label(variant) -> str:
    """A variant as the chapters name it (its registry label), its identifier only when it is not registered."""
    return variants.REGISTRY[variant].label if variant in variants.REGISTRY else str(variant)


def _fp32_runs_of_one_machine(cpu_frame, *, here: Mapping | str | None = None):
    """The FP32 variant rows of the CPU matrix, flagged for load, of the one machine that decides (Chapter 7)."""
    if cpu_frame is None or not len(cpu_frame):
        return cpu_frame, None
    fp32_rows = cpu_frame[(cpu_frame["record"] == "variant") & ~cpu_frame["variant"].str.contains(_NOT_FP32)
                          & cpu_frame["variant"].isin(list(variants.REGISTRY))]
    flagged = runs.flag_under_load(fp32_rows)
    machine = runs.deciding_machine(flagged, here=here)
    if machine is None:
        return flagged.iloc[0:0], None
    return runs.single_machine(flagged, machine), machine


def _restart_medians(restart_frame) -> tuple[dict[str, float], str | None]:
    """path -> median seconds to the first correct output in the newest recording, and its machine."""
    if restart_frame is None or not len(restart_frame):
        return {}, None
    newest = runs.single_machine(results.latest_run(restart_frame))
    found = {path: float(rows["first_output_s"].median()) for path, rows in newest.groupby("path")
             if rows["same_output"].astype(bool).all()}
    return found, str(newest[runs.MACHINE].iloc[0])


def cpu_worker(cpu_frame, restart_frame, freezing_verdict: dict, *, here: Mapping | str | None = None) -> str:
    """Which CPU variant to serve, from one machine's quiet runs, with what a restart costs (Chapter 7)."""
    rows, machine = _fp32_runs_of_one_machine(cpu_frame, here=here)
    if machine is None:
        return "undecided: no quiet CPU BlurBall run recorded"
    best = runs.choose_best(rows, skip_under_load=True).iloc[0]
    medians = runs.summarize_runs(rows[~rows[runs.UNDER_LOAD]]).set_index("variant")["median"]
    flagged = rows.loc[rows[runs.UNDER_LOAD], "run_id"].nunique()
    text = (f"serve {_label(best.best)}: median {best.best_median:.0f} ms per clip over {best.runs} quiet runs"
            + (f" (eager {medians['eager_fp32']:.0f} ms)" if "eager_fp32" in medians else "")
            + f", ahead of {_label(best.runner_up)} by {best.margin:.2f}x"
            + ("" if best.decided else ", but not ahead in every run, so the two are interchangeable"))
    if best.excluded:
        text += f"; excluded for a failed check: {', '.join(map(_label, best.excluded))}"
        if any("freezing" in v for v in best.excluded):
            text += (" (freezing: the miscompile of Chapter 3, " if freezing_verdict["present"] else
                     " (freezing, although the reproducer says its miscompile is ")
            text += miscompile.verdict_sentence(freezing_verdict) + ")"
    if "ort_exporter_optimized_all" in medians and best.best != "ort_exporter_optimized_all":
        text += f"; ONNX Runtime's median was {medians['ort_exporter_optimized_all']:.0f} ms"
    restarts, restart_machine = _restart_medians(restart_frame)
    costs = [f"{name} {restarts[path]:.1f} s" for name, path in RESTART_NAMES if path in restarts]
    if costs:
        where = "the same machine" if restart_machine == machine else restart_machine
        text += f"; a restart to the first correct output costs ({where}): " + ", ".join(costs)
    text += f". Evidence: FP32 outputs checked against eager, recorded CPU runs on {machine}"
    if flagged:
        text += f" ({flagged} more run{'s' if flagged != 1 else ''} flagged as taken under load, left out)"
    return text


def phones_and_browsers(cpu_frame, *, here: Mapping | str | None = None) -> str:
    """The portable export and what its CPU check does and does not say, on one machine (Chapter 7)."""
    rows, machine = _fp32_runs_of_one_machine(cpu_frame, here=here)
    onnx = rows[rows["variant"] == "ort_exporter_optimized_all"] if machine else rows
    text = "export to ONNX (one portable file)"
    if machine and len(onnx) and onnx["same_output"].fillna(False).astype(bool).all():
        median = runs.summarize_runs(onnx)["median"].iloc[0]
        text += f"; it matched eager in every recorded run on {machine} (median {median:.0f} ms per clip)"
    else:
        text += "; its CPU check is not recorded"
    return text + (". Unchecked: the device's execution provider (NNAPI, Core ML, WebGPU) and any FP16 or INT8 "
                   "conversion on it; verify on the device against eager FP32 before shipping")


def lower_precision_worker(cpu_frame, *, here: Mapping | str | None = None) -> str:
    """Whether to serve a bf16 or INT8 variant on the CPU, from one machine's quiet runs (Chapter 7)."""
    if cpu_frame is None or not len(cpu_frame) or results.SAME_BALL not in cpu_frame.columns:
        return "undecided: no lower-precision run with the decoded-ball check recorded"
    rows = cpu_frame[(cpu_frame["record"] == "variant") & cpu_frame["precision"].isin(LOWER_PRECISIONS)
                     & cpu_frame[results.SAME_BALL].notna()]
    if not len(rows):
        return "undecided: no lower-precision run with the decoded-ball check recorded"
    # every variant of the runs that carry the check: eager FP32 is the reference of the speed-up
    checked = cpu_frame[(cpu_frame["record"] == "variant") & cpu_frame["run_id"].isin(set(rows["run_id"]))]
    flagged = runs.flag_under_load(checked)
    machine = runs.deciding_machine(flagged, here=here)
    if machine is None:
        return "undecided: every lower-precision run with the decoded-ball check was taken under load"
    mine = runs.single_machine(flagged, machine)
    low = mine[mine["variant"].isin(set(rows["variant"])) & mine[results.SAME_BALL].notna()]
    # Chapter 5's one rule: the decoded ball kept, and the FP32 twin correct on the same machine
    passed = decision.check_verdicts(mine)["check_passed"].droplevel(runs.MACHINE)
    low = low.assign(passed=low["variant"].map(passed).fillna(False).astype(bool))
    best = runs.choose_best(low, correct="passed", skip_under_load=True).iloc[0]
    if best.best is None:
        return (f"keep FP32: no bf16 or INT8 variant kept the decoded ball with a correct FP32 twin on {machine}"
                + (f" (moved: {', '.join(map(_label, best.excluded))})" if best.excluded else ""))
    quiet = mine[~mine[runs.UNDER_LOAD]]
    medians = runs.summarize_runs(quiet).set_index("variant")["median"]
    rated = decision.executed_rates(quiet[quiet["variant"] == best.best])
    share = rated["share_of_ceiling"].astype(float).median()
    fp32_share = rated["share_of_fp32_ceiling"].astype(float).median()
    precision = str(rated["precision"].iloc[0])
    text = (f"serve {_label(best.best)} where its rounding is acceptable: median {best.best_median:.0f} ms per clip over "
            f"{best.runs} quiet runs")
    if "eager_fp32" in medians:
        text += f", {medians['eager_fp32'] / best.best_median:.1f}x eager FP32 ({medians['eager_fp32']:.0f} ms)"
    fp32_rows, fp32_machine = _fp32_runs_of_one_machine(cpu_frame, here=machine)
    if fp32_machine == machine:
        fp32 = runs.choose_best(fp32_rows, skip_under_load=True).iloc[0]
        if fp32.best is not None and fp32.best_median <= best.best_median:  # rounding bought nothing here
            return (f"keep FP32: the fastest lower precision that kept the decoded ball, {_label(best.best)} "
                    f"({best.best_median:.0f} ms), is not faster than {_label(fp32.best)} ({fp32.best_median:.0f} ms) on {machine}")
        if fp32.best is not None:
            text += f" and {fp32.best_median / best.best_median:.1f}x the best FP32 variant ({_label(fp32.best)})"
    if share == share:
        text += f"; {100 * share:.0f}% of the machine's {precision} ceiling"
        if fp32_share == fp32_share:
            text += f" ({100 * fp32_share:.0f}% of its FP32 one)"
    elif fp32_share == fp32_share:
        text += f"; {100 * fp32_share:.0f}% of the machine's FP32 ceiling (no {precision} ceiling is known for this CPU)"
    text += ("" if best.decided else f"; not ahead of {_label(best.runner_up)} in every run, so the two are interchangeable")
    if best.excluded:
        text += f"; left out, decoded ball moved: {', '.join(map(_label, best.excluded))}"
    return text + (f". Evidence: the trained checkpoint's decoded ball on held-out clips agreed with eager FP32's in "
                   f"every recorded run on {machine}; its logits differ by design")
