"""Dynamic batch in ONNX (graphbook.runtimes.onnx_utils.export_dynamic_batch, Chapter 7): one session, batches 1-3."""
import numpy as np
import pytest
import torch

from graphbook.config import BATCH_SIZES
from graphbook.measure.warmup import tiny_clip_net
from graphbook.record import results
from graphbook.runtimes import correctness, onnx_utils
from torch.export import Dim

H, W = 16, 24


def test_torch_export_specialises_a_batch_of_one_so_export_from_two():
    model = tiny_clip_net(hidden=4)
    batch = Dim("batch", min=1, max=3)
    with pytest.raises(Exception, match="Constraints violated"):  # size 1 is specialised to the constant 1
        torch.export.export(model, (torch.randn(1, 9, H, W),), dynamic_shapes=({0: batch},))
    program = torch.export.export(model, (torch.randn(2, 9, H, W),), dynamic_shapes=({0: batch},))
    shape = [n.meta["val"].shape for n in program.graph.nodes if n.op == "placeholder"][-1]  # the input's
    assert not isinstance(shape[0], int)  # a symbol (s0...), not a constant


def check_one_session_serves_batches(model, path, height, width):
    session = onnx_utils.make_session(path, threads=1)
    assert session.get_inputs()[0].shape[0] == "batch"
    x = torch.randn(max(BATCH_SIZES), 9, height, width, generator=torch.Generator().manual_seed(0))
    for b in BATCH_SIZES:
        out = onnx_utils.run_session(session, x[:b])
        with torch.no_grad():
            check = correctness.compare_to_reference(out, model(x[:b]))
        assert out.shape[0] == b and check[results.SAME_OUTPUT], (b, check)


@pytest.mark.slow
def test_dynamic_batch_export_serves_batches_1_to_3_from_one_session(tmp_path):
    model = tiny_clip_net(hidden=4)
    path = onnx_utils.export_dynamic_batch(model, torch.randn(2, 9, H, W), tmp_path / "dyn.onnx")
    assert onnx_utils.input_batch_dim(path) == "batch"
    check_one_session_serves_batches(model, path, H, W)
    static = onnx_utils.export_onnx(model, torch.randn(1, 9, H, W), tmp_path / "static.onnx")
    assert onnx_utils.input_batch_dim(static) == 1
    with pytest.raises(Exception, match="(?i)dimension|shape|index"):  # a static model refuses batch 2
        onnx_utils.run_session(onnx_utils.make_session(static, threads=1), np.zeros((2, 9, H, W), np.float32))


def test_dynamic_batch_export_refuses_an_empty_range(tmp_path):
    with pytest.raises(onnx_utils.OnnxExportError, match="min_batch"):
        onnx_utils.export_dynamic_batch(tiny_clip_net(), torch.randn(2, 9, H, W), tmp_path / "x.onnx",
                                        min_batch=3, max_batch=2)


def test_blurball_dynamic_batch_matches_eager_for_each_batch(blurball_dynamic_onnx):
    model, path = blurball_dynamic_onnx
    check_one_session_serves_batches(model, path, 32, 64)


@pytest.mark.slow
def test_check_batches_reports_each_batch_or_the_refusal(tmp_path):
    model = tiny_clip_net(hidden=4)
    dynamic = onnx_utils.export_dynamic_batch(model, torch.randn(2, 9, H, W), tmp_path / "dyn.onnx")
    rows = correctness.check_batches(model, dynamic, (9, H, W), threads=1)
    assert [r["batch_size"] for r in rows] == list(BATCH_SIZES) and all(r[results.SAME_OUTPUT] for r in rows)
    static = onnx_utils.export_onnx(model, torch.randn(1, 9, H, W), tmp_path / "static.onnx")
    rows = correctness.check_batches(model, static, (9, H, W), threads=1)
    assert rows[0][results.SAME_OUTPUT] and "error" in rows[1] and "error" in rows[2]
