"""The appendix's machines: one row per identity, medians over quiet runs, a sentence from the data."""
import pandas as pd
import pytest

from graphbook.record import machines

A = {"cpu_model": "Same Name CPU", "cpu_family": 25, "cpu_model_id": 17, "cpu_isa": "avx512", "threads": 2,
     "torch": "2.13.0", "date": "2026-12-01T10:00:00+00:00"}
B = {**A, "cpu_model_id": 97, "date": "2026-12-02T10:00:00+00:00"}


def write_matrix(folder, name, machine, eager_ms, runs_n=3, loaded_run=None):
    rows = []
    for run in range(1, runs_n + 1):
        factor = 5.0 if run == loaded_run else 1.0
        for variant, ms in (("eager_fp32", eager_ms), ("compile_default", eager_ms / 2)):
            rows.append({"record": "variant", "variant": variant, "height": 288, "median_ms": ms * factor,
                         "q1_ms": ms * factor * 0.99, "q3_ms": ms * factor * 1.01, "run_id": f"{name}/r{run}",
                         "run": run, **machine})
    pd.DataFrame(rows).to_csv(folder / f"{name}.csv", index=False)


def test_side_by_side_leaves_a_loaded_run_out_of_the_median_but_shows_it(tmp_path):
    write_matrix(tmp_path, "cpu-blurball-2026-12-01", A, 500, runs_n=4, loaded_run=2)
    table = machines._side_by_side("cpu-blurball", tmp_path)
    eager = table[table.variant == "eager_fp32"].iloc[0]
    assert eager["median"] == pytest.approx(500) and eager.quiet_runs == 3 and eager.flagged_runs == 1
    assert eager["flags"] == [False, True, False, False] and eager["values"][1] == pytest.approx(2500)
    import matplotlib

    matplotlib.use("Agg")
    write_matrix(tmp_path, "cpu-blurball-2026-12-01", A, 500)
    write_matrix(tmp_path, "cpu-blurball-2026-12-02", B, 1000)
    facts = machines.machine_facts(tmp_path)
    assert len(facts) == 2 and set(facts["cpu_model_id"]) == {"17", "97"}
    assert list(facts["cpu-blurball"]) == [3, 3] and list(facts["ablation"]) == [0, 0]
    ax = machines.plot_side_by_side("cpu-blurball", tmp_path)
    assert len(ax.patches) == 4
    assert machines.plot_side_by_side("attribution", tmp_path) is None
    with pytest.raises(KeyError, match="no side-by-side measure"):
        machines.measure("no-such-kind")
