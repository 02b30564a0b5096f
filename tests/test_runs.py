"""Tests of graphbook.record.runs (decisions across recorded runs) and timing.live_runs, on synthetic
frames: two machines, three runs each, one variant that fails its check, one run under load."""

import pandas as pd
import pytest

from graphbook.measure import timing
from graphbook.record import runs as R

LAPTOP = {"cpu_model": "AMD EPYC 7B12", "cpu_family": 23, "cpu_model_id": 49, "cpu_microarch": "Zen / Zen 2",
          "cpu_isa": "avx2", "torch_isa": "AVX2", "threads": 2}
XEON = {"cpu_model": "Intel(R) Xeon(R) Processor", "threads": 2}  # an older file: no identity, no ISA columns
LAPTOP_LABEL = "AMD EPYC 7B12 (Zen / Zen 2, family 23 model 49, avx2, torch AVX2, 2 threads)"
XEON_LABEL = "Intel(R) Xeon(R) Processor (CPU identity unrecorded, ISA unrecorded, 2 threads)"


def _rows(machine, run_id, times, same=None, q=None, **extra):
    same = same or {}
    rows = []
    for variant, ms in times.items():
        low, high = (q or {}).get(variant, (ms * 0.98, ms * 1.02))
        rows.append({"run_id": run_id, "variant": variant, "median_ms": ms, "q1_ms": low, "q3_ms": high,
                     "same_output": same.get(variant, True), **machine, **extra})
    return rows


def frame():
    rows = []
    rows += _rows(LAPTOP, "l1", {"eager": 100.0, "ort": 50.0, "bf16_frozen": 10.0}, same={"bf16_frozen": False})
    rows += _rows(LAPTOP, "l2", {"eager": 110.0, "ort": 60.0, "bf16_frozen": 11.0}, same={"bf16_frozen": False})
    rows += _rows(LAPTOP, "l3", {"eager": 105.0, "ort": 55.0, "bf16_frozen": 12.0}, same={"bf16_frozen": False})
    xeon = [dict(r, cpu_isa=float("nan"), torch_isa=float("nan"))
            for r in _rows(XEON, "x1", {"eager": 100.0, "ort": 40.0})
            + _rows(XEON, "x2", {"eager": 100.0, "ort": 101.0})
            + _rows(XEON, "x3", {"eager": 100.0, "ort": 33.0})]
    return pd.DataFrame(rows + xeon)


def test_machine_labels_keep_two_cpus_of_one_name_an_old_file_and_a_capped_run_apart():
    zen4 = {"cpu_model": "AMD EPYC", "cpu_family": 25, "cpu_model_id": 17, "cpu_microarch": "Zen 4",
            "cpu_isa": "avx512_vnni", "torch_isa": "AVX512", "threads": 2}
    zen5 = dict(zen4, cpu_family=26, cpu_model_id=2, cpu_microarch="Zen 5")
    old = {k: v for k, v in zen4.items() if not k.startswith(("cpu_family", "cpu_model_id", "cpu_microarch"))}
    labels = [R.machine_label(m) for m in (zen4, zen5, old)]
    assert len(set(labels)) == 3
    assert labels[0] == "AMD EPYC (Zen 4, family 25 model 17, avx512_vnni, torch AVX512, 2 threads)"
    assert "CPU identity unrecorded" in labels[2]
    rows = _rows(zen4, "a1", {"eager": 900.0}) + _rows(zen5, "b1", {"eager": 500.0}) + _rows(old, "c1", {"eager": 530.0})
    summary = R.summarize_runs(pd.DataFrame(rows))
    assert sorted(summary["median"]) == [500.0, 530.0, 900.0]  # three machines, nothing pooled
    assert set(R.add_machine(frame())[R.MACHINE]) == {LAPTOP_LABEL, XEON_LABEL}
    assert R.machine_label({"cpu_model": "Apple M2", "cpu_isa": "neon+dotprod+i8mm", "threads": 1.0}) == \
        "Apple M2 (CPU identity unrecorded, neon+dotprod+i8mm, 1 thread)"
    capped = dict(LAPTOP, isa_caps="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2")  # another configuration
    assert R.machine_label(capped) == LAPTOP_LABEL.replace(
        ", 2 threads", ", capped ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2, 2 threads")
    assert R.machine_label(dict(LAPTOP, isa_caps="")) == R.machine_label(LAPTOP)


def test_summarize_runs_gives_one_value_per_run_median_and_spread_per_machine_and_counts_too_few_runs():
    summary = R.summarize_runs(frame(), by="variant", value="median_ms")
    laptop_ort = summary[(summary[R.MACHINE].str.startswith("AMD")) & (summary["variant"] == "ort")].iloc[0]
    assert laptop_ort["runs"] == 3 and laptop_ort["median"] == 55.0
    assert (laptop_ort["min"], laptop_ort["max"]) == (50.0, 60.0)
    assert laptop_ort["spread"] == pytest.approx(10 / 55)
    assert laptop_ort["values"] == [50.0, 60.0, 55.0] and laptop_ort["enough_runs"]
    assert len(summary) == 5  # 3 variants on the laptop, 2 on the Xeon: never pooled
    data = pd.DataFrame(_rows(LAPTOP, "l1", {"eager": 100.0}) + _rows(LAPTOP, "l1", {"eager": 120.0}))
    summary = R.summarize_runs(data)
    assert summary.loc[0, "runs"] == 1 and summary.loc[0, "median"] == 110.0
    assert not summary.loc[0, "enough_runs"] and summary.loc[0, "spread"] == 0.0


def test_choose_best_among_correct_variants_and_deciding_machine_prefers_the_reference_then_here():
    best = R.choose_best(frame()).set_index(R.MACHINE)
    laptop = best.loc[LAPTOP_LABEL]
    assert laptop["best"] == "ort" and laptop["excluded"] == ["bf16_frozen"]  # fastest, but wrong output
    assert laptop["runner_up"] == "eager" and laptop["margin"] == pytest.approx(105 / 55)
    assert laptop["won_runs"] == 3 and laptop["decided"]
    xeon = best.loc[XEON_LABEL]
    assert xeon["best"] == "ort" and xeon["won_runs"] == 2 and not xeon["decided"]  # lost run x2
    speedups = frame().assign(speedup=lambda f: 1000.0 / f["median_ms"])  # higher is better: still ort
    laptop = R.choose_best(speedups, value="speedup", lower_is_better=False).set_index(R.MACHINE).loc[LAPTOP_LABEL]
    assert laptop["best"] == "ort" and laptop["margin"] > 1 and laptop["decided"]
    data = frame()  # a missing verdict is no pass
    data["same_output"] = data["same_output"].astype(object)
    data.loc[data["variant"] == "ort", "same_output"] = None
    best = R.choose_best(data).set_index(R.MACHINE)
    assert "ort" in best.loc[LAPTOP_LABEL, "excluded"]
    assert best.loc[LAPTOP_LABEL, "best"] == "eager"
    data = R.flag_under_load(frame())   # laptop: 3 quiet runs; Xeon: x2 is flagged, 2 quiet runs
    laptop, xeon = LAPTOP_LABEL, XEON_LABEL
    assert data[data.run_id == "x2"][R.UNDER_LOAD].all() and not data[data.run_id != "x2"][R.UNDER_LOAD].any()
    assert R.deciding_machine(data, here=laptop) == laptop
    assert R.deciding_machine(data, here=LAPTOP) == laptop            # a fingerprint works too
    assert R.deciding_machine(data, here=xeon) == laptop              # the Xeon has only 2 quiet runs
    assert R.deciding_machine(data, here="a reader's laptop") == laptop
    one_laptop_run = data[~data.run_id.isin(["l2", "l3"])]
    assert R.deciding_machine(one_laptop_run, here=laptop) == xeon    # 1 quiet run here, 2 there
    assert R.deciding_machine(data.assign(**{R.UNDER_LOAD: True}), here=laptop) is None


def test_flag_under_load_from_spread_probe_slowness_and_a_wandering_reference():
    rows = (_rows(LAPTOP, "l1", {"eager": 100.0}, copy_gbps=20.0)
            + _rows(LAPTOP, "l2", {"eager": 180.0}, q={"eager": (100.0, 240.0)}, copy_gbps=19.0)
            + _rows(LAPTOP, "l3", {"eager": 130.0}, copy_gbps=9.0)
            + _rows(LAPTOP, "l4", {"eager": 101.0}, copy_gbps=21.0)
            + _rows(LAPTOP, "l5", {"eager": 102.0}, copy_gbps=8.0))   # low probe, but its times are normal
    flagged = R.flag_under_load(pd.DataFrame(rows))
    by_run = flagged.groupby("run_id")[R.UNDER_LOAD].first().to_dict()
    assert by_run == {"l1": False, "l2": True, "l3": True, "l4": False, "l5": False}
    reasons = flagged.groupby("run_id")[R.LOAD_REASON].first()
    assert "unsteady" in reasons["l2"] and "copy bandwidth 9.0 GB/s" in reasons["l3"] and reasons["l1"] == ""
    assert "1.30x the fastest run's" in reasons["l3"]
    assert len(flagged) == len(rows)  # flagged, never dropped
    kept = R.choose_best(flagged.assign(variant="eager"), skip_under_load=True)
    assert kept.loc[0, "runs"] == 3
    # with nothing to compare the times against (one run of one variant each), the probe decides alone
    alone = R.flag_under_load(pd.DataFrame(_rows(LAPTOP, "a", {"eager": 100.0}, copy_gbps=20.0)
                                           + _rows(LAPTOP, "b", {"other": 100.0}, copy_gbps=5.0)))
    assert alone.groupby("run_id")[R.UNDER_LOAD].first().to_dict() == {"a": False, "b": True}
    rows = (_rows(XEON, "r1", {"eager": 18909.0, "ort": 997.0, "compile": 6452.0})
            + _rows(XEON, "r2", {"eager": 4563.0, "ort": 710.0, "compile": 2404.0})
            + _rows(XEON, "r3", {"eager": 844.0, "ort": 307.0, "compile": 389.0})
            + _rows(LAPTOP, "l1", {"eager": 2000.0, "ort": 900.0, "compile": 700.0}))  # another machine: not compared
    flagged = R.flag_under_load(pd.DataFrame(rows))
    by_run = flagged.groupby("run_id")
    assert by_run[R.UNDER_LOAD].first().to_dict() == {"r1": True, "r2": True, "r3": False, "l1": False}
    assert "slower than the fastest run of this machine" in by_run[R.LOAD_REASON].first()["r2"]
    text = R.phrase_comparison(flagged, "ort", "eager", here=XEON)  # the sentence says how many runs were flagged
    assert text.startswith(f"On this machine ({XEON_LABEL}) ort was 6.4x faster than eager (median of 3 runs, "
                           "per-run 2.7x to 19x). 2 of these 3 runs were flagged as taken under load.")
    ablation = pd.DataFrame([{"run_id": "a", "variant": v, "eager_median_ms": e, **LAPTOP}
                             for v, e in (("x", 9199.0), ("y", 1716.0))]
                            + [{"run_id": "b", "variant": v, "eager_median_ms": e, **LAPTOP}
                               for v, e in (("x", 86.0), ("y", 90.0))])
    wander = R.flag_under_load(ablation, value="speedup", reference="eager_median_ms").groupby("run_id")
    assert wander[R.UNDER_LOAD].first().to_dict() == {"a": True, "b": False}
    assert "eager_median_ms varied 5.4x within the run" in wander[R.LOAD_REASON].first()["a"]


def test_phrase_comparison_says_what_happened_here_and_elsewhere_or_that_nothing_or_too_little_did():
    text = R.phrase_comparison(frame(), "ort", "eager", here=LAPTOP)
    assert text.startswith(f"On this machine ({LAPTOP_LABEL}) ort was 1.9x faster than eager (median of 3 runs, "
                           "per-run 1.8x to 2.0x).")
    assert f"The recorded runs on {XEON_LABEL} found: ort and eager traded places (ort ahead in 2 of 3 runs" in text
    assert "no ranking holds there" in text
    text = R.phrase_comparison(frame(), "ort", "eager", here={"cpu_model": "Apple M2", "cpu_isa": "neon", "threads": 1})
    assert text.startswith("No run on this machine (Apple M2 (CPU identity unrecorded, neon, 1 thread)) measured both ort and eager yet.")
    one = pd.DataFrame(_rows(LAPTOP, "l1", {"a": 10.0, "b": 30.0}))
    sentence = R.phrase_comparison(one, "a", "b", here=LAPTOP)
    assert "a was 3.0x faster than b (a single run; fewer than 3 runs, not enough to decide)" in sentence
    assert "No other machine's runs are recorded" in sentence
    slower = R.phrase_comparison(one, "b", "a", here=LAPTOP)
    assert "b was 3.0x slower than a" in slower


def test_live_runs_gives_independent_alternated_runs_of_one_machine():
    calls = []
    rows = timing.live_runs({"fast": lambda: calls.append("a"), "slow": lambda: calls.append("b")}, runs=3, warmup=1,
                            repeats=2, env=dict(LAPTOP))
    assert list(rows["run_id"]) == ["live-1", "live-1", "live-2", "live-2", "live-3", "live-3"]
    assert list(rows["variant"]) == ["fast", "slow", "slow", "fast", "fast", "slow"]
    assert list(rows["went_first"]) == ["fast", "fast", "slow", "slow", "fast", "fast"]
    turns = [c for i, c in enumerate(calls) if i == 0 or calls[i - 1] != c]  # the Timer calls a name in bursts
    assert turns == ["a", "b"] * 8  # call by call in turn throughout; run 2's "b" first joins run 1's last turn
    summary = R.summarize_runs(rows)
    assert set(summary["runs"]) == {3} and set(summary[R.MACHINE]) == {R.machine_label(LAPTOP)}
