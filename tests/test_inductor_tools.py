"""Tests for graphbook.compilers.inductor_tools, on a snippet shaped like Inductor's CPU wrapper."""
import pytest
import torch

from graphbook.compilers import inductor_tools

WRAPPER = '''
from torch._inductor.codegen.cpp_utils import ...
async_compile = AsyncCompile()
cpp_fused_relu_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r\'\'\'
extern "C" void kernel(const float* in_ptr0, float* out_ptr0)
{
    out_ptr0[0] = in_ptr0[0];
}
\'\'\')

cpp_fused_add_1 = async_compile.cpp_pybinding(['const float*', 'float*'], r\'\'\'
extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {}
\'\'\')

async_compile.wait(globals())
class Runner:
    def call(self, args):
        arg5_1, = args
        cpp_fused_relu_0(arg5_1, buf0, buf1)
        buf2 = torch.ops.mkldnn._convolution_pointwise.default(buf1, _frozen_param16, buf0, 'relu')
        buf3 = extern_kernels.convolution(buf2, buf1, stride=(1, 1))
        cpp_fused_add_1(buf3, arg5_1, buf4)
        return (buf4, )
runner = Runner(partitions=[])
'''


def test_extern_calls_call_sequence_and_kernel_source():
    assert inductor_tools.extern_calls(WRAPPER) == ["torch.ops.mkldnn._convolution_pointwise",
                                        "extern_kernels.convolution"]
    assert inductor_tools.call_sequence(WRAPPER) == [
        "cpp_fused_relu_0(...)", "torch.ops.mkldnn._convolution_pointwise(...)",
        "extern_kernels.convolution(...)", "cpp_fused_add_1(...)"]
    assert "out_ptr0[0] = in_ptr0[0];" in inductor_tools.kernel_source(WRAPPER, "cpp_fused_relu_0")
    with pytest.raises(KeyError, match="cpp_fused_relu_0"):
        inductor_tools.kernel_source(WRAPPER, "nope")


def test_kernels_count_definitions_launches_count_call_sites_and_every_ablation_switch_exists():
    assert inductor_tools.kernel_definitions(WRAPPER) == ["cpp_fused_relu_0", "cpp_fused_add_1"]
    assert inductor_tools.count_kernels([WRAPPER, WRAPPER]) == 4
    twice = WRAPPER.replace("        return (buf4, )", "        cpp_fused_add_1(buf4, arg5_1, buf5)\n        return (buf5, )")
    assert inductor_tools._launch_counts(WRAPPER) == {"generated": 2, "library": 2}
    assert inductor_tools._launch_counts(twice) == {"generated": 3, "library": 2}
    assert inductor_tools.count_kernels(twice) == 2
    import torch._inductor.config as cfg

    for configs in (inductor_tools.ABLATION_CONFIGS, inductor_tools.UNFUSED_ABLATION_CONFIGS,
                    inductor_tools.CAUSE_ABLATION_CONFIGS):
        for name, options in configs.items():
            assert inductor_tools.ablation_options(name) == options
            assert all(hasattr(cfg, key) for key in options), options


@pytest.mark.slow
def testdynamo_graphs_records_without_compiling():
    graphs = inductor_tools.dynamo_graphs(lambda x: (x * 2).relu(), torch.randn(3))
    assert len(graphs) == 1
    assert isinstance(graphs[0], torch.fx.GraphModule)


@pytest.mark.slow
def test_compile_and_get_code_without_reset_keeps_earlier_compiles():
    """reset=False keeps a function compiled before (run_and_get_code resets): alternating them recompiles nothing."""
    from torch._dynamo.utils import counters

    def double(x):
        return x * 2

    def triple(x):
        return x * 3

    x = torch.randn(16)
    first = inductor_tools.compile_and_get_code(double, x)
    second = inductor_tools.compile_and_get_code(triple, x, reset=False)
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad():  # as compiled (grad mode is among Dynamo's guards)
        torch.testing.assert_close(first.compiled(x), x * 2)
        torch.testing.assert_close(second.compiled(x), x * 3)
    assert counters["stats"]["unique_graphs"] == graphs and first.kernel_count == second.kernel_count == 1


@pytest.mark.slow
def test_bench_ablation_records_three_rotated_runs_without_recompiling(tmp_path, run_main, monkeypatch):
    """Two configurations (one a non-Inductor backend) on a stand-in, compiled once each, in three rotated runs."""
    from graphbook.measure import warmup
    from graphbook.model import blurball
    from graphbook.record import results, runs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(blurball, "build_blurball", lambda: warmup.tiny_clip_net(hidden=4))
    code, _, err = run_main("bench_ablation.py", "--height", "16", "--width", "32", "--threads", "1", "--repeats", "2",
                            "--warmup", "1", "--probe-mib", "4", "--variants",
                            "without freezing,decomposed op by op (aot_eager)", "--results-dir", tmp_path)
    assert code == 0, err[-2000:]
    frame = results.latest_recording(results.load("ablation", tmp_path))
    stem = frame[results.SOURCE_FILE].iloc[0].removesuffix(".csv")
    assert sorted(frame[results.RUN_ID].unique()) == [f"{stem}/r{k}" for k in (1, 2, 3)]
    first = frame[frame[results.RUN_ORDER] == 1].sort_values(results.RUN)["variant"].tolist()
    assert first == ["without freezing", "decomposed op by op (aot_eager)", "without freezing"]
    # the non-Inductor backend row: checked like the others, no generated code
    backend = frame[frame["variant"] == "decomposed op by op (aot_eager)"]
    assert backend[results.SAME_OUTPUT].all() and (backend["generated_launches"] == 0).all()
    assert (frame["recompiles"] == 0).all() and (frame[results.COPY_GBPS] > 0).all()
    assert frame.groupby("variant")[results.COMPILE_S].nunique().eq(1).all()  # one build per configuration
    summary = runs.summarize_runs(frame.rename(columns={"compiled_median_ms": "median_ms"}))
    assert summary["runs"].tolist() == [3, 3]
