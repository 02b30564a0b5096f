"""BlurBall, the table-tennis ball detector measured in the book, rebuilt from its specification: WASB's small
HRNet with an SE block in every BasicBlock, layer names as in the released checkpoint so it loads strictly."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import torch
from torch import nn

from graphbook.paths import TRAINED_CHECKPOINT

# Input contract (spec section 3): three frames, ImageNet statistics per frame.
FRAMES_IN = 3
FRAMES_OUT = 3
INPUT_HEIGHT = 288
INPUT_WIDTH = 512
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# WASB / BlurBall HRNet configuration (identical in both projects).
STEM_CHANNELS = 64
BOTTLENECK_PLANES = 32
BOTTLENECK_EXPANSION = 4
STAGE_CHANNELS = ((16, 32), (16, 32, 64), (16, 32, 64, 128))
BLOCKS_PER_BRANCH = 2
SE_REDUCTION = 16
BN_MOMENTUM = 0.1
DEFAULT_SEED = 0

# Stage-4 fuse outputs 1-3 are computed but never read (spec section 5, row 11).
DEAD_MODULE_PREFIXES = ("stage4.0.fuse_layers.1.", "stage4.0.fuse_layers.2.", "stage4.0.fuse_layers.3.")


class CheckpointError(ValueError):
    """A weights file that is not a BlurBall checkpoint, or whose keys do not match."""


# -- Building blocks --
def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_ch: int, out_ch: int) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=1, padding=0, bias=False)


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=1e-5, momentum=BN_MOMENTUM)


class SqueezeExcitation(nn.Module):
    """Channel attention: global average pool, two bias-free Linear layers, sigmoid gate."""

    def __init__(self, channels: int, reduction: int = SE_REDUCTION):
        super().__init__()
        hidden = channels // reduction
        self.fc = nn.Sequential(nn.Linear(channels, hidden, bias=False), nn.ReLU(inplace=True),
                                nn.Linear(hidden, channels, bias=False), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.fc(x.mean(dim=(2, 3)))
        return x * gate[:, :, None, None]


class BasicBlockSE(nn.Module):
    """HRNet BasicBlock with SE after the second BN, before the residual add."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = _conv3x3(channels, channels)
        self.bn1 = _bn(channels)
        self.conv2 = _conv3x3(channels, channels)
        self.bn2 = _bn(channels)
        self.se = SqueezeExcitation(channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.se(self.bn2(self.conv2(out)))
        return self.relu(out + x)


class Bottleneck(nn.Module):
    """HRNet stage-1 Bottleneck (1x1, 3x3, 1x1) with a 1x1 projection shortcut, no SE."""

    def __init__(self, in_ch: int, planes: int, expansion: int = BOTTLENECK_EXPANSION):
        super().__init__()
        out_ch = planes * expansion
        self.conv1 = _conv1x1(in_ch, planes)
        self.bn1 = _bn(planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = _bn(planes)
        self.conv3 = _conv1x1(planes, out_ch)
        self.bn3 = _bn(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = nn.Sequential(_conv1x1(in_ch, out_ch), _bn(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.downsample(x))


def _fuse_path(channels: Sequence[int], src: int, dst: int) -> nn.Module | None:
    """The path that brings branch ``src`` to branch ``dst``'s resolution and width (None if equal)."""
    if src == dst:
        return None
    if src > dst:  # lower resolution into higher: 1x1 conv, BN, then nearest upsampling
        return nn.Sequential(_conv1x1(channels[src], channels[dst]), _bn(channels[dst]),
                             nn.Upsample(scale_factor=2 ** (src - dst), mode="nearest"))
    steps = []  # higher resolution into lower: a chain of stride-2 3x3 convs
    for step in range(dst - src):
        last = step == dst - src - 1
        out_ch = channels[dst] if last else channels[src]
        layers = [_conv3x3(channels[src], out_ch, stride=2), _bn(out_ch)]
        if not last:
            layers.append(nn.ReLU(inplace=True))
        steps.append(nn.Sequential(*layers))
    return nn.Sequential(*steps)


class HighResolutionModule(nn.Module):
    """Parallel branches of BasicBlocks, then every branch fused into every output. All fused outputs are computed, as
    in the released model: 13 of the 72 convolutions are dead compute a graph compiler may remove."""

    def __init__(self, channels: Sequence[int], blocks: int = BLOCKS_PER_BRANCH):
        super().__init__()
        self.branches = nn.ModuleList(
            nn.Sequential(*[BasicBlockSE(c) for _ in range(blocks)]) for c in channels)
        self.fuse_layers = nn.ModuleList(
            nn.ModuleList(_fuse_path(channels, j, i) for j in range(len(channels)))
            for i in range(len(channels)))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        xs = [branch(x) for branch, x in zip(self.branches, xs)]
        fused = []
        for i, paths in enumerate(self.fuse_layers):
            total = xs[0] if i == 0 else paths[0](xs[0])
            for j in range(1, len(xs)):
                total = total + (xs[j] if i == j else paths[j](xs[j]))
            fused.append(self.relu(total))
        return fused


def _transition(prev: Sequence[int], new: Sequence[int]) -> nn.ModuleList:
    """Adapt the previous stage's branches to the next stage's and open one new branch."""
    layers: list[nn.Module | None] = []
    for i, out_ch in enumerate(new):
        if i < len(prev):
            layers.append(None if prev[i] == out_ch else
                          nn.Sequential(_conv3x3(prev[i], out_ch), _bn(out_ch), nn.ReLU(inplace=True)))
        else:  # the new, lower-resolution branch is taken from the last existing branch
            layers.append(nn.Sequential(nn.Sequential(_conv3x3(prev[-1], out_ch, stride=2), _bn(out_ch),
                                                      nn.ReLU(inplace=True))))
    return nn.ModuleList(layers)


def _apply_transition(transition: nn.ModuleList, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [xs[i] if layer is None else layer(xs[i] if i < len(xs) else xs[-1]) for i, layer in enumerate(transition)]


# -- The model --
class BlurBall(nn.Module):
    """BlurBall as released: ``forward(x)`` returns ``{0: logits}``; H and W must be multiples of 8."""

    def __init__(self):
        super().__init__()
        c1, c2, c3 = STAGE_CHANNELS
        self.conv1 = _conv3x3(3 * FRAMES_IN, STEM_CHANNELS)
        self.bn1 = _bn(STEM_CHANNELS)
        self.conv2 = _conv3x3(STEM_CHANNELS, STEM_CHANNELS)
        self.bn2 = _bn(STEM_CHANNELS)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(Bottleneck(STEM_CHANNELS, BOTTLENECK_PLANES))
        stage1_out = BOTTLENECK_PLANES * BOTTLENECK_EXPANSION
        self.transition1 = _transition([stage1_out], c1)
        self.stage2 = nn.Sequential(HighResolutionModule(c1))
        self.transition2 = _transition(c1, c2)
        self.stage3 = nn.Sequential(HighResolutionModule(c2))
        self.transition3 = _transition(c2, c3)
        self.stage4 = nn.Sequential(HighResolutionModule(c3))
        self.final_layers = nn.ModuleList([nn.Conv2d(c3[0], FRAMES_OUT, kernel_size=1, bias=True)])

    def heatmap_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The ``(N, 3, H, W)`` logits (no sigmoid), computing every stage-4 output like the release."""
        if x.dim() != 4 or x.shape[1] != 3 * FRAMES_IN:
            raise ValueError(f"BlurBall expects input (N, {3 * FRAMES_IN}, H, W), got {tuple(x.shape)}")
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        x = self.layer1(x)
        xs = self.stage2(_apply_transition(self.transition1, [x]))
        xs = self.stage3(_apply_transition(self.transition2, xs))
        xs = self.stage4(_apply_transition(self.transition3, xs))
        return self.final_layers[0](xs[0])

    def forward(self, x: torch.Tensor) -> dict[int, torch.Tensor]:
        return {0: self.heatmap_logits(x)}


class BlurBallHeatmap(BlurBall):
    """BlurBall whose ``forward`` returns the logits tensor (simpler to compile and export): what the book times."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.heatmap_logits(x)


def build_blurball(weights: str | Path | None = None, *, seed: int = DEFAULT_SEED,
                   heatmap_only: bool = True) -> BlurBall:
    """A BlurBall in eval mode: the released weights if ``weights`` is given, else seeded random init. The seed drives a
    private generator, so building a model does not disturb the caller's random stream."""
    cls = BlurBallHeatmap if heatmap_only else BlurBall
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls()
        # Default BN (gamma 1, beta 0, mean 0, var 1) is an identity in eval mode, which would make
        # BN folding and BN timing trivially exact; give every BN non-trivial, well-scaled statistics.
        generator = torch.Generator().manual_seed(seed + 1)
        for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
            n = bn.num_features
            with torch.no_grad():
                bn.weight.copy_(0.75 + 0.5 * torch.rand(n, generator=generator))
                bn.bias.copy_(0.1 * torch.randn(n, generator=generator))
                bn.running_mean.copy_(0.1 * torch.randn(n, generator=generator))
                bn.running_var.copy_(0.75 + 0.5 * torch.rand(n, generator=generator))
    if weights is not None:  # strict key and shape checking, with errors that name the keys
        state, expected = _read_state_dict(weights), model.state_dict()
        missing = [k for k in expected if k not in state]
        extra = [k for k in state if k not in expected]
        misshapen = [f"{k} {tuple(state[k].shape)} != {tuple(expected[k].shape)}"
                     for k in expected if k in state and state[k].shape != expected[k].shape]
        problems = [f"{len(keys)} {what} key(s): {', '.join(keys[:5])}"
                    + f" (and {len(keys) - 5} more)" * (len(keys) > 5)
                    for what, keys in (("missing", missing), ("unexpected", extra), ("misshapen", misshapen)) if keys]
        if problems:
            raise CheckpointError("checkpoint does not match BlurBall: " + "; ".join(problems))
        model.load_state_dict(state, strict=True)
    return model.eval()


# -- Weights --
def _read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict of the authors' format or a bare one, ``module.`` prefix stripped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"BlurBall weights file not found: {path}")
    try:
        # weights_only=True: a checkpoint is data; never execute pickled code from a downloaded file.
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for non-checkpoint files
        raise CheckpointError(f"{path} is not a PyTorch checkpoint ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else 'no detail'})") from exc
    if isinstance(obj, Mapping) and "model_state_dict" in obj:
        obj = obj["model_state_dict"]
    if not isinstance(obj, Mapping) or not obj or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise CheckpointError(f"{path} holds no state dict (expected a mapping of parameter names to "
                              f"tensors, optionally under 'model_state_dict')")
    if all(k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    return dict(obj)


def save_weights(model: nn.Module, path: str | Path) -> Path:
    """Save in the authors' layout, ``{"model_state_dict": ...}``."""
    path = Path(path)
    torch.save({"model_state_dict": model.state_dict()}, path)
    return path


def load_trained_blurball(path: str | Path | None = None, *, heatmap_only: bool = True) -> BlurBall:
    """The BlurBall trained on the synthetic clips, in eval mode; a missing file's error names its script."""
    path = Path(path) if path is not None else TRAINED_CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"trained BlurBall checkpoint not found: {path}; "
                                "recreate it with `python code/train_blurball.py --seed 0`")
    return build_blurball(path, heatmap_only=heatmap_only)


# -- Input, output, cost --
def imagenet_normalize(x: torch.Tensor) -> torch.Tensor:
    """Per-frame ImageNet normalisation of ``(N, 3F, H, W)`` frames in [0, 1]."""
    if x.ndim != 4 or x.shape[1] % 3 != 0:
        raise ValueError(f"expected (N, 3*frames, H, W), got {tuple(x.shape)}")
    frames = x.shape[1] // 3
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).repeat(frames).view(1, -1, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).repeat(frames).view(1, -1, 1, 1)
    return (x.float() - mean) / std


def example_input(batch: int = 1, height: int = INPUT_HEIGHT, width: int = INPUT_WIDTH,
                  seed: int = DEFAULT_SEED) -> torch.Tensor:
    """A deterministic normalised input: a textured background and a bright ball moving across three frames."""
    if height % 8 or width % 8 or height < 8 or width < 8:
        raise ValueError(f"height and width must be positive multiples of 8, got {height}x{width}")
    gen = torch.Generator().manual_seed(seed)
    background = 0.35 + 0.15 * torch.rand(batch, 1, 3, height, width, generator=gen)
    frames = background.expand(batch, FRAMES_IN, 3, height, width).clone()
    rows = torch.arange(height).view(-1, 1).float()
    cols = torch.arange(width).view(1, -1).float()
    radius = max(2.0, height / 48)
    for t in range(FRAMES_IN):
        cy, cx = height * (0.3 + 0.15 * t), width * (0.25 + 0.2 * t)
        disc = ((rows - cy) ** 2 + (cols - cx) ** 2) <= radius ** 2
        frames[:, t, :, disc] = torch.tensor([0.95, 0.9, 0.8]).view(1, 3, 1)
    return imagenet_normalize(frames.reshape(batch, 3 * FRAMES_IN, height, width))


def heatmap_peaks(logits: torch.Tensor | Mapping[int, torch.Tensor]) -> torch.Tensor:
    """Per-frame argmax ``(row, col)`` positions, ``(N, F, 2)``: variants agree when every peak is the same pixel."""
    if isinstance(logits, Mapping):
        logits = logits[0]
    n, f, h, w = logits.shape  # anything but (N, F, H, W) raises ValueError here
    flat_index = logits.detach().float().reshape(n, f, h * w).argmax(dim=-1).cpu()
    return torch.stack([flat_index // w, flat_index % w], dim=-1)


def peak_margin(logits: torch.Tensor) -> float:
    """Smallest gap, over frames, between the highest and second-highest logit. A variant whose max abs diff from eager
    is below half this gap cannot move any peak."""
    n, f, h, w = logits.shape
    top2 = logits.detach().float().reshape(n * f, h * w).topk(2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min())
