"""graphbook.int8.int8_matrix and code/bench_int8.py: the design, the layer groups, the recommendation, a smoke run."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from graphbook.model import blurball
from graphbook.record import results
from graphbook.int8 import int8_matrix as im, quantization
from graphbook.int8 import int8_decision

FACTORS = ("per_channel", "calibration", "pre_process", "exclude", "reduce_range")


def _differences(a: quantization.Int8Config, b: quantization.Int8Config) -> set[str]:
    """The factors in which two configurations differ; the histogram size is part of the calibration."""
    diff = {f for f in FACTORS if getattr(a, f) != getattr(b, f)}
    return diff | ({"calibration"} if a.histogram_bins != b.histogram_bins else set())


# -- Design
@pytest.mark.parametrize("reduce_range", [False, True])
def test_design_is_one_factor_at_a_time_plus_combinations(reduce_range):
    configs = quantization.design(reduce_range)
    base = configs[0]
    assert base.name == quantization.BASELINE_NAME and base.role == "baseline"
    assert (base.per_channel, base.calibration, base.pre_process, base.exclude, base.reduce_range) == \
        (True, "MinMax", False, (), reduce_range)
    names = [c.name for c in configs]
    assert len(set(names)) == len(names) and im.FP32_NAME not in names
    varied = set()
    for config in configs[1:]:
        diff = _differences(config, base)
        if config.role.startswith("vary "):
            factor = config.role.split()[1]
            assert diff == {factor}, config
            varied.add((factor, repr(getattr(config, factor)) + (f"/{config.histogram_bins}" if factor == "calibration"
                                                                       and config.histogram_bins else "")))
        else:
            assert config.role == "combination" and len(diff) >= 2, config
    # every level of every factor is reached from the baseline
    assert {("calibration", "'Entropy'"), ("calibration", f"'Entropy'/{quantization.ENTROPY_BINS}"),
            ("calibration", "'Percentile'"), ("per_channel", "False"),
            ("pre_process", "True"), ("reduce_range", repr(not reduce_range))} <= varied
    assert {v for f, v in varied if f == "exclude"} == {"('stem',)", "('head',)", "('se',)", repr(quantization.GROUPS)}
    assert len(configs) == 13


def test_smoke_design_touches_every_step_and_excluded_groups_are_one_cell_in_the_groups_order():
    base, combo = quantization.design(False, smoke=True)
    assert base.name == quantization.BASELINE_NAME
    assert combo.pre_process and not combo.per_channel and combo.calibration != "MinMax" and combo.exclude == quantization.GROUPS
    assert combo.histogram_bins  # the calibration-cache path too
    assert quantization.Int8Config("c", exclude=("head", "stem")).excluded == "stem+head"


# -- Layer groups
@pytest.mark.parametrize("scopes, group", [
    (["", "bn1", "_native_batch_norm_legit_no_training"], "stem"),
    (["", "conv2", "conv2d_1"], "stem"),
    (["", "relu", "relu_1"], "stem"),
    (["", "final_layers", "final_layers.0", "conv2d_71"], "head"),
    (["", "stage2", "stage2.0", "stage2.0.branches.0.0", "stage2.0.branches.0.0.se", "mean"], "se"),
    (["", "stage2", "stage2.0", "stage2.0.branches.0.0.se.fc.0", "linear"], "se"),
    (["", "layer1", "layer1.0", "layer1.0.bn1", "x"], None),
    (["", "stage3", "stage3.0.branches.1.0.conv1", "conv"], None),
    ([], None),
])
def test_node_group(scopes, group):
    assert quantization.node_group(scopes) == group


def _tiny_model(with_scopes=True):
    from onnx import TensorProto, helper

    nodes = []
    for name, scopes in (("stem_relu", "['', 'relu', 'relu']"), ("body_relu", "['', 'layer1', 'layer1.0.relu', 'r']"),
                         ("head_relu", "['', 'final_layers', 'final_layers.0', 'r']")):
        node = helper.make_node("Relu", [nodes[-1].output[0] if nodes else "x"], [name + "_out"], name=name)
        if with_scopes:
            prop = node.metadata_props.add()
            prop.key, prop.value = "pkg.torch.onnx.name_scopes", scopes
        nodes.append(node)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("head_relu_out", TensorProto.FLOAT, [1, 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_nodes_in_groups_and_module_of_read_the_exporters_module_names():
    assert quantization.module_of(["", "stage2", "stage2.0.branches.0.0.se", "mean"]) == "stage2.0.branches.0.0.se"
    assert quantization.module_of([]) == ""
    model = _tiny_model()
    assert sorted(quantization._nodes_in_groups(model, ("stem", "head"))) == ["head_relu", "stem_relu"]
    with pytest.raises(quantization.Int8MatrixError, match="se"):
        quantization._nodes_in_groups(model, ("se",))
    with pytest.raises(quantization.Int8MatrixError, match="name_scopes"):
        quantization._nodes_in_groups(_tiny_model(with_scopes=False), ("stem",))


def _tiny_detector(path):
    """A 1x1 convolution 9 -> 3 channels: BlurBall's input and output shapes, no module names."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(0, 0.3, (3, 9, 1, 1)).astype(np.float32), "w")
    bias = numpy_helper.from_array(np.full(3, -4.0, np.float32), "b")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 9, 32, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 32, 64])], [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_run_matrix_records_a_failing_configuration(tmp_path):
    from graphbook.model import synthetic_clips

    fp32 = _tiny_detector(tmp_path / "tiny.onnx")
    clips = synthetic_clips.held_out_clips(2, 32, 64)
    configs = [quantization.Int8Config("baseline"), quantization.Int8Config("no-se", exclude=("se",), role="vary exclude")]
    run = im.run_matrix(fp32, configs, im.clip_inputs(clips[:1]), clips, workdir=tmp_path, threads=1, repeats=3)
    assert [r["config"] for r in run.rows] == ["fp32", "baseline", "no-se"]
    assert run.rows[1]["status"] == "ok" and run.rows[1]["quantize_nodes"] > 0 and run.rows[1]["latency_ms"] > 0
    assert run.rows[1]["max_abs_diff"] > 0 and run.rows[0]["max_abs_diff"] == 0
    assert "no-se" in run.failures and "name_scopes" in run.rows[2]["status"]  # recorded, not raised
    assert math.isnan(run.rows[2]["latency_ms"])
    chosen = int8_decision.recommend_int8_config(pd.DataFrame(run.rows), latency_budget_ms=1e9, max_rate_drop=1.0,
                                                 max_error_increase_px=1e9)["chosen"]
    assert chosen["config"] in ("fp32", "baseline")


def test_sqnr_is_nan_without_signal_and_the_worst_tensors_are_counted_by_layer_group():
    assert math.isnan(im._sqnr_db([np.zeros(4)], [np.ones(4)]))
    assert im._sqnr_db([np.ones(4)], [np.ones(4) * 1.1]) == pytest.approx(20.0)
    rows = [{"tensor_kind": "activation", "rank": k + 1, "tensor": f"t{k}", "op": "Relu", "sqnr_db": 1.0 + k,
             "module": f"stage2.0.branches.0.{k}.se.fc.1" if k < 3 else "stage3.0.branches.0.0.bn1",
             "group": "se" if k < 3 else "other"} for k in range(4)]
    rows.append({"tensor_kind": "weight", "rank": 1, "tensor": "w", "op": "Conv", "sqnr_db": 45.0, "module": "m",
                 "group": "other"})
    found = int8_decision.tensor_error_groups(pd.DataFrame(rows))
    assert found["groups"] == {"se": 3, "other": 1} and found["worst"]["tensor"] == "t0"
    assert found["weight_sqnr_db"] == (45.0, 45.0) and found["activations"] == 4
    # a run recorded before the group column existed: the group comes from the module name
    legacy = int8_decision.tensor_error_groups(pd.DataFrame(rows).drop(columns="group"))
    assert legacy["groups"]["se"] == 3


# -- Recommendation
def _row(config, rate, error, latency, *, precision="int8", status="ok", **extra):
    return {"config": config, "precision": precision, "status": status, "detection_rate": rate,
            "median_error_px": error, "median_angle_error_deg": 2.0, "latency_ms": latency,
            "per_channel": True, "calibration": "MinMax", "pre_process": False, "excluded": "",
            "reduce_range": False, "visible_frames": 100, "height": 96, "width": 160, "threads": 2,
            "eval_clips": 40, **extra}


def _frame(*rows):
    return pd.DataFrame([_row("fp32", 0.99, 0.40, 100.0, precision="fp32"), *rows])


@pytest.mark.parametrize("rows, kwargs, chosen, keep_fp32, as_accurate", [
    ((_row("fast-bad", 0.80, 0.9, 40.0), _row("good", 0.98, 0.5, 60.0), _row("best-but-slow", 0.99, 0.4, 150.0),
      _row("broken", math.nan, math.nan, math.nan, status="RuntimeError: boom")), {}, "good", "", 1),
    ((_row("a", 0.98, 0.7, 50.0), _row("b", 0.975, 0.5, 70.0), _row("c", 0.90, 0.1, 30.0)), {}, "b", "", 1),
    ((_row("a", 0.98, 0.52, 50.0, latency_min_ms=45.0, latency_max_ms=55.0),
      _row("b", 0.975, 0.50, 70.0, latency_min_ms=65.0, latency_max_ms=75.0)), {}, "a", "", 2),   # the fastest
    ((_row("a", 0.98, 0.6, 50.0), _row("b", 0.99, 0.5, 90.0)), {}, "b", "", 1),
    ((_row("a", 0.98, 0.6, 50.0), _row("b", 0.99, 0.5, 90.0)), {"latency_budget_ms": 60}, "a", "", 1),
    ((_row("lossy", 0.90, 0.4, 50.0),), {"max_rate_drop": 0.2}, "lossy", "", 1),   # a looser rate drop admits it
    ((_row("slow", 0.99, 0.4, 120.0),), {}, "fp32", "none within the latency budget", 0),
    ((_row("lossy", 0.90, 0.4, 50.0),), {}, "fp32", "the best INT8 configuration loses accuracy", 1),
    ((_row("blurry", 0.99, 0.80, 50.0),), {}, "fp32", "the best INT8 configuration loses accuracy", 1),
    ((_row("x", math.nan, math.nan, math.nan, status="Error"),), {}, "fp32", "no INT8 configuration ran", 0),
])
def test_recommendation(rows, kwargs, chosen, keep_fp32, as_accurate):
    made = int8_decision.recommend_int8_config(_frame(*rows), **kwargs)
    assert (made["chosen"]["config"], made["keep_fp32"], made["as_accurate"]) == (chosen, keep_fp32, as_accurate)
    assert not made["ties"]


def test_a_lead_within_the_timing_spread_is_a_tie_and_the_newest_real_run_decides(tmp_path):
    frame = _frame(_row("a", 0.98, 0.52, 50.0, latency_min_ms=40.0, latency_max_ms=80.0),
                   _row("b", 0.975, 0.50, 70.0, latency_min_ms=60.0, latency_max_ms=90.0))
    made = int8_decision.recommend_int8_config(frame)
    assert made["chosen"]["config"] == "a" and made["runner_up"]["config"] == "b" and made["ties"]
    with pytest.raises(quantization.Int8MatrixError, match="bench_int8"):
        int8_decision._latest(im.KIND_MATRIX, tmp_path)
    rows = _frame(_row("a", 0.98, 0.5, 50.0)).to_dict("records")
    results.write_run(im.KIND_MATRIX, rows, {"date": "2026-01-01T00:00:00+00:00", "smoke": False}, results_dir=tmp_path)
    results.write_run(im.KIND_MATRIX, rows[:1], {"date": "2026-01-02T00:00:00+00:00", "smoke": True},
                      results_dir=tmp_path)
    latest = int8_decision._latest(im.KIND_MATRIX, tmp_path)
    assert list(latest["config"]) == ["fp32", "a"]
    assert int8_decision.recommend_int8_config(latest)["chosen"]["config"] == "a"

def test_combined_runs_decide_latency_on_the_median_across_quiet_runs(tmp_path):
    env = {"cpu_model": "CPU A", "cpu_isa": "avx2", "smoke": False}
    for day, (fp32_ms, a_ms, b_ms) in enumerate([(100.0, 50.0, 80.0), (120.0, 90.0, 60.0), (110.0, 70.0, 65.0)], 1):
        rows = _frame(_row("a", 0.98, 0.52, a_ms), _row("b", 0.98, 0.50, b_ms)).to_dict("records")
        rows[0]["latency_ms"] = fp32_ms
        results.write_run(im.KIND_MATRIX, rows, {**env, "date": f"2026-01-0{day}T00:00:00+00:00"},
                          results_dir=tmp_path)
    other = _frame(_row("a", 0.98, 0.52, 1.0), _row("b", 0.98, 0.50, 1.0)).to_dict("records")
    results.write_run(im.KIND_MATRIX, other, {**env, "cpu_model": "CPU B", "date": "2025-12-31T00:00:00+00:00"},
                      results_dir=tmp_path)
    combined = int8_decision.combined_matrix(tmp_path)
    assert list(combined["config"]) == ["fp32", "a", "b"] and combined["run_id"].nunique() == 1
    assert list(combined["runs"]) == [3, 3, 3]  # the other machine's run is left out
    assert list(combined["latency_ms"]) == [110.0, 70.0, 65.0]
    assert list(combined["latency_min_ms"]) == [100.0, 50.0, 60.0]
    assert combined.loc[2, "speedup_vs_fp32"] == pytest.approx(110 / 65)
    made = int8_decision.recommend_int8_config(combined)
    assert made["chosen"]["config"] == "b" and made["chosen"]["runs"] == 3
    # runs taken under load are set aside: FP32 took 199 and 236 ms in two loaded runs, 35 ms in the quiet one
    env = {"cpu_model": "CPU A", "cpu_isa": "avx2", "smoke": False}
    for day, (fp32_ms, a_ms) in enumerate([(199.0, 70.0), (236.0, 80.0), (35.0, 24.5)], 1):
        rows = _frame(_row("a", 0.98, 0.52, a_ms)).to_dict("records")
        rows[0]["latency_ms"] = fp32_ms
        results.write_run(im.KIND_MATRIX, rows, {**env, "date": f"2026-01-0{day}T00:00:00+00:00"},
                          results_dir=tmp_path / "loaded")
    combined = int8_decision.combined_matrix(tmp_path / "loaded")
    assert list(combined["latency_ms"]) == [35.0, 24.5] and list(combined["runs"]) == [1, 1]
    assert combined["runs_set_aside"].iloc[0].count("cpu-int8-matrix-") == 2
    made = int8_decision.recommend_int8_config(combined)
    assert made["fp32"]["latency_ms"] / made["chosen"]["latency_ms"] == pytest.approx(35.0 / 24.5)


# -- The script
def test_missing_checkpoint_exits_3(tmp_path, run_main):
    code, _, err = run_main("bench_int8.py", "--smoke", "--checkpoint", tmp_path / "none.pt", "--results-dir", tmp_path)
    assert code == 3 and "checkpoint not found" in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("*.csv"))


class _TinyBall(torch.nn.Module):
    """A stand-in for BlurBall with its three layer groups, stem (conv1), SE and head (final_layers)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = torch.nn.Conv2d(9, 8, 3, padding=1)
        self.se = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 1), torch.nn.Sigmoid())
        self.final_layers = torch.nn.ModuleList([torch.nn.Conv2d(8, 3, 1)])

    def forward(self, x):
        y = torch.relu(self.conv1(x))
        return self.final_layers[0](y * self.se(y))


@pytest.mark.slow
def test_smoke_run_writes_both_kinds_and_recommends(tmp_path, run_main, monkeypatch):
    monkeypatch.setattr(blurball, "load_trained_blurball", lambda path: _TinyBall().eval())
    code, stdout, _ = run_main("bench_int8.py", "--smoke", "--results-dir", tmp_path)
    assert code == 0
    assert "2 INT8 configurations at 32x64, 2 threads" in stdout
    matrix = results.load(im.KIND_MATRIX, results_dir=tmp_path)
    assert list(matrix["config"]) == ["fp32", "baseline", "smoke-combination"]
    assert (matrix["status"] == "ok").all() and matrix["detection_rate"].between(0, 1).all()
    assert (matrix["latency_ms"] > 0).all() and (matrix["height"] == 32).all() and (matrix["timing_runs"] == 3).all()
    assert matrix.loc[0, "max_abs_diff"] == 0 and (matrix["max_abs_diff"].iloc[1:] > 0).all()
    assert (matrix["excluded_nodes"].iloc[2] > 0) and matrix["cpu_isa"].notna().all()
    assert matrix["smoke"].all()
    errors = results.load(im.KIND_TENSOR_ERRORS, results_dir=tmp_path)
    assert set(errors["tensor_kind"]) == {"activation", "weight"}
    assert errors.groupby("tensor_kind")["rank"].max().max() <= 10
    assert set(errors["group"]) <= {"stem", "head", "se", "other"}
    chosen = int8_decision.recommend_int8_config(results.latest_run(matrix))["chosen"]["config"]
    assert chosen in set(matrix["config"]) and f"recommended: {chosen}" in stdout
    with pytest.raises(quantization.Int8MatrixError, match="smoke"):  # a smoke run is never a recorded run
        int8_decision.combined_matrix(tmp_path)
