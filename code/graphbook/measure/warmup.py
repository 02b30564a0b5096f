"""Recompilation and warm-up: how many graphs batch sizes 1, 2, 3 cost, and how to pay before serving.

Introduced in Chapter 6. torch.compile guards every graph on the input shapes; a new batch size that
fails a guard means a new compile on the request path. Three policies differ:

- ``"automatic"`` (``dynamic=None``, the default): the first shape is compiled static; the first
  *different* shape triggers one recompile with a symbolic batch dimension that then covers the rest.
- ``"static"`` (``dynamic=False``): one compile per distinct shape.
- ``"mark_dynamic"``: ``torch._dynamo.mark_dynamic(x, 0)`` on the inputs asks for a symbolic batch
  dimension from the first call (sizes 0 and 1 are still specialised by Dynamo).

The cure is the same for all of them: call every batch size the server will see once, before it
reports ready (:func:`warm_up`), then prove that traffic compiles nothing more with recompilation
turned into an error (:func:`_no_recompiles`, :func:`serve_random_sequence`).
"""
from __future__ import annotations

import contextlib
import random
import time

import torch
from torch import nn
from torch._dynamo.utils import counters

from graphbook.config import BATCH_SIZES

STRATEGIES = ("automatic", "static", "mark_dynamic")


class TinyClipNet(nn.Module):
    """A two-layer stand-in for BlurBall with the same input contract (Introduced in Chapter 6).

    Input (N, 9, H, W): three normalised RGB frames stacked on channels; output (N, 3, H, W): one
    heatmap logit per frame. Small enough that a test compiles it in seconds.
    """

    def __init__(self, hidden: int = 8, in_channels: int = 9, out_channels: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, hidden, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(hidden)
        self.act = nn.ReLU()
        self.head = nn.Conv2d(hidden, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.bn(self.conv(x))))


def tiny_clip_net(hidden: int = 8, seed: int = 0) -> TinyClipNet:
    """A seeded, eval-mode :class:`TinyClipNet` with non-trivial BN statistics (Chapter 6).

    A factory by name (``"graphbook.measure.warmup:tiny_clip_net"``) so a fresh process can rebuild it.
    """
    gen = torch.Generator().manual_seed(seed)
    net = TinyClipNet(hidden)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        net.bn.running_mean.copy_(torch.randn(hidden, generator=gen) * 0.1)
        net.bn.running_var.copy_(torch.rand(hidden, generator=gen) + 0.5)
    return net.eval()


def logits_of(output) -> torch.Tensor:
    """The logits tensor of a model output: the tensor itself, or entry 0 of a dict/list (Chapter 6).

    BlurBall returns ``{0: logits}`` (one entry per output scale); the tiny model returns the tensor.
    """
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and 0 in output:
        return output[0]
    if isinstance(output, (list, tuple)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find logits in a model output of type {type(output).__name__}")


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled since the counters were last cleared (Chapter 6)."""
    return int(counters["stats"]["unique_graphs"])


def _check_sizes(batch_sizes) -> tuple[int, ...]:
    sizes = tuple(int(b) for b in batch_sizes)
    if not sizes or any(b < 1 for b in sizes):
        raise ValueError(f"batch sizes must be positive integers, got {tuple(batch_sizes)!r}")
    return sizes


def compile_for(model: nn.Module, strategy: str = "automatic", **compile_kwargs):
    """``torch.compile`` a model under one of :data:`STRATEGIES` (Chapter 6)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    dynamic = False if strategy == "static" else None
    return torch.compile(model, dynamic=dynamic, **compile_kwargs)


def count_compiles(model: nn.Module, input_chw, batch_sizes=BATCH_SIZES, strategy: str = "automatic",
                   *, reset: bool = True, **compile_kwargs) -> list[dict]:
    """Call a freshly compiled model on each batch size in order; count graphs per call (Chapter 6).

    Returns one dict per call: ``batch_size``, ``seconds`` (the call, compile included),
    ``graphs_total`` (graphs compiled so far) and ``compiled`` (True if this call compiled a graph).
    ``reset`` clears Dynamo's in-memory caches and counters first, so the counts start from zero;
    the on-disk Inductor cache is untouched (a warm cache makes each compile cheaper, not fewer).
    """
    sizes = _check_sizes(batch_sizes)
    if reset:
        torch._dynamo.reset()
        counters.clear()
    compiled = compile_for(model, strategy, **compile_kwargs)
    rows = []
    before = graphs_compiled()
    with torch.no_grad():
        for b in sizes:
            x = torch.randn(b, *input_chw)
            if strategy == "mark_dynamic":
                torch._dynamo.mark_dynamic(x, 0)
            t0 = time.perf_counter()
            compiled(x)
            seconds = time.perf_counter() - t0
            now = graphs_compiled()
            rows.append({"strategy": strategy, "batch_size": b, "seconds": seconds,
                         "graphs_total": now - (0 if reset else before), "compiled": now > before})
            before = now
    return rows


def warm_up(compiled, input_chw, batch_sizes=BATCH_SIZES, *, calls_per_size: int = 1) -> dict[int, float]:
    """Call ``compiled`` on every batch size once (or more) before serving; seconds per size (Chapter 6).

    With torch.compile the first call of each size *is* the compilation, so this is where a server
    spends its start-up time. Returns ``{batch_size: seconds of the first call}``.
    """
    sizes = _check_sizes(batch_sizes)
    if calls_per_size < 1:
        raise ValueError(f"calls_per_size must be >= 1, got {calls_per_size}")
    seconds = {}
    with torch.no_grad():
        for b in sizes:
            x = torch.randn(b, *input_chw)
            t0 = time.perf_counter()
            compiled(x)
            seconds[b] = time.perf_counter() - t0
            for _ in range(calls_per_size - 1):
                compiled(x)
    return seconds


@contextlib.contextmanager
def _no_recompiles():
    """Inside this block any recompilation raises ``RuntimeError`` instead of compiling (Chapter 6).

    Uses ``torch.compiler.set_stance("fail_on_recompile")``: a first compile of a new function is
    still allowed, but a guard failure on an already compiled one is an error, which is the proof
    that warm-up covered every shape. The stance is process-wide: while the block runs, every thread's
    compiles are under it, and another thread's ``set_stance`` changes it underneath. Use it in a
    single-threaded check like :func:`serve_random_sequence`; a server's worker thread runs its model
    with ``torch._dynamo.run`` instead (:class:`graphbook.serving.runners.TorchRunner`), which never
    compiles and belongs to the calling thread alone.
    """
    with torch.compiler.set_stance("fail_on_recompile"):
        yield


def serve_random_sequence(compiled, input_chw, batch_sizes=BATCH_SIZES, *, requests: int = 20,
                          seed: int = 0) -> dict:
    """Serve ``requests`` calls with random batch sizes under :func:`_no_recompiles` (Chapter 6).

    Returns ``{"requests", "sizes_seen", "new_graphs"}``; ``new_graphs`` is 0 after a complete warm-up
    (a recompile would have raised before it could be counted).
    """
    sizes = _check_sizes(batch_sizes)
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    rng = random.Random(seed)
    sequence = [rng.choice(sizes) for _ in range(requests)]
    before = graphs_compiled()
    with _no_recompiles(), torch.no_grad():
        for b in sequence:
            compiled(torch.randn(b, *input_chw))
    return {"requests": len(sequence), "sizes_seen": sorted(set(sequence)),
            "new_graphs": graphs_compiled() - before}
