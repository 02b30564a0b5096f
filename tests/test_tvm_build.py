"""graphbook.compilers.tvm_build and code/bench_tvm.py: the code census and busy cores, and with TVM (slow) the two
untuned targets and a whole tiny recording."""
import pytest
import torch

from graphbook import paths
from graphbook.compilers import tvm_build as tb
from graphbook.record import results
from graphbook.teach import tvm_compare

TVM_OK, TVM_WHY = tvm_compare.tvm_status()
SCRIPT = paths.REPO_ROOT / "code" / "bench_tvm.py"

IR = """
declare i32 @TVMBackendParallelLaunch(ptr, ptr, i32)
  %1 = call i32 @TVMBackendParallelLaunch(ptr @body, ptr %closure, i32 0)
  %2 = fadd <4 x float> %a, %b
  %3 = fmul <8 x float> %c, %d
  %4 = fadd <8 x float> %3, %e
  %5 = load <16 x float>, ptr %p, align 64
  %6 = call <8 x float> @llvm.masked.gather.v8f32.v8p0(<8 x ptr> %q, i32 4, <8 x i1> %m, <8 x float> poison)
"""


def test_census_counts_launch_calls_and_vector_lines_and_timed_with_cores_adds_busy_cores():
    assert tb._code_census(IR) == {"parallel_launches": 1, "ir_lines_gather": 1, "ir_lines_f32x4": 1,
                                   "ir_lines_f32x8": 3, "ir_lines_f32x16": 1}
    assert set(tb._code_census("").values()) == {0}
    before = torch.get_num_threads()
    columns = tb.timed_with_cores(lambda: sum(range(20000)), warmup=1, repeats=3, threads=1)
    assert torch.get_num_threads() == before
    assert {"median_ms", "q1_ms", "q3_ms", "repeats", "busy_cores"} <= set(columns) and "name" not in columns
    assert columns["repeats"] >= 1 and columns["busy_cores"] >= 0  # repeats: the Timer's blocks


@pytest.mark.slow
@pytest.mark.skipif(not TVM_OK, reason=TVM_WHY)
def test_targets_generic_has_no_mcpu_and_host_names_llvms_host_cpu():
    from tvm.target import codegen

    targets = tb.targets(2)
    generic, host = targets[tb.GENERIC], targets[tb.HOST]
    assert "mcpu" not in generic.export() and str(host.export()["mcpu"]) == codegen.llvm_get_system_cpu()
    assert int(generic.export()["num-cores"]) == int(host.export()["num-cores"]) == 2


@pytest.mark.slow
@pytest.mark.skipif(not TVM_OK, reason=TVM_WHY)
def test_a_tiny_recording_checks_every_variant_in_three_runs(tmp_path, run_main, monkeypatch):
    from graphbook.measure import warmup
    from graphbook.model import blurball

    monkeypatch.setattr(blurball, "build_blurball", lambda: warmup.tiny_clip_net(hidden=4))  # the protocol's test
    code, _, err = run_main("bench_tvm.py", "--height", "16", "--width", "32", "--repeats", "1", "--warmup", "1",
                            "--results-dir", tmp_path)
    assert code == 0, err[-2000:]
    (path,) = tmp_path.glob("cpu-tvm-*.csv")
    assert results.kind("tvm").matches(path.name)
    frame = results.load("tvm", results_dir=tmp_path)
    variants = [tb.EAGER, tb.EAGER_1_THREAD, tb.GENERIC, tb.HOST]
    assert sorted(frame["run"]) == [1] * 4 + [2] * 4 + [3] * 4 and frame["run_id"].nunique() == 3
    assert all(sorted(run["variant"]) == sorted(variants) for _, run in frame.groupby("run"))
    assert frame["same_output"].astype(bool).all()
    assert frame["cpu_family"].notna().all() and frame["cpu_ghz"].notna().all()  # the machine on every row
    tvm_rows = frame[frame["variant"].str.startswith("tvm_")]
    assert (tvm_rows["parallel_launches"] == 0).all(), "TVM's default CPU schedules have no parallel loop"
    for column, baseline in tb.SPEEDUP_BASELINES.items():  # each over its eager of the same run, never another's
        eager = frame[frame["variant"] == baseline].set_index("run")["median_ms"]
        assert frame[column].tolist() == pytest.approx((frame["run"].map(eager) / frame["median_ms"]).tolist())
    assert (frame.loc[frame["variant"] == tb.EAGER, "speedup_vs_eager"] == 1).all()
    assert tvm_rows.loc[tvm_rows["variant"] == tb.HOST, "target"].str.contains('"mcpu"').all()
    assert not tvm_rows.loc[tvm_rows["variant"] == tb.GENERIC, "target"].str.contains('"mcpu"').any()
