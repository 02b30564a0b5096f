"""Recompilation and warm-up: torch.compile guards graphs on input shapes, so a new batch size can compile on
the request path; the cure is to call every size before serving, then prove traffic compiles nothing."""
from __future__ import annotations

import random
import time

import torch
from torch import nn
from torch._dynamo.utils import counters

from graphbook.config import BATCH_SIZES

STRATEGIES = ("automatic", "static", "mark_dynamic")


class TinyClipNet(nn.Module):
    """A two-layer stand-in for BlurBall with the same (N, 9, H, W) -> (N, 3, H, W) contract, quick to compile."""

    def __init__(self, hidden: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(9, hidden, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(hidden)
        self.act = nn.ReLU()
        self.head = nn.Conv2d(hidden, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.bn(self.conv(x))))


def tiny_clip_net(hidden: int = 8) -> TinyClipNet:
    """A seeded, eval-mode :class:`TinyClipNet`; a factory by name so a fresh process can rebuild it."""
    gen = torch.Generator().manual_seed(0)
    net = TinyClipNet(hidden)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        net.bn.running_mean.copy_(torch.randn(hidden, generator=gen) * 0.1)
        net.bn.running_var.copy_(torch.rand(hidden, generator=gen) + 0.5)
    return net.eval()


def logits_of(output) -> torch.Tensor:
    """The logits of a model output: the tensor, or entry 0 of BlurBall's ``{0: logits}``."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and 0 in output:
        return output[0]
    if isinstance(output, (list, tuple)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find logits in a model output of type {type(output).__name__}")


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled since the counters were last cleared."""
    return int(counters["stats"]["unique_graphs"])


def _check_sizes(batch_sizes) -> tuple[int, ...]:
    sizes = tuple(int(b) for b in batch_sizes)
    if not sizes or any(b < 1 for b in sizes):
        raise ValueError(f"batch sizes must be positive integers, got {tuple(batch_sizes)!r}")
    return sizes


def compile_for(model: nn.Module, strategy: str = "automatic"):
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    return torch.compile(model, dynamic=False if strategy == "static" else None)


def count_compiles(model: nn.Module, input_chw, batch_sizes=BATCH_SIZES, strategy: str = "automatic") -> list[dict]:
    """Call a freshly compiled model on each batch size in order: seconds and graphs compiled per call. Dynamo's
    in-memory caches are cleared first; a warm on-disk cache makes compiles cheaper, not fewer."""
    sizes = _check_sizes(batch_sizes)
    torch._dynamo.reset()
    counters.clear()
    compiled = compile_for(model, strategy)
    rows = []
    before = 0
    with torch.no_grad():
        for b in sizes:
            x = torch.randn(b, *input_chw)
            if strategy == "mark_dynamic":
                torch._dynamo.mark_dynamic(x, 0)
            t0 = time.perf_counter()
            compiled(x)
            seconds = time.perf_counter() - t0
            now = graphs_compiled()
            rows.append({"strategy": strategy, "batch_size": b, "seconds": seconds, "graphs_total": now,
                         "compiled": now > before})
            before = now
    return rows


def warm_up(compiled, input_chw, batch_sizes=BATCH_SIZES) -> dict[int, float]:
    """``{batch_size: seconds of the first call}``: with torch.compile the first call of a size is its compile."""
    sizes = _check_sizes(batch_sizes)
    seconds = {}
    with torch.no_grad():
        for b in sizes:
            x = torch.randn(b, *input_chw)
            t0 = time.perf_counter()
            compiled(x)
            seconds[b] = time.perf_counter() - t0
    return seconds


def serve_random_sequence(compiled, input_chw, batch_sizes=BATCH_SIZES, *, requests: int = 20,
                          seed: int = 0) -> dict:
    """Serve ``requests`` random batch sizes where a recompile raises: ``new_graphs`` is 0 after a full warm-up."""
    sizes = _check_sizes(batch_sizes)
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    rng = random.Random(seed)
    sequence = [rng.choice(sizes) for _ in range(requests)]
    before = graphs_compiled()
    # set_stance is process-wide, so this is a single-threaded check; a server's worker runs its model with
    # torch._dynamo.run instead, which never compiles
    with torch.compiler.set_stance("fail_on_recompile"), torch.no_grad():
        for b in sequence:
            compiled(torch.randn(b, *input_chw))
    return {"requests": len(sequence), "sizes_seen": sorted(set(sequence)),
            "new_graphs": graphs_compiled() - before}
