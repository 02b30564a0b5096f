"""The CPU benchmarks' one path: build every version once, check it against eager, time all in the run protocol (Ch. 3-5).
"""
from __future__ import annotations

from typing import Callable, Mapping

import pandas as pd

from graphbook.measure import timing
from graphbook.record.results import EXPECTED_TO_MATCH, RUN, SAME_OUTPUT, SPEEDUP_VS_EAGER
from graphbook.checks import compare_to_reference
from graphbook.method.variants import REFERENCE, VariantUnavailable

#: The columns every row of one run shares (repeated_runs'), given to the rows of a version that was not timed.
_PER_RUN = [RUN, "run_count", "run_started", "went_first", "copy_gbps"]


def build_check_time(builders: Mapping[str, Callable[[], tuple[Callable, dict]]], x, reference, *,
                     columns: Mapping[str, dict] | None = None, check: Callable[[Callable], dict] | None = None,
                     log: Callable[[str], object] = print, **protocol) -> tuple[pd.DataFrame, list[str]]:
    """Build every version once, check it against eager, then time them all in one run protocol (Chapters 3-5)."""
    runs, rows, failed = {}, {}, []
    for name, build in builders.items():
        row = {"_name": name, "variant": name, **(columns or {}).get(name, {})}
        try:
            run, built = build()
        except VariantUnavailable as why:  # a missing package or CPU feature: a row that says why
            rows[name] = {**row, "note": f"skipped: {why}"}
            log(f"{name}: skipped ({why})")
            continue
        checked = {**compare_to_reference(run(x), reference), **(check(run) if check else {})}
        notes = [built.pop("note", ""), checked.pop("note", "")]
        if row.get(EXPECTED_TO_MATCH, True) and not checked[SAME_OUTPUT]:
            notes.append("output differs from eager FP32")
            failed.append(name)
        runs[name], rows[name] = run, {**row, **built, **checked, "note": "; ".join(filter(None, notes))}
        log(f"{name}: built and checked, max|diff| {checked['max_abs_diff']:.2e}"
            + (", DIFFERS from eager FP32" if name in failed else ""))
    timed = pd.DataFrame(_timed(runs, x, log=log, **protocol))
    per_run = timed.drop_duplicates(RUN)[[c for c in _PER_RUN if c in timed]]
    untimed = pd.DataFrame([rows[name] for name in builders if name not in runs])
    frame = pd.concat([timed.rename(columns={"variant": "_name"}).merge(
        pd.DataFrame([rows[name] for name in runs]), on="_name", how="left"),
        per_run.merge(untimed, how="cross") if len(untimed) else None])
    frame["_name"] = frame["_name"].map({name: i for i, name in enumerate(builders)})
    frame = frame.sort_values([RUN, "_name"], kind="stable", ignore_index=True).drop(columns="_name")
    if REFERENCE in set(frame["variant"]) and "median_ms" in frame:
        keys = [RUN] + [c for c in ("threads",) if c in frame]
        eager = frame["median_ms"].where(frame["variant"] == REFERENCE).groupby([frame[k] for k in keys])
        frame[SPEEDUP_VS_EAGER] = eager.transform("max") / frame["median_ms"]
    return frame, failed


def _timed(built: Mapping[str, Callable], x, *, runs: int = 3, warmup: int = 3, repeats: int = 10,
           interleave: bool = False, threads: Mapping[str, int] | None = None, probe_bytes: int | None = 64 * 2**20,
           probes: Callable[[], dict] | None = None, measure: Callable[[str, int], dict] | None = None,
           log=None) -> list[dict]:
    """The run protocol over the built versions: one timing mode (``measure(name, run_index)``, the caller's, replaces
    the timing of a name), the ``copy_`` probe and any ``probes`` per run."""
    calls = {name: (lambda run=run: run(x)) for name, run in built.items()}
    timer = ((lambda order, index: {name: measure(name, index) for name in order}) if measure is not None
             else timing.in_turns(calls, warmup=warmup, repeats=repeats) if interleave
             else timing.one_by_one(calls, warmup=warmup, repeats=repeats, threads=threads))
    copy = timing.copy_probe(probe_bytes) if probe_bytes is not None else None
    probe = (lambda: {**(copy() if copy else {}), **(probes() if probes else {})}) if copy or probes else None
    return timing.repeated_runs(list(calls), timer, runs=runs, probe=probe, log=log)
