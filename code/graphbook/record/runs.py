"""Decisions across recorded runs. One run on a shared CPU can rank two variants either way (ONNX Runtime over
eager was 2.53x, 0.99x and 3.01x on one machine), so chapters decide on the median of at least three runs per
machine, and flag runs taken under load instead of deleting them."""
from __future__ import annotations

import statistics
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from graphbook.measure.environment import fingerprint
from graphbook.record import verdict

#: What identifies a machine configuration: the CPU's name *and* identity (vendor family and model: one name
#: covers CPUs whose speed differs by 2x), its instruction set, PyTorch's, any cap, and the threads used.
MACHINE_COLUMNS = ("cpu_model", "cpu_family", "cpu_model_id", "cpu_microarch", "cpu_isa", "torch_isa", "isa_caps",
                   "threads")
MACHINE = "machine"            #: the column added by :func:`add_machine`: one label per fingerprint
UNDER_LOAD = "under_load"      #: bool column added by :func:`flag_under_load`
LOAD_REASON = "load_reason"    #: why a run was flagged ("" when it was not)
UNRECORDED = "unrecorded"      #: a fingerprint field an older file did not record
MIN_RUNS = 3                   #: the book decides on no fewer recorded runs than this


def count(n: int, noun: str) -> str:
    """``count(1, "run")`` is "one run", ``count(3, "run")`` "3 runs": no "run(s)" on the page."""
    return f"one {noun}" if n == 1 else f"{n} {noun}s"


def _blank(value) -> bool:
    try:
        return value is None or (not isinstance(value, str) and pd.isna(value)) or str(value).strip() == ""
    except (TypeError, ValueError):
        return value is None


def _field(value) -> str:
    if _blank(value):
        return UNRECORDED
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def machine_label(fingerprint: Mapping, columns: Sequence[str] = MACHINE_COLUMNS) -> str:
    """A readable label of one machine configuration; a file recorded before the CPU's identity reads "CPU identity
    unrecorded", so its runs never merge with a newer machine's of the same name."""
    values = {c: _field(fingerprint.get(c)) for c in columns}
    model = values.pop("cpu_model", UNRECORDED)
    parts = []
    if "cpu_family" in values or "cpu_model_id" in values:
        family, model_id = values.pop("cpu_family", UNRECORDED), values.pop("cpu_model_id", UNRECORDED)
        arch = values.pop("cpu_microarch", UNRECORDED)
        if family == UNRECORDED and model_id == UNRECORDED:
            parts.append("CPU identity unrecorded")
        else:
            parts.append((f"{arch}, " if arch not in (UNRECORDED, "unknown") else "") + f"family {family} model {model_id}")
    if "cpu_isa" in values:
        isa = values.pop("cpu_isa")
        parts.append("ISA unrecorded" if isa == UNRECORDED else isa)
    # an unrecorded torch ISA or cap is left out: "" (nothing capped) and older files read the same, no cap
    for key, prefix in (("torch_isa", "torch"), ("isa_caps", "capped")):
        if values.get(key, UNRECORDED) != UNRECORDED:
            parts.append(f"{prefix} {values[key]}")
        values.pop(key, None)
    if "threads" in values:
        threads = values.pop("threads")
        parts.append(f"{threads} thread{'s' if threads != '1' else ''}")
    parts += [f"{k}={v}" for k, v in values.items()]
    return f"{model} ({', '.join(parts)})" if parts else model


def add_machine(frame, columns: Sequence[str] = MACHINE_COLUMNS):
    """A copy of ``frame`` with a ``machine`` column (an unrecorded fingerprint field makes a group of its own)."""
    out = frame.copy()
    present = [c for c in columns if c in out.columns]
    records = out[present].to_dict("records") if present else [{} for _ in range(len(out))]
    out[MACHINE] = [machine_label(row, columns) for row in records]
    return out


def _here_label(here: Mapping | str | None) -> str:
    """The machine label of ``here``: a label, a fingerprint, or None for this machine."""
    return here if isinstance(here, str) else machine_label(fingerprint() if here is None else here)


class MixedMachines(ValueError):
    """A number was asked of runs from more than one machine."""


def single_machine(frame, machine: str | None = None):
    """The rows of one machine: the only door to a number a chapter states. Raises :class:`MixedMachines` when the frame
    holds several and none was named: a median over two CPUs describes neither."""
    data = add_machine(frame) if MACHINE not in frame.columns else frame
    present = list(dict.fromkeys(data[MACHINE]))
    if machine is None:
        if len(present) > 1:
            raise MixedMachines(f"the rows come from {len(present)} machines ({'; '.join(present)}): "
                                "name the one to quote")
        return data
    if machine not in present:
        raise ValueError(f"no rows of machine {machine!r}; the frame has {present}")
    return data[data[MACHINE] == machine]


def summarize_runs(frame, by: Sequence[str] | str = ("variant",), value: str = "median_ms", *,
                   run: str = "run_id"):
    """Per machine and ``by`` group: runs, median, min, max, spread, per-run values and ``enough_runs``."""
    by = [by] if isinstance(by, str) else list(by)
    framed = frame if MACHINE in frame.columns else add_machine(frame)
    # one value per (machine, *by, run): the median of that run's rows
    per_run = framed.dropna(subset=[value]).groupby([MACHINE, *by, run], dropna=False, sort=False)[value] \
        .median().reset_index()
    table = per_run.groupby([MACHINE, *by], dropna=False, sort=False)[value].agg(
        runs="size", median="median", min="min", max="max", values=list).reset_index()
    table["spread"] = (table["max"] - table["min"]) / table["median"].where(table["median"] != 0)
    table["enough_runs"] = table["runs"] >= MIN_RUNS
    return table[[MACHINE, *by, "runs", "median", "min", "max", "spread", "values", "enough_runs"]]


def flag_under_load(frame, *, value: str = "median_ms", variant: str = "variant", run: str = "run_id",
                    max_relative_iqr: float = 0.5, slow_factor: float = 2.0, reference: str | None = None,
                    reference_factor: float = 1.5, probe: str = "copy_gbps", probe_factor: float = 1.5,
                    probe_slowdown: float = 1.1):
    """Add ``under_load`` and ``load_reason``, judged from the runs' own data (unsteady calls, slow against the
    machine's best, an unsteady reference, a low bandwidth probe the times confirm); nothing is removed."""
    out = add_machine(frame) if MACHINE not in frame.columns else frame.copy()
    reasons: dict = {}
    run_slowdown: dict = {}  # run -> median over its variants of (its value / the machine's fastest run's)

    def flag(run_id, why):
        reasons.setdefault(run_id, []).append(why)

    if {"q1_ms", "q3_ms", "median_ms"} <= set(out.columns):
        rel = (out["q3_ms"] - out["q1_ms"]) / out["median_ms"]
        for run_id, values in rel.groupby(out[run], sort=False):
            values = values.dropna()
            if len(values) and float(values.median()) > max_relative_iqr:
                flag(run_id, f"unsteady calls (interquartile range {float(values.median()):.0%} of the median)")
    if {value, variant} <= set(out.columns):
        per_run = out.groupby([MACHINE, variant, run], sort=False)[value].median().dropna().reset_index()
        fastest = per_run.groupby([MACHINE, variant])[value].transform("min")
        per_run["slowdown"] = per_run[value] / fastest
        counts = per_run.groupby([MACHINE, variant])[run].transform("nunique")
        compared = per_run[counts > 1]
        for run_id, slowdowns in compared.groupby(run, sort=False)["slowdown"]:
            run_slowdown[run_id] = float(slowdowns.median())
            if float(slowdowns.median()) > slow_factor:
                flag(run_id, f"{float(slowdowns.median()):.1f}x slower than the fastest run of this machine "
                             "(median over its variants)")
    if reference and reference in out.columns:
        for run_id, values in out.groupby(run, sort=False)[reference]:
            values = values.dropna()
            if len(values) > 1 and values.min() > 0 and values.max() / values.min() > reference_factor:
                flag(run_id, f"{reference} varied {values.max() / values.min():.1f}x within the run")
    if probe in out.columns:
        per_run_probe = out.groupby([MACHINE, run], sort=False)[probe].median().dropna()
        for (machine, run_id), bandwidth in per_run_probe.items():
            others = [v for (m, r), v in per_run_probe.items() if m == machine and r != run_id]
            slower = run_slowdown.get(run_id)
            if others and bandwidth < statistics.median(others) / probe_factor and (
                    slower is None or slower > probe_slowdown):
                flag(run_id, f"copy bandwidth {bandwidth:.1f} GB/s against {statistics.median(others):.1f} GB/s "
                             "in the other runs of this machine"
                             + (f", and its times {slower:.2f}x the fastest run's" if slower is not None else ""))
    out[UNDER_LOAD] = out[run].map(lambda r: r in reasons)
    out[LOAD_REASON] = out[run].map(lambda r: "; ".join(reasons.get(r, [])))
    return out


def deciding_machine(frame, *, here: Mapping | str | None = None, run: str = "run_id") -> str | None:
    """The machine a figure is quoted from: ``here`` with :data:`MIN_RUNS` quiet runs, else the one with the most
    quiet runs; None when no run is quiet. (A page's recorded frames hold one machine: the reference recording's.)"""
    label = _here_label(here)
    data = add_machine(frame) if MACHINE not in frame.columns else frame
    quiet = data[~data[UNDER_LOAD].astype(bool)] if UNDER_LOAD in data.columns else data
    if quiet.empty:
        return None
    counts = quiet.groupby(MACHINE, sort=False)[run].nunique()
    if counts.get(label, 0) >= MIN_RUNS:
        return label
    return str(counts.idxmax())


def choose_best(frame, *, value: str = "median_ms", variant: str = "variant", correct: str = "same_output",
                run: str = "run_id", lower_is_better: bool = True, candidates: Iterable[str] | None = None,
                skip_under_load: bool = False):
    """The best variant per machine among those whose every row passed ``correct`` (a missing verdict fails), and
    the runner-up: the next fastest of those timed in every run of the best (a comparison needs the same runs).
    ``margin`` > 1 means the best is ahead. Whether it is ahead is the book's rule (:mod:`graphbook.record.verdict`)
    on the pair's per-run log ratios, with the noise pooled over the screen's variants timed in every run:
    ``outcome``, ``lead`` with its interval, ``detectable_lead``; ``decided`` is an outcome of *faster*."""
    data = add_machine(frame) if MACHINE not in frame.columns else frame.copy()
    if candidates is not None:
        data = data[data[variant].isin(list(candidates))]
    rows = []
    for machine, checked in data.groupby(MACHINE, sort=False):
        flags = {name: [v for v in values if not _blank(v)]
                 for name, values in checked.groupby(variant, sort=False)[correct]}
        verdicts = {name: bool(f) and all(bool(v) and str(v) != "False" for v in f) for name, f in flags.items()}
        passing = [v for v, ok in verdicts.items() if ok]
        excluded = sorted(v for v, ok in verdicts.items() if not ok)
        # a check holds whatever the load; only the times of a run under load are left out (all of them: no best)
        group = (checked[~checked[UNDER_LOAD].astype(bool)] if skip_under_load and UNDER_LOAD in checked.columns
                 else checked)
        summary = summarize_runs(group[group[variant].isin(passing)], by=variant, value=value, run=run)
        summary = summary.sort_values("median", ascending=lower_is_better).reset_index(drop=True)
        row = {MACHINE: machine, "best": None, "best_median": float("nan"), "runs": 0, "runner_up": None,
               "runner_up_median": float("nan"), "margin": float("nan"), "won_runs": 0, "decided": False,
               "excluded": excluded, **UNCOMPARED}
        if len(summary):
            best = summary.iloc[0]
            row.update(best=best[variant], best_median=float(best["median"]), runs=int(best["runs"]))
            best_runs = set(group.loc[group[variant] == best[variant], run])
            sharing = [name for name, ran in group.groupby(variant, sort=False)[run] if best_runs <= set(ran)]
            summary = pd.concat([summary.iloc[:1], summary.iloc[1:][summary.iloc[1:][variant].isin(sharing)]])
        if len(summary) > 1:
            second = summary.iloc[1]
            pivot = group.pivot_table(index=run, columns=variant, values=value, aggfunc="median")
            pivot = pivot[[row["best"], second[variant]]].dropna()
            ahead = (pivot.iloc[:, 0] < pivot.iloc[:, 1]) if lower_is_better else (pivot.iloc[:, 0] > pivot.iloc[:, 1])
            margin = (second["median"] / best["median"]) if lower_is_better else (best["median"] / second["median"])
            screen = np.log(group[group[variant].isin(passing)].pivot_table(  # the pair's runs, every variant in all
                index=run, columns=variant, values=value, aggfunc="median").loc[pivot.index]).dropna(axis=1)
            ratios = np.log(pivot.iloc[:, 1] / pivot.iloc[:, 0]) * (1 if lower_is_better else -1)
            compared = _compared(ratios, verdict.pooled_noise(screen))
            row.update(runner_up=second[variant], runner_up_median=float(second["median"]), margin=float(margin),
                       won_runs=int(ahead.sum()), **compared, decided=compared["outcome"] == verdict.FASTER)
        rows.append(row)
    return pd.DataFrame(rows, columns=[MACHINE, "best", "best_median", "runs", "runner_up", "runner_up_median",
                                       "margin", "won_runs", "decided", "excluded", *UNCOMPARED])


#: A verdict's rule columns where there was nothing to compare.
UNCOMPARED = {"outcome": verdict.CANT_TELL, "lead": float("nan"), "lead_low": float("nan"),
              "lead_high": float("nan"), "detectable_lead": float("nan"), "noise_from": "no comparison"}


def _compared(ratios, screen_noise) -> dict:
    """The rule on one pair's per-run log ratios: with the screen's pooled noise where it has one, else the pair's
    own spread; fewer than :data:`MIN_RUNS` runs, the book's protocol, compare nothing."""
    if len(ratios) < MIN_RUNS:
        return {**UNCOMPARED, "noise_from": f"fewer than {MIN_RUNS} runs"}
    if screen_noise is not None:
        found, source = verdict.compare(ratios, noise=screen_noise[0], noise_df=screen_noise[1]), "the screen"
    else:
        found, source = verdict.compare(ratios), "the pair"
    return {"outcome": found.outcome, "lead": found.lead, "lead_low": found.lead_low, "lead_high": found.lead_high,
            "detectable_lead": found.detectable_lead, "noise_from": source}


def _times(ratio: float) -> str:
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:.0f}x"


def paired_ratios(frame, a: str, b: str, *, value: str = "median_ms", variant: str = "variant",
                  run: str = "run_id", lower_is_better: bool = True):
    """{machine: per-run ratios of how many times better ``a`` was than ``b``}, from runs that measured both."""
    data = add_machine(frame) if MACHINE not in frame.columns else frame
    found = {}
    for machine, group in data.groupby(MACHINE, sort=False):
        pivot = group.pivot_table(index=run, columns=variant, values=value, aggfunc="median")
        if a not in pivot.columns or b not in pivot.columns:
            continue
        pair = pivot[[a, b]].dropna()
        ratios = (pair[b] / pair[a]) if lower_is_better else (pair[a] / pair[b])
        if len(ratios):
            found[machine] = [float(r) for r in ratios]
    return found


def _describe(ratios: Sequence[float], a: str, b: str) -> str:
    middle = statistics.median(ratios)
    n = len(ratios)
    low, high = _times(min(ratios)), _times(max(ratios))
    span = ("a single run" if n == 1 else f"{low} in every run" if low == high else f"per-run {low} to {high}")
    wins = sum(r > 1 for r in ratios)
    if n > 1 and 0 < wins < n:
        return (f"{a} and {b} traded places ({a} ahead in {wins} of {n} runs, {span}; "
                f"median {_times(middle)}), so no ranking holds there")
    if middle >= 1:
        verdict = f"{a} was {_times(middle)} faster than {b}"
    else:
        verdict = f"{a} was {_times(1 / middle)} slower than {b}"
    runs = f"median of {n} runs, {span}" if n > 1 else span
    caution = "" if n >= MIN_RUNS else f"; fewer than {MIN_RUNS} runs, not enough to decide"
    return f"{verdict} ({runs}{caution})"


def phrase_comparison(frame, a: str, b: str, *, here: Mapping | str | None = None, value: str = "median_ms",
                      variant: str = "variant", run: str = "run_id", lower_is_better: bool = True) -> str:
    """A sentence from the data comparing ``a`` with ``b`` here and elsewhere; runs that disagree rank nothing."""
    label = _here_label(here)
    data = add_machine(frame) if MACHINE not in frame.columns else frame
    ratios = paired_ratios(data, a, b, value=value, variant=variant, run=run, lower_is_better=lower_is_better)

    def load_note(machine: str) -> str:
        if UNDER_LOAD not in data.columns:
            return ""
        mine = data[(data[MACHINE] == machine) & data[variant].isin([a, b])]
        flagged = mine.loc[mine[UNDER_LOAD].astype(bool), run].nunique()
        total = mine[run].nunique()
        return f" {flagged} of these {total} runs were flagged as taken under load." if flagged else ""

    parts = []
    if label in ratios:
        parts.append(f"On this machine ({label}) {_describe(ratios[label], a, b)}.{load_note(label)}")
    else:
        parts.append(f"No run on this machine ({label}) measured both {a} and {b} yet.")
    others = [(m, r) for m, r in ratios.items() if m != label]
    for machine, values in others:
        parts.append(f"The recorded runs on {machine} found: {_describe(values, a, b)}.{load_note(machine)}")
    if not others:
        parts.append("No other machine's runs are recorded for this comparison.")
    return " ".join(parts)
