"""No recorded FP32 variant runs faster than its machine's ceiling, unless a measured reason says why."""
import pandas as pd

from graphbook.record import recording, results
from graphbook.method import decision

IDENTIFIED = {"cpu_model": "CPU", "cpu_family": 6, "cpu_model_id": 1, "cpu_microarch": "Zen 4", "cpu_isa": "avx512",
              "cpu_ghz": 3.0, "threads": 2}  # Zen 4: 32 FLOPs per cycle per core -> 192 GFLOP/s on 2 threads


def rows(median_ms, variant="compile_default", **extra):
    return pd.DataFrame([{"variant": variant, "precision": "fp32", "median_ms": median_ms, "macs": 10 ** 9,
                          "dead_macs": 2 * 10 ** 8, **IDENTIFIED, **extra}])


def test_the_rate_counts_only_the_work_each_variant_executes():
    compiled = decision.executed_rates(rows(10.0)).iloc[0]
    eager = decision.executed_rates(rows(10.0, variant="eager_fp32")).iloc[0]
    assert compiled.executed_macs == 8 * 10 ** 8 and eager.executed_macs == 10 ** 9
    assert compiled.ceiling_gflop_per_s == 192.0
    assert round(compiled.executed_gflop_per_s, 1) == 160.0


def test_a_rate_above_the_ceiling_is_caught_and_an_unidentified_machine_is_not_judged():
    assert len(decision.above_ceiling(rows(5.0))) == 1           # 320 GFLOP/s on a 192 GFLOP/s machine
    assert len(decision.above_ceiling(rows(10.0))) == 0
    assert len(decision.above_ceiling(rows(5.0, precision="bf16"))) == 0
    assert len(decision.above_ceiling(rows(5.0, cpu_ghz=None))) == 0


def test_no_recorded_fp32_variant_exceeds_its_machines_ceiling():
    frame = recording.load("cpu-blurball")
    frame = frame[frame["record"] == "variant"].dropna(subset=["median_ms"])
    over = decision.above_ceiling(frame)
    assert over.empty, over[["source_file", "variant", "executed_gflop_per_s", "ceiling_gflop_per_s"]].to_string()
    judged = decision.executed_rates(frame)["ceiling_gflop_per_s"].notna().sum()
    assert judged > 0, "no recorded CPU matrix carries the identity and clock that give its ceiling"


def test_a_lower_precision_row_is_rated_against_its_own_ceiling_and_the_fp32_one():
    bf16 = decision.executed_rates(rows(5.0, precision="bf16", variant="compile_bf16")).iloc[0]
    assert bf16.ceiling_gflop_per_s == 384.0 and bf16.fp32_ceiling_gflop_per_s == 192.0  # Zen 4: bf16 dot products
    assert round(bf16.share_of_ceiling, 3) == round(320 / 384, 3)
    assert round(bf16.share_of_fp32_ceiling, 3) == round(320 / 192, 3)
