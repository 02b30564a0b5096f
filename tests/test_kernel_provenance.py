"""Inductor's provenance record of BlurBall's kernels (Chapter 3): the table logic on a small mapping, the
recorded mapping against the generated code published with it, and (slow) a fresh traced compile."""
import json
import re
import shutil

import pandas as pd
import pytest
import yaml

from graphbook import paths
from graphbook.record import recording, results
from graphbook.teach import kernel_provenance as kp
from graphbook.teach.fusion_rules import FusionGroup, OpClass

# A mapping shaped like Inductor's: an SE gate whose mean shares a kernel with the block's batch norm
MAPPING = {
    "cppCodeToPost": {"cpp_fused_batch_norm_mean_0:1": ["add", "mean", "mul"], "extern_kernels.mm:2": ["mm"],
                      "cpp_fused_relu_sigmoid_1:3": ["relu", "sigmoid"], "cpp_fused_2:4": ["orphan"]},
    "postToCppCode": {}, "preToPost": {},
    "postToPre": {"add": ["bn"], "mul": ["bn"], "mean": ["mean"], "mm": ["linear"], "relu": ["relu"],
                  "sigmoid": ["gate"]},
    "version": 2.0,
}
NODES = {"bn": {"op": "batch_norm", "module": "blk.bn2"}, "mean": {"op": "mean", "module": "blk.se"},
         "linear": {"op": "linear", "module": "blk.se.fc.0"}, "relu": {"op": "relu", "module": "blk.se.fc.1"},
         "gate": {"op": "sigmoid", "module": "blk.se.fc.3"}, "other": {"op": "add", "module": "blk2"}}
GROUPS = {"bn": FusionGroup(4, ("conv", "bn"), ("conv2d", "batch_norm"), OpClass.COMPLEX_OUT_FUSABLE, "conv"),
          "mean": FusionGroup(5, ("mean",), ("mean",), OpClass.REDUCTION, "mean"),
          "linear": FusionGroup(6, ("linear", "relu"), ("linear", "relu"), OpClass.COMPLEX_OUT_FUSABLE, "linear"),
          "relu": FusionGroup(6, ("linear", "relu"), ("linear", "relu"), OpClass.COMPLEX_OUT_FUSABLE, "linear"),
          "gate": FusionGroup(7, ("gate",), ("sigmoid",), OpClass.INJECTIVE, "gate")}
WRAPPER = """
cpp_fused_batch_norm_mean_0 = async_compile.cpp_pybinding(['float*'], '''
''')
cpp_fused_relu_sigmoid_1 = async_compile.cpp_pybinding(['float*'], '''
''')
cpp_fused_2 = async_compile.cpp_pybinding(['float*'], '''
''')
class Runner:
    def call(self, args):
        cpp_fused_batch_norm_mean_0(buf0, buf1)
        extern_kernels.mm(buf1, arg0, out=buf2)
        cpp_fused_relu_sigmoid_1(buf2)
        cpp_fused_2(buf2)
        return (buf2, )
runner = Runner()
"""


def _frame():
    return pd.DataFrame(kp.provenance_rows(MAPPING, NODES))


def test_rows_follow_each_launch_to_its_eager_operators_and_the_page_s_code_pane_is_read():
    rows = kp.provenance_rows(MAPPING, NODES)
    assert [tuple(r[c] for c in ("kernel", "launch", "post_grad_node", "pre_grad_node")) for r in rows[:3]] == [
        ("cpp_fused_batch_norm_mean_0", 1, "add", "bn"), ("cpp_fused_batch_norm_mean_0", 1, "mul", "bn"),
        ("cpp_fused_batch_norm_mean_0", 1, "mean", "mean")]
    assert [r["op"] for r in rows if r["launch"] == 3] == ["relu", "sigmoid"]   # eager order, not by name
    orphan = [r for r in rows if r["launch"] == 4]
    assert orphan == [{"kernel": "cpp_fused_2", "launch": 4, "post_grad_node": "orphan", "pre_grad_node": "",
                       "node_index": -1, "op": "", "module": ""}]
    with pytest.raises(ValueError, match="not an Inductor provenance mapping"):
        kp.provenance_rows({"version": 2.0}, NODES)
    page = ('<div id="postGradGraph" class="editor"><pre>graph</pre></div>'
            '<div id="generatedCode" class="editor">\n<pre style="x"><span class="k">if</span> a &lt; b: f(&quot;x&quot;)</pre></div>')
    assert kp.page_output_code(page) == 'if a < b: f("x")'
    with pytest.raises(ValueError):
        kp.page_output_code("<html></html>")


def test_block_table_lists_a_module_with_the_book_groups_differences_and_untraced_launches():
    table = kp.block_table(_frame(), "blk", GROUPS)
    assert list(table["eager operator"]) == ["bn2: batch_norm", "se: mean", "se.fc.0: linear", "se.fc.1: relu",
                                             "se.fc.3: sigmoid"]
    assert table.set_index("pre-grad node").loc["bn", "post-grad nodes"] == "add, mul"
    many = kp.provenance_rows({**MAPPING, "postToPre": {**MAPPING["postToPre"], "mean": ["bn"], "mm": ["bn"]}}, NODES)
    assert kp.block_table(pd.DataFrame(many), "blk")["post-grad nodes"].iloc[0] == "add, mean, mul +1 more"
    assert table.set_index("pre-grad node").loc["linear", "Inductor kernels"] == "extern_kernels.mm #2"
    assert table.set_index("pre-grad node").loc["mean", "book group"] == "5: mean"
    se = kp.block_table(_frame(), "blk.se")
    assert "book group" not in se and len(se) == 4 and se["eager operator"].iloc[0] == "(block): mean"
    with pytest.raises(ValueError, match="no traced operator"):
        kp.block_table(_frame(), "bl")   # a name prefix is not a module
    found = kp.fusion_differences(kp.block_table(_frame(), "blk", GROUPS))
    assert [(d["difference"], d["where"]) for d in found] == [
        ("Inductor fused, the book splits", "cpp_fused_batch_norm_mean_0 #1"),
        ("Inductor fused, the book splits", "cpp_fused_relu_sigmoid_1 #3"),
        ("the book fuses, Inductor splits", "6: linear + relu")]
    assert found[0]["across"] == "4: conv2d + batch_norm; 5: mean"
    assert found[2]["operators"] == "se.fc.0: linear, se.fc.1: relu"
    assert kp.launches(WRAPPER) == ["cpp_fused_batch_norm_mean_0", "extern_kernels.mm", "cpp_fused_relu_sigmoid_1",
                                    "cpp_fused_2"]
    assert kp.untraced_launches(_frame(), WRAPPER) == ["cpp_fused_2 #4"]
    swapped = WRAPPER.replace("extern_kernels.mm(buf1, arg0, out=buf2)\n        cpp_fused_relu_sigmoid_1(buf2)",
                              "cpp_fused_relu_sigmoid_1(buf2)\n        extern_kernels.mm(buf1, arg0, out=buf2)")
    assert kp.untraced_launches(_frame(), swapped) == ["cpp_fused_relu_sigmoid_1 #2", "extern_kernels.mm #3",
                                                       "cpp_fused_2 #4"]


# ------------------------------------------------------------------ the recording and its published page
BLOCK, GATE = "stage2.0.branches.0.0", "stage2.0.branches.0.0.se"


@pytest.fixture(scope="module")
def recorded():
    return results.latest_recording(recording.load("kernel-provenance"))


@pytest.fixture(scope="module")
def page():
    return (paths.PROVENANCE_VIEW_DIR / "index.html").read_text()


def test_the_recording_traces_every_launch_of_the_code_published_where_chapter_3_links_it(recorded, page):
    frame = recorded.fillna({"pre_grad_node": ""})
    assert frame[frame["pre_grad_node"] != ""]["kernel"].nunique() >= 3
    assert (recorded[["height", "width"]].drop_duplicates().values.tolist() == [[96, 160]])
    assert kp.untraced_launches(frame, kp.page_output_code(page)) == []
    assert len(kp.launches(kp.page_output_code(page))) == frame["launch"].nunique()
    record = json.loads((paths.PROVENANCE_VIEW_DIR / "provenance.json").read_text())  # the recorded compile's page
    assert record["results_file"] == recorded["source_file"].iloc[0] and record["torch"] == recorded["torch"].iloc[0]
    config = yaml.safe_load((paths.REPO_ROOT / "_config.yml").read_text())
    extra = [paths.REPO_ROOT / p for p in config["sphinx"]["config"]["html_extra_path"]]
    source = next(p for p in extra if paths.PROVENANCE_VIEW_DIR.is_relative_to(p))
    assert (paths.PROVENANCE_VIEW_DIR / "index.html").relative_to(source).as_posix() == kp.PROVENANCE_SITE_PATH
    assert not re.search(r'(?:src|href)=["\'](?!#|https?:)', (paths.PROVENANCE_VIEW_DIR / "index.html").read_text())


@pytest.mark.parametrize("module", [BLOCK, GATE])
def test_every_launch_of_the_traced_block_is_in_its_table(recorded, page, module):
    frame = recorded.fillna({"pre_grad_node": ""})
    table = kp.block_table(frame, module)
    shown = {k for cell in table["Inductor kernels"] for k in cell.split(", ")}
    in_block = frame[(frame["module"] == module) | frame["module"].str.startswith(module + ".")]
    source = kp.launches(kp.page_output_code(page))
    assert shown == {f"{source[n - 1]} #{n}" for n in in_block["launch"]}   # the wrapper's own names
    assert len(shown) >= 2


@pytest.mark.slow
def test_a_fresh_traced_compile_is_recorded_with_its_page_beside_it_and_published_from_its_recording(tmp_path,
                                                                                                    run_main, script):
    # the stand-in checks the pipeline (trace, tlparse, rows, page); BlurBall's own rows are the recording's tests above
    code, _, err = run_main("trace_kernel_provenance.py", "--model", "tiny", "--height", "32", "--width", "48",
                            "--results-dir", tmp_path / "results")
    assert code == 0, err[-2000:]
    (written,) = (tmp_path / "results").glob("*.csv")
    view = written.with_suffix(kp.VIEW_SUFFIX)   # the page beside its rows, never in the book's folder
    frame = results.load("kernel-provenance", tmp_path / "results").fillna({"pre_grad_node": ""})
    page = kp.page_output_code((view / "index.html").read_text())
    # as a recording holds it: published from there to the folder the book serves, and refused where there is none
    (tmp_path / "results" / recording.LOG).write_text(json.dumps(
        {"record": "command", "invocation": 1, "command": "trace", "start": "", "end": "",
         "files": [{"file": written.name, "kind": "kernel-provenance", "sha256": ""}]}) + "\n")
    site = tmp_path / "site"
    site.mkdir()
    publish = script("scripts/publish_provenance_view.py").main
    assert publish(["--recording", str(tmp_path / "results"), "--to", str(site)]) == 0
    assert (site / "tlparse_provenance" / "index.html").read_bytes() == (view / "index.html").read_bytes()
    shutil.rmtree(view)
    assert publish(["--recording", str(tmp_path / "results"), "--to", str(site)]) == 3
    assert kp.untraced_launches(frame, page) == [] and frame["launch"].nunique() >= 2
    assert (frame["model"] == "tiny").all() and (frame["op"] != "").any()
