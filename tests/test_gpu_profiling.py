"""graphbook.lab.gpu_profiling's rules on a CPU, with fake profiler events, a fake clock and fake streams."""
import io
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import profile

from graphbook.lab import gpu_profiling as gp
from graphbook.measure.warmup import tiny_clip_net


def event(name, device="CPU", start=0.0, end=1.0, id=0, linked=0, annotation=False, children=(), activity=""):
    return SimpleNamespace(name=name, device_type=SimpleNamespace(name=device), id=id, linked_correlation_id=linked,
                           time_range=SimpleNamespace(start=start, end=end), is_user_annotation=annotation,
                           activity_type=activity, cpu_children=list(children))


# -- user annotations are not kernels ------------------------------------------------------
def compiled_graph_events():
    """One compiled forward: Inductor's range on CPU and GPU, two Triton kernels and one extern convolution."""
    return [
        event("## Call CompiledFxGraph fabc123 ##", "CPU", 0, 100, id=1, annotation=True, activity="user_annotation"),
        event("triton_poi_fused__native_batch_norm_legit_no_training_relu_0", "CPU", 10, 12, id=2),
        event("aten::convolution", "CPU", 20, 25, id=3),
        event("triton_poi_fused_add_relu_1", "CPU", 30, 32, id=4),
        # the GPU copy of the range: it spans every kernel of the graph
        event("## Call CompiledFxGraph fabc123 ##", "CUDA", 5, 1005, id=10, linked=1, annotation=True,
              activity="gpu_user_annotation"),
        event("triton_poi_fused__native_batch_norm_legit_no_training_relu_0", "CUDA", 100, 200, id=11, linked=2),
        event("sm80_xmma_fprop_implicit_gemm_f16f16", "CUDA", 200, 600, id=12, linked=3),
        event("triton_poi_fused_add_relu_1", "CUDA", 600, 700, id=13, linked=4),
        event("Memcpy DtoD (Device -> Device)", "CUDA", 700, 710, id=14, linked=4),
    ]


def test_annotations_are_skipped_and_do_not_inflate_kernel_time():
    kernels = gp._kernels_from_events(compiled_graph_events(), "cuda")
    assert [k[1] for k in kernels] == ["triton_poi_fused__native_batch_norm_legit_no_training_relu_0",
                                       "sm80_xmma_fprop_implicit_gemm_f16f16", "triton_poi_fused_add_relu_1"]
    rows = {r["category"]: r for r in gp._summarize_kernels(kernels, wall_ms=1.2)}
    assert rows["other"]["kernels"] == 1                      # not 2: the range is no "other kernel"
    assert rows["convolution"]["kernels"] == 1 and rows["batch_norm"]["kernels"] == 1
    assert rows["other"]["total_kernels"] == 3
    assert rows["other"]["active_gpu_ms"] == pytest.approx(0.6)  # 100..700 us, not the range's 1000 us
    assert rows["convolution"]["share"] == pytest.approx(400 / 600)


@pytest.mark.parametrize("flags", [dict(annotation=True), dict(activity="gpu_user_annotation"), dict()])
def test_every_annotation_flavour_is_recognised(flags):
    assert gp.is_annotation(event("## Call CompiledFxGraph k ##", "CUDA", **flags))
    assert not gp.is_annotation(event("void cudnn::bn_fw_inf_1C11_kernel_NCHW", "CUDA"))


# -- the innermost op decides (autocast weight casts are copies) ---------------------------
def autocast_conv_events():
    """aten::conv2d under autocast: the weight cast and the convolution are both inside it."""
    copy = event("aten::copy_", "CPU", 2, 3, id=4)
    to_copy = event("aten::_to_copy", "CPU", 1, 4, id=3, children=[copy])
    cudnn = event("aten::cudnn_convolution", "CPU", 5, 8, id=6)
    conv2d = event("aten::conv2d", "CPU", 0, 10, id=2, children=[to_copy, cudnn])
    return [conv2d, to_copy, copy, cudnn,
            event("void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>", "CUDA", 10, 12, id=20, linked=4),
            event("sm86_xmma_fprop_implicit_gemm_f16f16_f16f32", "CUDA", 12, 40, id=21, linked=6),
            event("void cudnn::bn_fw_inf_1C11_kernel_NCHW", "CUDA", 40, 45, id=22, linked=99)]  # owner unknown


def test_weight_casts_under_conv2d_are_cast_copy_not_convolution_and_runtime_calls_own_no_kernel():
    events = [event("cudaLaunchKernel", "CPU", 1, 2, id=6, linked=4),   # CUPTI id equal to the conv's op id
              *autocast_conv_events()]
    kernels = gp._kernels_from_events(events, "cuda")
    assert [k[0] for k in kernels] == ["aten::copy_", "aten::cudnn_convolution", ""]
    rows = {r["category"]: r["kernels"] for r in gp._summarize_kernels(kernels, wall_ms=0.05)}
    assert rows == {"convolution": 1, "batch_norm": 1, "cast/copy": 1, "elementwise": 0, "other": 0}


@pytest.mark.parametrize("op, kernel, category", [
    ("aten::cudnn_convolution", "nchwToNhwcKernel", "convolution"),   # the op decides
    ("aten::cudnn_batch_norm", "bn_fw_inf_1C11_kernel_NCHW", "batch_norm"),
    ("aten::_to_copy", "unrolled_elementwise_kernel", "cast/copy"),
    ("aten::copy_", "direct_copy_kernel_cuda", "cast/copy"),
    ("aten::add_", "vectorized_elementwise_kernel", "elementwise"),
    ("aten::upsample_nearest2d", "upsample_nearest2d_out_frame", "other"),
    ("", "implicit_convolve_sgemm", "convolution"),                     # no op: the kernel name decides
    ("triton_poi_fused__native_batch_norm_legit_no_training_0", "triton_poi_fused__native_batch_norm_legit_no_training_0",
     "batch_norm"),
    ("", "triton_poi_fused_convolution_relu_2", "convolution"),
])
def test_kernel_category(op, kernel, category):
    assert gp.op_category(op, kernel) == category


def test_cpu_profile_uses_innermost_computing_ops_and_real_events_have_the_attributes_the_rules_read():
    model = tiny_clip_net()
    x = torch.randn(1, 9, 16, 16)

    def call():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x)
    rows = {r["category"]: r["kernels"] for r in gp.profile_call(call, "cpu")}
    assert rows["convolution"] == 2 and rows["cast/copy"] >= 3  # weights cast under autocast
    with profile() as prof, torch.no_grad():
        model(x)
    events = prof.events()
    assert all(gp._device_kind(e) == "CPU" for e in events)
    assert all(getattr(e, "linked_correlation_id", None) == 0 for e in events)  # ops link to nothing
    assert gp._kernels_from_events(events, "cuda") == []   # no CUDA events on a CPU
    assert gp._kernels_from_events(events, "cpu")


# -- first calls are synchronized, and CUDA-graph modes time two --------------------------
def test_first_calls_stop_the_clock_after_synchronize():
    log, now = [], [0.0]

    def clock():
        log.append("clock")
        return now[0]

    def call():
        log.append("call")
        now[0] += 1.0          # the launch returns at once ...

    def synchronize():
        log.append("sync")
        now[0] += 4.0          # ... the work finishes on the device later

    assert gp.first_calls(call, 2, synchronize=synchronize, clock=clock) == [5.0, 5.0]
    assert log == ["sync", "clock", "call", "sync", "clock", "clock", "call", "sync", "clock"]


# -- SM count and is_big_gpu -----------------------------------------------------------------
@pytest.mark.parametrize("sms, big", [(None, None), (24, False), (132, True)])   # None: no CUDA, missing
def test_autotune_verdict_uses_inductors_rule(monkeypatch, sms, big):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: sms is not None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(multi_processor_count=sms))
    monkeypatch.setattr(gp, "is_big_gpu", lambda i: sms >= 68)
    assert gp.autotune_verdict() == {"sm_count": sms, "inductor_is_big_gpu": big}
    monkeypatch.setattr(gp, "is_big_gpu", lambda i: 1 / 0)  # Inductor's helper failing: its documented threshold
    assert gp.autotune_verdict()["inductor_is_big_gpu"] == big


@pytest.mark.slow
def test_child_rows_round_trip(tmp_path):
    line = io.StringIO()
    gp.emit_child_rows([{"variant": "a", "x": 1.5}], stream=line)
    script = tmp_path / "child.py"  # prints what emit_child_rows printed, without importing torch (seconds)
    script.write_text(f"print({line.getvalue().strip()!r})\n")
    assert gp.run_child([str(script)]) == [{"variant": "a", "x": 1.5}]
    bad = tmp_path / "bad.py"
    bad.write_text("raise SystemExit('no rows here')\n")
    with pytest.raises(RuntimeError, match="no rows here"):
        gp.run_child([str(bad)])
