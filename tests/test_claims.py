"""The claims ledger: every claim holds on the book's recording and fails on a copy of it that says otherwise, and the
chapters' takeaways cite only claims the ledger has, at most five a chapter."""
import json
import re

import pytest

from graphbook import paths
from graphbook.ledger import claims


def _scaled(frame, where, column, factor):
    out = frame.copy()
    out.loc[where(out), column] = out.loc[where(out), column] * factor
    return out


def _ort_kernels_no_faster_than_eager(f):
    """E1's contradiction: ONNX Runtime with every rewrite disabled no faster than eager."""
    rows = f["cpu-onnxruntime"]
    eager = rows[rows.variant == "eager_fp32"].set_index("run_id")["median_ms"]
    out = rows.copy()
    disabled = out.variant == "ort_disabled"
    out.loc[disabled, "median_ms"] = out.loc[disabled, "run_id"].map(eager.groupby(level=0).max()).values
    return {**f, "cpu-onnxruntime": out}


def _residual_add_unfused_is_faster(f):
    """E3's contradiction: the out-of-place conv + add without fusion as fast as the in-place one, or faster."""
    return {**f, "cpu-blurball": _scaled(f["cpu-blurball"], lambda r: r.variant.str.startswith(
        "compile_freezing_out_of_place_conv_add_no_fusion"), "median_ms", 0.5)}


def _freezing_still_wrong_in_the_new_torch(f):
    rows = f["torch-versions"].copy()
    newest = rows["torch"].dropna().iloc[-1]
    rows.loc[(rows.torch == newest) & (rows.variant == "compile_freezing"), "same_output"] = False
    return {**f, "torch-versions": rows}


def _layout_worth_nothing(f):
    """Inductor as fast without its layout optimization as with it."""
    rows = f["attribution"].copy()
    inductor = rows[rows.variant == "Inductor"].set_index("run_id")["median_ms"]
    no_layout = rows.variant == "Inductor without layout optimization"
    rows.loc[no_layout, "median_ms"] = rows.loc[no_layout, "run_id"].map(inductor.groupby(level=0).first()).values
    return {**f, "attribution": rows}


def _lower_precision_slower(f):
    return {**f, "cpu-blurball": _scaled(f["cpu-blurball"], lambda r: r.precision.isin(["bf16", "int8"]),
                                         "median_ms", 20.0)}


def _book_server_queues_everything(f):
    rows = f["litserve-compare"].copy()
    book = (rows.server == "book") & rows.overload_level.astype(bool)
    rows.loc[book, "ok"] = rows.loc[book, "sent"]
    rows.loc[book, "overloaded"] = 0
    rows.loc[book, "p99_ms"] = rows.loc[book, "p99_ms"] * 10
    return {**f, "litserve-compare": rows}


def _allocation_costs_nothing(f):
    """The preallocated out= chain no faster than eager: allocation explains nothing."""
    rows = f["fusion-demo"].copy()
    chain = rows["part"] == "chain"
    eager = rows[chain & (rows.variant == "eager")].set_index("run_id")["median_ms"].groupby(level=0).first()
    out = chain & rows.variant.str.contains("out=", regex=False)
    rows.loc[out, "median_ms"] = rows.loc[out, "run_id"].map(eager).values
    return {**f, "fusion-demo": rows}


def _warm_cache_barely_helps(f):
    rows = f["restart-paths"].copy()
    warm = rows.path == "compile-warm"
    rows.loc[warm, "first_output_s"] = rows.loc[warm, "first_output_s"] * 5
    return {**f, "restart-paths": rows}


CONTRADICTIONS = {
    "ort-own-kernels-and-layout-carry-it": _ort_kernels_no_faster_than_eager,
    "residual-add-fusion-pays-in-bf16": _residual_add_unfused_is_faster,
    "freezing-fixed-in-new-torch": _freezing_still_wrong_in_the_new_torch,
    "layout-carries-the-compile": _layout_worth_nothing,
    "lower-precision-beats-fp32": _lower_precision_slower,
    "bounded-queue-refuses-where-litserve-waits": _book_server_queues_everything,
    "allocation-outweighs-traffic": _allocation_costs_nothing,
    "warm-cache-takes-most-of-the-compile-away": _warm_cache_barely_helps,
}


@pytest.fixture(scope="module")
def recording():
    return claims.recorded(sorted({kind for claim in claims.LEDGER.values() for kind in claim.kinds}))


def test_every_claim_has_a_contradicting_copy_of_its_runs():
    assert set(CONTRADICTIONS) == set(claims.LEDGER)


@pytest.mark.parametrize("name", sorted(claims.LEDGER))
def test_a_claim_holds_on_the_recording_and_fails_on_its_contradiction(name, recording):
    claim = claims.LEDGER[name]
    assert claim.holds(recording), f"the recording no longer supports {name}: rewrite the takeaway from the data"
    assert not claim.holds(CONTRADICTIONS[name](recording)), f"{name} accepts runs that contradict it"


CITED = re.compile(r"^% claims: (.+)$", re.M)


def _takeaways(notebook):
    """The takeaways cell's claim names (its ``% claims:`` line) and its bullets."""
    for cell in notebook["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and "## Takeaways" in text:
            section = text.split("## Takeaways", 1)[1].split("\n## ", 1)[0]
            cited = CITED.search(section)
            names = [n.strip() for n in cited.group(1).split(",")] if cited else []
            return names, re.findall(r"^- ", section, re.M)
    return [], []


CHAPTERS = sorted((paths.REPO_ROOT / "chapters").glob("0[1-7]*.ipynb"))


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_a_chapter_states_at_most_five_takeaways_and_cites_only_ledger_claims(path):
    names, bullets = _takeaways(json.loads(path.read_text()))
    assert 0 < len(bullets) <= 5, f"{len(bullets)} takeaways"
    assert set(names) <= set(claims.LEDGER), f"cited claims the ledger lacks: {set(names) - set(claims.LEDGER)}"
    assert len(names) <= len(bullets)


def test_every_ledger_claim_is_a_takeaway_of_some_chapter():
    cited = {name for path in CHAPTERS for name in _takeaways(json.loads(path.read_text()))[0]}
    assert cited == set(claims.LEDGER)
