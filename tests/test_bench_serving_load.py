"""code/bench_serving_load.py: the server under loopback load, batching off and on (Chapter 7)."""
import pytest

from graphbook.record import results


@pytest.mark.slow
def test_both_runtimes_are_served_with_batching_off_and_on_and_the_overload_level_is_recorded(tmp_path, run_main):
    code, _, err = run_main("bench_serving_load.py", "--model", "tiny", "--runtimes", "eager,onnxruntime",
                            "--height", "16", "--width", "24", "--concurrency", "1,3", "--requests", "6",
                            "--overload-clients", "12", "--max-queue", "3", "--threads", "1",
                            "--results-dir", tmp_path / "res")
    assert code == 0, err[-2000:]
    frame = results.load("serving-load", tmp_path / "res")
    assert len(frame) == 12 and (frame["errors"] == 0).all()
    assert frame.groupby("served")["runtime"].first().to_dict() == {"eager": "torch", "onnxruntime": "onnxruntime"}
    assert sorted(frame.groupby(["served", "batching"]).size().tolist()) == [3, 3, 3, 3]
    normal = frame[~frame["overload_level"]]
    assert (normal["ok"] == normal["sent"]).all()
    # a lone client is never joined with anybody: batch 1 in either mode
    assert (frame[frame["concurrency"] == 1]["mean_joined_batch"] == 1.0).all()
    # The overload level is recorded and every request answered, 200 or 503; whether a tiny model's queue overflows
    # depends on the machine, so the 503 itself is checked in test_serving_faults.py (worker paused, queue full).
    overload = frame[frame["overload_level"]]
    assert len(overload) == 4 and ((overload["ok"] + overload["overloaded"]) == overload["sent"]).all()
