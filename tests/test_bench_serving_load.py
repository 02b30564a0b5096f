"""code/bench_serving_load.py: the server under loopback load, batching off and on (Chapter 7)."""
import subprocess
import sys

import pytest
import torch

from graphbook import paths
from graphbook.measure.warmup import tiny_clip_net
from graphbook.record import results
from graphbook.runtimes import onnx_utils

SCRIPT = paths.script("bench_serving_load.py")


@pytest.mark.slow
def test_load_run_records_both_batching_modes_and_the_overload_level(tmp_path):
    artifact = onnx_utils.export_dynamic_batch(tiny_clip_net(hidden=4), torch.randn(2, 9, 16, 24), tmp_path / "tiny.onnx")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--artifact", str(artifact), "--height", "16", "--width", "24",
                           "--concurrency", "1,3", "--requests", "6", "--overload-clients", "12", "--max-queue", "3",
                           "--threads", "1", "--results-dir", str(tmp_path / "res")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    frame = results.load("serving-load", tmp_path / "res")
    assert len(frame) == 6 and sorted(frame["batching"].unique()) == [False, True]
    normal = frame[~frame["overload_level"]]
    assert (normal["ok"] == normal["sent"]).all() and (frame["errors"] == 0).all()
    # The overload level is recorded for both modes and every request is answered, 200 or 503, never an
    # error. Whether a tiny model's queue overflows depends on the machine's speed, so the 503 itself is
    # checked deterministically in test_serving.py (worker paused, queue full -> 503 with Retry-After).
    overload = frame[frame["overload_level"]]
    assert len(overload) == 2 and ((overload["ok"] + overload["overloaded"]) == overload["sent"]).all()


@pytest.mark.slow
def test_both_runtimes_are_served_with_batching_off_and_on(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--runtimes", "eager,onnxruntime",
                           "--height", "16", "--width", "24", "--concurrency", "1,3", "--requests", "6",
                           "--overload-clients", "0", "--threads", "1", "--results-dir", str(tmp_path / "res")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    frame = results.load("serving-load", tmp_path / "res")
    assert len(frame) == 8 and (frame["ok"] == frame["sent"]).all()
    assert frame.groupby("served")["runtime"].first().to_dict() == {"eager": "torch", "onnxruntime": "onnxruntime"}
    assert sorted(frame.groupby(["served", "batching"]).size().tolist()) == [2, 2, 2, 2]
    # a lone client is never joined with anybody: batch 1 in either mode
    assert (frame[frame["concurrency"] == 1]["mean_joined_batch"] == 1.0).all()
