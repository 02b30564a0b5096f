"""code/bench_litserve.py and graphbook.serving.litserve_compare: the book's server beside LitServe (Chapter 7)."""
import json

import numpy as np
import pandas as pd
import pytest

from graphbook.record import results
from graphbook.serving import litserve_compare


def test_the_json_body_carries_the_exact_float32_bytes_and_the_summary_each_level_s_median_and_spread():
    x = np.random.default_rng(0).standard_normal((1, 9, 8, 16)).astype(np.float32)
    body, headers = litserve_compare._base64_json_request(x)
    decoded = litserve_compare._decode_clip(json.loads(body), (9, 8, 16))
    assert headers["Content-Type"] == "application/json" and np.array_equal(decoded, x)
    summary = litserve_compare.summarize(_fake_recording([50, 52, 51], [40, 41, 39])).set_index(["server", "clients"])
    book = summary[~summary.overload].xs("book")
    assert book["rps_median"].iloc[0] == 51 and (book["rps_min"].iloc[0], book["rps_max"].iloc[0]) == (50, 52)
    overload = summary[summary.overload].xs("book")
    assert int(overload["overloaded"].iloc[0]) == 258 and int(overload["sent"].iloc[0]) == 288


@pytest.mark.slow
def test_three_alternating_runs_of_both_servers_are_recorded(tmp_path, run_main):
    code, _, err = run_main("bench_litserve.py", "--model", "tiny", "--height", "16", "--width", "24",
                            "--concurrency", "1,3", "--requests", "6", "--overload-clients", "6", "--max-queue", "3",
                            "--threads", "1", "--results-dir", tmp_path)
    assert code == 0, err[-2000:]
    frame = results.load("litserve-compare", tmp_path)
    assert sorted(frame["server"].unique()) == ["book", "litserve"] and sorted(frame["run"].unique()) == [1, 2, 3]
    assert len(frame) == 2 * 3 * 3 and (frame["errors"] == 0).all()
    firsts = frame[frame["run_order"] == 1].groupby("run")["server"].first().tolist()
    assert firsts == ["book", "litserve", "book"]  # the order alternates between runs
    normal = frame[~frame["overload_level"].astype(bool)]
    assert (normal["ok"] == normal["sent"]).all()
    # LitServe has no queue bound: at the overload level it answers everything (200), later
    lit_overload = frame[(frame["server"] == "litserve") & frame["overload_level"].astype(bool)]
    assert (lit_overload["overloaded"] == 0).all()
    assert {"copy_gbps", "loadavg_1m", "cpu_family", "cpu_model_id", "ready_s"} <= set(frame.columns)


def _fake_recording(book_rps, lit_rps, loadavg=0.5):
    rows = []
    for run, (b, l) in enumerate(zip(book_rps, lit_rps), start=1):
        for server, rps in (("book", b), ("litserve", l)):
            for clients, overload in ((1, False), (8, False), (24, True)):
                ok, over = (96, 0) if server == "litserve" or not overload else (10, 86)
                rows.append({"server": server, "run": run, "concurrency": clients, "overload_level": overload,
                             "throughput_rps": rps, "p50_ms": 1000 / rps, "p99_ms": 2000 / rps, "sent": ok + over,
                             "ok": ok, "overloaded": over, "errors": 0, "mean_joined_batch": 1.0, "ready_s": 1.0,
                             "loadavg_1m": loadavg, "copy_gbps": 10.0, "cpu_cores": 2, "threads": 2,
                             "cpu_model": "Some CPU", "cpu_family": "6", "cpu_model_id": "143",
                             "date": "2026-12-01T00:00:00", "input_hw": "96x160",
                             "max_queue": 8 if server == "book" else float("nan")})
    return pd.DataFrame(rows)
