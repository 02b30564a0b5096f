"""Tests of graphbook.teach.fusion_demo (the demo's measurements) and of code/03_fusion.py, its command line."""
import ast
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from graphbook import paths
from graphbook.teach import fusion_demo

SCRIPT = paths.script("03_fusion.py")


@pytest.fixture(scope="module")
def fusion():
    return fusion_demo


def _run(*args, timeout=300, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def test_script_defaults_agree_with_the_module():
    """The script repeats three defaults so it can refuse a typo before importing torch; they must agree."""
    tree = ast.parse(SCRIPT.read_text())
    constants = {node.targets[0].id: eval(ast.unparse(node.value)) for node in tree.body  # plain arithmetic
                 if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                 and node.targets[0].id.startswith("DEFAULT_")}
    assert constants == {"DEFAULT_SIZE": fusion_demo.DEFAULT_SIZE, "DEFAULT_REPEATS": fusion_demo.DEFAULT_REPEATS,
                         "DEFAULT_FEATURE_MAP": fusion_demo.DEFAULT_FEATURE_MAP, "DEFAULT_RUNS": fusion_demo.DEFAULT_RUNS}


def test_failed_checks_name_the_versions_that_differ():
    folding = {"max_abs_diff": 1e-6}
    chain = {"variants": [{"variant": "eager", "max_abs_diff": 0.0}, {"variant": "torch.compile", "max_abs_diff": 0.5}]}
    assert fusion_demo.failed_checks(folding, chain, atol=1e-4) == ["torch.compile"]
    assert fusion_demo.failed_checks({"max_abs_diff": 1.0}, chain, atol=1.0) == []
    assert fusion_demo.failed_checks({"max_abs_diff": 1.0}, chain, atol=1e-4) == ["folded conv", "torch.compile"]


def test_chain_versions_agree(fusion):
    x = torch.randn(1000)
    expected = torch.relu(x * 2 + 1) * 3
    assert torch.equal(fusion.chain(x), expected)
    assert torch.equal(fusion.chain_inplace(x), expected)
    out = torch.empty(1000)
    assert fusion.chain_into(x, out) is out and torch.equal(out, expected)
    assert not torch.equal(expected, x)


def test_bytes_moved_model(fusion):
    assert fusion.bytes_moved(1000) == 4 * 2 * 4 * 1000
    assert fusion.bytes_moved(1000, fused=True) == 2 * 4 * 1000
    assert fusion.bytes_moved(10, ops=1) == 80
    with pytest.raises(ValueError):
        fusion.bytes_moved(0)


def test_count_cpp_kernels(fusion):
    code = "a = async_compile.cpp_pybinding(['x'])\nb = async_compile.cpp_pybinding(['y'])\n"
    assert fusion.count_cpp_kernels(code) == 2
    assert fusion.count_cpp_kernels("nothing") == 0


def test_measure_runs_times_both_parts_in_the_run_protocol(fusion):
    messages = []
    folding, chain = fusion.measure_runs((4, 16, 16), 4096, repeats=3, runs=5, compile_chain=False,
                                         progress=messages.append)
    assert folding["max_rel_diff"] < 1e-5 and len(folding["runs"]) == 5
    # each part rotates on its own: the BN pair alternates, the chain's versions take turns going first
    assert [run["first"] for run in folding["runs"]] == ["unfolded", "folded", "unfolded", "folded", "unfolded"]
    assert [v["variant"] for v in chain["variants"]] == ["eager", "manual in-place", "preallocated out="]
    assert [run["order"][0] for run in chain["runs"]] == ["eager", "manual in-place", "preallocated out=", "eager",
                                                           "manual in-place"]
    assert all(run["copy"]["gb_per_s"] > 0 for run in chain["runs"])
    assert all(v["max_abs_diff"] == 0 for v in chain["variants"])
    assert chain["variants"][0]["speedup_vs_eager"] == 1.0
    assert sum(m.startswith("run ") for m in messages) == 5


@pytest.mark.slow
def test_tiny_end_to_end_run(tmp_path):
    results_dir = tmp_path / "results"
    args = ["--size", "4096", "--repeats", "3", "--feature-map", "4", "16", "16", "--report-dir", str(tmp_path),
            "--results-dir", str(results_dir), "--no-compile", "--no-allocator"]
    for _ in range(2):  # a re-run adds a record, never rewrites one
        proc = _run(*args, cwd=tmp_path)  # from any folder: graphbook is installed, not found beside the script
        assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "03_fusion.out.txt").read_text()
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


def _compile_pair(run: int, cold_s: float, warm_s: float) -> dict:
    return {"run": run, "cold": {"seconds": cold_s, "fxgraph_cache_hit": 0, "fxgraph_cache_miss": 1},
            "warm": {"seconds": warm_s, "fxgraph_cache_hit": 1, "fxgraph_cache_miss": 0},
            "warm_over_cold": warm_s / cold_s}


def test_csv_rows_give_each_compile_pair_the_run_it_belongs_to(tmp_path):
    folding, chain = fusion_demo.measure_runs((2, 8, 8), 2048, repeats=3, compile_chain=False)
    compile_result = {"runs": [_compile_pair(k, 9.0 + k, 1.0) for k in (1, 2, 3)], "warm_over_cold": 0.1}
    rows = fusion_demo.csv_rows(folding, chain, compile_result)
    compile_rows = [r for r in rows if r["part"] == "compile_time"]
    assert rows[:6] == compile_rows
    assert [(r["run"], r["variant"], r["run_order"]) for r in compile_rows] == [
        (k, variant, order) for k in (1, 2, 3) for order, variant in ((1, "cold"), (2, "warm"))]
    from graphbook.record import results, runs

    path = results.write_run("fusion-demo", rows, {"date": "2026-11-30T00:00:00+00:00"}, results_dir=tmp_path,
                             per_run=True)
    frame = results.load("fusion-demo", tmp_path)
    compile_frame = frame[frame["part"] == "compile_time"]
    assert sorted(compile_frame[results.RUN_ID].unique()) == [f"{path.stem}/r{k}" for k in (1, 2, 3)]
    summary = runs.summarize_runs(compile_frame, by="variant", value=results.COMPILE_S).set_index("variant")
    assert summary.loc["cold", "runs"] == 3 and summary.loc["cold", "median"] == 11.0
    assert results.latest_run(frame)[results.RUN_ID].unique().tolist() == [path.stem + "/r3"]
    report = fusion_demo._format_report({}, folding, chain, compile_result)
    assert "3 runs in a rotated order" in report and "run 3: empty cache 12.00 s" in report


def test_each_compile_time_run_starts_from_its_own_empty_cache(monkeypatch):
    calls = []

    def stand_in(script, function, shapes, cache_dir, *, threads):
        cold = not any(Path(cache_dir).iterdir())
        (Path(cache_dir) / f"entry-{len(calls)}").write_text("compiled")
        calls.append((Path(cache_dir), cold, shapes, threads))
        return {"seconds": 8.0 if cold else 2.0, "fxgraph_cache_hit": int(not cold), "fxgraph_cache_miss": int(cold)}

    monkeypatch.setattr(fusion_demo.compiletime, "compile_in_fresh_process", stand_in)
    result = fusion_demo.measure_compile_time(4096, threads=2, runs=3)
    assert [cold for _, cold, _, _ in calls] == [True, False] * 3
    folders = [folder for folder, *_ in calls]
    assert folders[0::2] == folders[1::2] and len(set(folders)) == 3  # a pair shares one new folder
    assert not any(folder.exists() for folder in folders)             # and leaves nothing behind
    assert {(tuple(map(tuple, shapes)), threads) for _, _, shapes, threads in calls} == {(((4096,),), 2)}
    assert [pair["run"] for pair in result["runs"]] == [1, 2, 3] and result["warm_over_cold"] == 0.25
    with pytest.raises(ValueError, match="runs must be an integer >= 1"):
        fusion_demo.measure_compile_time(4096, runs=0)


def test_cache_levels_read_the_fingerprint_and_skip_what_it_lacks():
    from graphbook.teach import fusion_demo

    assert fusion_demo.cache_levels({"cpu_l1d_kib": 48, "cpu_l2_kib": 2048, "cpu_l3_kib": ""}) == {
        "L1d": 48 * 1024, "L2": 2048 * 1024}
    assert fusion_demo.cache_levels({}) == {}


def test_the_size_sweep_checks_and_times_every_size():
    from graphbook.teach import fusion_demo

    sweep = fusion_demo.chain_size_sweep((8, 10), runs=3)
    assert list(sweep.elements) == [256, 1024]
    assert (sweep.speedup_min <= sweep.speedup).all() and (sweep.speedup <= sweep.speedup_max).all()
    assert (sweep.model_speedup == 4.0).all()
