"""The your-model report (Chapter 8): tables and two figures, written from the rows of one results file, so that a
recorded file gives the same page as the run that wrote it."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure   # no pyplot: the command needs no window, a notebook keeps its backend

from graphbook.method import decision
from graphbook.record import runs
from graphbook.teach import attribution
from graphbook.yourmodel.run import CAUSES, LADDER, QUICK_LADDER, SAME_TASK, TASK_SAMPLES

#: The fingerprint's columns, on every row: the report names the machine once and leaves them out of the tables.
_FINGERPRINT = {"run_id", "source_file", "date", "git_commit", "python", "torch", "onnxruntime", "platform",
                "threads", "run", "run_count", "run_started", "went_first", "copy_gbps", "torch_isa", "isa_caps",
                "machine", "model", "check", "quick", "inputs", "batch", "check_samples"}


def records(rows: pd.DataFrame, record: str) -> pd.DataFrame:
    """The rows of one ``record`` type, without the columns blank in all of them or the fingerprint's."""
    found = rows[rows["record"] == record].dropna(axis=1, how="all").reset_index(drop=True)
    return found[[c for c in found.columns if c not in _FINGERPRINT and not c.startswith(("cpu_", "gpu"))]]


def variant_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per variant: median over runs, speed-up, cold compile, its check's verdict and why it failed."""
    variant_rows = runs.add_machine(rows[rows["record"] == "variant"])
    timed = variant_rows[variant_rows["median_ms"].notna()]
    table = variant_rows.drop_duplicates("variant")[["variant", "precision", "family", "note"]].set_index("variant")
    if len(timed):
        summary = runs.summarize_runs(timed).set_index("variant")
        speedups = runs.summarize_runs(timed, value="speedup_vs_eager").set_index("variant")
        verdicts = decision.check_verdicts(timed, task=SAME_TASK, samples=TASK_SAMPLES).reset_index(level=0,
                                                                                                    drop=True)
        table = table.join(summary[["median", "min", "max"]].rename(columns=lambda c: f"{c}_ms")).join(
            speedups["median"].rename("speedup")).join(timed.groupby("variant")["compile_s"].max()).join(
            verdicts[["check_passed", "failed_check"]])
    return table.reset_index()


def ladder(rows: pd.DataFrame):
    """``(steps, summary)`` of the cause ladder over the timed rungs (:func:`graphbook.teach.attribution.ladder`)."""
    timed = rows[rows["record"] == "variant"].dropna(subset=["median_ms"])
    order = LADDER if "compile_freezing_max_autotune" in set(timed["variant"]) else QUICK_LADDER
    rungs = [name for name in order if name in set(timed["variant"])]
    return attribution.ladder(timed, rungs=rungs, causes=CAUSES)


def _figure_paths(table: pd.DataFrame, path: Path) -> Path:
    timed = table.dropna(subset=["speedup"]).sort_values("speedup")
    fig = Figure(figsize=(8, 0.3 * len(timed) + 1), layout="tight")
    ax = fig.subplots()
    colors = ["tab:green" if ok else "tab:red" for ok in timed["check_passed"]]
    ax.barh(timed["variant"], timed["speedup"], color=colors)
    ax.axvline(1, color="grey", lw=0.8)
    ax.set_xlabel("speed-up over eager FP32 (median of runs); red: failed its check")
    fig.savefig(path, dpi=110)
    return path


def _markdown(frame: pd.DataFrame) -> str:
    return frame.astype(object).fillna("").to_markdown(index=False, floatfmt=".3g") if len(frame) else "(none)"


def write_report(rows: pd.DataFrame, folder: str | Path, *, title: str, command: str) -> Path:
    """``report.md`` with its figures in ``folder`` (created; a new folder per results file)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=False)
    first = rows.iloc[0]
    table = variant_table(rows)
    parts = [f"# {title}", "", f"`{command}`", "",
             f"Recorded {first.get('date', '')} on {runs.machine_label(first.to_dict())}, torch {first.get('torch', '')}.",
             ""]
    folds = records(rows, "fold")
    left = folds[~folds["folded"].astype(bool)] if len(folds) else folds
    for heading, record in (("Steps", "step"), ("Capture", "capture"),
                            ("Inductor's kernels against the predicted groups", "kernels"),
                            ("Groups Inductor split", "split group"), ("Planted fault", "fault"),
                            ("Bisection", "bisect"), ("Verdict", "verdict")):
        found = records(rows, record).drop(columns=["record", "recipe"], errors="ignore")
        parts += ["", f"## {heading}", "", _markdown(found)]
        if record == "capture":
            parts += ["", "## BatchNorm fold inventory", "", f"{len(folds) - len(left)} of {len(folds)} BatchNorm "
                      "calls fold into the convolution before them; those left, with the reason:", "",
                      _markdown(left.drop(columns=["record", "conv", "folded"], errors="ignore"))]
    if table.get("speedup") is not None and table["speedup"].notna().any():
        parts += ["", "## Every variant", "", f"![paths]({_figure_paths(table, folder / 'paths.png').name})", "",
                  _markdown(table)]
        try:
            steps, summary = ladder(rows)
            fig = Figure(figsize=(8, 4), layout="tight")
            attribution.draw_ladder(steps, summary, ax=fig.subplots(),
                                    title="Where the speed-up comes from, rung by rung")
            fig.savefig(folder / "ladder.png", dpi=110)
            parts += ["", "## The cause ladder", "", "![ladder](ladder.png)", "",
                      _markdown(pd.DataFrame([vars(step) for step in steps])), "",
                      _markdown(pd.DataFrame([summary]).drop(columns="machine"))]
        except ValueError as why:   # a rung missing from every run: the table above says which
            parts += ["", "## The cause ladder", "", f"Not drawn: {why}"]
    for verdict in records(rows, "verdict").itertuples():
        if isinstance(getattr(verdict, "recipe", None), str):
            parts += ["", f"## Recipe: {verdict.precision}, {verdict.best}", "", "```python", verdict.recipe.rstrip(),
                      "```"]
    path = folder / "report.md"
    path.write_text("\n".join(parts) + "\n")
    return path
