"""Rules of the book as a story: a generated paragraph appears once, where the prose uses it."""
import json
import re

import pytest

from graphbook import paths

NOTEBOOKS = sorted((paths.REPO_ROOT / "chapters").glob("*.ipynb")) + sorted((paths.REPO_ROOT / "appendix").glob("*.ipynb"))
GLUED = ("application/papermill.record/text/markdown", "application/papermill.record/text/plain")


def _text(value) -> str:
    return " ".join(("".join(value) if isinstance(value, list) else str(value)).split()).strip("'\"")


def printed_twice(notebook: dict, shortest: int = 80) -> list[str]:
    """Glued paragraphs (at least ``shortest`` characters) that a cell also prints: the reader would read them twice."""
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


CHAPTERS = sorted((paths.REPO_ROOT / "chapters").glob("*.ipynb"))
DATED_FILE = re.compile(r"[\w.-]*\d{4}-\d{2}-\d{2}[\w.-]*\.(?:csv|json|txt)")
RUN_ID = re.compile(r"\b[\w-]+-\d{4}-\d{2}-\d{2}[\w-]*/r\d+\b")


def identifiers_in_prose(notebook: dict, variant_ids) -> list[str]:
    """Variant IDs, dated result files and run IDs in what the reader reads as prose: markdown cells and the
    generated paragraphs they glue. Tables and code may name them; a sentence uses the variant's label."""
    prose = [("".join(c.get("source", "")), f"markdown cell {i}") for i, c in enumerate(notebook["cells"])
             if c.get("cell_type") == "markdown"]
    used = set(re.findall(r"\{glue:(?:md|text)\}`([\w-]+)", " ".join(text for text, _ in prose)))
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            value = output.get("data", {}).get(GLUED[0])
            if value is not None and name in used:
                prose.append((_text(value), f"the paragraph cell {index} glues as {name}"))
    found = []
    for text, where in prose:
        text = re.sub(r"```.*?```", " ", text, flags=re.S)
        text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets are addresses, not prose
        words = set(re.findall(r"[A-Za-z][\w-]*", text))
        found += [f"{where}: variant ID {v}" for v in sorted(variant_ids) if v in words and ("_" in v or "-" in v)]
        found += [f"{where}: file {m}" for m in DATED_FILE.findall(text)]
        found += [f"{where}: run ID {m}" for m in RUN_ID.findall(text)]
    return found


def recorded_identifiers() -> set[str]:
    """Every variant and restart-path ID the book records: the registry's, the restart paths' and any
    snake_case variant name in a recorded file (TVM's, the browser's)."""
    import csv

    from graphbook.method import variants
    from graphbook.startup import restart_paths
    found = set(variants.names()) | {p.name for p in restart_paths.PATHS if "-" in p.name}
    for path in (paths.REPO_ROOT / "data" / "results").rglob("*.csv"):
        with path.open(newline="") as handle:
            found |= {row["variant"] for row in csv.DictReader(handle)
                      if re.fullmatch(r"[a-z0-9]+(?:_[a-z0-9]+)+", row.get("variant") or "")}
    return found


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.name)
def test_chapter_prose_names_no_variant_id_file_or_run_id(notebook):
    found = identifiers_in_prose(json.loads(notebook.read_text()), recorded_identifiers())
    assert not found, found


def test_the_identifier_rule_catches_ids_files_and_run_ids():
    ids = ["compile_default", "eager_fp32"]
    glued = {"output_type": "display_data", "data": {GLUED[0]: "compile_default was fastest"},
             "metadata": {"scrapbook": {"name": "s"}}}
    notebook = {"cells": [{"cell_type": "code", "outputs": [glued]},
                          {"cell_type": "markdown", "source": "As measured: {glue:md}`s`"}]}
    assert identifiers_in_prose(notebook, ids) == ["the paragraph cell 0 glues as s: variant ID compile_default"]
    notebook["cells"][1]["source"] = "See cpu-blurball-2026-12-01.csv, run cpu-blurball-2026-12-01/r2, and `eager_fp32`."
    assert len(identifiers_in_prose(notebook, ids)) == 3


def prose_words(notebook: dict) -> int:
    """Words of Markdown a reader reads; a glue or cross-reference role counts as one word."""
    text = " ".join("".join(c.get("source", "")) for c in notebook["cells"] if c.get("cell_type") == "markdown")
    return len(re.sub(r"\{[^}]*\}`[^`]*`", "X", text).split())


def visible_code_lines(notebook: dict) -> int:
    """Non-blank lines of the code cells shown open on the page, besides the algorithms the page teaches
    (``#@save`` cells, which are the point of the page); collapsed and removed cells do not count."""
    hidden = {"hide-input", "remove-input", "remove-cell"}
    return sum(len([line for line in "".join(c.get("source", "")).splitlines() if line.strip()])
               for c in notebook["cells"]
               if c.get("cell_type") == "code" and not hidden & set(c.get("metadata", {}).get("tags", []))
               and not "".join(c.get("source", "")).startswith("#@save"))


MAX_CHAPTER_WORDS, MAX_BOOK_WORDS, MAX_VISIBLE_CODE = 3200, 14000, 200
#: The method on the reader's own model is a short page of its own, outside the seven chapters' budget.
YOUR_MODEL_CHAPTER, MAX_YOUR_MODEL_WORDS = "08_your_model.ipynb", 1500


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.name)
def test_a_chapter_stays_short_enough_to_finish(notebook):
    nb = json.loads(notebook.read_text())
    assert prose_words(nb) <= MAX_CHAPTER_WORDS, f"{prose_words(nb)} words: move a deep dive to an appendix page"
    assert visible_code_lines(nb) <= MAX_VISIBLE_CODE, f"{visible_code_lines(nb)} open code lines: collapse plumbing"


def test_the_seven_chapters_stay_within_the_books_word_budget():
    seven = [p for p in CHAPTERS if p.name != YOUR_MODEL_CHAPTER]
    assert len(seven) == 7
    total = sum(prose_words(json.loads(p.read_text())) for p in seven)
    assert total <= MAX_BOOK_WORDS, f"{total} words of chapter prose"
    assert prose_words(json.loads((paths.REPO_ROOT / "chapters" / YOUR_MODEL_CHAPTER).read_text())) <= MAX_YOUR_MODEL_WORDS


def test_the_length_rules_count_what_the_reader_sees():
    notebook = {"cells": [{"cell_type": "markdown", "source": "Eager took {glue:text}`ms:.1f` ms, see {doc}`x`."},
                          {"cell_type": "code", "source": "a = 1\n\nb = 2\n", "metadata": {}},
                          {"cell_type": "code", "source": "plot()\n", "metadata": {"tags": ["hide-input"]}}]}
    assert prose_words(notebook) == 6 and visible_code_lines(notebook) == 2


_ROLE = re.compile(r"\{glue(?::(text|md))?\}`([\w-]+)(?::([^`]*))?`")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?![\w])")
_EQUAL_RANGE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(\s?(?:x|×|%|ms|s|px))?\s?(?:to|-|–)\s?\1\2?(?![\d.])")
_NOT_READ_AS_NUMBERS = [re.compile(p, re.S) for p in (r"`[^`]*`", r"\$[^$]*\$", r"\]\([^)]*\)", r"\{\w+\}`[^`]*`",
                                                      r"<[^>]*>")]


def _glued(notebook: dict) -> dict[str, str]:
    """Every glued value as its stored text: Markdown when the cell glued Markdown, else the plain text."""
    values = {}
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            data = output.get("data", {})
            for mime in GLUED:
                if name and mime in data:
                    values[name] = _text(data[mime])
                    break
    return values


def rendered_paragraphs(notebook: dict) -> list[str]:
    """The Markdown paragraphs and list items as a reader sees them: every glue role replaced by its value, formatted."""
    values = _glued(notebook)

    def render(match):
        key, spec = match.group(2), match.group(3)
        value = values.get(key, "")
        try:
            return format(float(value), spec) if spec else value
        except ValueError:
            return value

    paragraphs = []
    for cell in notebook["cells"]:
        if cell.get("cell_type") != "markdown":
            continue
        text = re.sub(r"```.*?```", "", "".join(cell.get("source", "")), flags=re.S)
        for block in re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )", text):
            if block.strip() and not block.lstrip().startswith(("|", "#", ":")):
                paragraphs.append(" ".join(_ROLE.sub(render, block).split()))
    return paragraphs


def numbers_read(paragraph: str) -> int:
    for pattern in _NOT_READ_AS_NUMBERS:
        paragraph = pattern.sub(" ", paragraph)
    return len(_NUMBER.findall(paragraph))


MAX_NUMBERS_PER_PARAGRAPH = 8


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_a_paragraph_carries_a_few_numbers_and_no_template_debris(notebook):
    paragraphs = rendered_paragraphs(json.loads(notebook.read_text()))
    crowded = [f"{numbers_read(p)} numbers: {p[:90]}..." for p in paragraphs if numbers_read(p) > MAX_NUMBERS_PER_PARAGRAPH]
    assert not crowded, "move the numbers into a table or a figure:\n" + "\n".join(crowded)
    debris = [m.group(0) for p in paragraphs for m in _EQUAL_RANGE.finditer(p)]
    assert not debris, f"a range whose ends print equal is one number: {debris}"


def test_the_paragraph_rules_read_glued_values_as_rendered():
    glued = {"output_type": "display_data", "data": {"application/papermill.record/text/plain": "2.6012"},
             "metadata": {"scrapbook": {"name": "r"}}}
    notebook = {"cells": [{"cell_type": "code", "outputs": [glued]},
                          {"cell_type": "markdown", "source": "from {glue:text}`r:.1f`x to {glue:text}`r:.1f`x"}]}
    (paragraph,) = rendered_paragraphs(notebook)
    assert paragraph == "from 2.6x to 2.6x" and _EQUAL_RANGE.search(paragraph)
    assert numbers_read("1, 2, 3 and `4`, 5.5 % of $6$ ([7](a8.md))") == 5   # a link's text is read, its target not


MAX_RENDERED_WORDS, MAX_APPENDIX_WORDS, MAX_TABLES, MAX_CODE_SENTENCES = 12000, 4000, 6, 1
#: Glue names of the sentences that say a measurement was not made (DESIGN rule 7): written by code, counted apart.
NOT_MEASURED = re.compile(r"^absent_")
_SENTENCE = re.compile(r"[.!?](?:\s|$)")


def rendered_words(notebook: dict) -> int:
    """Words a reader reads in the paragraphs and list items, every glued value filled in."""
    return sum(len(p.split()) for p in rendered_paragraphs(notebook))


def code_written_sentences(notebook: dict) -> list[str]:
    """The glued values a page's prose shows that are sentences (a sentence end inside), rule 7's apart."""
    text = " ".join("".join(c.get("source", "")) for c in notebook["cells"] if c.get("cell_type") == "markdown")
    shown = {m.group(2) for m in _ROLE.finditer(text)}
    return [name for name, value in _glued(notebook).items()
            if name in shown and not NOT_MEASURED.match(name) and " " in value.strip() and _SENTENCE.search(value)]


def tables_shown(notebook: dict) -> int:
    """Tables on the page: Markdown tables, and tables a code cell displays (glued values are not shown as such)."""
    count = 0
    for cell in notebook["cells"]:
        if cell.get("cell_type") == "markdown":
            count += len(re.findall(r"^\s*\|\s*:?-{3,}", "".join(cell.get("source", "")), re.M))
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html")
            if html and not output.get("metadata", {}).get("scrapbook"):
                count += _text(html).count("<table")
    return count


SEVEN = [p for p in CHAPTERS if p.name != YOUR_MODEL_CHAPTER]
APPENDIX = sorted((paths.REPO_ROOT / "appendix").glob("*.ipynb"))


def test_the_book_reads_in_under_two_hours_with_every_glued_value_filled_in():
    chapters = {p.name: rendered_words(json.loads(p.read_text())) for p in SEVEN}
    appendix = {p.name: rendered_words(json.loads(p.read_text())) for p in APPENDIX}
    assert sum(chapters.values()) <= MAX_RENDERED_WORDS, chapters
    assert sum(appendix.values()) <= MAX_APPENDIX_WORDS, appendix


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.name)
def test_a_chapter_shows_few_tables_and_at_most_one_sentence_written_by_code(notebook):
    nb = json.loads(notebook.read_text())
    assert tables_shown(nb) <= MAX_TABLES, f"{tables_shown(nb)} tables"
    assert len(code_written_sentences(nb)) <= MAX_CODE_SENTENCES, code_written_sentences(nb)


def test_the_reading_rules_count_what_the_page_shows():
    glued = lambda name, value, mime=GLUED[0]: {"output_type": "display_data", "data": {mime: value},
                                                "metadata": {"scrapbook": {"name": name}}}
    notebook = {"cells": [{"cell_type": "code", "outputs": [
        glued("ms", "2.5"), glued("said", "It was faster. Much."), glued("absent_gpu", "No GPU ran this."),
        {"output_type": "display_data", "data": {"text/html": "<table></table>"}, "metadata": {}}]},
        {"cell_type": "markdown", "source": "Took {glue:text}`ms:.1f` ms. {glue:md}`said` {glue:md}`absent_gpu`\n\n"
                                            "| a |\n|---|\n| 1 |"}]}
    assert code_written_sentences(notebook) == ["said"]
    assert tables_shown(notebook) == 2 and rendered_words(notebook) == 11   # "Took 2.5 ms." and both glued sentences


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.name)
def test_a_chapter_gives_its_times_and_its_recordings_machine_and_torch_at_its_top(notebook):
    nb = json.loads(notebook.read_text())
    top = "".join(nb["cells"][0]["source"])
    assert "{glue:text}`reading_min`" in top and "{glue:text}`execution_min" in top, "the first cell's admonition"
    assert "{glue:text}`recorded_on`" in top and "{glue:text}`recorded_torch`" in top, "the recording it quotes"
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert any(f'book.chapter_timing("{notebook.name}")' in source for source in code)
