"""Dynamic batch in ONNX (graphbook.runtimes.onnx_utils.export_dynamic_batch, Chapter 7): one session, batches 1-3."""
import pytest
import torch

from graphbook.config import BATCH_SIZES
from graphbook.measure.warmup import tiny_clip_net
from graphbook.record import results
from graphbook import checks
from graphbook.runtimes import onnx_utils


@pytest.mark.slow
def test_dynamic_batch_export_refuses_an_empty_range_and_matches_eager_for_each_batch(tmp_path, blurball_dynamic_onnx):
    with pytest.raises(onnx_utils.OnnxExportError, match="min_batch"):
        onnx_utils.export_dynamic_batch(tiny_clip_net(), torch.randn(2, 9, 16, 24), tmp_path / "x.onnx",
                                        min_batch=3, max_batch=2)
    model, path = blurball_dynamic_onnx
    session = onnx_utils.make_session(path, threads=1)
    assert session.get_inputs()[0].shape[0] == "batch"
    x = torch.randn(max(BATCH_SIZES), 9, 32, 64, generator=torch.Generator().manual_seed(0))
    for b in BATCH_SIZES:
        out = onnx_utils.run_session(session, x[:b])
        with torch.no_grad():
            check = checks.compare_to_reference(out, model(x[:b]))
        assert out.shape[0] == b and check[results.SAME_OUTPUT], (b, check)
