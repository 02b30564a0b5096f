"""Tiny models for the your-model command's tests: each factory returns a module in a few milliseconds."""
from __future__ import annotations

import torch
from torch import nn


class TinyResidual(nn.Module):
    """conv-BN-ReLU, a residual block, pooling and a linear head: every step of the command has something to do."""

    def __init__(self, channels: int = 8, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                                  nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels))
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.body(x) + x)
        return self.head(x.mean(dim=(2, 3)))


def tiny_residual() -> nn.Module:
    torch.manual_seed(0)
    return TinyResidual()


class PlainConvs(nn.Module):
    """Convolutions and ReLUs only: no residual add, so the planted fault scales a convolution instead."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(8, 4, 1))

    def forward(self, x):
        return self.net(x).mean(dim=(2, 3))


def plain_convs() -> nn.Module:
    torch.manual_seed(0)
    return PlainConvs()


class WithGraphBreak(TinyResidual):
    """TinyResidual with a graph break between its body and its head."""

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.body(x) + x)
        torch._dynamo.graph_break()
        return self.head(x.mean(dim=(2, 3)))


@torch.library.custom_op("yourmodel_cases::reverse_channels", mutates_args=())
def reverse_channels(x: torch.Tensor) -> torch.Tensor:
    """An operator of the reader's own: torch.compile calls it, the ONNX exporter knows no translation of it."""
    return x.flip(1).clone()


@reverse_channels.register_fake
def _(x):
    return torch.empty_like(x)


class Unexportable(WithGraphBreak):
    """A graph break, and an operator ONNX has no translation for."""

    def forward(self, x):
        return super().forward(reverse_channels(x))


def unexportable() -> nn.Module:
    torch.manual_seed(0)
    return Unexportable()


def not_a_module():
    return lambda x: x


def raises():
    raise RuntimeError("weights file missing")


def halve_first_convolution(graph: torch.fx.Graph) -> None:
    """A post-grad pass that makes the compiled model wrong: the first convolution's output halved."""
    conv = next(n for n in graph.nodes if n.op == "call_function" and "convolution" in str(n.target))
    with graph.inserting_after(conv):
        halved = graph.call_function(torch.ops.aten.mul.Tensor, (conv, 0.5))
    halved.meta.update(conv.meta)   # the same shape and strides: later passes read them
    conv.replace_all_uses_with(halved, delete_user_cb=lambda user: user is not halved)
