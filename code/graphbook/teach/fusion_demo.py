"""The article's CPU fusion demo as a library: chain variants, the bytes-moved model, measurements (Chapter 2).

Introduced in Chapter 2. ``code/03_fusion.py`` (the article's script, where the article puts it) is a
thin command line over this module; Chapter 2 and Chapter 3 import it directly. Three measurements:

(a) **BN folding**: a 3x3 convolution followed by an eval-mode BatchNorm2d against the same convolution
    with the BN folded into its weights.
(b) **An element-wise chain** ``x*2 -> +1 -> relu -> *3``: eager (a new tensor per op), ``torch.compile``
    (one fused loop), manual in-place, into a preallocated output, and the compiled loop into a
    preallocated output; each against the bytes-moved model (:func:`bytes_moved`) and the ``copy_``
    bandwidth of the same run. (a) and (b) are timed together by :func:`measure_runs`, in the book's run
    protocol; :mod:`graphbook.teach.allocation` measures what the bytes model leaves out, the first touch of fresh pages.
(c) **Compile time** of the chain in fresh processes, cold then warm cache, per run -- :func:`measure_compile_time`.

:func:`csv_rows` turns the results into rows of ``CSV_COLUMNS``; :func:`_format_report` and
:func:`write_report` make the ``03_fusion.out.txt`` report.

The imports below are absolute (``from graphbook import ...``) on purpose: :func:`measure_compile_time`
has a fresh process load this file by its path, outside the package.
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from graphbook.measure import compiletime, probes, timing
from graphbook.record import runs as runs_lib
from graphbook.teach.folding import fold_conv_bn

DEFAULT_SIZE = 2 ** 25          # float32 elements per array: 128 MiB, well beyond the private caches
DEFAULT_REPEATS = 7             # the article took the median of 7 runs
DEFAULT_FEATURE_MAP = (64, 288, 512)  # channels, height, width: BlurBall's full-resolution stem
CHAIN_OPS = 4                   # x*2, +1, relu, *3
FLOAT_BYTES = 4
REPORT_NAME = "03_fusion.out.txt"
DEFAULT_RUNS = 3               # independent runs per invocation (the book decides on medians across runs)
CSV_COLUMNS = ["run_id", "part", "variant", "run", "size_elements", "feature_map", "median_ms",
               "min_ms", "max_ms", "q1_ms", "q3_ms", "repeats", "model_bytes", "gb_per_s",
               "share_of_copy", "speedup_vs_eager", "max_abs_diff", "change_pct", "compile_s",
               "fxgraph_cache_hit", "fxgraph_cache_miss", "run_order", "went_first", "copy_gbps", "run_count",
               "faults_per_new_tensor"]


# The element-wise chain, four ways (and the fused loop into an output).
# >>> taught on chapters/02_fusion_on_a_laptop_cpu.ipynb: edit it there, then run scripts/export_taught_code.py
def chain(x: torch.Tensor) -> torch.Tensor:
    """The four-op chain ``relu(x*2 + 1) * 3``, eager: every op writes a new tensor."""
    return torch.relu(x * 2 + 1) * 3


def chain_inplace(x: torch.Tensor) -> torch.Tensor:
    """One new tensor, then three in-place ops on it: four passes, one allocation."""
    y = x * 2
    y.add_(1)
    y.relu_()
    y.mul_(3)
    return y


def chain_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The same four passes into a preallocated ``out``: no allocation at all."""
    torch.mul(x, 2, out=out)
    out.add_(1)
    out.relu_()
    out.mul_(3)
    return out


def chain_fused_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """For torch.compile: the fused loop writing into ``out``, so no fresh output is timed with it."""
    out.copy_(chain(x))
    return out
# <<< end of the code taught on chapters/02_fusion_on_a_laptop_cpu.ipynb


def bytes_moved(n_elements: int, ops: int = CHAIN_OPS, fused: bool = False) -> int:
    """Bytes a chain of ``ops`` element-wise float32 ops moves by the bytes-moved model (Chapter 2).

    Unfused, each op reads ``4N`` bytes and writes ``4N``: ``8N * ops``. Fused, the values stay in
    registers between ops: one read and one write, ``8N``. Caches and allocation are ignored.
    """
    if n_elements < 1 or ops < 1:
        raise ValueError("n_elements and ops must be >= 1")
    passes = 1 if fused else ops
    return 2 * FLOAT_BYTES * n_elements * passes


def count_cpp_kernels(code: str) -> int:
    """Number of C++ kernels defined in Inductor's generated CPU code (Chapter 2).

    Each kernel is compiled through one ``async_compile.cpp_pybinding(`` call, whatever its name.
    """
    return code.count("async_compile.cpp_pybinding(")


# ---------------------------------------------------------------- (a) BN folding
def _conv_bn(channels: int) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
    bn = nn.BatchNorm2d(channels)
    with torch.no_grad():  # "trained" statistics, so the fold is not a no-op
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return conv.eval(), bn.eval()


def _bn_folding_setup(feature_map=DEFAULT_FEATURE_MAP, seed: int = 0) -> dict:
    """Build conv3x3 + BN and its folded conv on one ``(C, H, W)`` feature map, once, and check them (Chapter 2).

    Returns the modules, the input and ``max_abs_diff`` / ``max_rel_diff`` (folded vs unfolded output);
    :func:`measure_runs` times them, as often as wanted, without rebuilding anything.
    """
    channels, height, width = feature_map
    torch.manual_seed(seed)
    conv, bn = _conv_bn(channels)
    folded = fold_conv_bn(conv, bn)
    x = torch.randn(1, channels, height, width)
    with torch.no_grad():
        reference, candidate = bn(conv(x)), folded(x)
        max_abs = (reference - candidate).abs().max().item()
        max_rel = max_abs / reference.abs().max().item()
    return {"feature_map": list(feature_map), "max_abs_diff": max_abs, "max_rel_diff": max_rel,
            "versions": {"unfolded": lambda: bn(conv(x)), "folded": lambda: folded(x)}}


# ---------------------------------------------------------------- (b) the chain, timed
def _chain_setup(n_elements: int = DEFAULT_SIZE, compile_chain: bool = True, seed: int = 0) -> dict:
    """Build (and compile) the chain's versions on ``n_elements`` float32 values once, and check them (Chapter 2).

    The versions are eager, torch.compile, manual in-place, preallocated out= and torch.compile into
    out= (the fused loop without a fresh output tensor); with ``compile_chain=False`` the two compiled
    ones are left out. Each is checked against eager (``max_abs_diff``; the compiled ones compile in
    that first call). :func:`measure_runs` times them.
    """
    torch.manual_seed(seed)
    x = torch.randn(n_elements)
    out = torch.zeros(n_elements)
    expected = chain(x)
    versions = [("eager", lambda: chain(x), False)]
    if compile_chain:
        torch._dynamo.reset()
        compiled = torch.compile(chain)
        compiled_into = torch.compile(chain_fused_into)
        versions.append(("torch.compile", lambda: compiled(x), True))
    versions += [("manual in-place", lambda: chain_inplace(x), False),
                 ("preallocated out=", lambda: chain_into(x, out), False)]
    if compile_chain:
        versions.append(("torch.compile, out=", lambda: compiled_into(x, out), True))
    checked = []
    for name, fn, fused in versions:
        max_abs = (fn() - expected).abs().max().item()  # correctness first (also compiles)
        checked.append({"variant": name, "fn": fn, "model_bytes": bytes_moved(n_elements, fused=fused),
                        "max_abs_diff": max_abs})
    del expected
    return {"n_elements": n_elements, "versions": checked}


def _folding_result(setup: dict, runs: list[dict]) -> dict:
    return {k: setup[k] for k in ("feature_map", "max_abs_diff", "max_rel_diff")} | {"runs": runs}


def _chain_result(setup: dict, runs: list[dict]) -> dict:
    """The runs, plus ``copy`` and ``variants`` summarised across them: medians of the per-run values,
    ``min_ms``/``max_ms`` the fastest and slowest run's median (what the report prints)."""
    def middle(values):
        return statistics.median(values)

    copy = {"gb_per_s": middle([r["copy"]["gb_per_s"] for r in runs]),
            "median_ms": middle([r["copy"]["median_ms"] for r in runs])}
    summary = []
    for index, version in enumerate(setup["versions"]):
        per_run = [r["variants"][index] for r in runs]
        medians = [v["median_ms"] for v in per_run]
        summary.append({"variant": version["variant"], "median_ms": middle(medians), "min_ms": min(medians),
                        "max_ms": max(medians), "model_bytes": version["model_bytes"],
                        "gb_per_s": middle([v["gb_per_s"] for v in per_run]),
                        "share_of_copy": middle([v["share_of_copy"] for v in per_run]),
                        "speedup_vs_eager": middle([v["speedup_vs_eager"] for v in per_run]),
                        "max_abs_diff": version["max_abs_diff"]})
    return {"n_elements": setup["n_elements"], "copy": copy, "variants": summary, "runs": runs}


_FOLDING_NAMES = {"unfolded": "conv+bn", "folded": "folded conv"}


def measure_runs(feature_map=DEFAULT_FEATURE_MAP, n_elements: int = DEFAULT_SIZE, repeats: int = DEFAULT_REPEATS,
                 runs: int = DEFAULT_RUNS, compile_chain: bool = True, seed: int = 0, progress=None) -> tuple[dict, dict]:
    """Parts (a) and (b) built and checked once, then timed in ``runs`` runs of the book's protocol (Chapter 2).

    :func:`graphbook.measure.timing.repeated_runs` times the BN folding pair and the chain's versions in an
    order that rotates between runs, after that run's ``copy_`` probe on buffers of the chain's size.
    Returns ``(folding, chain_result)``: ``folding`` has ``max_abs_diff``, ``max_rel_diff`` and ``runs``
    (per run: ``unfolded`` and ``folded`` timing dicts, ``first`` and ``change_pct``, the time folding
    saved in % of the unfolded median); ``chain_result`` has ``runs`` (per run: ``order``, ``copy`` and
    ``variants`` with ``gb_per_s``, ``share_of_copy``, ``speedup_vs_eager``) and the same summarised
    across runs (medians). ``progress(message)`` receives the protocol's log lines, if given.
    """
    folding_setup = _bn_folding_setup(feature_map, seed)
    chain_state = _chain_setup(n_elements, compile_chain, seed)
    calls = {_FOLDING_NAMES[name]: fn for name, fn in folding_setup["versions"].items()}
    calls.update({v["variant"]: v["fn"] for v in chain_state["versions"]})

    def copy_probe() -> dict:
        copy = probes.copy_bandwidth(nbytes=n_elements * FLOAT_BYTES, repeats=repeats)
        return {"copy_gbps": copy["gb_per_s"], "copy_probe": copy}

    with torch.no_grad():
        rows = timing.repeated_runs(calls, runs=runs, warmup=2, repeats=repeats, probe_bytes=None,
                                    probes=copy_probe, log=progress,
                                    groups=[list(_FOLDING_NAMES.values()), [v["variant"] for v in chain_state["versions"]]])
    folding_runs, chain_runs = [], []
    for number in range(1, runs + 1):
        this_run = sorted((r for r in rows if r["run"] == number), key=lambda r: r["run_order"])
        by_name = {r["variant"]: {k: v for k, v in r.items() if k in _TIMING_KEYS} | {"name": r["variant"]}
                   for r in this_run}
        unfolded, folded = by_name[_FOLDING_NAMES["unfolded"]], by_name[_FOLDING_NAMES["folded"]]
        first = next(key for key, name in _FOLDING_NAMES.items()
                     if name == next(r["variant"] for r in this_run if r["variant"] in _FOLDING_NAMES.values()))
        folding_runs.append({"run": number, "first": first, "unfolded": unfolded, "folded": folded,
                             "change_pct": (unfolded["median_ms"] - folded["median_ms"]) / unfolded["median_ms"] * 100})
        copy = this_run[0]["copy_probe"]
        variants = []
        for version in chain_state["versions"]:
            row = by_name[version["variant"]]
            rate = version["model_bytes"] / (row["median_ms"] * 1e-3) / 1e9
            variants.append({"variant": version["variant"], **row, "model_bytes": version["model_bytes"],
                             "gb_per_s": rate, "share_of_copy": rate / copy["gb_per_s"],
                             "speedup_vs_eager": by_name["eager"]["median_ms"] / row["median_ms"],
                             "max_abs_diff": version["max_abs_diff"]})
        order = [r["variant"] for r in this_run if r["variant"] in {v["variant"] for v in chain_state["versions"]}]
        chain_runs.append({"run": number, "order": order, "copy": copy, "variants": variants})
    return _folding_result(folding_setup, folding_runs), _chain_result(chain_state, chain_runs)


_TIMING_KEYS = ("median_ms", "min_ms", "max_ms", "q1_ms", "q3_ms", "repeats", "warmup", "device")


# ---------------------------------------------------------------- the chain from in-cache to DRAM
def cache_levels(env: dict) -> dict[str, int]:
    """The CPU's data caches from a fingerprint, in bytes: ``L1d``, ``L2``, ``L3`` (those it recorded) (Chapter 2)."""
    levels = {}
    for name, column in (("L1d", "cpu_l1d_kib"), ("L2", "cpu_l2_kib"), ("L3", "cpu_l3_kib")):
        try:
            kib = int(env.get(column) or 0)
        except (TypeError, ValueError):
            kib = 0
        if kib > 0:
            levels[name] = kib * 1024
    return levels


def chain_size_sweep(exponents=(10, 12, 14, 16, 18, 20, 22, 24, 26), *, runs: int = 3, env: dict | None = None):
    """Eager against compiled on the chain at sizes from in-cache to far beyond it, with the run protocol (Chapter 2).

    For each ``n = 2**e`` floats: the compiled chain is checked against eager, then both are timed in
    ``runs`` alternated runs (:func:`graphbook.measure.timing.live_runs`). Returns a DataFrame with
    ``elements``, ``array_bytes`` (one array), ``eager_ms``, ``compiled_ms`` (medians across runs),
    ``speedup`` (median of the per-run ratios), ``speedup_min``, ``speedup_max`` and ``model_speedup``
    (what the bytes-moved model predicts: the same factor at every size).
    """
    compiled = torch.compile(chain)
    rows = []
    for exponent in exponents:
        n = 2 ** int(exponent)
        x = torch.randn(n)
        if not torch.allclose(compiled(x), chain(x), rtol=1e-6, atol=1e-6):
            raise AssertionError(f"the compiled chain differs from eager at n = 2^{exponent}")
        repeats = 30 if n <= 2 ** 18 else 10 if n <= 2 ** 22 else 4
        pair = timing.live_runs({"eager": lambda: chain(x), "compiled": lambda: compiled(x)}, runs=runs,
                                warmup=3, repeats=repeats, env=env)
        ratios = next(iter(runs_lib.paired_ratios(pair, "compiled", "eager").values()))
        medians = runs_lib.summarize_runs(pair).set_index("variant")["median"]
        rows.append({"elements": n, "array_bytes": n * FLOAT_BYTES, "eager_ms": float(medians["eager"]),
                     "compiled_ms": float(medians["compiled"]), "speedup": statistics.median(ratios),
                     "speedup_min": min(ratios), "speedup_max": max(ratios),
                     "model_speedup": bytes_moved(n) / bytes_moved(n, fused=True)})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- (c) compile time, cold and warm
def measure_compile_time(n_elements: int = DEFAULT_SIZE, threads: int = 1, runs: int = 3) -> dict:
    """Compile time of :func:`chain` in fresh processes, ``runs`` times: empty cache, then warm (Chapter 2).

    Each run gets a new empty Inductor cache folder (removed afterwards): its first child finds it empty
    (cold), its second finds what the first wrote (a restart with a warm cache). Returns ``runs``, one dict
    per run (``run``, ``cold`` and ``warm`` with ``seconds`` and the cache hit and miss counts,
    ``warm_over_cold``), and ``warm_over_cold``, the median of the runs' ratios.
    """
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise ValueError(f"runs must be an integer >= 1, got {runs!r}")
    pairs = []
    for run in range(1, runs + 1):
        with tempfile.TemporaryDirectory(prefix="fusion-inductor-cache-") as directory:
            cold = compiletime.compile_in_fresh_process(__file__, "chain", [[n_elements]], directory,
                                                        threads=threads)
            warm = compiletime.compile_in_fresh_process(__file__, "chain", [[n_elements]], directory,
                                                        threads=threads)
        pairs.append({"run": run, "cold": cold, "warm": warm, "warm_over_cold": warm["seconds"] / cold["seconds"]})
    return {"runs": pairs, "warm_over_cold": statistics.median(p["warm_over_cold"] for p in pairs)}


# ---------------------------------------------------------------- report and records
def csv_rows(folding: dict, chain_result: dict, compile_result: dict | None, run_id: str | None = None,
             allocator: list[dict] | None = None) -> list[dict]:
    """One CSV row per measurement, all with the columns of ``CSV_COLUMNS`` (Chapter 2).

    ``allocator`` (rows of :func:`graphbook.teach.allocation.allocator_runs`) adds part ``allocator``: per run and allocator, the eager
    chain's median (``median_ms``) and ``faults_per_new_tensor``.

    Rows of run ``k`` carry ``run`` = k, ``run_order`` (1 = timed first in its part), ``went_first``
    and ``copy_gbps`` (that run's ``copy_`` probe of part (b)); ``results.write_run(..., per_run=True)``
    gives them the run id ``<file stem>/r<k>``. The compile-time rows come first: run ``k``'s cold and
    warm first calls (``run_order`` 1 and 2, in fresh processes sharing that run's own cache folder), with
    no ``copy_`` probe. Without ``run_id`` the rows carry none (``results.write_run`` assigns it).
    """
    rows = []
    for pair in (compile_result or {}).get("runs", []):
        for order, variant in enumerate(("cold", "warm"), start=1):
            rows.append({"part": "compile_time", "variant": variant, "run": pair["run"], "run_order": order,
                         "size_elements": chain_result["n_elements"],
                         # the schema's name for compile time (graphbook.record.results.COMPILE_S)
                         **{("compile_s" if k == "seconds" else k): v for k, v in pair[variant].items()}})
    fmap = "x".join(str(v) for v in folding["feature_map"])
    timing_keys = ("median_ms", "min_ms", "max_ms", "q1_ms", "q3_ms", "repeats")
    chain_by_run = {r["run"]: r for r in chain_result.get("runs", [])}
    count = max(len(folding["runs"]), len(chain_by_run), len((compile_result or {}).get("runs", [])))
    for run in folding["runs"]:
        probe = chain_by_run.get(run["run"], {}).get("copy", {}).get("gb_per_s")
        first = run.get("first", "unfolded")
        for variant in ("unfolded", "folded"):
            rows.append({"part": "bn_folding", "variant": variant, "run": run["run"], "feature_map": fmap,
                         **{k: run[variant][k] for k in timing_keys},
                         "max_abs_diff": folding["max_abs_diff"],
                         "change_pct": run["change_pct"] if variant == "folded" else None,
                         "run_order": 1 if variant == first else 2, "went_first": first,
                         "copy_gbps": probe, "run_count": count})
    for chain_run_result in chain_by_run.values():
        number, copy, order = chain_run_result["run"], chain_run_result["copy"], chain_run_result["order"]
        per_run = {"part": "chain", "run": number, "size_elements": chain_result["n_elements"],
                   "went_first": order[0], "copy_gbps": copy["gb_per_s"], "run_count": count}
        rows.append({**per_run, "variant": "copy_ (bandwidth probe)", "median_ms": copy["median_ms"],
                     "min_ms": copy["min_ms"], "max_ms": copy["max_ms"], "model_bytes": copy["bytes_moved"],
                     "gb_per_s": copy["gb_per_s"], "share_of_copy": 1.0, "run_order": 0})
        for variant in chain_run_result["variants"]:
            rows.append({**per_run, "run_order": order.index(variant["variant"]) + 1,
                         **{k: variant[k] for k in ("variant", *timing_keys, "model_bytes", "gb_per_s",
                                                    "share_of_copy", "speedup_vs_eager", "max_abs_diff")}})
    for row in allocator or []:
        rows.append({"part": "allocator", "variant": row["allocator"], "run": row["run"],
                     "run_order": row["run_order"], "size_elements": chain_result["n_elements"],
                     "median_ms": row["eager chain"], "faults_per_new_tensor": row["faults_per_new_tensor"],
                     "run_count": count})
    columns = CSV_COLUMNS if run_id is not None else [c for c in CSV_COLUMNS if c != "run_id"]
    return [{column: row.get(column) for column in columns} | ({"run_id": run_id} if run_id else {}) for row in rows]


def _format_report(env: dict, folding: dict, chain_result: dict, compile_result: dict | None) -> str:
    """The text of ``03_fusion.out.txt``: the environment header, then parts (a), (b) and (c) (Chapter 2)."""
    lines = ["# code/03_fusion.py output", "# environment"]
    lines += [f"#   {key}: {value}" for key, value in env.items()]
    c, h, w = folding["feature_map"]
    lines += ["", f"(a) BN folding: conv3x3 {c}->{c} + BatchNorm2d on a 1x{c}x{h}x{w} feature map",
              f"    max abs difference folded vs unfolded: {folding['max_abs_diff']:.3g} "
              f"(relative {folding['max_rel_diff']:.3g})"]
    for run in folding["runs"]:
        lines.append(f"    run {run['run']}: conv+BN {run['unfolded']['median_ms']:.2f} ms, folded "
                     f"{run['folded']['median_ms']:.2f} ms -> {run['change_pct']:+.1f}% time saved"
                     + (f" ({run['first']} timed first)" if "first" in run else ""))
    n = chain_result["n_elements"]
    copy = chain_result["copy"]
    per_run_copy = ", ".join(f"{r['copy']['gb_per_s']:.2f}" for r in chain_result.get("runs", []))
    runs = len(chain_result.get("runs", [])) or 1
    lines += ["", f"(b) element-wise chain relu(x*2 + 1)*3 on N = {n} float32 ({n * 4 / 2**20:.0f} MiB per array), "
              f"{runs} run{'s' if runs != 1 else ''} in a rotated order (medians across runs; min..max: the runs' medians)",
              f"    copy_ bandwidth (median of the runs' probes): {copy['gb_per_s']:.2f} GB/s "
              f"({copy['median_ms']:.2f} ms per copy)"
              + (f"; per run {per_run_copy} GB/s" if per_run_copy else ""),
              f"    {'version':<22}{'median ms':>10}{'min..max ms':>18}{'model MB':>10}{'GB/s':>8}"
              f"{'of copy':>9}{'vs eager':>10}{'max|diff|':>11}"]
    for v in chain_result["variants"]:
        spread = f"{v['min_ms']:.3g}..{v['max_ms']:.3g}"
        lines.append(f"    {v['variant']:<22}{v['median_ms']:>10.2f}{spread:>18}{v['model_bytes'] / 1e6:>10.4g}"
                     f"{v['gb_per_s']:>8.2f}{v['share_of_copy'] * 100:>8.0f}%{v['speedup_vs_eager']:>9.2f}x"
                     f"{v['max_abs_diff']:>11.2g}")
    lines.append("")
    if compile_result is None:
        lines.append("(c) compile time: skipped (--no-compile)")
    else:
        lines.append("(c) compile time of the chain, first call in a fresh process (each run its own empty cache)")
        for pair in compile_result["runs"]:
            cold, warm = pair["cold"], pair["warm"]
            lines.append(f"    run {pair['run']}: empty cache {cold['seconds']:.2f} s (FX graph cache misses "
                         f"{cold['fxgraph_cache_miss']}), warm cache {warm['seconds']:.2f} s (hits "
                         f"{warm['fxgraph_cache_hit']}), {pair['warm_over_cold']:.2f} of the cold time")
        lines.append(f"    median warm/cold ratio: {compile_result['warm_over_cold']:.2f}")
    return "\n".join(lines) + "\n"


def write_report(directory: str | Path, env: dict, folding: dict, chain_result: dict,
                 compile_result: dict | None) -> Path:
    """Write :func:`_format_report` to ``directory/03_fusion.out.txt`` (created if needed); return its path (Chapter 2)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / REPORT_NAME
    path.write_text(_format_report(env, folding, chain_result, compile_result))
    return path


def failed_checks(folding: dict, chain_result: dict, atol: float) -> list[str]:
    """Names of the measured versions whose output differs from the reference by more than ``atol`` (Chapter 2).

    The folded convolution is compared with conv + BN, every chain version with the eager chain.
    """
    failed = ["folded conv"] if folding["max_abs_diff"] > atol else []
    return failed + [v["variant"] for v in chain_result["variants"] if v["max_abs_diff"] > atol]
