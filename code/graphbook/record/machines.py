"""Every machine that has run the book and its recorded matrices side by side (appendix "Machines and runs"): the
reference recording, any recording a reader made beside it, and the runs kept from before the first recording, so a
reader's own sitting adds a machine with no code change. ``results_dir`` reads one folder instead."""
from __future__ import annotations

from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import pandas as pd

from graphbook.record import recording, results, runs


@dataclass(frozen=True)
class Measure:
    """What one kind of result file measures, for a side-by-side view."""

    kind: str
    title: str
    value: str                      # the column compared across machines
    unit: str
    by: tuple[str, ...] = ("variant",)
    where: dict = field(default_factory=dict)   # column -> required value (e.g. the full input size)
    groups: tuple[str, ...] = ()    # the groups shown (first column of ``by``), in order; empty: all
    lower_is_better: bool = True
    run: str = results.RUN_ID


#: The recorded matrices the appendix shows, in the chapters' order.
MEASURES = (
    Measure("ablation", "Inductor ablation (Chapter 3), 96 x 160", "speedup_vs_eager", "x over eager",
            lower_is_better=False),
    Measure("cpu-onnxruntime", "ONNX Runtime levels (Chapter 4), 288 x 512", "median_ms", "ms",
            by=("variant", "threads"), groups=("eager_fp32", "ort_disabled", "ort_basic", "ort_extended",
                                               "ort_layout", "ort_all", "compile_default")),
    Measure("int8-matrix", "INT8 configurations (Chapter 4)", "latency_ms", "ms", by=("config",)),
    Measure("cpu-blurball", "BlurBall CPU matrix (Chapter 5), 288 x 512", "median_ms", "ms",
            where={"record": "variant", "height": 288}),
    Measure("attribution", "Attribution ladder (Chapter 5), 288 x 512", "median_ms", "ms", where={"height": 288}),
    Measure("restart-paths", "Restart paths (Chapter 6)", "first_output_s", "s to the first correct output",
            by=("path",)),
    Measure("serving-load", "Load test (Chapter 7)", "throughput_rps", "requests per second",
            by=("batching", "concurrency"), lower_is_better=False),
)

#: The facts the machines table shows, in order (those a file did not record read "unrecorded").
FACTS = ("cpu_model", "cpu_vendor", "cpu_family", "cpu_model_id", "cpu_stepping", "cpu_microarch", "cpu_ghz",
         "cpu_l2_kib", "cpu_l3_kib", "cpu_isa", "torch_isa", "cpu_cores", "threads", "torch", "onnxruntime")


def measure(kind: str) -> Measure:
    for found in MEASURES:
        if found.kind == kind:
            return found
    raise KeyError(f"no side-by-side measure for kind {kind!r}; known: {[m.kind for m in MEASURES]}")


def _rows(found: Measure, results_dir=None):
    frame = recording.every_run(found.kind) if results_dir is None else results.load(found.kind, results_dir)
    for column, wanted in found.where.items():
        if column in frame.columns:
            frame = frame[frame[column] == wanted]
    if not len(frame) or found.value not in frame.columns:
        return frame.iloc[0:0].assign(**{runs.MACHINE: []})
    return runs.add_machine(frame.dropna(subset=[found.value]))


def machine_facts(results_dir=None):
    """One row per machine configuration: the :data:`FACTS`, first and last date, runs per kind."""
    facts: dict[str, dict] = {}
    for found in MEASURES:
        frame = _rows(found, results_dir)
        for machine, group in frame.groupby(runs.MACHINE, sort=False):
            row = facts.setdefault(machine, {runs.MACHINE: machine, **{f: runs.UNRECORDED for f in FACTS},
                                             "first": None, "last": None})
            first = group.iloc[0]
            for fact in FACTS:
                if row[fact] == runs.UNRECORDED and fact in group.columns and not runs._blank(first.get(fact)):
                    row[fact] = runs._field(first[fact])
            dates = sorted(str(d)[:10] for d in group.get("date", pd.Series(dtype=str)).dropna())
            if dates:
                row["first"] = min(filter(None, [row["first"], dates[0]]))
                row["last"] = max(filter(None, [row["last"], dates[-1]]))
            row[found.kind] = int(group[found.run].nunique())
    table = pd.DataFrame(list(facts.values()))
    table = table.assign(**{m.kind: table.get(m.kind, 0) for m in MEASURES})  # a kind no machine recorded: 0 runs
    return table.fillna({m.kind: 0 for m in MEASURES}).astype({m.kind: int for m in MEASURES})


def _side_by_side(kind: str, results_dir=None):
    """Per machine and group: the median over quiet runs, and every run's value and load flag. A machine whose runs were
    all flagged keeps its rows with ``median`` NaN: the appendix shows such runs, it does not decide on them."""
    found = measure(kind)
    frame = _rows(found, results_dir)
    columns = [runs.MACHINE, *found.by, "median", "quiet_runs", "flagged_runs", "values", "flags"]
    if not len(frame):
        return pd.DataFrame(columns=columns)
    if found.value == "median_ms" and {"variant"} <= set(frame.columns):
        frame = runs.flag_under_load(frame, run=found.run)
    else:  # a number that is not a time per call: the probe and the steadiness tests still apply
        frame = runs.flag_under_load(frame, value=found.value, variant=found.by[0], run=found.run)
        if not found.lower_is_better:  # "slower than the fastest run" means a *lower* throughput here
            frame[runs.UNDER_LOAD] = False
            frame[runs.LOAD_REASON] = ""
    rows = []
    for keys, group in frame.groupby([runs.MACHINE, *found.by], sort=False, dropna=False):  # keys: always a tuple
        if found.groups and keys[1] not in found.groups:
            continue
        per_run = group.groupby(found.run, sort=False).agg(value=(found.value, "median"),
                                                           flagged=(runs.UNDER_LOAD, "first"))
        quiet = per_run[~per_run.flagged.astype(bool)]["value"]
        rows.append({runs.MACHINE: keys[0], **dict(zip(found.by, keys[1:])),
                     "median": float(quiet.median()) if len(quiet) else float("nan"),
                     "quiet_runs": len(quiet), "flagged_runs": int(per_run.flagged.astype(bool).sum()),
                     "values": [float(v) for v in per_run["value"]], "flags": [bool(f) for f in per_run.flagged]})
    out = pd.DataFrame(rows, columns=columns)
    if found.groups:
        order = {g: i for i, g in enumerate(found.groups)}
        out = out.sort_values(found.by[0], key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
    return out


def plot_side_by_side(kind: str, results_dir=None, ax=None, *, where: dict | None = None):
    """Bars per machine, a dot per quiet run and a cross per flagged one; None when nothing is recorded."""
    found, table = measure(kind), _side_by_side(kind, results_dir)
    for column, wanted in (where or {}).items():
        table = table[table[column] == wanted]
    if not len(table):
        return None
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.35 * len(table) + 1.5))
    label_of = lambda row: " / ".join(str(row[c]) for c in found.by if c not in (where or {}))
    groups = list(dict.fromkeys(label_of(r) for _, r in table.iterrows()))
    machines = list(dict.fromkeys(table[runs.MACHINE]))
    height = 0.8 / len(machines)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for m_index, machine in enumerate(machines):
        mine = table[table[runs.MACHINE] == machine]
        for _, row in mine.iterrows():
            y = groups.index(label_of(row)) + m_index * height
            ax.barh(y, 0 if row["median"] != row["median"] else row["median"], height * 0.9,
                    color=colors[m_index % len(colors)], label=machine if _ == mine.index[0] else None)
            for value, flagged in zip(row["values"], row["flags"]):
                ax.plot(value, y, "x" if flagged else "o", color="tab:red" if flagged else "black", markersize=4)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(groups))], groups)
    ax.invert_yaxis()
    ax.set_xlabel(found.unit + (" (lower is better)" if found.lower_is_better else " (higher is better)"))
    ax.set_title(found.title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return ax


def files_shown() -> list[str]:
    return sorted({name for found in MEASURES for name in recording.every_file(found.kind)})
