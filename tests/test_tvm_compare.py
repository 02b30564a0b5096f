"""Real TVM against the book's fusion rules (graphbook.teach.tvm_compare): group counts by composition pinned,
so that a change on either side (the book's rules, BlurBall, or a TVM release) is noticed."""
import pytest

from graphbook.teach import tvm_compare as tc

TVM_OK, TVM_WHY = tc.tvm_status()


def test_status_says_why_when_absent(monkeypatch):
    monkeypatch.setattr(tc, "_tvm_installed", lambda: False)
    ok, why = tc.tvm_status()
    assert not ok and "requirements-tvm.txt" in why


@pytest.fixture(scope="module")
def comparison():
    if not TVM_OK:
        pytest.skip(TVM_WHY)
    return tc.compare(height=16, width=32)


@pytest.mark.slow
def test_totals_compositions_and_differences(comparison):
    c = comparison
    assert (c.book_live, c.book_dead) == (117, 16)
    assert c.relax_ops == 388                       # the 42 dead stage-4 nodes never reach Relax
    assert (c.tvm_default, c.tvm_decomposed) == (182, 134)
    counts = comparison.counts
    book, default, decomposed = counts["book_live"], counts["tvm_default"], counts["tvm_decomposed"]
    assert book["conv2d + batch_norm + relu"] == 27 and book["conv2d + batch_norm"] == 27
    assert book["mean"] == 18 and book["linear + relu"] == 18
    # default pipeline: legalized batch_norm is injective, so no conv absorbs it
    assert default["conv2d"] == 58 and default["batch_norm + relu"] == 27 and default["batch_norm"] == 18
    # decomposed: the convs take BN (subtract, divide, multiply, add) and the ReLU
    assert decomposed["conv2d + subtract + divide + multiply + add + relu"] == 27
    assert decomposed["conv2d + subtract + divide + multiply + add"] == 27
    assert decomposed["expand_dims + expand_dims + multiply + add + relu"] == 17
    rows = {row["difference"]: row for row in comparison.differences}
    assert rows["dead stage-4 outputs"]["number"] == 16
    assert rows["BN not absorbed by its conv (default pipeline)"]["number"] == 58
    assert rows["SE tail split at expand_dims (decomposed pipeline)"]["number"] == 18
    assert "(accounted for)" in rows["kernels, all told"]["why"]
    assert int(comparison.by_kind.loc["total", "TVM default"]) == 182
