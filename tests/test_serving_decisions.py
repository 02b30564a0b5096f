"""Chapter 7's decisions quote one machine's quiet runs, never a median over two CPUs."""
import json
import re

import pandas as pd

from graphbook import paths
from graphbook.record import runs
from graphbook.serving import decisions

A = {"cpu_model": "CPU", "cpu_family": 25, "cpu_model_id": 17, "cpu_isa": "avx512", "threads": 2}
B = {**A, "cpu_model_id": 97}


def matrix(machine, eager_ms, ort_ms, prefix, runs_n=3):
    rows = []
    for run in range(1, runs_n + 1):
        for variant, ms in (("eager_fp32", eager_ms), ("ort_exporter_optimized_all", ort_ms),
                            ("compile_default", (eager_ms + ort_ms) / 2)):
            rows.append({"record": "variant", "variant": variant, "median_ms": ms, "q1_ms": ms * 0.99,
                         "q3_ms": ms * 1.01, "same_output": True, "run_id": f"{prefix}/r{run}", **machine})
    return pd.DataFrame(rows)


def test_the_cpu_worker_and_the_portable_export_quote_only_the_deciding_machine():
    frame = pd.concat([matrix(A, 500, 150, "a"), matrix(B, 1000, 300, "b")])
    mine = decisions.cpu_worker(frame, here=A)
    assert (mine.best, mine.best_median_ms, mine.machine) == ("ort_exporter_optimized_all", 150.0, runs.machine_label(A))
    other = decisions.cpu_worker(frame, here=B)
    assert (other.best_median_ms, other.machine) == (300.0, runs.machine_label(B))   # never a median over both
    assert decisions.portable_export(frame, here=B) == {runs.MACHINE: runs.machine_label(B), "matched_eager": True,
                                                        "median_ms": 300.0}
    assert decisions.cpu_worker(frame.iloc[0:0]) is None


def lower_matrix(machine, prefix, *, int8_ball=False, runs_n=3, twin_correct=True):
    rows = []
    for run in range(1, runs_n + 1):
        for variant, precision, ms, same_output, same_ball in (
                ("eager_fp32", "fp32", 1000, True, True), ("ort_exporter_optimized_all", "fp32", 300, True, True),
                ("openvino_fp32", "fp32", 350, twin_correct, twin_correct),
                ("openvino_bf16", "bf16", 150, False, True), ("openvino_int8", "int8", 100, False, int8_ball)):
            rows.append({"record": "variant", "variant": variant, "precision": precision, "median_ms": ms,
                         "q1_ms": ms * 0.99, "q3_ms": ms * 1.01, "same_output": same_output, "same_ball": same_ball,
                         "ball_frames": 12, "ball_agree_frames": 12 if same_ball else 10, "max_abs_diff": 0.0,
                         "macs": 28e9, "dead_macs": 1e9, "run_id": f"{prefix}/r{run}", "cpu_ghz": 3.0, **machine})
    return pd.DataFrame(rows)


def test_the_lower_precision_worker_is_judged_on_the_decoded_ball_and_its_fp32_twin():
    made = decisions.lower_precision_worker(lower_matrix(A, "a"), here=A)
    # INT8 is faster but moved the ball: the bf16 variant is the pick, INT8 left out for its failed task check
    assert made["lower"].best == "openvino_bf16" and made["lower"].excluded == {"openvino_int8": "task check failed"}
    assert made["fp32"].best == "ort_exporter_optimized_all" and made["faster_than_fp32"]
    assert made["share_of_fp32_ceiling"] > 0
    int8 = decisions.lower_precision_worker(lower_matrix(A, "a", int8_ball=True), here=A)
    assert int8["lower"].best == "openvino_int8"
    slow = lower_matrix(A, "a")
    slow.loc[slow.variant == "openvino_bf16", ["median_ms", "q1_ms", "q3_ms"]] = [400, 396, 404]
    assert not decisions.lower_precision_worker(slow, here=A)["faster_than_fp32"]
    # OpenVINO's bf16 and INT8 inherit a fault of its FP32 compile: with a wrong twin neither is served
    wrong_twin = decisions.lower_precision_worker(lower_matrix(A, "a", twin_correct=False), here=A)["lower"]
    assert wrong_twin.best is None and wrong_twin.excluded == {"openvino_bf16": "FP32 twin failed",
                                                               "openvino_int8": "task check failed"}


def test_without_the_decoded_ball_check_no_lower_precision_is_decided():
    old = lower_matrix(A, "a").drop(columns=["same_ball"])
    assert decisions.lower_precision_worker(old, here=A) is None and decisions.lower_precision_worker(None) is None


POOLED_MEDIAN = re.compile(r"""(\.median_ms|\[["']median_ms["']\])\.median\(\)""")


def test_no_chapter_takes_a_median_of_recorded_times_outside_the_runs_layer():
    # a bare .median() over recorded rows pools every machine; graphbook.record.runs keys on the machine
    found = []
    for notebook in sorted((paths.REPO_ROOT / "chapters").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(notebook.read_text())["cells"]):
            if cell["cell_type"] == "code" and POOLED_MEDIAN.search("".join(cell["source"])):
                found.append(f"{notebook.name} cell {index}")
    assert not found, found
