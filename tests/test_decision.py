"""Tests of graphbook.method.decision (the recorded BlurBall CPU matrix as Chapter 5 and the appendix read it),
on a synthetic recording: one machine, three runs, a variant that fails its check, one run under load."""
import pandas as pd
import pytest

from graphbook.record import runs
from graphbook.method import decision

ZEN4 = {"cpu_model": "AMD EPYC", "cpu_family": 25, "cpu_model_id": 17, "cpu_microarch": "Zen 4",
        "cpu_isa": "avx512_vnni", "torch_isa": "AVX512", "threads": 2, "torch": "2.13.0+cpu"}


def _recording(eager_ms=(500.0, 510.0, 505.0), ort_ms=(150.0, 160.0, 155.0), *, size=(288, 512), ball=True):
    rows = []
    for run, (eager, ort) in enumerate(zip(eager_ms, ort_ms), start=1):
        common = {"record": "variant", "height": size[0], "width": size[1], "run_id": f"cpu-blurball-x/r{run}",
                  "source_file": "cpu-blurball-x.csv", "date": f"2026-12-0{run}T10:00:00", **ZEN4}
        for variant, ms, same, diff in (("eager_fp32", eager, True, 0.0), ("ort_exporter_optimized_all", ort, True, 2e-5),
                                        ("compile_freezing", ort / 2, False, 4.1),
                                        ("eager_bf16_autocast", eager / 2, False, 0.37)):
            rows.append({**common, "variant": variant, "median_ms": ms, "q1_ms": ms * 0.99, "q3_ms": ms * 1.01,
                         "same_output": same, "same_peaks": True, "max_abs_diff": diff,
                         "same_ball": ball if variant == "eager_bf16_autocast" else None,
                         "ball_frames": 12, "ball_agree_frames": 12 if ball else 9})
    return pd.DataFrame(rows)


def test_verdicts_judge_fp32_on_logits_and_lower_precision_on_the_decoded_ball():
    rows, verdicts = decision.full_size_rows(_recording())
    assert verdicts.check_passed.to_dict() == {"eager_fp32": True, "ort_exporter_optimized_all": True,
                                               "compile_freezing": False, "eager_bf16_autocast": True}
    assert verdicts.failed_check["compile_freezing"] == decision.OUTPUT_DIFFERS
    assert verdicts.max_abs_diff["compile_freezing"] == 4.1 and rows.check_passed.dtype == bool
    moved = decision.full_size_rows(_recording(ball=False))[1]
    assert moved.failed_check["eager_bf16_autocast"] == decision.TASK_FAILED
    # a pass on 12 frames bounds the failure rate only at 22 %
    assert verdicts.check_samples["eager_bf16_autocast"] == 12
    assert verdicts.failure_bound["eager_bf16_autocast"] == pytest.approx(1 - 0.05 ** (1 / 12))


def _lower_precision_recording(machine, ball, *, twin_same=True, with_ball_check=True):
    """One machine's three runs of a bf16 variant and its FP32 twin (compile + freezing)."""
    rows = _recording()[lambda f: f.variant == "eager_fp32"].assign(**machine)
    bf16 = rows.assign(variant="compile_freezing_bf16", same_output=False, max_abs_diff=4.19,
                       same_ball=ball if with_ball_check else None)
    twin = rows.assign(variant="compile_freezing", same_output=twin_same, max_abs_diff=4.13 if not twin_same else 2e-5)
    return pd.concat([rows, bf16, twin], ignore_index=True)


def test_a_lower_precision_passes_only_with_its_fp32_twin_on_its_own_machine():
    xeon = {**ZEN4, "cpu_model": "Intel Xeon", "cpu_family": 6, "cpu_model_id": 143, "cpu_microarch": "Sapphire Rapids"}
    older = {**ZEN4, "cpu_family": None, "cpu_model_id": None}   # random weights, no ball check
    recorded = pd.concat([_lower_precision_recording(ZEN4, True, twin_same=False),
                          _lower_precision_recording(xeon, True),
                          _lower_precision_recording(older, None, with_ball_check=False)], ignore_index=True)
    machines = list(dict.fromkeys(runs.add_machine(recorded)[runs.MACHINE]))
    rows, zen4 = decision.full_size_rows(recorded, machine=machines[0])
    assert zen4.failed_check["compile_freezing_bf16"] == decision.TWIN_FAILED   # kept the ball, twin wrong (E2)
    xeon_verdicts = decision.full_size_rows(recorded, machine=machines[1])[1]   # never pooled with the Zen 4's
    assert xeon_verdicts.check_passed["compile_freezing_bf16"]
    old = decision.full_size_rows(recorded, machine=machines[2])[1]
    assert old.failed_check["compile_freezing_bf16"] == decision.NO_TASK_CHECK
    assert rows.groupby(runs.MACHINE, sort=False).check_passed.sum().tolist() == [3, 9, 6]   # passing rows per machine
    alone = _lower_precision_recording(ZEN4, True).query("variant != 'compile_freezing'")
    assert decision.full_size_rows(alone)[1].failed_check["compile_freezing_bf16"] == decision.TWIN_MISSING


def test_only_the_full_size_counts_and_nothing_recorded_is_none():
    assert decision.full_size_rows(_recording(size=(96, 160))) == (None, None)
    assert decision.full_size_rows(pd.DataFrame()) == (None, None)


def test_a_decision_names_the_best_the_runner_up_and_each_exclusion_with_its_failed_check():
    rows, _ = decision.full_size_rows(_recording())
    made = decision.decide(rows, rows[runs.MACHINE].iloc[0])
    assert (made.best, made.runner_up, made.runs, made.won_runs, made.decided, made.outcome) == \
        ("ort_exporter_optimized_all", "eager_bf16_autocast", 3, 3, True, "faster")
    assert made.lead == pytest.approx(((500 / 2) * (510 / 2) * (505 / 2) / (150 * 160 * 155)) ** (1 / 3))
    assert made.lead_low < made.lead < made.lead_high and made.noise_from == "the screen"
    assert made.excluded == {"compile_freezing": decision.OUTPUT_DIFFERS}   # the faster freezing failed its check
    fp32 = decision.decide(rows, made.machine, candidates=["eager_fp32", "ort_exporter_optimized_all", "compile_freezing"])
    assert fp32.best == "ort_exporter_optimized_all" and fp32.margin == pytest.approx(505 / 155)


def test_a_run_under_load_is_listed_and_too_few_quiet_runs_or_none_decide_nothing():
    rows, _ = decision.full_size_rows(_recording(eager_ms=(500.0, 3000.0, 505.0), ort_ms=(150.0, 900.0, 155.0)))
    table = decision.run_table(rows)
    assert list(table["under load?"].str.startswith("yes")) == [False, True, False]
    assert list(table["eager FP32 (ms)"]) == [500, 3000, 505]
    made = decision.decide(rows, rows[runs.MACHINE].iloc[0])
    assert made.runs == 2 and not made.decided and made.noise_from == "fewer than 3 runs"
    rows = rows.assign(**{runs.UNDER_LOAD: True})   # every run under load: nothing decided, the checks still exclude
    made = decision.decide(rows, made.machine)
    assert (made.best, made.runs, made.decided) == (None, 0, False)
    assert made.excluded == {"compile_freezing": decision.OUTPUT_DIFFERS}
