"""Tests of the append-only results writer (graphbook.results)."""
import csv

import pytest

from graphbook import results


def _read(path):
    with open(path, newline="") as handle:
        return list(csv.reader(handle))


def test_append_creates_header_once_and_appends(tmp_path):
    path = tmp_path / "sub" / "r.csv"
    results.append_rows(path, [{"name": "a", "ms": 1.5}], env={"cpu": "X", "threads": 1})
    results.append_rows(path, [{"name": "b", "ms": 2.5}, {"name": "c", "ms": 3}],
                        env={"cpu": "X", "threads": 1})
    rows = _read(path)
    assert rows[0] == ["name", "ms", "cpu", "threads"]
    assert rows[1:] == [["a", "1.5", "X", "1"], ["b", "2.5", "X", "1"], ["c", "3", "X", "1"]]


def test_missing_keys_are_empty_and_row_value_wins_over_env(tmp_path):
    path = tmp_path / "r.csv"
    results.append_rows(path, [{"a": 1, "threads": 4}, {"a": 2, "b": 3}], env={"threads": 1})
    rows = _read(path)
    assert rows[0] == ["a", "threads", "b"]
    assert rows[1] == ["1", "4", ""]
    assert rows[2] == ["2", "1", "3"]


def test_header_mismatch_names_columns_and_writes_nothing(tmp_path):
    path = tmp_path / "r.csv"
    results.append_rows(path, [{"a": 1, "b": 2}])
    before = path.read_bytes()
    with pytest.raises(ValueError) as info:
        results.append_rows(path, [{"a": 1, "c": 2}])
    assert "'b'" in str(info.value) and "'c'" in str(info.value)
    with pytest.raises(ValueError, match="different order"):
        results.append_rows(path, [{"b": 1, "a": 2}])
    assert path.read_bytes() == before


def test_empty_input_is_refused(tmp_path):
    with pytest.raises(ValueError):
        results.append_rows(tmp_path / "r.csv", [])
    with pytest.raises(ValueError):
        results.append_rows(tmp_path / "r.csv", [{}])
    assert not (tmp_path / "r.csv").exists()


def test_unique_path_never_returns_an_existing_file(tmp_path):
    first = results.unique_path(tmp_path, "run")
    assert first.name == "run.csv" and not first.exists()
    first.write_text("x")
    second = results.unique_path(tmp_path, "run")
    assert second.name == "run-2.csv"
    second.write_text("y")
    assert results.unique_path(tmp_path, "run", "txt").name == "run.txt"
    assert results.unique_path(tmp_path, "run").name == "run-3.csv"
    with pytest.raises(ValueError):
        results.unique_path(tmp_path, "a/b")


def test_read_results_concatenates_with_source_file(tmp_path):
    results.append_rows(tmp_path / "x-1.csv", [{"a": 1}])
    results.append_rows(tmp_path / "x-2.csv", [{"a": 2, "b": 5}])
    frame = results.read_results("x-*.csv", base=tmp_path)
    assert list(frame["a"]) == [1, 2]
    assert list(frame["source_file"]) == ["x-1.csv", "x-2.csv"]
    absolute = results.read_results(str(tmp_path / "x-*.csv"))
    assert len(absolute) == 2
    empty = results.read_results("nothing-*.csv", base=tmp_path)
    assert len(empty) == 0 and "source_file" in empty.columns


def test_latest_source_goes_by_date_not_by_file_name(tmp_path):
    from graphbook import results

    results.append_rows(tmp_path / "bench-2026-11-29.csv", [{"v": 1, "date": "2026-11-29T08:00:00+00:00"}])
    results.append_rows(tmp_path / "bench-2026-11-29-2.csv", [{"v": 2, "date": "2026-11-29T09:00:00+00:00"}])
    frame = results.read_results("bench-*.csv", base=tmp_path)
    assert sorted(frame.source_file)[-1] == "bench-2026-11-29.csv"  # the trap: name order is not time order
    latest = results.latest_source(frame)
    assert latest["v"].tolist() == [2] and latest["source_file"].iloc[0] == "bench-2026-11-29-2.csv"
    assert results.latest_source(frame.iloc[0:0]).empty
