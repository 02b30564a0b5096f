"""Chapter 7's decisions quote one machine's quiet runs, never a median over two CPUs."""
import json
import re

import pandas as pd

from graphbook import paths
from graphbook.record import runs
from graphbook.serving import decisions

A = {"cpu_model": "CPU", "cpu_family": 25, "cpu_model_id": 17, "cpu_isa": "avx512", "threads": 2}
B = {**A, "cpu_model_id": 97}
VERDICT = {"present": True, "torch": "2.13.0", "max_abs_diff": 1.0}


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
    text = decisions.cpu_worker(frame, None, VERDICT, here=A)
    assert "median 150 ms" in text and "eager 500 ms" in text and runs.machine_label(A) in text
    assert "1000" not in text and "300 ms" not in text
    pooled = frame[frame.variant == "eager_fp32"].median_ms.median()  # what a median over both machines says
    assert f"eager {pooled:.0f} ms" not in text
    other = decisions.cpu_worker(frame, None, VERDICT, here=B)
    assert "median 300 ms" in other and "eager 1000 ms" in other
    portable = decisions.phones_and_browsers(frame, here=B)
    assert "median 300 ms" in portable and runs.machine_label(B) in portable
    assert decisions.cpu_worker(frame.iloc[0:0], None, VERDICT).startswith("undecided")


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


def test_the_lower_precision_worker_is_judged_on_the_decoded_ball():
    text = decisions.lower_precision_worker(lower_matrix(A, "a"), here=A)
    # INT8 is faster but moved the ball: the bf16 variant is served, the INT8 one named as left out
    assert text.startswith("serve openvino bf16") and "median 150 ms" in text and "6.7x eager FP32" in text
    assert "2.0x the best FP32 variant (onnxruntime exporter-optimized)" in text and "openvino int8" in text
    assert "% of the machine's FP32 ceiling (no bf16 ceiling is known for this CPU)" in text
    assert runs.machine_label(A) in text
    zen5 = decisions.lower_precision_worker(lower_matrix({**A, "cpu_microarch": "Zen 5"}, "a"), here=A)
    assert "% of the machine's bf16 ceiling (" in zen5 and "% of its FP32 one)" in zen5
    assert decisions.lower_precision_worker(lower_matrix(A, "a", int8_ball=True), here=A).startswith("serve openvino int8")
    slow = lower_matrix(A, "a")
    slow.loc[slow.variant == "openvino_bf16", ["median_ms", "q1_ms", "q3_ms"]] = [400, 396, 404]
    assert decisions.lower_precision_worker(slow, here=A).startswith("keep FP32: the fastest lower precision")
    # OpenVINO's bf16 and INT8 inherit a fault of its FP32 compile: with a wrong twin neither is served
    wrong_twin = decisions.lower_precision_worker(lower_matrix(A, "a", twin_correct=False), here=A)
    assert wrong_twin.startswith("keep FP32: no bf16 or INT8 variant kept the decoded ball with a correct FP32 twin")


def test_without_the_decoded_ball_check_no_lower_precision_is_decided():
    old = lower_matrix(A, "a").drop(columns=["same_ball"])
    assert decisions.lower_precision_worker(old, here=A).startswith("undecided")
    assert decisions.lower_precision_worker(None).startswith("undecided")


POOLED_MEDIAN = re.compile(r"""(\.median_ms|\[["']median_ms["']\])\.median\(\)""")


def test_no_chapter_takes_a_median_of_recorded_times_outside_the_runs_layer():
    # a bare .median() over recorded rows pools every machine; graphbook.record.runs keys on the machine
    found = []
    for notebook in sorted((paths.REPO_ROOT / "chapters").glob("*.ipynb")):
        for index, cell in enumerate(json.loads(notebook.read_text())["cells"]):
            if cell["cell_type"] == "code" and POOLED_MEDIAN.search("".join(cell["source"])):
                found.append(f"{notebook.name} cell {index}")
    assert not found, found
