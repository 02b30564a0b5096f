"""Tests of the results schema (graphbook.record.results): kinds, write_run, load, latest_run, the comparison."""
import csv
import hashlib
import re

import pandas as pd
import pytest
import torch

from graphbook import paths
from graphbook.record import recording, results
from graphbook import checks

ROOT = paths.REPO_ROOT
COMMITTED = recording.reference().folder
ENV = {"date": "2026-11-30T10:00:00+00:00", "git_commit": "0123", "threads": 2}


def _read(path):
    with open(path, newline="") as handle:
        return list(csv.reader(handle))


# ------------------------------------------------------------------------------ kinds and file names
def test_every_committed_file_belongs_to_one_kind_no_kind_matches_another_s_and_an_unknown_one_is_refused(tmp_path):
    for path in sorted(COMMITTED.glob("*.csv")):
        matching = [k.name for k in results.KINDS.values() if k.matches(path.name)]
        assert len(matching) == 1, f"{path.name} matches {matching}"
    for name, k in results.KINDS.items():
        if k.log_file:  # the notebook log grows by append_rows, it is not a recording
            continue
        written = results.write_run(name, [{"v": 1}], ENV, results_dir=tmp_path,
                                    tag="nvidia-h200" if k.tagged else None)
        assert [k for k in results.KINDS.values() if k.matches(written.name)] == [k]

    def kinds_of(file_name):
        return [k.name for k in results.KINDS.values() if k.matches(file_name)]

    assert kinds_of("gpu-tensorrt-nvidia-h200-2026-11-30-2.csv") == ["gpu-tensorrt"]
    assert kinds_of("gpu-blurball-nvidia-h200-2026-11-30.csv") == ["gpu-blurball"]
    assert kinds_of("cpu-blurball-2026-11-30.csv") == ["cpu-blurball"]
    assert kinds_of("cpu-ablation-2026-11-30-4.csv") == ["ablation"]
    assert kinds_of("notebook_executions.csv") == ["notebook-executions"]
    for unknown in ("gpu-nvidia-h200-2026-11-30.csv", "cpu-blurball-extra-2026-11-30.csv", "ablation_cpu.csv", "notes.csv"):
        assert kinds_of(unknown) == []
    for name, k in results.KINDS.items():
        assert len(results.files(name, tmp_path)) == (0 if k.log_file else 1)
    with pytest.raises(ValueError, match="unknown result kind 'nope'.*cpu-blurball"):
        results.load("nope", tmp_path)
    with pytest.raises(ValueError, match="unknown result kind"):
        results.write_run("nope", [{"a": 1}], results_dir=tmp_path)


# ------------------------------------------------------------------------------ write_run
def test_write_run_makes_a_new_file_per_run_never_overwrites_and_refuses_bad_tags_rows_and_names(tmp_path):
    first = results.write_run("cpu-blurball", [{"variant": "eager_fp32", "median_ms": 2.0}], ENV,
                              results_dir=tmp_path)
    before = first.read_bytes()
    second = results.write_run("cpu-blurball", [{"variant": "eager_fp32", "median_ms": 1.0}], ENV,
                               results_dir=tmp_path)
    assert first.name == "cpu-blurball-2026-11-30.csv" and second.name == "cpu-blurball-2026-11-30-2.csv"
    assert first.read_bytes() == before
    rows = _read(second)
    assert rows[0][0] == "run_id" and rows[0][1:] == ["variant", "median_ms", "date", "git_commit", "threads"]
    assert rows[1][0] == "cpu-blurball-2026-11-30-2"
    path = results.write_run("gpu-tensorrt", [{"a": 1}], ENV, results_dir=tmp_path, tag="nvidia-h200")
    assert path.name == "gpu-tensorrt-nvidia-h200-2026-11-30.csv"
    for name, tag in (("gpu-blurball", None), ("cpu-blurball", "x"), ("gpu-blurball", "a/b")):  # a tag only if tagged
        with pytest.raises(ValueError, match="does not match"):
            results.write_run(name, [{"a": 1}], ENV, results_dir=tmp_path, tag=tag)
    path = results.write_run("cpu-onnxruntime", [{"run_id": "R1", "a": 1}], ENV, results_dir=tmp_path)
    assert _read(path)[1][0] == "R1"  # a given run id is kept; no rows, or an empty one, are refused
    with pytest.raises(ValueError):
        results.write_run("cpu-onnxruntime", [], ENV, results_dir=tmp_path)
    with pytest.raises(ValueError):
        results.write_run("cpu-onnxruntime", [{}], ENV, results_dir=tmp_path)
    # a date that is not YYYY-MM-DD makes a name no reader would find: refused, and no orphan file left
    before = sorted(tmp_path.iterdir())
    with pytest.raises(ValueError, match="does not match"):
        results.write_run("serving-load", [{"ok": 1}], {"date": "yesterday"}, results_dir=tmp_path)
    assert sorted(tmp_path.iterdir()) == before


def test_a_frame_goes_to_the_file_as_it_is_comes_back_typed_and_defaults_to_the_books_folder(tmp_path, monkeypatch):
    frame = pd.DataFrame([{"run": 1, "variant": "a", "median_ms": 2.5, "same_output": True},
                          {"run": 2, "variant": "a", "median_ms": 3.0, "same_output": False},
                          {"variant": "profile", "ops": 7, "threads": 1}])
    path = results.write_run("cpu-blurball", frame, ENV, results_dir=tmp_path, per_run=True)
    rows = _read(path)
    assert rows[0] == ["run_id", "run", "variant", "median_ms", "same_output", "ops", "threads", "date", "git_commit"]
    assert rows[1][:5] == [f"{path.stem}/r1", "1", "a", "2.5", "True"]  # a whole number with gaps stays whole
    assert rows[3][:3] == [path.stem, "", "profile"]  # measured once per invocation: the file's own run id
    back = results.load("cpu-blurball", tmp_path)
    assert back["threads"].tolist() == [2, 2, 1]  # the environment fills the gaps, a row's own value wins
    assert str(back["same_output"].dtype) == "boolean" and back["median_ms"].iloc[1] == 3.0
    monkeypatch.setattr(paths, "RESULTS_DIR", tmp_path)
    path = results.write_run("serving-ready", [{"server": "eager"}])
    assert path.parent == tmp_path and re.match(r"cpu-serving-ready-\d{4}-\d{2}-\d{2}\.csv", path.name)
    assert len(results.load("serving-ready")) == 1


# ------------------------------------------------------------------------------ load
def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.csv"))}


@pytest.mark.parametrize("kind", ["fusion-demo", "cpu-blurball", "cpu-onnxruntime", "ablation", "serving-ready"])
def test_each_committed_file_loads_with_typed_columns(kind):
    before = _digest(COMMITTED)
    frame = results.load(kind, COMMITTED)
    assert _digest(COMMITTED) == before, "load must never rewrite a results file"
    assert len(frame) > 0
    assert frame[results.RUN_ID].notna().all() and frame[results.SOURCE_FILE].notna().all()
    retired = {"speedup_over_eager", "speedup_vs_eager_fp32", "ratio_to_eager", "peaks_equal", "peaks_same",
               "peaks_total", "verified_fp32", "setup_s", "compile_first_call_s", "first_call_s", "seconds"}
    assert not retired & set(frame.columns), retired & set(frame.columns)
    for column in (results.SAME_OUTPUT, results.SAME_PEAKS):
        if column in frame:
            assert pd.api.types.is_bool_dtype(frame[column]), (column, frame[column].dtype)
    for column in (results.SPEEDUP_VS_EAGER, results.COMPILE_S, results.MAX_ABS_DIFF, results.MEDIAN_MS):
        if column in frame:
            assert pd.api.types.is_numeric_dtype(frame[column]), (column, frame[column].dtype)
    latest = results.latest_run(frame)
    assert latest[results.RUN_ID].nunique() == 1 and len(latest) > 0


def test_committed_files_have_the_expected_canonical_columns_and_the_registrys_variant_names():
    blurball = results.load("cpu-blurball", COMMITTED)
    assert {results.SPEEDUP_VS_EAGER, results.SAME_PEAKS, results.COMPILE_S, results.SAME_OUTPUT} <= set(blurball)
    variants = blurball[blurball["record"] == "variant"]
    assert set(variants[results.SAME_PEAKS].dropna()) <= {True, False}
    ort = results.load("cpu-onnxruntime", COMMITTED)
    assert {results.SPEEDUP_VS_EAGER, results.SAME_PEAK_FRAMES, results.PEAK_FRAMES, results.SAME_PEAKS,
            results.SAME_OUTPUT} <= set(ort)
    assert ort[results.SAME_PEAKS].dtype == bool
    ablation = results.load("ablation", COMMITTED)
    assert ablation[results.SAME_PEAKS].dtype == bool and ablation[results.SAME_OUTPUT].dtype == bool
    # the freezing miscompile recorded by the ablation is a "different output" under the one tolerance
    frozen = ablation[ablation[results.VARIANT] == "all optimizations"]
    assert frozen[results.SAME_OUTPUT].all()   # torch 2.14.1 freezes BlurBall correctly
    assert ablation[results.RUN_ID].nunique() >= 3 and ablation[results.RUN_ID].map(type).eq(str).all()
    fusion = results.load("fusion-demo", COMMITTED)
    assert fusion.loc[fusion["part"] == "compile_time", results.COMPILE_S].notna().all()
    names = set(blurball.loc[blurball["record"] == "variant", results.VARIANT])  # the variant registry's names
    assert "onnxruntime" not in names and "ort_exporter_optimized_all" in names
    from graphbook.method import variants

    assert names <= set(variants.REGISTRY) | set(variants.RETIRED)
    assert not set(variants.RETIRED) & set(variants.REGISTRY), "a retired name is never reused"


def test_load_types_the_columns_and_of_nothing_gives_the_key_columns(tmp_path):
    (tmp_path / "cpu-ablation-2026-11-29.csv").write_text(
        "run_id,variant,compile_s,max_abs_diff,same_peaks,speedup_vs_eager,date\n"
        "0001,a,1.5,1e-6,True,2.0,2026-11-29T08:00:00+00:00\n"
        "0001,b,2.5,0.05,False,3.0,2026-11-29T08:00:00+00:00\n")
    frame = results.load("ablation", tmp_path)
    assert frame[results.RUN_ID].tolist() == ["0001", "0001"]  # digits stay text
    assert frame[results.COMPILE_S].tolist() == [1.5, 2.5]
    assert frame[results.SAME_PEAKS].dtype == bool and frame[results.SAME_PEAKS].tolist() == [True, False]
    assert frame[results.SPEEDUP_VS_EAGER].tolist() == [2.0, 3.0]
    assert frame[results.SOURCE_FILE].tolist() == ["cpu-ablation-2026-11-29.csv"] * 2
    frame = results.load("gpu-blurball", tmp_path)  # nothing: an empty frame with the key columns
    assert frame.empty and {results.RUN_ID, results.SOURCE_FILE, results.DATE} <= set(frame.columns)
    assert results.latest_run(frame).empty
    assert results.load("gpu-blurball", tmp_path / "missing").empty


# ------------------------------------------------------------------------------ latest_run
def test_latest_run_goes_by_date_not_by_file_name_and_per_run_ids_make_the_latest_recording(tmp_path):
    results.write_run("cpu-blurball", [{"v": 1}], {"date": "2026-11-29T08:00:00+00:00"}, results_dir=tmp_path)
    results.write_run("cpu-blurball", [{"v": 2}], {"date": "2026-11-29T09:00:00+00:00"}, results_dir=tmp_path)
    results.write_run("cpu-blurball", [{"v": 3}], {"date": "2026-11-29T07:00:00+00:00"}, results_dir=tmp_path)
    frame = results.load("cpu-blurball", tmp_path)
    assert sorted(frame[results.SOURCE_FILE])[-1] == "cpu-blurball-2026-11-29.csv"  # name order is not time order
    latest = results.latest_run(frame)
    assert latest["v"].tolist() == [2] and latest[results.SOURCE_FILE].iloc[0] == "cpu-blurball-2026-11-29-2.csv"
    assert results.runs(frame)[results.RUN_ID].tolist() == [
        "cpu-blurball-2026-11-29-3", "cpu-blurball-2026-11-29", "cpu-blurball-2026-11-29-2"]
    from graphbook.record import runs

    folder = tmp_path / "per_run"
    env = {"date": "2026-11-30T10:00:00+00:00", "cpu_model": "X", "threads": 1}
    old = results.write_run("cpu-blurball", [{"variant": "a", "median_ms": 9.0}], {**env, "date": "2026-11-29T10:00:00+00:00"},
                            results_dir=folder)
    rows = [{"record": "profile", "variant": "a"}]
    rows += [{"record": "variant", results.RUN: k, "variant": v, "median_ms": float(k)} for k in (1, 2, 3) for v in "ab"]
    new = results.write_run("cpu-blurball", rows, env, results_dir=folder, per_run=True)
    frame = results.load("cpu-blurball", folder)
    ids = frame.loc[frame[results.SOURCE_FILE] == new.name, results.RUN_ID].tolist()
    assert ids == [new.stem] + [f"{new.stem}/r{k}" for k in (1, 1, 2, 2, 3, 3)]
    assert results.latest_run(frame)[results.RUN_ID].unique().tolist() == [f"{new.stem}/r3"]
    newest = results.latest_recording(frame)
    assert set(newest[results.SOURCE_FILE]) == {new.name} and len(newest) == 7
    assert runs.summarize_runs(newest[newest["record"] == "variant"])["runs"].tolist() == [3, 3]
    assert results.latest_recording(frame.iloc[:0]).empty
    assert old.name in set(frame[results.SOURCE_FILE])


# ------------------------------------------------------------------------------ compare_to_reference
def test_compare_to_reference_on_heatmaps():
    reference = torch.zeros(1, 3, 4, 4)
    reference[0, :, 1, 1] = 0.5
    same = reference + 1e-6
    check = checks.compare_to_reference(same, reference)
    assert check[results.SAME_OUTPUT] is True and check[results.SAME_PEAKS] is True
    assert check[results.SAME_PEAK_FRAMES] == 3 and check[results.PEAK_FRAMES] == 3
    assert check[results.MAX_ABS_DIFF] == pytest.approx(1e-6, rel=5e-2)
    moved = reference.clone()
    moved[0, 2, 3, 3] = 2.0
    check = checks.compare_to_reference(moved, reference)
    assert check[results.SAME_PEAKS] is False and check[results.SAME_PEAK_FRAMES] == 2
    assert check[results.SAME_OUTPUT] is False and check[results.MAX_ABS_DIFF] == pytest.approx(2.0)
    assert checks.compare_to_reference({0: same}, {0: reference})[results.SAME_PEAKS] is True


def test_compare_tolerance_is_relative_to_a_large_reference():
    reference = torch.full((2, 3), 1000.0)
    close = reference + 0.5   # 5e-4 of the scale
    assert checks.compare_to_reference(close, reference)[results.SAME_OUTPUT] is True
    small = torch.full((2, 3), 0.1)
    assert checks.compare_to_reference(small + 2e-3, small)[results.SAME_OUTPUT] is False
    assert checks.compare_to_reference(small + 5e-4, small)[results.SAME_OUTPUT] is True
    assert "same_peaks" not in checks.compare_to_reference(close, reference)


def test_compare_to_reference_accepts_arrays_and_bf16_and_checks_shape():
    import numpy as np

    reference = torch.rand(1, 3, 8, 8)
    check = checks.compare_to_reference(reference.to(torch.bfloat16), reference.numpy())
    assert 0 < check[results.MAX_ABS_DIFF] < 1e-2
    with pytest.raises(ValueError, match="shape"):
        checks.compare_to_reference(np.zeros((1, 3)), np.zeros((1, 4)))


# ------------------------------------------------------------------------------ append_rows (logs only)
def test_append_writes_the_header_once_blanks_missing_keys_and_a_rows_value_wins(tmp_path):
    path = tmp_path / "sub" / "r.csv"
    results.append_rows(path, [{"name": "a", "ms": 1.5}], env={"threads": 1})
    results.append_rows(path, [{"name": "b", "ms": 2.5, "threads": 4}, {"name": "c", "ms": 3}, {"name": "d"}],
                        env={"threads": 1})
    assert _read(path) == [["name", "ms", "threads"], ["a", "1.5", "1"], ["b", "2.5", "4"], ["c", "3", "1"],
                           ["d", "", "1"]]
    path = tmp_path / "r.csv"  # a header mismatch names the columns and writes nothing
    results.append_rows(path, [{"a": 1, "b": 2}])
    before = path.read_bytes()
    with pytest.raises(ValueError) as info:
        results.append_rows(path, [{"a": 1, "c": 2}])
    assert "'b'" in str(info.value) and "'c'" in str(info.value)
    with pytest.raises(ValueError, match="different order"):
        results.append_rows(path, [{"b": 1, "a": 2}])
    assert path.read_bytes() == before
    for empty in ([], [{}]):
        with pytest.raises(ValueError):
            results.append_rows(tmp_path / "new.csv", empty)
    assert not (tmp_path / "new.csv").exists()



def test_a_timed_rows_readings_are_kept_beside_its_file_and_recompute_its_statistics(tmp_path):
    from graphbook.measure import summaries

    readings = (3.0, 1.0, 2.0, 10.0)
    rows = [{"variant": "a", **summaries.summary(readings), "times_ms": readings}, {"variant": "untimed"}]
    path = results.write_run("fusion-demo", rows, results_dir=tmp_path)
    assert "times_ms" not in pd.read_csv(path).columns            # no list in a CSV cell
    kept = results.raw_times(path)
    assert results.raw_times_path(path).name == path.stem + results.RAW_TIMES_SUFFIX
    assert kept["row"].tolist() == [0] * 4 and kept["ms"].tolist() == list(readings)
    assert set(kept["series"]) == {""}
    assert summaries.summary(kept["ms"]) == {k: pd.read_csv(path).loc[0, k] for k in summaries.summary(readings)}
    again = results.write_run("fusion-demo", rows, results_dir=tmp_path)   # a second run: new files, none rewritten
    assert again != path and results.raw_times(again)["ms"].tolist() == list(readings)
    assert results.raw_times(results.write_run("fusion-demo", rows[1:], results_dir=tmp_path)) is None


def test_a_row_timing_two_things_keeps_each_ones_readings_under_its_prefix(tmp_path):
    rows = [{"variant": "a", "eager_median_ms": 2.0, "eager_times_ms": (1.0, 2.0, 3.0),
             "compiled_median_ms": 1.0, "compiled_times_ms": (1.0, 1.0, 5.0)}]
    path = results.write_run("ablation", rows, results_dir=tmp_path)
    assert not [c for c in pd.read_csv(path).columns if c.endswith("times_ms")]
    kept = results.raw_times(path)
    assert {series: group["ms"].tolist() for series, group in kept.groupby("series")} == {
        "eager_": [1.0, 2.0, 3.0], "compiled_": [1.0, 1.0, 5.0]}
