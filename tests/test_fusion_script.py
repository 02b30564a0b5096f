"""Tests of graphbook.teach.fusion_demo (the demo's measurements) and of code/03_fusion.py, its command line."""
from pathlib import Path

import pandas as pd
import pytest
import torch

from graphbook.teach import fusion_demo


def test_failed_checks_name_the_versions_that_differ_and_the_chain_s_versions_agree():
    def frame(fold_diff, compile_diff):
        return pd.DataFrame({"variant": ["unfolded", "folded", "eager", "torch.compile", fusion_demo.PROBE],
                             "max_abs_diff": [fold_diff, fold_diff, 0.0, compile_diff, None]})
    assert fusion_demo.failed_checks(frame(1e-6, 0.5), atol=1e-4) == ["torch.compile"]
    assert fusion_demo.failed_checks(frame(1.0, 0.5), atol=1.0) == []
    assert fusion_demo.failed_checks(frame(1.0, 0.5), atol=1e-4) == ["folded conv", "torch.compile"]
    x = torch.randn(1000)
    expected = torch.relu(x * 2 + 1) * 3
    assert torch.equal(fusion_demo.chain(x), expected)
    assert torch.equal(fusion_demo.chain_inplace(x), expected)
    out = torch.empty(1000)
    assert fusion_demo.chain_into(x, out) is out and torch.equal(out, expected)
    assert not torch.equal(expected, x)
    assert fusion_demo.bytes_moved(1000) == 4 * 2 * 4 * 1000
    assert fusion_demo.bytes_moved(1000, fused=True) == 2 * 4 * 1000
    assert fusion_demo.bytes_moved(10, ops=1) == 80
    code = "a = async_compile.cpp_pybinding(['x'])\nb = async_compile.cpp_pybinding(['y'])\n"
    assert fusion_demo.count_cpp_kernels(code) == 2
    assert fusion_demo.count_cpp_kernels("nothing") == 0


def test_measure_runs_times_both_parts_in_the_run_protocol_and_records_each_compile_pair_s_run(tmp_path):
    messages = []
    frame = fusion_demo.measure_runs((4, 16, 16), 4096, repeats=3, runs=5, compile_chain=False,
                                     progress=messages.append)
    firsts = frame[frame["run_order"] == 1].pivot(index="run", columns="part", values="variant")
    # each part rotates on its own: the BN pair alternates, the chain's versions take turns going first
    assert firsts["bn_folding"].tolist() == ["unfolded", "folded", "unfolded", "folded", "unfolded"]
    assert firsts["chain"].tolist() == ["eager", "manual in-place", "preallocated out=", "eager", "manual in-place"]
    chain = frame[frame["part"] == "chain"]
    probe = chain[chain["variant"] == fusion_demo.PROBE]
    assert probe["run_order"].eq(0).all() and probe["gb_per_s"].gt(0).all() and len(probe) == 5
    assert (probe.set_index("run")["gb_per_s"] == chain.groupby("run")["copy_gbps"].first()).all()  # the run's own
    versions = chain[chain["variant"] != fusion_demo.PROBE]
    assert versions["max_abs_diff"].eq(0).all() and versions.groupby("run").size().eq(3).all()
    assert versions[versions["variant"] == "eager"]["speedup_vs_eager"].eq(1.0).all()
    folded = frame[frame["variant"] == "folded"].set_index("run")
    unfolded = frame[frame["variant"] == "unfolded"].set_index("run")["median_ms"]
    assert ((unfolded - folded["median_ms"]) / unfolded * 100 == folded["change_pct"]).all()
    assert folded["max_rel_diff"].lt(1e-5).all() and sum(m.startswith("run ") for m in messages) == 5
    frame = fusion_demo.measure_runs((2, 8, 8), 2048, repeats=3, compile_chain=False)
    compile_frame = _compile_rows([(10.0, 1.0), (11.0, 1.0), (12.0, 1.0)])
    from graphbook.record import results, runs

    path = results.write_run("fusion-demo", pd.concat([compile_frame, frame]),
                             {"date": "2026-11-30T00:00:00+00:00"}, results_dir=tmp_path, per_run=True)
    back = results.load("fusion-demo", tmp_path)
    compile_back = back[back["part"] == "compile_time"]
    assert sorted(compile_back[results.RUN_ID].unique()) == [f"{path.stem}/r{k}" for k in (1, 2, 3)]
    summary = runs.summarize_runs(compile_back, by="variant", value=results.COMPILE_S).set_index("variant")
    assert summary.loc["cold", "runs"] == 3 and summary.loc["cold", "median"] == 11.0
    assert results.latest_run(back)[results.RUN_ID].unique().tolist() == [path.stem + "/r3"]
    chain = back[(back["part"] == "chain") & (back["variant"] != fusion_demo.PROBE)]
    assert (runs.summarize_runs(chain)["runs"] == 3).all()  # what the chapter reads back: three runs per version
    report = fusion_demo._format_report({}, frame, compile_frame)
    assert "3 runs in a rotated order" in report and "run 3: empty cache 12.00 s" in report
    assert "median warm/cold ratio: 0.09" in report and "timed first" in report


@pytest.mark.slow
def test_tiny_end_to_end_run(tmp_path, run_main, monkeypatch):
    results_dir = tmp_path / "results"
    args = ["--size", "4096", "--repeats", "3", "--feature-map", "4", "16", "16",
            "--results-dir", str(results_dir), "--no-compile", "--no-allocator"]
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # a re-run adds a record, never rewrites one
        code, _, err = run_main("03_fusion.py", *args)
        assert code == 0, err
    # each run's report beside its results file, none rewritten
    reports = {p.name.removesuffix(".out.txt"): p for p in results_dir.glob("*.out.txt")}
    assert sorted(reports) == sorted(p.stem for p in results_dir.glob("*.csv")) and len(reports) == 2
    report = next(iter(reports.values())).read_text()
    assert "# environment" in report and "torch: " in report
    assert "(a) BN folding" in report and "(b) element-wise chain" in report
    assert "skipped (--no-compile)" in report
    frame = pd.concat([pd.read_csv(path) for path in sorted(results_dir.glob("*.csv"))])
    assert frame["run_id"].nunique() == 6  # two invocations of three runs each
    assert set(frame["part"]) == {"bn_folding", "chain"}
    from graphbook.record import results, runs

    newest = results.latest_recording(results.load("fusion-demo", results_dir))
    stem = newest[results.SOURCE_FILE].iloc[0].removesuffix(".csv")
    assert sorted(newest[results.RUN_ID].unique()) == [f"{stem}/r{k}" for k in (1, 2, 3)]
    chain = newest[(newest["part"] == "chain") & (newest["variant"] != "copy_ (bandwidth probe)")]
    firsts = chain[chain[results.RUN_ORDER] == 1].sort_values(results.RUN)["variant"].tolist()
    assert firsts == ["eager", "manual in-place", "preallocated out="]  # round-robin
    assert (newest[results.COPY_GBPS] > 0).all()
    assert (runs.summarize_runs(chain)["runs"] == 3).all()
    folds = newest[(newest["part"] == "bn_folding") & (newest["variant"] == "folded")]
    assert runs.summarize_runs(folds, by="feature_map", value="change_pct")["runs"].tolist() == [3]
    assert runs.flag_under_load(chain)[runs.UNDER_LOAD].dtype == bool
    assert {"cpu_model", "torch", "threads", "date"} <= set(frame.columns)
    assert (frame["threads"] == 1).all()


def _compile_rows(seconds):
    return pd.DataFrame([{"part": "compile_time", "variant": variant, "run": run, "run_order": order,
                          "compile_s": s, "fxgraph_cache_hit": order - 1, "fxgraph_cache_miss": 2 - order}
                         for run, (cold, warm) in enumerate(seconds, start=1)
                         for order, (variant, s) in enumerate((("cold", cold), ("warm", warm)), start=1)])


@pytest.mark.slow
def test_each_compile_time_run_starts_from_its_own_empty_cache(monkeypatch):
    calls = []

    def stand_in(spec, cache_dir):
        cold = not any(Path(cache_dir).iterdir())
        (Path(cache_dir) / f"entry-{len(calls)}").write_text("compiled")
        calls.append((Path(cache_dir), cold, spec))
        return {"first_call_s": {"1": 8.0 if cold else 2.0}, "fxgraph_cache_hit": int(not cold),
                "fxgraph_cache_miss": int(cold)}

    monkeypatch.setattr(fusion_demo, "fresh_process_compile", stand_in)
    result = fusion_demo.measure_compile_time(4096, threads=2, runs=3)
    assert [cold for _, cold, _ in calls] == [True, False] * 3
    folders = [folder for folder, *_ in calls]
    assert folders[0::2] == folders[1::2] and len(set(folders)) == 3  # a pair shares one new folder
    assert not any(folder.exists() for folder in folders)             # and leaves nothing behind
    specs = {(spec.factory, spec.input_chw, spec.threads) for *_, spec in calls}
    assert specs == {("graphbook.teach.fusion_demo:Chain", (4096,), 2)}
    assert result["run"].tolist() == [1, 1, 2, 2, 3, 3] and result["compile_s"].tolist() == [8.0, 2.0] * 3
    assert result["variant"].tolist() == ["cold", "warm"] * 3 and result["fxgraph_cache_hit"].tolist() == [0, 1] * 3


def test_cache_levels_read_the_fingerprint_and_skip_what_it_lacks():
    assert fusion_demo.cache_levels({"cpu_l1d_kib": 48, "cpu_l2_kib": 2048, "cpu_l3_kib": ""}) == {
        "L1d": 48 * 1024, "L2": 2048 * 1024}
    assert fusion_demo.cache_levels({}) == {}


@pytest.mark.slow
def test_the_size_sweep_checks_and_times_every_size():
    sweep = fusion_demo.chain_size_sweep((8, 10), runs=3)
    assert list(sweep.elements) == [256, 1024]
    assert (sweep.speedup_min <= sweep.speedup).all() and (sweep.speedup <= sweep.speedup_max).all()
    assert (sweep.model_speedup == 4.0).all()
