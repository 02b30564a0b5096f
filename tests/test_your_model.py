"""The your-model command (Chapter 8): its refusals, its checks, its planted fault, its bisection and its recipes,
on the tiny models of yourmodel_cases.py."""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch._inductor.config as inductor_config

import yourmodel_cases as cases
from conftest import slow_fixture
from graphbook.record import cli, results
from graphbook.yourmodel import bisect, capture, fault, recipes, spec
from graphbook.yourmodel.run import SAME_TASK, _variant_names

TINY = "yourmodel_cases:tiny_residual"
#: Where yourmodel_cases is: a recipe runs in a fresh Python that imports the reader's factory.
FACTORY_PATH = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
QUICK = ["--quick", "--repeats", "2", "--warmup", "1", "--bisect-seconds", "60"]


# ------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("argv, message", [
    (["--model", "yourmodel_cases", "--shape", "3,8,8"], "expected MODULE:CALLABLE"),
    (["--model", "no_such_module:f", "--shape", "3,8,8"], "cannot import 'no_such_module'"),
    (["--model", "yourmodel_cases:missing", "--shape", "3,8,8"], "has no 'missing'"),
    (["--model", "yourmodel_cases:not_a_module", "--shape", "3,8,8"], "not a torch.nn.Module"),
    (["--model", "yourmodel_cases:raises", "--shape", "3,8,8"], "raised RuntimeError: weights file missing"),
    (["--model", TINY, "--shape", "5,8,8"], "refuses inputs of shape [(1, 5, 8, 8)]"),
    (["--model", TINY, "--inputs", "{dir}/none.pt"], "no inputs file"),
    (["--model", TINY, "--inputs", "{dir}/text.pt"], "cannot read"),
    (["--model", TINY, "--shape", "3,8,8", "--check", "topk:0"], "positive K"),
    (["--model", TINY, "--shape", "3,8,8", "--batch", "5"], "cannot give"),
])
def test_an_unusable_model_or_input_exits_2_with_one_line_and_writes_nothing(argv, message, run_main, tmp_path):
    (tmp_path / "text.pt").write_text("not a tensor file")
    results_dir = tmp_path / "results"
    code, out, err = run_main("your_model.py", *[a.format(dir=tmp_path) for a in argv],
                              "--results-dir", results_dir)
    assert code == cli.EXIT_USAGE and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not results_dir.exists()


def test_the_inputs_split_into_calibration_and_check_batches_and_random_inputs_say_so():
    inputs = (torch.arange(10.0).reshape(10, 1),)
    samples = spec.split(inputs, batch=2, calibration=4, random=False)
    assert [b.flatten().tolist() for b in samples.calibration] == [[0, 1], [2, 3]]
    assert [b.flatten().tolist() for b in samples.check] == [[4, 5], [6, 7], [8, 9]]
    assert samples.example is samples.check[0] and samples.check_samples == 6
    assert spec.split(inputs, batch=1, calibration=None, random=True).check_samples == 5
    two = spec.split((torch.zeros(4, 3), torch.ones(4, 2)), batch=2, calibration=2, random=False)
    assert isinstance(two.example, tuple) and [t.shape[1] for t in two.example] == [3, 2]


# ------------------------------------------------------------------------------------------ checks
def test_top_k_passes_when_eagers_class_is_among_the_k_best_and_counts_the_samples_that_are_not():
    reference = [torch.tensor([[0.0, 1.0, 0.5], [2.0, 0.0, 1.0]])]
    swapped = [torch.tensor([[0.0, 0.9, 1.0], [2.0, 0.0, 1.0]])]    # sample 0's best is now second
    assert spec.parse_check("top1").judge(reference, reference)["passed"]
    top1 = spec.parse_check("top1").judge(swapped, reference)
    assert not top1["passed"] and top1["failures"] == 1 and top1["samples"] == 2
    assert spec.parse_check("topk:2").judge(swapped, reference)["passed"]


def test_elementwise_judges_every_tensor_of_a_dict_output_and_judges_fp32_only():
    check = spec.parse_check("elementwise")
    reference = [{"boxes": torch.ones(2, 4), "scores": torch.ones(2)}]
    off = [{"boxes": torch.ones(2, 4), "scores": torch.ones(2) + 0.01}]
    assert check.judge(reference, reference)["passed"] and not check.task
    verdict = check.judge(off, reference)
    assert not verdict["passed"] and verdict["statistic"] == pytest.approx(0.01, rel=1e-3)


def test_a_readers_check_may_return_a_bool_or_a_dict_and_anything_else_is_refused():
    assert spec._custom(lambda o, r: True, "mine")([1], [1])["passed"]
    assert spec._custom(lambda o, r: {"passed": False, "statistic": 3.0}, "mine")([1], [1])["statistic"] == 3.0
    with pytest.raises(spec.YourModelError, match="must return a bool"):
        spec._custom(lambda o, r: 0.5, "mine")([1], [1])
    assert spec.parse_check("yourmodel_cases:tiny_residual").task


# ------------------------------------------------------------------------------------------ planted fault
@pytest.mark.slow  # torch.export
def test_the_planted_fault_drops_a_residual_summand_or_else_scales_a_convolution():
    x = torch.randn(2, 3, 8, 8)
    model = cases.tiny_residual().eval()
    dropped = fault.plant(model, x)
    assert dropped.kind == "dropped summand" and "1 of 1 residual adds" in dropped.where
    with torch.no_grad():
        without = model.head(model.body(model.stem(x)).relu().mean(dim=(2, 3)))  # the add left out by hand
        assert torch.allclose(dropped.model(x), without, atol=1e-6)
        assert not torch.allclose(dropped.model(x), model(x), atol=1e-3)
    plain = cases.plain_convs().eval()
    scaled = fault.plant(plain, x)
    assert scaled.kind == "scaled convolution" and scaled.where.startswith("net.2")
    with torch.no_grad():
        assert not torch.allclose(scaled.model(x), plain(x), atol=1e-4)


# ------------------------------------------------------------------------------------------ bisection
def test_the_bisection_tries_a_switch_this_process_changed_first_and_stops_at_the_first_that_passes():
    with inductor_config.patch(post_grad_custom_post_pass=cases.halve_first_convolution, pattern_matcher=True):
        assert bisect.candidates()[0] == ("post_grad_custom_post_pass", None)
        tried = []
        rows = bisect.bisect(lambda patch: tried.append(patch) or {"passed": "pattern_matcher" in patch},
                             time_limit=60, log=lambda line: None)
    assert [r["status"] for r in rows] == ["still wrong", "passes"] and rows[-1]["switch"] == "pattern_matcher=False"
    expired = bisect.bisect(lambda patch: {"passed": False}, time_limit=-1, log=lambda line: None)
    assert [r["status"] for r in expired] == ["not tried: time limit"]


# ------------------------------------------------------------------------------------------ kernels
def test_groups_computed_by_one_launch_or_split_and_a_library_call_keeps_only_its_own_operator():
    rows = pd.DataFrame([
        # group 0 (conv + bn + relu): the convolution by a library call, BN and ReLU by a generated kernel
        ("cpp_fused_0", 1, "convolution", "conv", False), ("extern_kernels.convolution", 2, "convolution", "conv", True),
        ("cpp_fused_1", 3, "add", "bn", False), ("cpp_fused_1", 3, "relu", "relu", False),
        # group 1 (add + relu): one generated kernel
        ("cpp_fused_2", 4, "add_1", "add", False), ("cpp_fused_2", 4, "relu_1", "relu_1", False)],
        columns=["kernel", "launch", "post_grad_node", "pre_grad_node", "library"])
    rows = rows.assign(graph=0, group=[0, 0, 0, 0, 1, 1])
    counts = capture.kernels_against_groups(rows)
    assert counts["predicted_groups"] == 2 and counts["groups_one_launch"] == 1 and counts["groups_split"] == 1
    assert counts["library_calls"] == 1 and counts["generated_kernels"] == 3


# ------------------------------------------------------------------------------------------ the whole command
@pytest.fixture(scope="module")
@slow_fixture
def tiny_run(tmp_path_factory, script):
    """One --quick run of the tiny residual model with a top-1 check on saved inputs."""
    folder = tmp_path_factory.mktemp("your-model")
    torch.save(torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0)), folder / "inputs.pt")
    threads = torch.get_num_threads()
    try:
        code = script("your_model.py").main(["--model", TINY, "--inputs", str(folder / "inputs.pt"),
                                             "--check", "top1", "--results-dir", str(folder), *QUICK])
    finally:
        torch.set_num_threads(threads)
    rows = results.load("your-model", folder)
    return code, rows, folder


def test_a_quick_run_records_every_step_judges_every_variant_and_writes_its_report(tiny_run):
    code, rows, folder = tiny_run
    assert code == cli.EXIT_OK
    steps = rows[rows.record == "step"].set_index("step")["status"]
    assert set(steps) == {"ok", "skipped"} and steps["bisection"] == "skipped"
    timed = rows[(rows.record == "variant") & rows.median_ms.notna()]
    assert set(timed.variant) == set(_variant_names(quick=True)) - _unavailable(rows)
    assert timed.groupby("variant")["run"].nunique().eq(3).all() and timed[SAME_TASK].notna().all()
    fold = rows[rows.record == "fold"]
    assert fold.folded.astype(bool).all() and len(fold) == 3
    planted = rows[rows.record == "fault"].iloc[0]   # top-1 may miss what element-wise sees: the row says which
    assert not planted.same_output and bool(planted.rejected) == (not planted[SAME_TASK])
    kernels = rows[rows.record == "kernels"].iloc[0]
    assert kernels.predicted_groups == kernels.groups_one_launch + kernels.groups_split > 0
    verdicts = rows[rows.record == "verdict"].set_index("precision")
    assert verdicts.loc["FP32", "best"] in set(timed.variant) and pd.isna(verdicts.loc["FP32", "refused"])
    # four check images bound a lower precision's failure rate only at 53 %: refused, with the reason
    assert verdicts.loc["lower precision (bf16, INT8)", "refused"] == (
        "4 check samples: a pass bounds the failure rate only at 53%; a lower precision needs 29")
    assert verdicts["task_samples"].eq(4).all() and verdicts["failure_bound"].round(3).eq(0.527).all()
    report = next(folder.glob("cpu-your-model-tiny_residual-*/report.md")).read_text()
    assert "![ladder](ladder.png)" in report and "residual" in report.split("## The cause ladder")[1]


def _unavailable(rows):
    untimed = rows[(rows.record == "variant") & rows.median_ms.isna()]
    return set(untimed.variant)


@pytest.mark.slow
def test_the_winners_recipe_and_every_kind_of_recipe_are_python_that_builds_and_calls_its_variant(tiny_run, tmp_path):
    _, rows, _ = tiny_run
    torch.save(torch.randn(4, 3, 16, 16), tmp_path / "inputs.pt")
    kinds = ["eager_fp32_channels_last_folded", "compile_freezing_bf16", "ort_all_without_nchwc", "openvino_int8"]
    programs = [rows[(rows.record == "verdict") & (rows.precision == "FP32")].recipe.iloc[0]] + [
        recipes.recipe(name, factory=TINY, inputs="inputs.pt", batch=1, calibration=2, threads=1, reduce_range=False,
                       example=recipes.example_code("inputs.pt", 1, None)) for name in kinds]
    # one interpreter, each recipe in a namespace of its own, as if pasted into a fresh file
    runner = "import sys\nfor program in sys.argv[1:]:\n    scope = {}\n    exec(program + '\\nrun(example)', scope)\n"
    done = subprocess.run([sys.executable, "-c", runner, *programs], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=FACTORY_PATH)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_a_model_that_breaks_its_graph_and_will_not_export_still_gets_every_other_step(run_main, tmp_path):
    code, out, err = run_main("your_model.py", "--model", "yourmodel_cases:unexportable", "--shape", "3,16,16",
                              "--results-dir", tmp_path, *QUICK)
    rows = results.load("your-model", tmp_path)
    steps = rows[rows.record == "step"].set_index("step")
    assert code == cli.EXIT_OK and steps.loc["ONNX export", "status"] == "failed"
    assert "ConversionError" in steps.loc["ONNX export", "reason"]
    capture_row = rows.query("record == 'capture'").iloc[0]
    assert capture_row.graph_breaks >= 1 and capture_row.graphs == capture_row.graph_breaks + 1
    assert "graph_break" in capture_row.break_reasons
    variants = rows[rows.record == "variant"].drop_duplicates("variant").set_index("variant")
    assert variants.loc["ort_all", "note"] == "skipped: the ONNX export failed"
    assert variants.loc["compile_freezing", "median_ms"] > 0
    assert rows.query("record == 'fault'").rejected.astype(bool).all()   # element-wise sees a dropped summand
    assert "lower-precision verdicts are refused" in out
    assert rows[rows.record == "verdict"].set_index("precision").loc["lower precision (bf16, INT8)", "refused"]


@pytest.mark.slow
def test_a_variant_made_wrong_by_a_switch_exits_1_naming_it_and_the_bisection_names_the_switch(run_main, tmp_path):
    with inductor_config.patch(post_grad_custom_post_pass=cases.halve_first_convolution):
        code, _, err = run_main("your_model.py", "--model", TINY, "--shape", "3,16,16", "--results-dir", tmp_path,
                                *QUICK)
    rows = results.load("your-model", tmp_path)
    assert code == cli.EXIT_CHECK_FAILED and "compile_default" in err.strip().splitlines()[-1]
    found = rows[(rows.record == "bisect") & (rows.variant == "compile_default")]
    assert found.iloc[-1].switch == "post_grad_custom_post_pass=None" and found.iloc[-1].status == "passes"
    eager = rows[(rows.record == "variant") & (rows.variant == "eager_fp32")]
    assert eager.same_output.astype(bool).all()
