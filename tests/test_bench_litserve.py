"""code/bench_litserve.py and graphbook.serving.litserve_compare: the book's server beside LitServe (Chapter 7)."""
import subprocess
import sys

import numpy as np
import pytest

from graphbook import results
from graphbook.environment import REPO_ROOT
from graphbook.serving import litserve_compare
from cli_checks import assert_usage_error, run_script

SCRIPT = REPO_ROOT / "code" / "bench_litserve.py"


@pytest.mark.parametrize("args", [["--runs", "2"], ["--concurrency", "1,x"], ["--concurrency", "16"],
                                  ["--height", "7"], ["--overload-clients", "-1"], ["--max-wait-ms", "-3"],
                                  ["--model", "resnet"]])
def test_bad_arguments_exit_2_with_one_line(args):
    assert_usage_error(run_script(SCRIPT, *args))


def test_the_json_body_carries_the_exact_float32_bytes():
    x = np.random.default_rng(0).standard_normal((1, 9, 8, 16)).astype(np.float32)
    body, headers = litserve_compare.base64_json_request(x)
    import json

    decoded = litserve_compare._decode_clip(json.loads(body), (9, 8, 16))
    assert headers["Content-Type"] == "application/json" and np.array_equal(decoded, x)
    with pytest.raises(ValueError, match="shape"):
        litserve_compare._decode_clip(json.loads(body), (9, 16, 8))


def test_cpu_identity_names_family_and_model_where_the_kernel_says():
    identity = litserve_compare.cpu_identity()
    assert set(identity) == {"cpu_vendor", "cpu_family", "cpu_model_number", "cpu_stepping"}


def test_every_operator_feature_is_described_for_both_servers():
    assert set(litserve_compare.OPERATOR_FEATURES) == {"readiness", "batching", "back-pressure", "metrics"}
    assert all(len(pair) == 2 and all(pair) for pair in litserve_compare.OPERATOR_FEATURES.values())


@pytest.mark.slow
def test_three_alternating_runs_of_both_servers_are_recorded(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny", "--height", "16", "--width", "24",
                           "--concurrency", "1,3", "--requests", "6", "--overload-clients", "6", "--max-queue", "3",
                           "--threads", "1", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
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
    assert {"copy_gbps", "loadavg_1m", "cpu_family", "cpu_model_number", "ready_s"} <= set(frame.columns)
