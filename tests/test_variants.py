"""The BlurBall variant registry (graphbook.method.variants): names, builders, expectations, freezing."""
import pytest
import torch

from graphbook.measure import warmup
from graphbook.record import results
from graphbook import checks
from graphbook.compilers import inductor_tools
from graphbook.method import variants

SHAPE = (1, 9, 16, 24)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return warmup.tiny_clip_net(hidden=4), torch.randn(*SHAPE)


def test_registry_names_and_labels_are_unique_and_reference_first():
    assert list(variants.REGISTRY)[0] == variants.REFERENCE == "eager_fp32"
    labels = [v.label for v in variants.REGISTRY.values()]
    assert len(set(labels)) == len(labels)
    assert all(name == v.name for name, v in variants.REGISTRY.items())
    for v in variants.REGISTRY.values():
        assert v.family in ("eager", "compile", "onnxruntime", "openvino") and v.precision in ("fp32", "bf16", "int8")
        assert isinstance(v.expected_to_match_eager, bool) and v.description
        # only full precision is expected to give eager's output (so the freezing miscompile is a failure)
        assert v.expected_to_match_eager == (v.precision == "fp32")


def test_every_lower_precision_has_one_fp32_twin_of_its_own_runtime():
    lower = {n for n, v in variants.REGISTRY.items() if v.precision != "fp32"}
    assert set(variants.FP32_TWINS) == lower
    for name, twin in variants.FP32_TWINS.items():
        assert variants.get(twin).precision == "fp32" and variants.get(twin).family == variants.get(name).family
    assert variants.FP32_TWINS["compile_freezing_bf16"] == "compile_freezing"


def test_unknown_names_are_clear_errors():
    with pytest.raises(ValueError, match="unknown variant 'warp'.*eager_fp32"):
        variants.get("warp")
    with pytest.raises(ValueError, match="no variant labelled"):
        variants.by_label("warp")
    assert variants.by_label("compile + freezing").name == "compile_freezing"
    assert variants.names(families=["compile"])[0] == "compile_default"
    assert variants.names(precisions=["int8"]) == ["ort_int8_qdq_all", "openvino_int8"]
    assert variants.names(families=["openvino"]) == ["openvino_fp32", "openvino_bf16", "openvino_int8"]
    assert all(variants.get(name).needs_calibration for name in variants.names(precisions=["int8"]))


@pytest.mark.parametrize("name", ["eager_fp32", "eager_fp32_channels_last", "eager_bf16_autocast"])
def test_eager_builders_output_shape_and_match(tiny, name):
    model, x = tiny
    built = variants.build(name, model, x)
    out = built.run(x)
    assert out.shape == (1, 3, 16, 24) and out.dtype == torch.float32
    assert built.compile_s >= 0
    check = checks.compare_to_reference(out, model(x).detach())
    if built.variant.expected_to_match_eager:
        assert check[results.SAME_OUTPUT], check
    else:
        assert check[results.MAX_ABS_DIFF] > 0


@pytest.mark.slow
def test_onnx_builders_share_one_export_and_match(tiny, tmp_path):
    model, x = tiny
    calibration = [torch.randn(*SHAPE) for _ in range(2)]
    with variants.BuildContext(workdir=tmp_path, threads=1, calibration=calibration) as context:
        reference = variants.build("eager_fp32", model, x, context).run(x)
        for name in variants.names(families=["onnxruntime"]):
            built = variants.build(name, model, x, context)
            out = built.run(x)
            assert out.shape == reference.shape, name
            check = checks.compare_to_reference(out, reference)
            assert check[results.SAME_OUTPUT] == built.variant.expected_to_match_eager, (name, check)
            assert built.artifact is not None and built.artifact.exists()
    assert sorted(p.name for p in tmp_path.glob("*.onnx")) == [
        "model_int8_qdq.onnx", "model_optimized.onnx", "model_raw.onnx"]


@pytest.mark.slow  # exports to ONNX
def test_without_calibration_int8_is_skipped_and_without_a_workdir_the_scratch_folder_goes(tiny):
    model, x = tiny
    context = variants.BuildContext(threads=1)
    with pytest.raises(variants.VariantUnavailable, match="calibration"):
        variants.build("ort_int8_qdq_all", model, x, context)
    runners = variants.runners(model, x, ["ort_all", "ort_int8_qdq_all"], key="name", context=context)
    assert list(runners) == ["eager_fp32", "ort_all"]
    folder = context.folder()
    assert folder.exists()
    context.close()
    assert not folder.exists()
    assert runners["ort_all"](x).shape == (1, 3, 16, 24)  # the session keeps the model in memory


def test_freezing_context_sets_config_and_no_grad():
    import torch._inductor.config as inductor_config

    before = inductor_config.freezing
    with inductor_tools.freezing():
        assert inductor_config.freezing is True and not torch.is_grad_enabled()
    with inductor_tools.freezing(False):
        assert inductor_config.freezing is False
    assert inductor_config.freezing == before and torch.is_grad_enabled()


@pytest.mark.slow
def test_freezing_really_freezes_and_compiled_variants_alternate_without_recompiling():
    """Freezing folds the BN (its code holds frozen parameters); each compiled variant keeps its own Dynamo cache
    (variants.own_code), so rotating them, as the benchmarks do, compiles nothing new and reuses no other's graph."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    net = torch.nn.Sequential(torch.nn.Conv2d(9, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4),
                              torch.nn.ReLU(), torch.nn.Conv2d(4, 3, 1)).eval()
    x = torch.randn(1, 9, 16, 16)
    torch._dynamo.reset()
    plain = variants.build("compile_default", net, x).run
    frozen = variants.build("compile_freezing", net, x).run
    assert torch.is_grad_enabled()
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        reference = net(x)
    for runner in (plain, frozen, plain, frozen):
        assert checks.compare_to_reference(runner(x), reference)[results.SAME_OUTPUT]
    assert counters["stats"]["unique_graphs"] == graphs, "alternating variants recompiled"
    # run_and_get_code's patched config is part of the guards: each compiles again, and shows its code
    _, code_frozen = run_and_get_code(frozen, x)
    _, code_plain = run_and_get_code(plain, x)   # after the frozen one: switching back never reuses its graph
    assert "_frozen_param" in "\n".join(code_frozen), "the BN was not folded: freezing did not apply"
    assert code_plain and "_frozen_param" not in "\n".join(code_plain)


def test_own_code_gives_forward_a_distinct_code_object():
    net = torch.nn.Linear(2, 2)
    copy_ = variants.own_code(net)
    assert copy_.forward.__code__ is not type(net).forward.__code__
    assert copy_ is not net and torch.equal(copy_(torch.ones(1, 2)), net(torch.ones(1, 2)))


def test_the_max_autotune_note_names_the_products_tuned_and_which_kind_won():
    log = ("AUTOTUNE packed_linear(1x64, 1982689x1, 4x64)\nstrides: [64, 1], [1, 0], [64, 1]\n"
           "  cpp_CppMicroGemmFP32Vec_3 0.0019 ms 100.0% \n  _mkl_linear 0.0067 ms 28.0% \n"
           "SingleProcess AUTOTUNE benchmarking takes 3.1 seconds\n"
           "AUTOTUNE packed_linear(1x4, 1982689x1, 64x4)\n  _mkl_linear 0.0011 ms 100.0% \n  cpp_x 0.0020 ms 55.0% \n")
    assert variants._autotuned(log) == ("max-autotune tuned 2 matrix products (packed_linear; first 1x64, 1982689x1, "
                                        "4x64); a C++ template won 1")
    assert variants._autotuned("compiled without tuning") == ""
