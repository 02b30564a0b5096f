"""Rules of the book as a story: a generated paragraph appears once, where the prose uses it."""
import json

import pytest

from graphbook import paths

NOTEBOOKS = sorted((paths.REPO_ROOT / "chapters").glob("*.ipynb")) + sorted((paths.REPO_ROOT / "appendix").glob("*.ipynb"))
GLUED = ("application/papermill.record/text/markdown", "application/papermill.record/text/plain")


def _text(value) -> str:
    return " ".join(("".join(value) if isinstance(value, list) else str(value)).split()).strip("'\"")


def printed_twice(notebook: dict, shortest: int = 80) -> list[str]:
    """Glued paragraphs (at least ``shortest`` characters) that a cell also prints: the reader would read them twice."""
    import re

    prose = " ".join("".join(c.get("source", "")) for c in notebook["cells"] if c.get("cell_type") == "markdown")
    used = set(re.findall(r"\{glue:(?:md|text)\}`([\w-]+)", prose)) | set(re.findall(r"```\{glue:md\} ([\w-]+)", prose))
    glued, printed = [], []
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            for mime, value in output.get("data", {}).items():
                if mime in GLUED and len(_text(value)) >= shortest and (name is None or name in used):
                    glued.append((index, _text(value)))
            if output.get("output_type") == "stream":
                printed.append((index, _text(output.get("text", ""))))
    return [f"cell {gi} glues a paragraph that cell {pi} prints: {g[:70]}..."
            for gi, g in glued for pi, text in printed if g[:120] in text]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_no_generated_paragraph_is_printed_and_glued(notebook):
    assert not printed_twice(json.loads(notebook.read_text())), printed_twice(json.loads(notebook.read_text()))


def test_the_rule_catches_a_paragraph_printed_and_glued():
    sentence = "On this machine the compiled model was 2.5x faster than eager, median of three runs, per run 2.4x to 2.6x."
    glued = {"output_type": "display_data", "data": {GLUED[0]: sentence}, "metadata": {"scrapbook": {"name": "s"}}}
    notebook = {"cells": [{"cell_type": "code", "outputs": [{"output_type": "stream", "text": sentence + "\n"}, glued]},
                          {"cell_type": "markdown", "source": "As measured: {glue:md}`s`"}]}
    assert len(printed_twice(notebook)) == 1
    notebook["cells"][1]["source"] = "a page that does not use it (the provenance page reads it)"
    assert printed_twice(notebook) == []
    notebook["cells"][1]["source"] = "As measured: {glue:md}`s`"
    notebook["cells"][0]["outputs"].pop(0)
    assert printed_twice(notebook) == []
