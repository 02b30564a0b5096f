"""What a fresh tensor costs, the allocator removed as a cause, and the recorded split of the chain's speed-up."""
import pandas as pd
import pytest

from graphbook.teach import allocation


def test_minor_page_faults_ignore_other_threads_and_allocator_runs_alternate_which_goes_first(monkeypatch):
    import resource

    if allocation.minor_page_faults(lambda: None) is None:
        pytest.skip("no getrusage here")
    # A fault counter that another thread bumps in some rounds: the smallest round is reported. (That a fresh
    # 64 MiB tensor faults and a reused one does not, Chapter 2 asserts on this machine.)
    counts = iter([0, 900, 900, 1800, 1800, 1803, 1803, 2700, 2700, 3600, 3600])
    monkeypatch.setattr(resource, "getrusage", lambda who: type("R", (), {"ru_minflt": next(counts)})())
    assert allocation.minor_page_faults(lambda: None, calls=3, trials=5) == 1.0
    calls = []

    def fake(n_elements, threads, repeats, swap=False):
        calls.append(swap)
        pair = [{"allocator": "glibc default", "eager chain": 100.0, "faults_per_new_tensor": 16000.0},
                {"allocator": "glibc keeping freed memory", "eager chain": 40.0, "faults_per_new_tensor": 0.0}]
        return pair[::-1] if swap else pair

    monkeypatch.setattr(allocation, "allocator_ablation", fake)
    rows = allocation.allocator_runs(1024, threads=1, runs=3)
    assert calls == [False, True, False]
    assert [(r.run, r.run_order, r.variant[:10]) for r in rows[:4].itertuples()] == [
        (1, 1, "glibc defa"), (1, 2, "glibc keep"), (2, 1, "glibc keep"), (2, 2, "glibc defa")]
    # the rows code/03_fusion.py records: the eager chain's median and the faults, part "allocator"
    assert rows["median_ms"].tolist()[:2] == [100.0, 40.0] and set(rows["part"]) == {"allocator"}
    assert rows["faults_per_new_tensor"].tolist()[:2] == [16000.0, 0.0] and set(rows["size_elements"]) == {1024}
    monkeypatch.setattr(allocation, "allocator_ablation", lambda *a, **k: "needs glibc")
    assert allocation.allocator_runs(1024, runs=3) == "needs glibc"


def _recorded(machine_id, eager, out, fused_out, default, kept, source):
    rows = []
    for run in (1, 2, 3):
        for variant, ms in (("eager", eager), ("preallocated out=", out), ("torch.compile, out=", fused_out)):
            rows.append({"part": "chain", "variant": variant, "run": run, "run_id": f"{source}/r{run}",
                         "median_ms": ms * (1 + run / 100)})
        for variant, ms in (("glibc default", default), ("glibc keeping freed memory", kept)):
            rows.append({"part": "allocator", "variant": variant, "run": run, "run_id": f"{source}/r{run}",
                         "median_ms": ms})
    return pd.DataFrame(rows).assign(source_file=source, date="2026-12-02", cpu_model="CPU", cpu_family=25,
                                      cpu_model_id=machine_id, cpu_isa="avx512", threads=1)


def test_the_recorded_split_keeps_machines_apart_and_multiplies_to_the_whole():
    frame = pd.concat([_recorded(17, 120.0, 30.0, 10.0, 120.0, 40.0, "a.csv"),
                       _recorded(2, 60.0, 20.0, 5.0, 60.0, 30.0, "b.csv")])
    split = allocation.recorded_split(frame).set_index("source_file")
    assert split.loc["a.csv", "allocation"] == pytest.approx(4.0) and split.loc["a.csv", "traffic"] == pytest.approx(3.0)
    assert split.loc["a.csv", "both"] == pytest.approx(12.0) and split.loc["a.csv", "allocator"] == pytest.approx(3.0)
    assert split.loc["b.csv", "both"] == pytest.approx(12.0) and split.loc["b.csv", "allocator"] == pytest.approx(2.0)
    assert split["runs"].tolist() == [3, 3] and split["machine"].nunique() == 2
    without = frame[frame["part"] != "allocator"]
    assert "allocator" not in allocation.recorded_split(without).columns
    assert allocation.recorded_split(frame[frame["part"] == "allocator"]).empty
