"""The correctness table (graphbook.runtimes.correctness, Chapter 6) on a tiny model and small clips."""
import copy
import math

import pytest
import torch
from torch._dynamo.utils import counters

from graphbook.freezing import miscompile
from graphbook.config import BATCH_SIZES, FULL_SIZE, SMALL_SIZE
from graphbook.measure import probes, warmup
from graphbook.model import blurball, decoding, synthetic_clips
from graphbook import checks
from graphbook.compilers import inductor_tools
from graphbook.model import ball
from graphbook.teach import ball_table
from graphbook.method import variants
from conftest import slow_fixture


def frame(x=None, y=None, score=1.0):
    det = None if x is None else decoding.Detection(x=x, y=y, score=score, angle_deg=0.0, half_extent=1.0,
                                                     half_length=0.0, area=4)
    return decoding.FrameDecoding(det, (det,) if det else ())


def test_detections_agree_counts_empty_and_shifted_frames():
    a = [[frame(), frame(10, 10), frame(5, 5)]]
    b = [[frame(), frame(10.3, 10), frame(8, 9)]]
    agree, total, shift = ball.detections_agree(a, b, agree_px=0.5)
    assert (agree, total) == (2, 3)
    assert shift == pytest.approx(5.0)
    assert ball.detections_agree([[frame()]], [[frame(1, 1)]]) == (0, 1, 0.0)
    # with a minimum score only a clear ball is judged: a weak speck on one side is no ball, a weak blob in
    # the clear ball's place is the same ball, nothing (or a blob elsewhere) where the other is clear is not
    weak, clear = [[frame(), frame(5, 5), frame(5.2, 5)]], [[frame(1, 1), frame(), frame(5, 5, score=2.5)]]
    assert ball.detections_agree(weak, clear, min_score=2.0) == (3, 3, pytest.approx(0.2))
    assert ball.detections_agree([[frame(9, 5)]], [[frame(5, 5, score=2.5)]], min_score=2.0)[0] == 0


def test_ball_check_passes_itself_and_catches_a_moved_ball():
    from graphbook.paths import TRAINED_CHECKPOINT

    torch.set_num_threads(1)
    model = blurball.build_blurball(TRAINED_CHECKPOINT)
    clips = synthetic_clips.held_out_clips(1, 32, 64, max_speed=30.0)

    def run(x):
        with torch.no_grad():
            return model(x)
    same = ball.check(run, clips, run)
    assert same["same_ball"] and same["ball_agree_frames"] == same["ball_frames"] == 3
    assert same["ball_max_shift_px"] == 0.0
    moved = ball.check(lambda x: torch.roll(run(x), shifts=4, dims=-1), clips, [run(
        blurball.imagenet_normalize(synthetic_clips.frames_to_tensor([clips[0]])))])
    if moved["ball_frames"] and same["ball_detection_rate"] > 0:  # the trained model finds the ball here
        assert not moved["same_ball"] and moved["ball_max_shift_px"] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="held-out clip"):
        ball.check(run, [], run)


@pytest.fixture(scope="module")
@slow_fixture
def frozen_blurball():
    """The trained BlurBall compiled with freezing once for both input sizes and batch sizes 1-3, as ``(model, run,
    generated code)``. Batch, height and width are unbacked: backed sizes would be specialized (Dynamo's 0/1 rule and
    the conv memory-format choice split batch 1 from 2-3, a reduction's accumulator choice splits the two sizes), four
    compiles instead of one. The compile is the slow part, so every test of freezing in this file shares it."""
    model = blurball.load_trained_blurball()
    sizes = [SMALL_SIZE, FULL_SIZE]
    first = torch.randn(max(BATCH_SIZES), 9, *FULL_SIZE)
    for dim, values in ((0, BATCH_SIZES), (2, [h for h, _ in sizes]), (3, [w for _, w in sizes])):
        torch._dynamo.decorators.mark_unbacked(first, dim, min=min(values), max=max(values))
    generated = inductor_tools.compile_and_get_code(variants.own_code(model), first, options={"freezing": True},
                                                    reset=False)

    def run(x):
        with inductor_tools.freezing(True):
            return generated.compiled(x)
    return model, run, generated.sources


@pytest.mark.slow
def test_freezing_matches_eager_at_both_sizes_and_every_batch_size_from_one_graph(frozen_blurball):
    """torch 2.13 miscompiled BlurBall with freezing (the appendix's version history); the pinned torch must not. The
    graph holds the in-place conv + add that 2.13 got wrong, so the check reaches the site of the bug."""
    model, run, code = frozen_blurball
    assert "mkldnn._convolution_pointwise_.binary(" in "\n".join(code)
    generator = torch.Generator().manual_seed(0)
    graphs = counters["stats"]["unique_graphs"]
    for height, width in (SMALL_SIZE, FULL_SIZE):
        for batch in BATCH_SIZES:
            x = torch.randn(batch, 9, height, width, generator=generator)
            with torch.no_grad():
                reference = model(x)
            check = checks.compare_to_reference(run(x), reference)
            assert check["same_output"], f"freezing differs from eager at {height}x{width}, batch {batch}: {check}"
    assert counters["stats"]["unique_graphs"] == graphs, "an input compiled a graph of its own"


@pytest.mark.slow  # BlurBall passes over eight clips: seconds, too long for the edit loop
def test_ball_check_on_hard_clips_rejects_the_planted_dropped_summand_and_passes_freezing_and_bf16(frozen_blurball):
    """The book's planted fault: one fuse-layer summand left out (stage 3, output 2, branch 1, the summand torch 2.13's
    freezing dropped) moves a decoded ball; freezing in the pinned torch and bf16 rounding move none."""
    model, frozen, _ = frozen_blurball
    clips = synthetic_clips.check_clips(8, *SMALL_SIZE)   # the checkpoint's size; the summand moves a ball in clip 7
    inputs = [blurball.imagenet_normalize(synthetic_clips.frames_to_tensor([c])) for c in clips]
    eager = variants.build("eager_fp32", model, inputs[0]).run
    reference = [eager(x) for x in inputs]
    miscompiled = copy.deepcopy(model)
    fuse = miscompiled.stage3[0]
    fuse.forward = lambda xs: miscompile._fuse_sum(fuse, xs, (2, 1))
    dropped = variants.build("eager_fp32", miscompiled, inputs[0]).run
    assert not checks.compare_to_reference(dropped(inputs[0]), reference[0])["same_output"]
    assert ball.check(eager, clips, reference)["same_ball"]
    rejected = ball.check(dropped, clips, reference)
    assert not rejected["same_ball"] and rejected["ball_agree_frames"] < rejected["ball_frames"]
    assert ball.check(frozen, clips, reference)["same_ball"]
    if probes.bf16_support()[0]:   # rounding, not a dropped summand: the ball stays (emulated bf16 is not judged)
        assert ball.check(variants.build("eager_bf16_autocast", model, inputs[0]).run, clips,
                                      reference)["same_ball"]


@pytest.mark.slow
def test_table_on_tiny_model_with_onnx_and_int8_leaves_no_onnx_files_without_a_workdir():
    import glob
    import tempfile

    torch.set_num_threads(1)
    before = set(glob.glob(f"{tempfile.gettempdir()}/graphbook-onnx-*"))
    net = warmup.tiny_clip_net(hidden=4)
    held_out = synthetic_clips._make_clips(2, seed=100, height=32, width=48)
    calib = synthetic_clips._make_clips(2, seed=200, height=32, width=48)
    runners = ball_table.all_variants(net, held_out[0], calibration_clips=calib, threads=1)
    assert set(glob.glob(f"{tempfile.gettempdir()}/graphbook-onnx-*")) == before  # the sessions hold the models
    # the compiled variants are exercised by Chapter 6; keep this test fast
    runners.pop("compile")
    runners.pop("compile + freezing")
    rows = {r["variant"]: r for r in ball_table.correctness_table(runners, held_out)}
    assert rows["eager FP32"]["max_abs_diff"] == 0.0 and rows["eager FP32"]["agree_share"] == 1.0
    assert rows["channels-last"]["max_abs_diff"] < 1e-4
    assert rows["ONNX Runtime all"]["max_abs_diff"] < 1e-3
    assert "ONNX Runtime INT8 (Q/DQ)" in rows and "ONNX Runtime disabled" in rows and rows["bf16 autocast"]["max_abs_diff"] > 0
    assert all(r["frames"] == 6 for r in rows.values())
    assert all(0.0 <= r["agree_share"] <= 1.0 for r in rows.values())
    assert all(math.isnan(r["detection_rate"]) or 0 <= r["detection_rate"] <= 1 for r in rows.values())


def test_table_rejects_missing_reference_and_empty_clips():
    with pytest.raises(ValueError, match="reference"):
        ball_table.correctness_table({"x": lambda t: t}, [object()])
    with pytest.raises(ValueError, match="clip"):
        ball_table.correctness_table({"eager FP32": lambda t: t}, [])
