"""The README's lab sequence on a CPU: fake GPU runs, written by the lab scripts' own writer beside the committed
results, reach in-memory copies of chapters 4, 5 and 7 (their cells tagged ``lab-path``) through
``GRAPHBOOK_RESULTS_DIR``."""
import shutil

import pandas as pd
import pytest

from graphbook import paths
from graphbook.lab import gpu_measure as gpu
from graphbook.lab import gpu_profiling as gp
from graphbook.lab import gpu_runtimes as trt
from graphbook.measure.environment import fingerprint

ROOT = paths.REPO_ROOT
FAKE_GPU = "Fake Lab GPU 9000"
# Distinctive fake medians (ms): eager FP32 / FP16 reduce-overhead = 5.0, unlike the article's 3.5.
FAKE_MS = {**{c["variant"]: 3.0 + i for i, c in enumerate(gpu.plan_matrix())},
           "fp32_eager_nchw": 12.345, "fp16_compile_reduce_overhead_nchw": 2.469}
FAKE_SPEEDUP = "5.0x"


def fake_env():
    return {**fingerprint(), "gpu_name": FAKE_GPU, "gpu_driver": "999.99", "cuda_version": "13.0",
            "gpu_sm_count": 132, "weights": "seeded-random"}


def timed(ms, **columns):
    """A variant's rows as the lab scripts write them: one per run of the book's run protocol, in rotation."""
    return [dict(columns, run=run, run_count=3, median_ms=ms, min_ms=ms * 0.98, max_ms=ms * 1.05, q1_ms=ms * 0.99,
                 q3_ms=ms * 1.01, repeats=50, warmup=20) for run in (1, 2, 3)]


def write_fake_blurball_run(results_dir):
    rows = pd.DataFrame([row for c in gpu.plan_matrix() for row in timed(
        FAKE_MS[c["variant"]], **c, record="variant", expected_to_match_eager=c["precision"] == "fp32",
        compile_s=12.0 if "compile" in c["mode"] else 0.1,
        second_call_s=0.4 if c["mode"] in ("compile_reduce_overhead", "compile_max_autotune") else None,
        max_abs_diff=1e-5 if c["precision"] == "fp32" else 2e-3, same_output=c["precision"] == "fp32",
        same_peaks=True)]).sort_values("run", kind="stable")
    profile = pd.DataFrame(gp._summarize_kernels([("aten::cudnn_convolution", "sm90_xmma_fprop", 0, 800),
                                                  ("aten::cudnn_batch_norm", "bn_fw_inf", 800, 1100),
                                                  ("aten::copy_", "direct_copy_kernel", 1100, 1200)], wall_ms=1.3))
    profile = profile.assign(record="profile", variant="fp32_eager_nchw", precision="fp32")
    return gp.write_results(gpu.KIND, pd.concat([profile, rows]), fake_env(), results_dir, FAKE_GPU)


def write_fake_tensorrt_run(results_dir):
    rows = [row for variant, ms, extra in [
        ("eager_fp32", 12.345, {"precision": "fp32", "same_output": True, "speedup_vs_eager": 1.0}),
        ("eager_fp16_half", 6.111, {"precision": "fp16", "fp16_method": "model.half()"}),
        ("ort_cuda_fp32", 10.222, {"precision": "fp32", "same_output": True}),
        ("ort_tensorrt_fp16", 2.333, {"precision": "fp16", "compile_s": 40.0,
                                      "engine_cache": "built (empty per-run cache folder)"}),
        ("tensorrt_fp16", 1.987, {"precision": "fp16", "compile_s": 35.0, "build_s_timing_cache": 9.0,
                                  "trt_typing": "strong"}),
        ("tensorrt_int8_qdq", float("nan"), {"precision": "int8",
                                             "note": "skipped: TensorRT takes only symmetric INT8 Q/DQ"})]
        for row in timed(ms, variant=variant, max_abs_diff=1e-3, same_peaks=True, stream="dedicated", **extra)]
    frame = pd.DataFrame(rows).sort_values("run", kind="stable")
    return gp.write_results(trt.KIND, frame, fake_env(), results_dir, FAKE_GPU)


LAB_TAG = "lab-path"


def lab_cells(nb):
    """The cells of a chapter a lab re-execution depends on: its set-up and its readers of GPU results."""
    return [cell for cell in nb.cells if LAB_TAG in cell.get("metadata", {}).get("tags", [])]


def execute_copy(chapter, results_dir):
    """Execute a copy of a chapter's lab-path cells in memory (the file is never written); returns (notebook, error)."""
    import nbclient
    import nbformat

    nb = nbformat.read(ROOT / "chapters" / chapter, as_version=4)
    nb.cells = lab_cells(nb)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "chapters")}})
    try:
        client.execute()
        return nb, None
    except Exception as error:  # report every chapter, not just the first that fails
        return nb, f"{type(error).__name__}: {str(error)[-1500:]}"


def output_text(nb):
    parts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            parts.append(str(output.get("text", "")))
            for mime, value in output.get("data", {}).items():
                if mime.startswith("text/") or "papermill" in mime:
                    parts.append(str(value))
    return "\n".join(parts)


@pytest.mark.parametrize("chapter", ["04_onnx_and_runtimes.ipynb", "05_blurball_measurements.ipynb",
                                     "07_serving.ipynb"])
def test_each_lab_chapter_tags_its_set_up_and_its_gpu_readers(chapter):
    import nbformat

    cells = lab_cells(nbformat.read(ROOT / "chapters" / chapter, as_version=4))
    sources = ["".join(cell.source) for cell in cells]
    assert cells and "setup_chapter" in sources[0], "the first lab-path cell must be the chapter's set-up"
    assert any("gpu" in source for source in sources[1:]), "no lab-path cell reads the GPU results"


@pytest.mark.slow
def test_lab_runs_reach_chapters_4_5_and_7(tmp_path, monkeypatch):
    results_dir = tmp_path / "results"
    shutil.copytree(ROOT / "data" / "results", results_dir)
    blurball_file = write_fake_blurball_run(results_dir)
    tensorrt_file = write_fake_tensorrt_run(results_dir)
    monkeypatch.setenv("GRAPHBOOK_RESULTS_DIR", str(results_dir))

    problems = []
    executed = {}
    for chapter in ("04_onnx_and_runtimes.ipynb", "05_blurball_measurements.ipynb", "07_serving.ipynb"):
        nb, error = execute_copy(chapter, results_dir)
        executed[chapter] = output_text(nb)
        if error:
            problems.append(f"{chapter} raised {error}")

    ch4, ch5, ch7 = executed.values()
    # Chapter 4 shows the TensorRT run.
    if tensorrt_file.name not in ch4 or "tensorrt_fp16" not in ch4 or FAKE_GPU not in ch4:
        problems.append("chapter 4 does not show the recorded gpu-tensorrt run")
    # Chapter 5 shows the BlurBall run, beside the article's numbers, and never the TensorRT file as a run.
    if "One recorded GPU run is shown below" not in ch5 or blurball_file.name not in ch5:
        problems.append("chapter 5 does not count exactly the gpu-blurball run")
    if tensorrt_file.name in ch5:
        problems.append("chapter 5 counts the gpu-tensorrt file as a BlurBall run")
    if "12.345" not in ch5 or "article (ms)" not in ch5:
        problems.append("chapter 5 does not show the recorded run beside the article's numbers")
    # Chapter 7 decides from the recorded run, and drops its caveat only because a gpu-blurball run exists.
    if FAKE_GPU not in ch7 or FAKE_SPEEDUP not in ch7:
        problems.append("chapter 7's GPU decision does not use the recorded gpu-blurball run")
    if "no GPU re-execution recorded yet" in ch7:
        problems.append("chapter 7 still says no GPU re-execution is recorded")
    assert not problems, "\n".join(problems)
