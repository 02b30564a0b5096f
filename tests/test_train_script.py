"""code/train_blurball.py (Chapter 6) and graphbook.model.training: a tiny run, its outputs, its helpers."""
import json
from pathlib import Path

import pytest

from graphbook import paths
from graphbook.model import training

TINY = ["--height", "32", "--width", "32", "--batch-size", "1", "--max-steps", "2", "--epoch-steps", "1",
        "--val-clips", "1", "--final-val-clips", "1", "--full-eval-clips", "0", "--threads", "1"]


@pytest.mark.slow
def test_tiny_training_run_writes_checkpoint_log_and_provenance(tmp_path, run_main, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main("train_blurball.py", *TINY, "--checkpoint-dir", tmp_path, "--seed", "3")
    assert code == 0, err
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["blurball_synthetic.log.csv", "blurball_synthetic.provenance.json", "blurball_synthetic.pt"]
    provenance = json.loads((tmp_path / "blurball_synthetic.provenance.json").read_text())
    assert provenance["seed"] == 3 and provenance["steps"] == 2 and provenance["samples_seen"] == 2
    assert {"git_commit", "date", "machine", "args", "train_wall_seconds", "final_metrics"} <= provenance.keys()
    assert provenance["checkpoint_bytes"] <= 10 * 1024 * 1024
    assert provenance["final_metrics"]["32x32"]["clips"] == 1
    log_lines = (tmp_path / "blurball_synthetic.log.csv").read_text().strip().splitlines()
    assert len(log_lines) == 3 and log_lines[0].startswith("epoch,step,samples")

    # The checkpoint loads into BlurBall with strict key checking, in the authors' layout.
    import torch

    from graphbook.model import blurball

    raw = torch.load(tmp_path / "blurball_synthetic.pt", weights_only=True)
    assert set(raw) == {"model_state_dict"}
    model = blurball.build_blurball(tmp_path / "blurball_synthetic.pt")
    assert tuple(model(torch.zeros(1, 9, 32, 32)).shape) == (1, 3, 32, 32)

    # A second run never overwrites the first: it takes the next free name.
    assert run_main("train_blurball.py", *TINY, "--checkpoint-dir", tmp_path, "--max-steps", "1")[0] == 0
    assert (tmp_path / "blurball_synthetic-2.pt").exists()
    assert (tmp_path / "blurball_synthetic.provenance.json").read_text() == json.dumps(provenance, indent=2) + "\n"


def test_loss_weights_target_pixels_output_paths_never_reuse_a_name_and_the_record_is_strict_json(tmp_path):
    import torch

    logits = torch.full((1, 1, 4, 4), -10.0)
    target = torch.zeros(1, 1, 4, 4)
    target[0, 0, 0, 0] = 1.0
    plain = training._line_loss(logits, target, "mse")
    weighted = training._line_loss(logits, target, "weighted-mse", pos_weight=15.0)
    assert float(plain) == pytest.approx(1 / 16, rel=1e-3)
    assert float(weighted) == pytest.approx(15 / 30, rel=1e-3)  # the missed pixel weighs half the loss
    first = training._output_paths(tmp_path, "run")
    assert [p.name for p in first.values()] == ["run.pt", "run.log.csv", "run.provenance.json"]
    first["log"].write_text("")  # one of the three files taken is enough to move on
    assert training._output_paths(tmp_path, "run")["checkpoint"].name == "run-2.pt"
    import numpy as np

    record = training._json_ready({"a": float("nan"), "b": [np.float32(1.5), Path("x")], "c": np.int64(3)})
    assert json.dumps(record, allow_nan=False) == '{"a": null, "b": [1.5, "x"], "c": 3}'


def test_the_books_checkpoint_finds_the_ball():
    """The committed checkpoint (data/checkpoints/) matches its provenance and detects held-out balls."""
    import hashlib

    import torch

    from graphbook.model import blurball, scoring, synthetic_clips

    checkpoint = paths.TRAINED_CHECKPOINT
    provenance = json.loads(checkpoint.with_name("blurball_synthetic.provenance.json").read_text())
    assert checkpoint.stat().st_size <= 10 * 1024 * 1024
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() == provenance["checkpoint_sha256"]
    assert (checkpoint.parent / provenance["log"]).is_file()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = blurball.load_trained_blurball()
        held_out = synthetic_clips.held_out_clips(6, 96, 160, max_speed=30.0)
        summary, _ = scoring.evaluate_model(model, held_out, batch_size=2)
    finally:
        torch.set_num_threads(threads)
    assert summary["detection_rate"] >= 0.8
    assert summary["median_error_px"] < 2.0
