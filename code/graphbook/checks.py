"""The book's one comparison with a reference output (Chapters 3-8): every tensor of the output, flattened with
torch's pytree so that tuples and dicts compare, within the book's tolerance of eager FP32's. A task-level check
(a decoded ball, a top-1 class) is the caller's, passed in beside it."""
from __future__ import annotations

import numpy as np
from torch.utils import _pytree as pytree

from graphbook.config import SAME_OUTPUT_ATOL
from graphbook.record.results import (
    MAX_ABS_DIFF,
    PEAK_FRAMES,
    RELATIVE_DIFF,
    SAME_OUTPUT,
    SAME_PEAK_FRAMES,
    SAME_PEAKS,
)


def leaves(output) -> list[np.ndarray]:
    """The tensors (or arrays) of an output, in pytree order, as float64 arrays."""
    def as_array(value):
        if hasattr(value, "detach"):
            value = value.detach().float().cpu().numpy()
        return np.asarray(value, dtype=np.float64)
    return [as_array(leaf) for leaf in pytree.tree_leaves(output)]


def _peaks(maps: np.ndarray) -> np.ndarray:
    """The argmax pixel of each ``(H, W)`` map of an ``(N, C, H, W)`` output."""
    return maps.reshape(*maps.shape[:2], -1).argmax(axis=-1)


def compare_to_reference(output, reference, *, atol: float = SAME_OUTPUT_ATOL) -> dict:
    """How far ``output`` is from ``reference``: the largest absolute difference over every tensor, relative to the
    reference's magnitude where it exceeds 1, and for 4-D outputs (heatmaps) whether each map's peak stays put."""
    outs, refs = leaves(output), leaves(reference)
    if [o.shape for o in outs] != [r.shape for r in refs]:
        raise ValueError(f"output shapes {[o.shape for o in outs]} differ from the reference's "
                         f"{[r.shape for r in refs]}")
    diff = max((float(np.max(np.abs(o - r))) for o, r in zip(outs, refs) if o.size), default=0.0)
    scale = max((float(np.max(np.abs(r))) for r in refs if r.size), default=0.0)
    relative = diff / max(1.0, scale)
    result = {MAX_ABS_DIFF: diff, "reference_scale": scale, RELATIVE_DIFF: relative,
              SAME_OUTPUT: bool(relative <= atol)}
    if len(outs) == 1 and outs[0].ndim == 4:
        same = _peaks(outs[0]) == _peaks(refs[0])
        result.update({SAME_PEAK_FRAMES: int(same.sum()), PEAK_FRAMES: int(same.size), SAME_PEAKS: bool(same.all())})
    return result
