"""Tests of graphbook.teach.diagnostics: TORCH_LOGS parsing, the graph-break fix, tlparse availability."""
import io

import pytest
import torch

from graphbook.teach import diagnostics as d

_LOG = """\
V1130 18:14:49.512000 27052 torch/_dynamo/symbolic_convert.py:5124] [0/0] [__graph_breaks] Graph break in user code at f.py:3
V1130 18:14:49.512000 27052 torch/_dynamo/symbolic_convert.py:5124] [0/0] [__graph_breaks] Graph Break Reason: print
V1130 18:14:49.512000 27052 torch/_dynamo/symbolic_convert.py:5124] [0/0] [__graph_breaks]   Hint: avoid print
V1130 18:14:52.528000 27052 torch/_dynamo/symbolic_convert.py:5124] [1/0] [__graph_breaks] Graph break in user code at f.py:4
I1130 18:14:53.000000 27052 torch/_dynamo/guards.py:100] [0/1] [__recompiles] Recompiling function f in f.py:1
    triggered by the following guard failure(s):
    - 0/0: tensor 'x' size mismatch at index 0. expected 8, actual 16
I1130 18:14:54.000000 27052 torch/_inductor/compile_fx.py:10] [0/1] compiling the graph
"""


def test_parse_groups_multiline_records_by_artifact_and_excerpts_cut_and_count():
    records = d._parse_torch_log(_LOG)
    assert {k: len(v) for k, v in records.items()} == {"graph_breaks": 2, "recompiles": 1, "other": 1}
    first = records["graph_breaks"][0].splitlines()
    assert first[0] == "Graph break in user code at f.py:3" and first[-1] == "  Hint: avoid print"
    assert "size mismatch" in records["recompiles"][0]
    capture = d.LogCapture(records, 0, 1.0)
    text = capture.excerpt("graph_breaks", max_records=1, max_lines=1)
    assert text.splitlines()[0] == "Graph break in user code at f.py:3"
    assert "(2 more lines)" in text and "1 more graph_breaks records" in text
    assert capture.excerpt("fusion") == "(no fusion records)"
    assert capture.excerpt("graph_breaks", grep="f.py:4").startswith("Graph break in user code at f.py:4")


def test_chapter_artifacts_exist_unknown_names_are_refused_and_a_report_needs_tlparse(monkeypatch, tmp_path):
    assert set(d.CHAPTER_ARTIFACTS) <= set(d.available_log_artifacts())
    with pytest.raises(ValueError, match="unknown TORCH_LOGS"):
        d.capture_torch_logs("pass", ["not_a_log"])
    with pytest.raises(KeyError, match="unknown scenario"):
        d.run_scenario("nope")
    monkeypatch.setattr(d, "tlparse_command", lambda: None)
    assert not d.tlparse_available()
    with pytest.raises(RuntimeError, match="tlparse is not installed"):
        d.tlparse_report(tmp_path / "out")


@pytest.mark.parametrize("values", [torch.zeros(8), torch.ones(8), torch.linspace(-2, 2, 33)])
@pytest.mark.slow  # compiles
def test_fixed_versions_compute_what_the_original_does(values):
    sink = io.StringIO()
    expected = d._detect_with_breaks(values, sink)
    assert sink.getvalue().startswith("peak")
    for fixed in (d._detect_fullgraph, d._detect_cond):
        result, peak = fixed(values)
        assert torch.equal(result, expected)
        assert torch.equal(peak, torch.sigmoid(values * 2).max())


@pytest.mark.slow
def test_unfused_ablation_really_generates_no_kernel():
    from graphbook.compilers import inductor_tools as it

    options = it.ablation_options("without fusion and inlining")
    assert options == {"freezing": False, "fallback_by_default": True}
    model, x = d._small_conv_block(size=8)
    with torch.no_grad():
        expected = model(x)
    code = it.compile_and_get_code(model, x, options=options)
    assert code.kernel_count == 0 and code.launches["generated"] == 0
    assert code.launches["library"] > 10           # one ATen call per decomposed operator
    assert torch.allclose(code.output, expected, atol=1e-5)
