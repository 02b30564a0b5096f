"""Scoring detections against the clips' labels (graphbook.model.scoring, Chapter 6)."""
import math

import numpy as np

from graphbook.model import decoding, scoring, synthetic_clips


def test_decoding_ground_truth_scores_perfectly_and_so_does_an_oracle_model_but_not_a_blind_one():
    held = synthetic_clips._make_clips(4, seed=9, height=64, width=96)
    logits = np.stack([np.where(c.targets > 0, 6.0, -6.0) for c in held]).astype(np.float32)
    rows = scoring.match_detections(decoding.decode_batch(logits), held)
    summary = scoring.summarize_matches(rows)
    assert summary["detection_rate"] == 1.0 and summary["false_positive_rate"] in (0.0,) or math.isnan(
        summary["false_positive_rate"])
    assert summary["median_error_px"] < 0.5
    assert len(rows) == 12 and all(isinstance(v, float) for v in summary.values() if not isinstance(v, int))
    import torch

    held = synthetic_clips._make_clips(3, seed=4, height=32, width=48, p_no_ball=0.0)
    targets = synthetic_clips.targets_to_tensor(held)

    class Oracle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            out = targets[self.calls:self.calls + x.shape[0]] * 12 - 6
            self.calls += x.shape[0]
            return {0: out}  # BlurBall's dict output is accepted too

    summary, rows = scoring.evaluate_model(Oracle(), held, batch_size=2)
    assert summary["detection_rate"] == 1.0 and len(rows) == 9
    blind, _ = scoring.evaluate_model(lambda x: torch.full((x.shape[0], 3, 32, 48), -5.0), held)
    assert blind["detection_rate"] == 0.0 and math.isnan(blind["median_error_px"])
