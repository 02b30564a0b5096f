"""Library vision models the book does not otherwise use, for Chapter 8: built from transformers' own configurations
with seeded random weights (nothing is downloaded), and table-tennis frames to feed them."""
from __future__ import annotations

from pathlib import Path

import torch
import transformers
from torch import nn

from graphbook.model import blurball, synthetic_clips

#: ImageNet's classes: the heads are sized as the released checkpoints'.
CLASSES = 1000
SEED = 0
#: Images the BatchNorm statistics are set from (other frames than :func:`images` gives).
STATISTICS_IMAGES = 8


def _seeded(build, size: int = 224) -> nn.Module:
    """A model built under a private seed, so its random weights are the same on every machine and run. Random
    weights leave BatchNorm's running statistics at mean 0 and variance 1, which shrinks the activations layer by
    layer to nothing (MobileNetV2's logits come out near 1e-23); the statistics are set from a few frames instead,
    as a trained model's are from its data."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = build()
    batch_norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if batch_norms:
        frames = synthetic_clips.frames_to_tensor(synthetic_clips.calibration_clips(STATISTICS_IMAGES, size, size))
        for bn in batch_norms:
            bn.reset_running_stats()
            bn.momentum = None   # a plain average over the batches seen
        model.train()
        with torch.no_grad():
            model(blurball.imagenet_normalize(frames[:, 3:6]))
    return model.eval()


def resnet50() -> nn.Module:
    """ResNet-50 (bottleneck residual CNN), transformers' default ResNet configuration."""
    return _seeded(lambda: transformers.ResNetForImageClassification(transformers.ResNetConfig(num_labels=CLASSES)))


def resnet18() -> nn.Module:
    """ResNet-18 (basic-block residual CNN): small enough to run live in Chapter 8."""
    config = transformers.ResNetConfig(num_labels=CLASSES, depths=[2, 2, 2, 2], layer_type="basic",
                                       hidden_sizes=[64, 128, 256, 512])
    return _seeded(lambda: transformers.ResNetForImageClassification(config))


def mobilenet_v2() -> nn.Module:
    """MobileNetV2 (depthwise convolutions, inverted residuals, ReLU6)."""
    return _seeded(lambda: transformers.MobileNetV2ForImageClassification(
        transformers.MobileNetV2Config(num_labels=CLASSES)))


def vit_small() -> nn.Module:
    """A ViT of DeiT-small's shape (12 layers, width 384, 6 heads, 16-pixel patches): attention, no convolution but
    the patch embedding, no BatchNorm."""
    config = transformers.ViTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                                    intermediate_size=1536, num_labels=CLASSES)
    return _seeded(lambda: transformers.ViTForImageClassification(config))


def images(n: int, size: int = 224) -> torch.Tensor:
    """``n`` ImageNet-normalised ``(3, size, size)`` images: the middle frame of the book's held-out table-tennis
    clips, a textured scene with a ball, not noise."""
    clips = synthetic_clips.held_out_clips(n, size, size)
    middle = synthetic_clips.frames_to_tensor(clips)[:, 3:6]
    return blurball.imagenet_normalize(middle)


def save_images(path: str | Path, n: int = 16, size: int = 224) -> Path:
    """:func:`images` as the command's inputs file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(images(n, size), path)
    return path
