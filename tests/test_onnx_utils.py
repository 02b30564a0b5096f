"""graphbook.runtimes.onnx_utils on a tiny conv-BN-ReLU-residual block: export, sessions, counts, profiles, Q/DQ."""
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn as nn

from graphbook.lab import gpu_runtimes
from graphbook import checks
from graphbook.runtimes import onnx_utils as ou
from graphbook.int8 import quantization
from graphbook.runtimes import profiling
from conftest import slow_fixture


class TinyBlock(nn.Module):
    """conv-BN-ReLU, conv-BN, residual add, ReLU: the shape of a BlurBall BasicBlock without SE."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + y)


def tiny_model() -> TinyBlock:
    torch.manual_seed(0)
    model = TinyBlock()
    with torch.no_grad():  # non-trivial BN statistics, so folding is not an identity
        for bn in (model.bn1, model.bn2):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    return model.eval()


@pytest.fixture(scope="module")
def model_and_input():
    return tiny_model(), torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
@slow_fixture
def exported(model_and_input, tmp_path_factory):
    """The two exports the chapter makes: exporter-optimized, and raw with constants folded."""
    model, x = model_and_input
    folder = tmp_path_factory.mktemp("onnx")
    optimized = ou.export_onnx(model, x, folder / "optimized.onnx")
    raw = ou.export_onnx(model, x, folder / "raw.onnx", optimize=False, fold_constants=True, external_data=False)
    return {"optimized": optimized, "raw": raw, "folder": folder}


# Export ------------------------------------------------------------------------------------------
def test_export_writes_graph_and_external_weights(exported):
    files = ou.onnx_files(exported["optimized"])
    assert [f.name for f in files] == ["optimized.onnx", "optimized.onnx.data"]
    assert ou.onnx_files(exported["raw"]) == [exported["raw"]]


@pytest.mark.parametrize("change, match", [
    *[({"opset": opset}, "opset") for opset in (17, 9, 99, "20", True)],
    ({"path": "m.txt"}, r"\.onnx"), ({"optimize": True, "fold_constants": True}, "fold_constants"),
    ({"model": lambda t: t}, "nn.Module"), ({"model": "training"}, r"training mode.*model\.eval\(\)"),
])
@pytest.mark.slow
def test_export_refuses_what_it_cannot_export_faithfully(model_and_input, tmp_path, change, match):
    model, x = model_and_input
    change = dict(change)
    model = change.pop("model", model)
    path = tmp_path / change.pop("path", "m.onnx")
    with pytest.raises(ou.OnnxExportError, match=match):
        ou.export_onnx(tiny_model().train() if model == "training" else model, x, path, **change)
    assert not path.exists()


# Levels and sessions ------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["fast", "", "Extended", "ORT_ENABLE_BASIC", "ORT_ENABLE_TURBO", 2, None])
def test_unknown_level_gives_clear_error(bad):
    with pytest.raises(ValueError, match="optimization level"):
        ou.optimization_level(bad)


@pytest.mark.parametrize("truncated", [False, True])
def test_corrupt_or_truncated_model_file_gives_clear_error(exported, tmp_path, truncated):
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(exported["raw"].read_bytes()[:200] if truncated else b"this is not a protobuf \x00\xff\x13")
    with pytest.raises(ou.OnnxModelError, match="not a readable ONNX model"):
        ou.make_session(bad)
    with pytest.raises(ou.OnnxModelError):
        ou.op_counts(bad)


def test_a_missing_file_a_bad_thread_count_and_unmatched_provider_options_are_refused(exported, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ou.make_session(tmp_path / "absent.onnx")
    with pytest.raises(ValueError, match="threads"):
        ou.make_session(exported["raw"], threads=0)
    with pytest.raises(ValueError, match="provider_options"):
        ou.make_session(exported["optimized"], providers=[ou.CPU_PROVIDER], provider_options=[{}, {}])


def test_every_level_matches_eager_saves_its_graph_keeps_rewrites_without_nchwc(exported, model_and_input, tmp_path):
    model, x = model_and_input
    with torch.no_grad():
        reference = model(x)
    counts = {}
    for level in ou.LEVEL_NAMES:
        saved = exported["folder"] / f"raw_{level}.onnx"
        session = ou.make_session(exported["raw"], level=level, threads=1, optimized_model_path=saved)
        output = ou.run_session(session, x)
        assert output.shape == (1, 8, 16, 16)
        assert checks.compare_to_reference(output, reference)["max_abs_diff"] < 1e-4, level
        counts[level] = ou.op_counts(saved)
    # The rewrites the chapter names, level by level.
    assert counts["disabled"][("ai.onnx", "BatchNormalization")] == 2
    assert counts["basic"][("ai.onnx", "BatchNormalization")] == 0
    assert counts["extended"][("com.microsoft", "FusedConv")] >= 1
    assert counts["all"][("com.microsoft.nchwc", "Conv")] == 2
    fusions = ou.name_fusions(counts["disabled"], counts["basic"])
    assert fusions == ["Conv+BatchNormalization folding: 2 BatchNormalization nodes removed"]
    assert any("FusedConv" in note for note in ou.name_fusions(counts["basic"], counts["extended"]))
    assert any("NCHWc" in note for note in ou.name_fusions(counts["extended"], counts["all"]))
    assert ou.name_fusions(counts["all"], counts["all"]) == []
    _, x = model_and_input
    session = ou.make_session(exported["optimized"], threads=1)
    name = session.get_inputs()[0].name
    a = ou.run_session(session, x)
    b = ou.run_session(session, x.numpy())
    c = ou.run_session(session, {name: x.numpy()})
    assert np.array_equal(a, b) and np.array_equal(a, c)
    # disabling the NCHWc rewrite keeps the level's other rewrites
    _, x = model_and_input
    counts = {}
    for disabled in ((), (ou.NCHWC_TRANSFORMER,)):
        saved = tmp_path / f"all_{len(disabled)}.onnx"
        session = ou.make_session(exported["raw"], level="all", threads=1, optimized_model_path=saved,
                                  disabled_optimizers=disabled)
        assert ou.run_session(session, x).shape == (1, 8, 16, 16)
        counts[disabled] = ou.op_counts(saved)
    def nchwc(c):
        return sum(n for (domain, _), n in c.items() if "nchwc" in domain)
    assert nchwc(counts[()]) > 0 and nchwc(counts[(ou.NCHWC_TRANSFORMER,)]) == 0
    # the fusions of the lower levels stay: no BatchNormalization left in either graph
    assert all(c[("ai.onnx", "BatchNormalization")] == 0 for c in counts.values())


# Providers -------------------------------------------------------------------------------------
def test_resolve_providers_keeps_the_available_ones_in_order_and_falls_back_to_cpu():
    choice = ou.resolve_providers([ou.TENSORRT_PROVIDER, ou.CUDA_PROVIDER], available=[ou.CPU_PROVIDER])
    assert choice.providers == (ou.CPU_PROVIDER,)
    assert choice.missing == (ou.TENSORRT_PROVIDER, ou.CUDA_PROVIDER)
    assert "not available" in choice.note() and "CPUExecutionProvider instead" in choice.note()
    available = [ou.TENSORRT_PROVIDER, ou.CUDA_PROVIDER, ou.CPU_PROVIDER]
    choice = ou.resolve_providers([ou.CUDA_PROVIDER, ou.TENSORRT_PROVIDER], available=available)
    assert choice.providers == (ou.CUDA_PROVIDER, ou.TENSORRT_PROVIDER, ou.CPU_PROVIDER)
    assert choice.missing == ()
    assert ou.resolve_providers(None, available=available).providers == (ou.CPU_PROVIDER,)
    with pytest.raises(ValueError, match="provider"):
        ou.resolve_providers([], available=available)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_a_session_asking_for_gpu_providers_runs_on_cpu_and_the_detection_explains_their_absence(exported):
    session = ou.make_session(exported["optimized"], threads=1,
                              providers=[ou.TENSORRT_PROVIDER, ou.CUDA_PROVIDER],
                              provider_options=[{"trt_fp16_enable": "True"}, {}])
    if ou.CUDA_PROVIDER not in ou.available_providers():
        assert session.get_providers() == [ou.CPU_PROVIDER]
    status = gpu_runtimes.detect_gpu_runtimes()
    assert not status.ort_cuda and not status.tensorrt and not status.anything
    assert status.summary().startswith("No GPU runtime can be measured on this machine: ")
    assert "no CUDA device" in status.summary()


# Counting and comparing ---------------------------------------------------------------------------
def test_fusion_names():
    before = Counter({("ai.onnx", "Conv"): 2, ("ai.onnx", "Relu"): 2, ("ai.onnx", "Gemm"): 1,
                      ("ai.onnx", "Sigmoid"): 1})
    after = Counter({("com.microsoft", "FusedConv"): 2, ("com.microsoft", "FusedGemm"): 1})
    notes = ou.name_fusions(before, after)
    assert notes[0].startswith("Conv+activation fusion: 2")
    assert notes[1].startswith("Gemm+activation fusion: 1")
    assert notes[-1] == "absorbed into the fused operators: 2 Relu, 1 Sigmoid"
    assert ou.name_fusions(after, before) == ["other rewrites: removed 2 com.microsoft::FusedConv, "
                                               "1 com.microsoft::FusedGemm"]


# Profiling and quantization ------------------------------------------------------------------------
def test_profile_operators_gives_per_op_table_and_refuses_an_empty_trace(exported, model_and_input, tmp_path):
    _, x = model_and_input
    table = profiling.profile_operators(exported["raw"], x, level="extended", threads=1, runs=2, workdir=tmp_path)
    assert set(table.columns) == {"op_name", "nodes", "total_ms", "share"}
    assert "FusedConv" in set(table["op_name"])
    assert table["share"].sum() == pytest.approx(1.0)
    assert table.loc[table["op_name"] == "FusedConv", "nodes"].item() == 1
    empty = tmp_path / "p.json"
    empty.write_text("[]")
    with pytest.raises(ValueError, match="no kernel events"):
        profiling._read_profile(empty)


X86_NO_VNNI = {"arch": "x86", "avx2": True, "avx512f": False, "avx512_vnni": False, "avx_vnni": False,
               "vnni": False}
X86_VNNI = {**X86_NO_VNNI, "avx512f": True, "avx512_vnni": True, "vnni": True}
ARM = {"arch": "arm", "neon": True, "dotprod": True, "i8mm": False, "bf16": False, "vnni": False}


@pytest.mark.parametrize("features, reduce_range, word", [
    (X86_NO_VNNI, True, "no VNNI"), (X86_VNNI, False, "AVX-512 VNNI"),
    ({**X86_NO_VNNI, "avx_vnni": True, "vnni": True}, False, "AVX-VNNI"), (ARM, False, "ARM"),
    ({"arch": "other", "vnni": None}, True, "could not be read"),
    ({"arch": "x86", "avx2": None, "vnni": None}, True, "could not be read"),
])
def test_int8_settings_reduce_the_weight_range_only_without_vnni(features, reduce_range, word):
    settings = quantization.int8_settings_for(features)
    assert settings.reduce_range is reduce_range and word in settings.reason
    assert settings.quantize_static_kwargs()["reduce_range"] is reduce_range
    assert (settings.activation_type, settings.weight_type) == ("QUInt8", "QInt8")


def _int8_weights(path):
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    return [numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8]


@pytest.mark.parametrize("features", [None, X86_NO_VNNI], ids=["this-cpu", "simulated-x86-without-vnni"])
def test_quantize_qdq_inserts_qdq_nodes_and_stays_close(exported, model_and_input, tmp_path, features):
    model, x = model_and_input
    frames = [torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    quantized = quantization.quantize_qdq(exported["optimized"], tmp_path / "q.onnx", frames, features=features)
    settings = quantization.int8_settings_for(features)
    weights = _int8_weights(quantized)
    assert weights, "the Q/DQ model stores int8 weights"
    widest = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    # what the chosen settings promise, checked on the stored weights (the same on every CPU):
    # without VNNI no u8 x s8 pair may exceed the 16-bit intermediate
    if settings.reduce_range:
        assert 2 * quantization.UINT8_MAX * widest <= quantization.INT16_MAX
    else:
        assert widest > 64
    counts = quantization.qdq_counts(quantized)
    assert counts["QuantizeLinear"] >= 2 and counts["DequantizeLinear"] >= counts["QuantizeLinear"]
    with torch.no_grad():
        reference = model(x).numpy()
    output = ou.run_session(ou.make_session(quantized, threads=1), x)
    # int8 is approximate: within a tenth of the output's range, far from exact
    assert 0 < checks.compare_to_reference(output, reference)["max_abs_diff"] < 0.1 * float(reference.max() - reference.min())
    with pytest.raises(ValueError, match="at least one"):
        quantization.quantize_qdq(exported["optimized"], tmp_path / "none.onnx", [])


# The benchmark script --------------------------------------------------------------------------------
@pytest.mark.slow
def test_bench_script_records_three_rotated_runs(tmp_path, run_main, monkeypatch):
    """code/bench_onnxruntime.py on a stand-in (no compile, no INT8): sessions built once, three rotated runs."""
    from graphbook.measure import warmup
    from graphbook.model import blurball
    from graphbook.record import results, runs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(blurball, "build_blurball", lambda: warmup.tiny_clip_net(hidden=4))
    code, _, err = run_main("bench_onnxruntime.py", "--height", "16", "--width", "32", "--threads", "1", "--repeats",
                            "2", "--warmup", "1", "--no-compile", "--no-quantize", "--probe-mib", "4",
                            "--results-dir", tmp_path)
    assert code == 0, err[-2000:]
    frame = results.latest_recording(results.load("cpu-onnxruntime", tmp_path))
    stem = frame[results.SOURCE_FILE].iloc[0].removesuffix(".csv")
    assert sorted(frame[results.RUN_ID].unique()) == [f"{stem}/r{k}" for k in (1, 2, 3)]
    firsts = frame[frame[results.RUN_ORDER] == 1].sort_values(results.RUN)["variant"].tolist()
    assert len(firsts) == 3 and len(set(firsts)) == 3  # round-robin: a different variant first in each run
    assert firsts[0] == "eager_fp32" and (frame[results.COPY_GBPS] > 0).all()
    summary = runs.summarize_runs(frame)
    assert (summary["runs"] == 3).all() and len(summary) == 8  # eager, 5 levels, all without NCHWc, exporter's file
    eager = frame[frame["variant"] == "eager_fp32"]
    assert (eager[results.SPEEDUP_VS_EAGER] == 1.0).all()  # against eager of the same run
    assert frame[results.SAME_OUTPUT].all()
