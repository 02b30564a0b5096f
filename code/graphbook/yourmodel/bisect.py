"""Which Inductor switch makes a compiled variant wrong (Chapter 8): rebuild the variant with one switch changed at a
time, each judged on the check samples, until one passes or the time runs out. The switches tried first are those
this process set away from Inductor's defaults; then the passes that rewrite the graph most."""
from __future__ import annotations

import time
from typing import Callable

import torch._inductor.config as inductor_config

#: Inductor switches that change what is generated, each with the value that turns its rewrite off, in the order
#: tried: the pattern matcher (freezing's conv + add in place lives there), fusion, the layout choice,
#: vectorization, generated code altogether.
REWRITE_SWITCHES = (("pattern_matcher", False), ("max_fusion_size", 1), ("layout_optimization", False),
                    ("cpp.simdlen", 1), ("fallback_by_default", True))
#: Switches that change where things are kept or logged, not what is computed: never the cause.
_BOOKKEEPING = ("cache", "trace.", "debug", "compile_threads", "worker", "provenance")


def _changed_switches() -> dict:
    """Inductor switches this process set away from their defaults, with the defaults (the candidates a reader's
    own configuration adds)."""
    current = inductor_config.get_config_copy()
    return {name: entry.default for name, entry in inductor_config._config.items()
            if current.get(name, entry.default) != entry.default and not any(word in name for word in _BOOKKEEPING)}


def candidates() -> list[tuple[str, object]]:
    """The switches to try, in order: each one changed from its default put back, then the rewrites turned off."""
    changed = list(_changed_switches().items())
    return changed + [(name, value) for name, value in REWRITE_SWITCHES if name not in dict(changed)]


def bisect(judge_with: Callable[[dict], dict], *, time_limit: float, log: Callable[[str], object] = print) -> list[dict]:
    """Try :func:`candidates` one at a time: ``judge_with({switch: value})`` rebuilds the failing variant under that
    patch and judges it. Stops at the first that passes or after ``time_limit`` seconds; one row per try."""
    rows, start = [], time.perf_counter()
    for switch, value in candidates():
        if time.perf_counter() - start > time_limit:
            rows.append({"switch": f"{switch}={value!r}", "status": "not tried: time limit"})
            break
        began = time.perf_counter()
        try:
            verdict = judge_with({switch: value})
        except Exception as error:  # the patched build itself failed: a fact of this switch, the search goes on
            rows.append({"switch": f"{switch}={value!r}", "status": "build failed",
                         "note": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}" if str(error) else "",
                         "seconds": time.perf_counter() - began})
            continue
        rows.append({"switch": f"{switch}={value!r}", "status": "passes" if verdict["passed"] else "still wrong",
                     "seconds": time.perf_counter() - began, **{f"check_{k}": v for k, v in verdict.items()}})
        log(f"  bisect: {rows[-1]['switch']}: {rows[-1]['status']} ({rows[-1]['seconds']:.0f} s)")
        if verdict["passed"]:
            break
    return rows
