"""graphbook.model.blurball on small inputs: shapes, weight naming, loader errors, normalisation, heatmap helpers."""
import pytest
import torch

from graphbook.model import blurball as bb, model_cost

SMALL = (32, 64)  # multiples of 8, so all four HRNet branches exist, at ~1/72 of the full cost


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)  # unit tests measure nothing; one thread avoids oversubscribing a shared CPU
    return bb.build_blurball()


@pytest.fixture(scope="module")
def small_input():
    return bb.example_input(height=SMALL[0], width=SMALL[1])


def test_heatmap_flavour_equals_released_flavour(model, small_input):
    assert bb.example_input().shape == (1, 9, 288, 512)
    released = bb.build_blurball(heatmap_only=False)
    with torch.no_grad():
        out = released(small_input)
        assert isinstance(out, dict) and list(out) == [0] and out[0].dtype == torch.float32
        assert out[0].shape == (1, 3, *SMALL) and torch.equal(model(small_input), out[0])
    assert isinstance(model, bb.BlurBallHeatmap) and isinstance(model, bb.BlurBall)


def test_seeded_init_is_deterministic_leaves_global_rng_alone_and_randomises_batchnorm():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = bb.build_blurball(seed=0)
    after = torch.rand(1)
    assert torch.equal(before, after), "building a model must not consume the caller's random stream"
    b = bb.build_blurball(seed=0)
    c = bb.build_blurball(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["conv1.weight"], sc["conv1.weight"])
    assert not a.training
    bn = a.bn1  # batch norm is not an identity
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))


def test_state_dict_names_follow_the_released_checkpoint(model):
    sd = model.state_dict()
    expected_shapes = {
        "conv1.weight": (64, 9, 3, 3),
        "bn2.running_var": (64,),
        "layer1.0.conv3.weight": (128, 32, 1, 1),
        "layer1.0.downsample.0.weight": (128, 64, 1, 1),
        "layer1.0.downsample.1.weight": (128,),
        "transition1.0.0.weight": (16, 128, 3, 3),
        "transition1.1.0.0.weight": (32, 128, 3, 3),
        "transition2.2.0.0.weight": (64, 32, 3, 3),
        "transition3.3.0.0.weight": (128, 64, 3, 3),
        "stage2.0.branches.0.0.conv1.weight": (16, 16, 3, 3),
        "stage2.0.branches.1.1.se.fc.0.weight": (2, 32),
        "stage2.0.branches.1.1.se.fc.2.weight": (32, 2),
        "stage4.0.branches.3.1.se.fc.0.weight": (8, 128),
        "stage2.0.fuse_layers.0.1.0.weight": (16, 32, 1, 1),
        "stage2.0.fuse_layers.1.0.0.0.weight": (32, 16, 3, 3),
        "stage4.0.fuse_layers.3.0.2.0.weight": (128, 16, 3, 3),
        "stage4.0.fuse_layers.3.0.1.1.running_mean": (16,),
        "final_layers.0.weight": (3, 16, 1, 1),
        "final_layers.0.bias": (3,),
    }
    for key, shape in expected_shapes.items():
        assert key in sd, key
        assert tuple(sd[key].shape) == shape, key
    assert not any(k.startswith("transition2.0") or k.startswith("transition2.1") for k in sd)
    assert not any("se.fc" in k and k.endswith("bias") for k in sd)
    assert not any(k.startswith("module.") for k in sd)


def test_round_trip_through_a_saved_checkpoint(tmp_path, small_input):
    source = bb.build_blurball(seed=7)
    path = bb.save_weights(source, tmp_path / "blurball.pth")
    raw = torch.load(path, weights_only=True)
    assert set(raw) == {"model_state_dict"}
    fresh = bb.BlurBall()
    fresh.load_state_dict(raw["model_state_dict"], strict=True)  # the release's own loading path
    loaded = bb.build_blurball(path, seed=0)
    with torch.no_grad():
        assert torch.equal(loaded(small_input), source(small_input))


def test_loader_accepts_bare_and_dataparallel_state_dicts(tmp_path):
    source = bb.build_blurball(seed=3)
    torch.save(source.state_dict(), tmp_path / "bare.pt")
    torch.save({"module." + k: v for k, v in source.state_dict().items()}, tmp_path / "dp.pt")
    for name in ("bare.pt", "dp.pt"):
        loaded = bb.build_blurball(tmp_path / name)
        assert torch.equal(loaded.conv1.weight, source.conv1.weight)


def _without_stage4(state):
    for key in [k for k in state if k.startswith("stage4")]:
        state.pop(key)


@pytest.mark.parametrize("modify, error, message", [
    (lambda s: (s.pop("final_layers.0.bias"), s.pop("conv1.weight")), bb.CheckpointError,
     r"2 missing key\(s\): conv1.weight, final_layers.0.bias"),
    (lambda s: s.update({"head.extra.weight": torch.zeros(1)}), bb.CheckpointError,
     r"1 unexpected key\(s\): head.extra.weight"),
    (lambda s: s.update({"final_layers.0.weight": torch.zeros(1, 16, 1, 1)}), bb.CheckpointError,
     r"misshapen.*final_layers.0.weight \(1, 16, 1, 1\) != \(3, 16, 1, 1\)"),
    (_without_stage4, bb.CheckpointError, r"missing key\(s\): .*\(and \d+ more\)"),
    ("absent", FileNotFoundError, "not found"),
    ("this is not a checkpoint\n", bb.CheckpointError, "not a PyTorch checkpoint"),
    ([1, 2, 3], bb.CheckpointError, "holds no state dict"),
], ids=["missing", "unexpected", "misshapen", "many missing", "absent", "text", "a list"])
def test_a_checkpoint_that_is_not_blurballs_is_refused_naming_what_is_wrong(tmp_path, modify, error, message):
    path = tmp_path / "bad.pth"
    if callable(modify):
        state = bb.build_blurball().state_dict()
        modify(state)
        torch.save({"model_state_dict": state}, path)
    elif isinstance(modify, str) and modify != "absent":
        path.write_text(modify)
    elif isinstance(modify, list):
        torch.save(modify, path)
    with pytest.raises(error, match=message):
        bb.build_blurball(path)


def test_normalisation_per_frame_in_time_order_and_bad_input():
    h, w = 4, 6
    mean = torch.tensor(bb.IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(bb.IMAGENET_STD).view(3, 1, 1)
    f0 = mean.expand(3, h, w)               # the mean image normalises to zero
    f1 = (mean + std).expand(3, h, w)       # one std above the mean normalises to one
    f2 = torch.zeros(3, h, w)
    x = bb.imagenet_normalize(torch.cat([f0, f1, f2]).unsqueeze(0))
    assert x.shape == (1, 9, h, w) and x.dtype == torch.float32
    assert torch.allclose(x[0, 0:3], torch.zeros(3, h, w), atol=1e-6)
    assert torch.allclose(x[0, 3:6], torch.ones(3, h, w), atol=1e-6)
    assert torch.allclose(x[0, 6:9, 0, 0], -mean.flatten() / std.flatten())
    with pytest.raises(ValueError, match="3\\*frames"):
        bb.imagenet_normalize(torch.rand(2, 8, 8, 16))


def test_a_reader_s_wrong_input_size_or_missing_checkpoint_is_a_clear_error(model, tmp_path):
    with pytest.raises(ValueError, match=r"expects input \(N, 9, H, W\)"):
        model(torch.zeros(1, 3, 64, 128))
    with pytest.raises(ValueError, match="multiples of 8"):
        bb.example_input(height=100, width=128)
    with pytest.raises(FileNotFoundError, match="train_blurball.py"):
        bb.load_trained_blurball(tmp_path / "absent.pt")


def test_heatmap_peaks():
    logits = torch.zeros(2, 3, 5, 7)
    logits[0, 0, 1, 2] = 5
    logits[0, 1, 4, 6] = 5
    logits[0, 2, 0, 0] = 5
    logits[1, :, 3, 3] = 1
    peaks = bb.heatmap_peaks({0: logits})
    assert peaks.shape == (2, 3, 2) and peaks.dtype == torch.long
    assert peaks[0].tolist() == [[1, 2], [4, 6], [0, 0]]
    assert peaks[1].tolist() == [[3, 3]] * 3
    assert bb.peak_margin(logits) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        bb.heatmap_peaks(torch.zeros(3, 5, 7))


def test_parameter_count_and_macs_by_hooks(model, small_input):
    params = model_cost.parameter_count(model)
    assert params == sum(p.numel() for p in model.parameters())
    # Hand count for the head (1x1, 16 -> 3, with bias) and the first conv (3x3, 9 -> 64).
    macs = model_cost.macs_by_module(model, small_input)
    h, w = SMALL
    assert macs["final_layers.0"] == 3 * h * w * 16
    assert macs["conv1"] == 64 * h * w * 9 * 9
    assert macs["stage2.0.branches.0.0.se.fc.0"] == 1 * 16
    assert len(macs) == 72 + 36
    cost = model_cost.model_cost(model, small_input)
    assert cost.macs == sum(macs.values())
    assert 0 < cost.dead_macs < cost.macs
    # MACs scale with the pixel count for conv layers: doubling both sides multiplies conv MACs by 4.
    big = model_cost.model_cost(model, bb.example_input(height=2 * h, width=2 * w))
    assert big.macs == pytest.approx(4 * cost.macs, rel=1e-3)
    assert cost.gflop == pytest.approx(2 * cost.macs / 1e9)

