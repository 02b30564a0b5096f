"""OpenVINO as a CPU runtime (graphbook.runtimes.openvino_runtime) and its variants in graphbook.method.variants (Chapter 4)."""
import sys

import numpy as np
import pytest
import torch

from graphbook.measure import warmup
from graphbook.record import results
from graphbook import checks
from graphbook.runtimes import openvino_runtime
from graphbook.method import variants

SHAPE = (1, 9, 16, 24)


@pytest.fixture(scope="module")
def conv_relu_onnx(tmp_path_factory):
    """A hand-built ONNX graph (Conv with bias, then Relu): no exporter, so these tests stay fast."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((4, 9, 3, 3)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "conv_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 24])], initializer=[weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path_factory.mktemp("ov") / "conv_relu.onnx"
    onnx.save(model, path)
    reference = torch.relu(torch.nn.functional.conv2d(torch.zeros(SHAPE), torch.tensor(
        numpy_helper.to_array(weight)), torch.tensor(numpy_helper.to_array(bias)), padding=1))
    return path, reference


@pytest.fixture
def no_openvino(monkeypatch):
    """As on a platform without an OpenVINO wheel: ``import openvino`` fails."""
    monkeypatch.setitem(sys.modules, "openvino", None)


def test_without_openvino_the_variants_are_unavailable_with_the_reason(no_openvino):
    ok, why = openvino_runtime.available()
    assert not ok and "openvino" in why
    assert openvino_runtime.version() == "absent"
    assert openvino_runtime.bf16_native() == (False, why)
    torch.manual_seed(0)
    model, x = warmup.tiny_clip_net(hidden=4), torch.randn(*SHAPE)
    for name in ("openvino_fp32", "openvino_bf16"):
        with pytest.raises(variants.VariantUnavailable, match="openvino"):
            variants.build(name, model, x)
    assert list(variants.runners(model, x, ["openvino_fp32"], key="name")) == ["eager_fp32"]


def test_bf16_is_unavailable_where_the_plugin_lists_no_bf16(monkeypatch):
    pytest.importorskip("openvino")
    monkeypatch.setattr(openvino_runtime, "_cpu_capabilities", lambda: ["FP32", "INT8"])
    ok, why = openvino_runtime.bf16_native()
    assert not ok and "no BF16" in why
    torch.manual_seed(0)
    with pytest.raises(variants.VariantUnavailable, match="no BF16"):
        variants.build("openvino_bf16", warmup.tiny_clip_net(hidden=4), torch.randn(*SHAPE))


def test_compile_refuses_unknown_precision_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="unknown precision 'int4'"):
        openvino_runtime.compile_model(tmp_path / "x.onnx", precision="int4")
    pytest.importorskip("openvino")
    with pytest.raises(FileNotFoundError, match="no ONNX file"):
        openvino_runtime.compile_model(tmp_path / "missing.onnx")


def test_runner_matches_and_the_runtime_model_shows_the_fusion_and_precisions(conv_relu_onnx, tmp_path):
    pytest.importorskip("openvino")
    path, reference = conv_relu_onnx
    run = openvino_runtime.runner(path, threads=1)
    out = run(torch.zeros(SHAPE))
    assert out.dtype == torch.float32 and checks.compare_to_reference(out, reference)[results.SAME_OUTPUT]
    layers = openvino_runtime._runtime_layers(run.compiled)
    conv = [layer for layer in layers if layer["layer_type"] == "Convolution"]
    # one executed convolution holds the convolution, its bias add and the Relu (named for the graph output)
    assert len(conv) == 1 and "conv" in conv[0]["fused"] and len(conv[0]["fused"]) == 3
    assert all(layer["precision"] for layer in layers)
    described = openvino_runtime.describe_runtime(run.compiled)
    assert described["by_type"]["Convolution"] == 1 and described["fused_layers"] >= 1
    assert described["by_precision"].get("f32", 0) >= 1 and sum(described["by_precision"].values()) == len(layers)
    assert described["precision_by_type"]["Convolution"] == {"f32": 1}
    assert "fusion_patterns" not in described
    assert openvino_runtime.describe_runtime(run.compiled, run.onnx_path)["fusion_patterns"] == {"Convolution + Relu": 1}
    cached = openvino_runtime.compile_model(path, threads=1, cache_dir=tmp_path / "cache")
    assert np.allclose(openvino_runtime.run_compiled(cached, np.zeros(SHAPE, np.float32)), out.numpy())
    assert any((tmp_path / "cache").iterdir())


def test_bf16_hint_runs_the_convolution_in_bf16(conv_relu_onnx):
    pytest.importorskip("openvino")
    if not openvino_runtime.bf16_native()[0]:
        pytest.skip("no native BF16 here")
    path, _ = conv_relu_onnx
    compiled = openvino_runtime.compile_model(path, precision="bf16", threads=1)
    assert "bf16" in openvino_runtime.describe_runtime(compiled)["precision_by_type"]["Convolution"]


@pytest.mark.slow
def test_openvino_variants_build_from_the_book_exports_and_match_eager(tmp_path):
    pytest.importorskip("openvino")
    torch.manual_seed(0)
    model, x = warmup.tiny_clip_net(hidden=4), torch.randn(*SHAPE)
    calibration = [torch.randn(*SHAPE) for _ in range(2)]
    with variants.BuildContext(workdir=tmp_path, threads=1, calibration=calibration) as context:
        reference = variants.build("eager_fp32", model, x, context).run(x)
        for name in variants.names(families=["openvino"]):
            try:
                built = variants.build(name, model, x, context)
            except variants.VariantUnavailable:
                assert name == "openvino_bf16" and not openvino_runtime.bf16_native()[0]
                continue
            check = checks.compare_to_reference(built.run(x), reference)
            assert check[results.SAME_OUTPUT] == built.variant.expected_to_match_eager, (name, check)
            assert built.note.startswith("OpenVINO ") and built.artifact is not None and built.artifact.exists()
            described = openvino_runtime.describe_runtime(built.run.compiled)
            assert described["layers"] > 0 and described["by_type"].get("Convolution")
            if name == "openvino_int8":  # the Q/DQ pairs become integer convolutions
                assert set(described["precision_by_type"]["Convolution"]) & {"u8", "i8"}
