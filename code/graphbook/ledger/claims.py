"""The claims ledger: the takeaways a chapter states, each a named predicate over the recorded runs it rests on.

A chapter cites its claims on a ``% claims:`` line above its takeaways and asserts them in the cell before; a
re-recording that no longer supports a claim fails the page, and each claim's test feeds it a contradicting copy of
its runs, which it must reject. The predicates read the book's recording only, never a reader's live run.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

from graphbook.freezing import torch_versions
from graphbook.method import decision
from graphbook.record import recording, results, runs
from graphbook.serving import decisions, litserve_compare
from graphbook.teach import allocation, attribution

Frames = Mapping[str, pd.DataFrame]


@dataclass(frozen=True)
class Claim:
    """One takeaway: its name (what pages cite), the result kinds it reads, and whether those runs support it."""

    name: str
    kinds: tuple[str, ...]
    holds: Callable[[Frames], bool]


def _ort_own_kernels_and_layout_carry_it(frames: Frames) -> bool:
    """ONNX Runtime's gain over eager comes in two steps of the ladder: its own kernels before any rewrite, and the
    layout rewrite. Each is above 1.3x by the median over runs, while the basic and extended rewrites each add less
    than 1.1x."""
    rows = frames["cpu-onnxruntime"].assign(run_key=lambda f: f["run_id"] + "/" + f["threads"].astype(str))
    flagged = runs.flag_under_load(rows, run="run_key")
    two = flagged[flagged["threads"] == 2]
    machine = runs.deciding_machine(two[two["variant"].isin(attribution.ORT_RUNGS)], run="run_key")
    steps, _ = attribution.ladder(runs.single_machine(two, machine), rungs=attribution.ORT_RUNGS, run="run_key")
    step = {s.rung: s.step for s in steps}
    return min(step["ort_disabled"], step["ort_layout"]) > 1.3 and max(step["ort_basic"], step["ort_extended"]) < 1.1


def _residual_add_fusion_pays_in_bf16(frames: Frames) -> bool:
    """Folding the residual add into the convolution (oneDNN's sum post-op) makes the frozen bf16 model faster in
    every quiet run, while in FP32 the runs disagree on its sign; every variant of the ablation passes its check."""
    rows, _ = decision.full_size_rows(frames["cpu-blurball"])
    fused, unfused = "compile_freezing_no_fusion", "compile_freezing_out_of_place_conv_add_no_fusion"
    ablation = rows[rows["variant"].isin([fused, unfused, fused + "_bf16", unfused + "_bf16"])]
    machine = runs.deciding_machine(ablation)
    ablation = runs.single_machine(ablation, machine)
    fp32, bf16 = (runs.paired_ratios(ablation, fused + suffix, unfused + suffix).get(machine, [])
                  for suffix in ("", "_bf16"))
    return (len(bf16) >= runs.MIN_RUNS and min(bf16) > 1 and len(fp32) >= runs.MIN_RUNS and min(fp32) < 1 < max(fp32)
            and bool(ablation["check_passed"].astype(bool).all()))


def _freezing_fixed_in_new_torch(frames: Frames) -> bool:
    """Freezing failed BlurBall's check under the older torch of the version history and passes under the newer,
    where it beats the default compile in every run."""
    history = results.latest_recording(frames["torch-versions"])
    speeds = torch_versions.speeds(history)   # the older torch first
    old, new = speeds["torch"].iloc[0], speeds["torch"].iloc[-1]
    speeds = speeds.set_index(["torch", "variant"])
    per_run = history[history["record"] == "blurball"].pivot_table(index=["torch", "run_id"], columns="variant",
                                                                   values="median_ms").loc[new]
    return (not speeds.loc[(old, "compile_freezing"), "passed"] and bool(speeds.loc[(new, "compile_freezing"), "passed"])
            and bool((per_run["compile_default"] / per_run["compile_freezing"] > 1).all()))


def _layout_carries_the_compile(frames: Frames) -> bool:
    """Without its layout optimization Inductor keeps less than half of its speed-up over eager (on a log scale),
    while without its generated code it falls below eager: the causes interact, and layout is the largest."""
    found = attribution.recorded_ladder(frames["attribution"])
    if found is None:
        return False
    _, summary, _ = found
    switches = summary["switches"]
    no_layout = switches["eager"] / switches["Inductor without layout optimization"]
    no_codegen = switches["eager"] / switches["Inductor without generated code"]
    return math.log(no_layout) < 0.5 * math.log(summary["total"]) and no_codegen < no_layout


def _lower_precision_beats_fp32(frames: Frames) -> bool:
    """On the deciding machine a lower precision that kept the ball on the hard clips, with a correct FP32 twin, is
    faster than the fastest FP32 variant and ahead of its own runner-up in every quiet run."""
    worker = decisions.lower_precision_worker(frames["cpu-blurball"])
    return worker is not None and worker["faster_than_fp32"] and worker["lower"].decided


def _bounded_queue_refuses_where_litserve_waits(frames: Frames) -> bool:
    """Beyond its queue bound the book's server refuses at once (503) and keeps its tail short; LitServe, with no
    bound, queues every request and its p99 is more than twice the book's."""
    summary = litserve_compare.summarize(results.latest_recording(frames["litserve-compare"]))
    busy = summary[summary["overload"]].set_index("server")
    book, lit = busy.loc["book"], busy.loc["litserve"]
    return bool(book["overloaded"] > 0 and lit["ok"] == lit["sent"] and book["p99_ms"] < lit["p99_ms"] / 2)


def _allocation_outweighs_traffic(frames: Frames) -> bool:
    """In every recorded run of the fusion demo, the four fresh outputs cost eager more than its four memory passes,
    and an allocator that keeps freed memory takes back most of what writing into a preallocated output saves."""
    recorded = frames["fusion-demo"]
    chain = recorded[(recorded["part"] == "chain") & (recorded["variant"] == "eager")]
    split = allocation.recorded_split(recorded)
    r = split[split["machine"] == runs.deciding_machine(chain)].iloc[0]
    return bool(r.allocation_min > r.traffic_max and r.allocator_min > 1
                and 1 - 1 / r.allocator > 0.5 * (1 - 1 / r.allocation))


def _warm_cache_takes_most_of_the_compile_away(frames: Frames) -> bool:
    """From launch to the first correct output: the warm cache folder takes away more than half of a cold compile,
    the saved cache artifacts less than the folder, and the paths built ahead (ONNX Runtime, the C++-loaded .pt2)
    start faster than either."""
    first = decisions.restart_costs(frames["restart-paths"]).set_index("path")["first_output_s"]
    return bool(first["compile-warm"] < 0.5 * first["compile-cold"]
                and first["compile-warm"] < first["compile-artifacts"] < first["compile-cold"]
                and max(first["ort-raw"], first["aoti-cpp"]) < first["compile-warm"])


LEDGER = {claim.name: claim for claim in (
    Claim("ort-own-kernels-and-layout-carry-it", ("cpu-onnxruntime",), _ort_own_kernels_and_layout_carry_it),
    Claim("residual-add-fusion-pays-in-bf16", ("cpu-blurball",), _residual_add_fusion_pays_in_bf16),
    Claim("freezing-fixed-in-new-torch", ("torch-versions",), _freezing_fixed_in_new_torch),
    Claim("layout-carries-the-compile", ("attribution",), _layout_carries_the_compile),
    Claim("lower-precision-beats-fp32", ("cpu-blurball",), _lower_precision_beats_fp32),
    Claim("bounded-queue-refuses-where-litserve-waits", ("litserve-compare",), _bounded_queue_refuses_where_litserve_waits),
    Claim("allocation-outweighs-traffic", ("fusion-demo",), _allocation_outweighs_traffic),
    Claim("warm-cache-takes-most-of-the-compile-away", ("restart-paths",), _warm_cache_takes_most_of_the_compile_away),
)}


def recorded(kinds) -> dict[str, pd.DataFrame]:
    """The reference recording's rows of each kind, as the claims read them."""
    return {kind: recording.load(kind) for kind in kinds}


def evaluate(names) -> pd.DataFrame:
    """Whether the reference recording supports each named claim: one row per claim, ``claim`` and ``holds``."""
    claims = [LEDGER[name] for name in names]
    frames = recorded(sorted({kind for claim in claims for kind in claim.kinds}))
    return pd.DataFrame({"claim": [c.name for c in claims], "holds": [bool(c.holds(frames)) for c in claims]})
