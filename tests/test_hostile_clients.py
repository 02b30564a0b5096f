"""graphbook.serving.hostile_clients and code/bench_litserve.py --faults: the same hostile clients against both servers (Chapter 7)."""
import numpy as np
import pandas as pd
import pytest

from graphbook import serving
from graphbook.measure.warmup import tiny_clip_net
from graphbook.record import results
from graphbook.serving import hostile_clients

H, W = 16, 24


@pytest.mark.slow
def test_the_book_server_answers_every_fault_as_documented_and_fails_only_past_its_upload_bound(capfd):
    service = serving.InferenceService(tiny_clip_net(), (H, W), max_queue=2)
    srv = serving.InferenceServer(service, request_timeout_s=1.0, max_connections=12).start()
    srv.wait_until_ready(timeout=60)
    clip = np.zeros((1, 9, H, W), np.float32)
    try:
        rows = {r["fault"]: r for r in hostile_clients._measure_faults(
            srv.url, clip, serving.binary_request(clip), max_queue=2, max_stalled=30, hold_s=5.0)}
    finally:
        srv.stop()
    assert list(rows) == list(hostile_clients.FAULTS)
    assert all(r["recovered_status"] == 200 for r in rows.values())
    stalled = rows["stalled-body"]
    assert stalled["valid_status"] == 200 and stalled["first_failing_stalled"] == srv.max_uploads == 10
    assert stalled["failing_answer"] == "503+Retry-After" and stalled["answers"] == "408 x10"
    assert stalled["stalled_answered_early"] == 0 and stalled["dropped_after_s"] < 5 * srv.request_timeout_s
    assert rows["huge-content-length"]["answers"] == "413 x8" and rows["garbage-request-line"]["answers"] == "400 x8"
    burst = dict(part.rsplit(" x", 1) for part in rows["burst"]["answers"].split(", "))
    assert set(burst) <= {"200", "503+Retry-After"} and sum(map(int, burst.values())) == 6
    assert "Traceback" not in capfd.readouterr().err


def test_the_chapter_table_agrees_across_runs_and_shows_the_spread():
    rows = []
    for run, (book_fails, lit_ms) in enumerate([(48, 10.0), (48, 12.0), (48, 30.0)], start=1):
        for server, fails, held in (("book", book_fails, 11.7), ("litserve", 63, float("nan"))):
            rows.append({"server": server, "run": run, "fault": "stalled-body", "hostile_clients": fails,
                         "answers": "408 x48" if server == "book" else "waiting x63", "valid_status": 200,
                         "valid_ms": lit_ms, "first_failing_stalled": fails, "failing_answer": "503",
                         "dropped_after_s": held, "hold_s": 15.0, "recovered_status": 200})
            rows.append({**rows[-1], "fault": "burst", "first_failing_stalled": float("nan"), "failing_answer": float("nan"),
                         "answers": f"200 x{40 + run}"})
    table = hostile_clients.fault_table(pd.DataFrame(rows))
    assert table["fault"].tolist() == ["burst", "burst", "stalled-body", "stalled-body"]
    stalled = table[table.fault == "stalled-body"].set_index("server")
    assert stalled.loc["the book's server", "first failing stalled"] == "48" and stalled.loc["LitServe", "first failing stalled"] == "63"
    assert stalled.loc["the book's server", "valid ms"] == "12 (10-30)"
    assert stalled.loc["the book's server", "stalled dropped after s"] == "12"
    assert stalled.loc["LitServe", "stalled dropped after s"] == "held past 15 s"
    assert table.loc[0, "their answers"] == "200 x41-43" and table.loc[0, "first failing stalled"] == ""


@pytest.mark.slow
def test_three_alternating_runs_of_both_servers_facing_the_faults_are_recorded(tmp_path, run_main):
    code, _, err = run_main("bench_litserve.py", "--faults", "--model", "tiny", "--height", "16", "--width", "24",
                            "--max-queue", "2", "--max-stalled", "4", "--hold", "0.5", "--threads", "1",
                            "--results-dir", tmp_path)
    assert code == 0, err[-2000:]
    frame = results.load("hostile-clients", tmp_path)
    assert len(frame) == 2 * 3 * len(hostile_clients.FAULTS) and sorted(frame["run"].unique()) == [1, 2, 3]
    firsts = frame[frame["run_order"] == 1].groupby("run")["server"].first().tolist()
    assert firsts == ["book", "litserve", "book"]
    assert (frame["recovered_status"] == 200).all() and (frame["valid_status"][frame.fault != "burst"] == 200).all()
    # neither server's limit is reached by four stalled uploads
    assert frame.loc[frame.fault == "stalled-body", "first_failing_stalled"].isna().all()
