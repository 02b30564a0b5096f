"""The book's own rules, checked on every stored notebook, and each rule shown able to fail."""
import json
import re
from pathlib import Path

import book_rules as rules
import pytest

from graphbook import paths

ROOT = paths.REPO_ROOT
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "appendix").glob("*.ipynb"))
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
EXPECTED_CHAPTERS = ["01_chef_and_refrigerator", "02_fusion_on_a_laptop_cpu", "03_what_graph_compilers_do",
                     "04_onnx_and_runtimes", "05_blurball_measurements", "06_limitations_measured", "07_serving",
                     "08_your_model"]


def load(path):
    return json.loads(Path(path).read_text())


def ids(paths):
    return [p.relative_to(ROOT).as_posix() for p in paths]


# -- the repository -----------------------------------------------------------------------------

def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/test.sh" in readme and "bash scripts/build_book.sh" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec bash scripts/test\.sh\s*$", ci, re.M), ".ci/run must call the README's test command"


def test_toc_lists_every_chapter_in_article_order():
    toc = (ROOT / "_toc.yml").read_text()
    listed = re.findall(r"file:\s*chapters/(\S+)", toc)
    assert listed == EXPECTED_CHAPTERS
    assert [p.stem for p in CHAPTERS] == EXPECTED_CHAPTERS, "a chapter notebook is missing or extra"


def test_helper_package_is_not_named_code():
    assert (ROOT / "code" / "graphbook" / "__init__.py").exists()
    assert not (ROOT / "code" / "__init__.py").exists(), "code/ must not be a package (it shadows stdlib 'code')"


# -- every stored notebook ----------------------------------------------------------------------

@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_notebook_is_stored_executed_top_to_bottom_without_errors(path):
    nb = load(path)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert not rules.unexecuted_cells(nb), "code cells without stored outputs (re-run scripts/execute_notebooks.py)"
    assert not rules.error_outputs(nb), "a cell stored an error output"
    assert rules.execution_counts_in_order(nb), "execution counts are not 1..n: outputs were not produced by one run"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_notebook_really_ran_and_alone(path):
    nb = load(path)
    for reason in (rules.ran_too_briefly(nb, path.relative_to(ROOT).as_posix()), rules.ran_beside_other_work(nb)):
        assert reason is None, reason


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_every_glue_key_in_prose_is_defined_and_plain_python(path):
    nb = load(path)
    assert not rules.missing_glue_keys(nb), f"prose uses glue keys no cell defines: {rules.missing_glue_keys(nb)}"
    assert not rules.numpy_glued(nb), f"glue NumPy scalars as float()/int(): {rules.numpy_glued(nb)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_no_measured_looking_number_typed_into_prose(path):
    hits = rules.prose_numbers(load(path))
    assert not hits, f"numbers with units typed in prose (glue them or read them from data/): {hits}"


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_chapter_starts_with_title_run_note_and_hidden_setup(path):
    nb = load(path)
    first_md = "".join(nb["cells"][0]["source"])
    assert first_md.startswith("# "), "a chapter starts with its title"
    assert "how to run this chapter" in rules.markdown_text(nb).lower()
    setup = rules.code_cells(nb)[0]
    assert "setup_chapter(" in "".join(setup["source"])
    assert "hide-input" in setup.get("metadata", {}).get("tags", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_every_figure_is_numbered_captioned_and_has_alt_text(path):
    bad = rules.figures_without_caption_or_alt(load(path))
    assert not bad, f"code cells {bad} show a figure without mystnb.figure caption/name or mystnb.image.alt"


# -- the rules themselves can fail --------------------------------------------------------------

def _nb(markdown, glued=None, counts=(1,), seconds=30.0, error=False):
    outputs = []
    for key, text in (glued or {}).items():
        outputs.append({"output_type": "display_data", "metadata": {"scrapbook": {"name": key, "mime_prefix": ""}},
                        "data": {"application/papermill.record/text/plain": text}})
    if error:
        outputs.append({"output_type": "error", "ename": "ValueError", "evalue": "x", "traceback": []})
    cells = [{"cell_type": "markdown", "source": markdown, "metadata": {}}]
    cells += [{"cell_type": "code", "source": "x = 1", "execution_count": c, "outputs": outputs if i == 0 else [],
               "metadata": {}} for i, c in enumerate(counts)]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3"},
                                         "graphbook": {"execution": {"seconds": seconds, "code_cells": len(counts)}}}}


def test_rules_catch_a_missing_glue_key():
    nb = _nb("Eager takes {glue:text}`eager_ms:.2f` ms and compiled {glue:text}`compiled_ms:.1f` ms.",
             glued={"eager_ms": "12.5"})
    assert rules.missing_glue_keys(nb) == {"compiled_ms"}


def test_rules_catch_a_numpy_glued_value():
    assert rules.numpy_glued(_nb("x", glued={"k": "np.float64(1.5)"})) == ["k"]


def test_rules_catch_typed_numbers_but_not_glued_or_code_ones():
    nb = _nb("It took 4.34 ms and was 3.5x faster; `3.2 ms` in code and {glue:text}`t:.2f` ms are fine; a 3x3 conv too.")
    assert rules.prose_numbers(nb) == ["4.34 ms", "3.5x"]


def test_rules_catch_unexecuted_errors_and_out_of_order_runs():
    assert rules.unexecuted_cells(_nb("x", counts=(None,))) == [0]
    assert rules.error_outputs(_nb("x", error=True)) == [0]
    assert not rules.execution_counts_in_order(_nb("x", counts=(1, 3)))


def test_rules_catch_a_chapter_that_did_not_really_run_or_ran_beside_other_work():
    assert rules.ran_too_briefly(_nb("x", seconds=0.2), "chapters/x.ipynb") is not None
    nb = _nb("x")
    assert "does not say" in rules.ran_beside_other_work(nb)
    nb["metadata"]["graphbook"]["execution"]["others_cores_mean"] = 1.0
    assert "1.00 cores" in rules.ran_beside_other_work(nb)
    nb["metadata"]["graphbook"]["execution"]["others_cores_mean"] = 0.02
    assert rules.ran_beside_other_work(nb) is None


def test_rules_catch_a_figure_without_alt_text():
    nb = _nb("x")
    nb["cells"][1]["outputs"] = [{"output_type": "display_data", "data": {"image/png": "iVBOR"}, "metadata": {}}]
    assert rules.figures_without_caption_or_alt(nb) == [0]


# -- data provenance ----------------------------------------------------------------------------

def _documented_patterns():
    """File names and name patterns (`cpu-blurball-<date>[-N].csv`) that data/README.md documents."""
    names = re.findall(r"`([^`\s]+\.(?:csv|json|pt|txt|md|png))`", (ROOT / "data" / "README.md").read_text())
    patterns = []
    for name in names:
        rx = re.escape(name).replace(re.escape("[-N]"), r"(-\d+)?")
        rx = re.sub(r"<[^>]+>", r"[^/]+", rx.replace(r"\<", "<").replace(r"\>", ">"))
        patterns.append(re.compile(rx + "$"))
    return patterns


def test_every_data_file_is_documented_in_data_readme():
    patterns = _documented_patterns()
    files = [p for p in (ROOT / "data").rglob("*") if p.is_file() and p.name != "README.md"]
    undocumented = [p.relative_to(ROOT).as_posix() for p in files if not any(rx.match(p.name) for rx in patterns)]
    assert not undocumented, f"data files not described in data/README.md: {undocumented}"


def test_quoted_numbers_carry_their_source():
    for folder, column in (("seed", "article_section"), ("papers", "hardware")):
        for path in (ROOT / "data" / folder).glob("*.csv"):
            header = path.read_text().splitlines()[0].split(",")
            assert column in header, f"{path.name} has no {column!r} column saying where its numbers come from"


# -- machine-independent checks: a compared output holds no float measured on this machine, and a chapter
# asserts no ranking between two implementations without a stated reason ----------------------------

@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_no_ranking_assert_without_a_stated_reason(path):
    hits = rules.ranking_asserts(load(path))
    assert not hits, ("asserts that rank two measurements, which another CPU can reverse (code cell, line, "
                      f"text): phrase the comparison from data, or add '# physical reason: ...': {hits}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_tolerances_and_batch_sizes_come_from_the_config(path):
    hits = rules.literal_config_values(load(path))
    assert not hits, f"config values typed on the page (code cell, expression): use graphbook.config's: {hits}"


def test_the_config_rule_catches_typed_tolerances_and_batch_sizes_only():
    nb = _cells_nb(_code("assert np.allclose(a, b, atol=1e-4)\n"), _code("ok = diff < 1e-5\n"),
                   _code("ok = diff < config.SAME_OUTPUT_ATOL\nms = seconds * 1e-3\nbig = ratio > 0.5\n"),
                   _code("warm_up(model, (9, 32, 48), (1, 2, 3))\nwarm_up(model, (9, 32, 48), (1, 2))\n"))
    assert rules.literal_config_values(nb) == [(0, "atol=0.0001"), (1, "diff < 1e-05"), (3, "(1, 2, 3)")]


def _glue_cell(key, value_text):
    return {"cell_type": "code", "source": "glue(...)", "execution_count": 1, "metadata": {"tags": []},
            "outputs": [{"output_type": "display_data", "metadata": {"scrapbook": {"name": key, "mime_prefix": ""}},
                         "data": {"application/papermill.record/text/plain": value_text}}]}


def _cells_nb(*cells):
    return {"cells": list(cells), "metadata": {"kernelspec": {"name": "python3"}}}


def test_sanitizer_masks_bare_floats_so_glue_records_are_not_compared_digit_by_digit():
    patterns = rules.sanitize_patterns()
    stored, fresh = "6.5737e-07", "6.5481e-07"  # two runs of chapter 1 on two CPUs
    assert rules.sanitize(stored, patterns) == rules.sanitize(fresh, patterns)
    assert rules.sanitize("0.274", patterns) == rules.sanitize("0.035", patterns)
    assert rules.sanitize("58", patterns) != rules.sanitize("59", patterns)  # counts stay compared
    assert rules.sanitize("'eager'", patterns) == "'eager'"


def _code(source):
    return {"cell_type": "code", "source": source, "execution_count": 1, "metadata": {}, "outputs": []}


def test_rules_catch_ranking_asserts():
    nb = _cells_nb(_code("a_ms, b_ms = 2.0, 1.0\nassert a_ms > 1.1 * b_ms\n"),
                   _code("assert speedup > 1.0\n"),
                   _code('assert table.loc["manual", "median_ms"] > table.loc["compile", "median_ms"]\n'),
                   _code('assert ort_live[fastest] < 0.9 * ort_live["disabled"]\n'),
                   _code("%time x = 1\nassert eager.median_ms > compiled.median_ms  # fused wins\n"))
    assert [(c, line) for c, line, _ in rules.ranking_asserts(nb)] == [(0, 2), (1, 1), (2, 1), (3, 1), (4, 2)]


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_a_chapter_reduces_recorded_runs_to_one_machine(path):
    assert rules.pooled_recorded_loads(json.loads(path.read_text())) == []


def test_the_one_machine_rule_catches_pooled_and_per_group_reads():
    def nb(*sources):
        return {"cells": [{"cell_type": "code", "source": s} for s in sources]}

    pooled = 'frame = results.load("cpu-blurball")\nprint(frame.median_ms.median())'
    assert rules.pooled_recorded_loads(nb(pooled)) == [
        "code cell 0 reads cpu-blurball without reducing it to one machine"]
    per_group = ('ready = results.load("serving-ready")\nfor name, g in ready.groupby("server"):\n'
                 '    rows.append(results.latest_run(g).time_to_ready_s.median())')
    assert len(rules.pooled_recorded_loads(nb(per_group))) == 1
