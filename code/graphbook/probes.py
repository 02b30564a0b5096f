"""The two physical limits of a machine, measured in the same run as the work (Chapter 1).

- :func:`copy_bandwidth` -- how many bytes per second memory can move: ``dst.copy_(src)`` into a
  preallocated tensor (a STREAM-style "copy"), counting the bytes read *and* the bytes written.
- :func:`matmul_peak` -- how many floating-point operations per second the cores can do: one large
  square matrix product, counted as ``2 * n**3`` FLOPs (a multiply and an add per term).

Their ratio is the roofline's ridge point (FLOPs per byte): work with fewer FLOPs per byte than that
is limited by memory, work with more by compute.
"""
from __future__ import annotations

MIB = 1024 ** 2


def _positive_int(label: str, value, lowest: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
        raise ValueError(f"{label} must be an integer >= {lowest}, got {value!r}")
    return value


def copy_bandwidth(nbytes: int = 256 * MIB, repeats: int = 5, device: str = "cpu",
                   warmup: int = 2) -> dict:
    """Memory bandwidth from ``dst.copy_(src)`` with both tensors allocated up front (Chapter 1).

    ``nbytes`` is the size of *one* buffer (float32, rounded down to whole elements); each copy moves
    ``2 * nbytes`` (read + write). Use buffers far larger than the last-level cache, or the number is
    cache bandwidth. Returns ``gb_per_s`` (decimal GB, 1e9 bytes), ``bytes_moved`` (per copy),
    ``median_ms``, ``min_ms``, ``max_ms``, ``nbytes`` and ``device``. The touch before timing makes
    the operating system map every page first, so page faults are not counted as bandwidth.
    """
    import torch

    from .record.timing import time_fn

    _positive_int("nbytes", nbytes, 4)
    _positive_int("repeats", repeats)
    elements = nbytes // 4
    src = torch.rand(elements, device=device)
    dst = torch.zeros(elements, device=device)  # zeros, not empty: touch every page now
    result = time_fn(lambda: dst.copy_(src), device=device, warmup=warmup, repeats=repeats,
                     name="copy_")
    moved = 2 * elements * 4
    return {"gb_per_s": moved / (result.median_ms * 1e-3) / 1e9, "bytes_moved": moved,
            "median_ms": result.median_ms, "min_ms": result.min_ms, "max_ms": result.max_ms,
            "nbytes": elements * 4, "device": str(device)}


def matmul_peak(n: int = 2048, dtype=None, device: str = "cpu", repeats: int = 5,
                warmup: int = 2) -> dict:
    """Compute throughput from one ``n x n`` by ``n x n`` matrix product (Chapter 1).

    FLOPs per product are ``2 * n**3``. ``dtype`` defaults to torch.float32. The BLAS library's
    matmul is the fastest dense kernel on most machines, so this is a practical peak, usually a
    little below the vendor's theoretical one. Returns ``gflop_per_s``, ``flops``, ``median_ms``,
    ``min_ms``, ``max_ms``, ``n``, ``dtype`` and ``device``.
    """
    import torch

    from .record.timing import time_fn

    _positive_int("n", n)
    _positive_int("repeats", repeats)
    dtype = torch.float32 if dtype is None else dtype
    a = torch.rand(n, n, device=device, dtype=dtype)
    b = torch.rand(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    result = time_fn(lambda: torch.mm(a, b, out=out), device=device, warmup=warmup, repeats=repeats,
                     name="matmul")
    flops = 2 * n ** 3
    return {"gflop_per_s": flops / (result.median_ms * 1e-3) / 1e9, "flops": flops,
            "median_ms": result.median_ms, "min_ms": result.min_ms, "max_ms": result.max_ms,
            "n": n, "dtype": str(dtype).replace("torch.", ""), "device": str(device)}


def bf16_support() -> tuple[bool, str]:
    """Whether this CPU runs bfloat16 convolutions natively, and why (Chapter 5).

    Native means oneDNN reports AVX512-BF16 or AMX; otherwise bf16 is emulated, and neither a bf16
    peak nor a bf16 speedup would mean anything.
    """
    import torch

    if not torch.backends.mkldnn.is_available():
        return False, "torch was built without oneDNN (mkldnn)"
    try:
        supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False, "this torch build cannot report oneDNN bfloat16 support"
    if not supported:
        return False, "the CPU lacks native bfloat16 instructions (AVX512-BF16 / AMX), so bf16 would be emulated"
    return True, f"oneDNN reports native bfloat16 ({torch.backends.cpu.get_cpu_capability()})"
