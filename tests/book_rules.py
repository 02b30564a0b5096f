"""The book's own rules as functions over notebook JSON, so each rule can be tested on a bad example.

Used by test_book_policy.py (on the real chapters and on deliberately broken notebooks).
"""
from __future__ import annotations

import ast
import re

from graphbook import paths
from graphbook.config import BATCH_SIZES
from graphbook.measure.environment import QUIET_OTHERS_CORES

GLUE_ROLE = re.compile(r"\{glue(?::(?:text|md|figure|math))?\}`([^`]+)`")
GLUE_DIRECTIVE = re.compile(r"```\{glue(?::(?:figure|math|md))?\}\s+(\S+)")
UNIT = r"(?:ms|µs|us|ns|s|sec|seconds|minutes|×|x|%|GB/s|GiB/s|MB/s|TFLOP/s|GFLOP/s|FLOP/s|GMAC|MB|GB|MiB|GiB)"
PROSE_NUMBER = re.compile(r"(?<![\w.`{])(\d+(?:[.,]\d+)?)\s?" + UNIT + r"(?![\w])")
_SKIP = [re.compile(p, re.S) for p in (r"```.*?```", r"\{glue[^`]*`[^`]*`", r"`[^`]*`", r"\$\$.*?\$\$",
                                       r"\$[^$\n]*\$", r"\{cite[^`]*`[^`]*`", r"\]\([^)]*\)")]
# Slow-chapter guard (as the PyTorch tutorials do): a chapter that "ran" faster than this did not run.
MIN_SECONDS = 3.0
NOT_RUN_OK: dict[str, str] = {
    "appendix/provenance.ipynb": "reads the stored execution records only; a few seconds is its real run time",
}  # notebook path -> reason it may legitimately run in under MIN_SECONDS


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]


def markdown_text(nb: dict) -> str:
    return "\n".join("".join(c.get("source", [])) for c in nb.get("cells", []) if c.get("cell_type") == "markdown")


def glue_keys_used(nb: dict) -> set[str]:
    text = markdown_text(nb)
    keys = {m.split(":")[0].strip() for m in GLUE_ROLE.findall(text)}
    keys |= {m.strip() for m in GLUE_DIRECTIVE.findall(text)}
    return {k for k in keys if "::" not in k}  # cross-page keys are checked by the build


def glue_keys_defined(nb: dict) -> dict[str, str]:
    found = {}
    for cell in code_cells(nb):
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                data = out.get("data", {})
                text = next((v for k, v in data.items() if k.endswith("text/plain")), "")
                found[name] = "".join(text) if isinstance(text, list) else str(text)
    return found


def missing_glue_keys(nb: dict) -> set[str]:
    return glue_keys_used(nb) - set(glue_keys_defined(nb))


def numpy_glued(nb: dict) -> list[str]:
    """Glued values stored as NumPy scalars, which `{glue:text}` with a format spec cannot render."""
    return [k for k, v in glue_keys_defined(nb).items() if re.match(r"np\.\w+\(", v)]


def prose_numbers(nb: dict) -> list[str]:
    text = markdown_text(nb)
    for pattern in _SKIP:
        text = pattern.sub(" ", text)
    return [m.group(0) for m in PROSE_NUMBER.finditer(text)]


def unexecuted_cells(nb: dict) -> list[int]:
    return [i for i, c in enumerate(code_cells(nb)) if c.get("execution_count") is None and "".join(c.get("source", "")).strip()]


def error_outputs(nb: dict) -> list[int]:
    return [i for i, c in enumerate(code_cells(nb)) if any(o.get("output_type") == "error" for o in c.get("outputs", []))]


def execution_counts_in_order(nb: dict) -> bool:
    """A notebook executed top to bottom in one kernel has execution counts 1, 2, 3, ..."""
    counts = [c.get("execution_count") for c in code_cells(nb) if "".join(c.get("source", "")).strip()]
    return counts == list(range(1, len(counts) + 1))


def ran_too_briefly(nb: dict, path: str) -> str | None:
    """Why a notebook's execution record looks like it did not really run, or None if it is fine."""
    rec = nb.get("metadata", {}).get("graphbook", {}).get("execution")
    if rec is None:
        return "no execution record (run scripts/execute_notebooks.py)"
    if rec.get("code_cells", 0) < 1:
        return "execution record says no code cells ran"
    if rec.get("seconds", 0) < MIN_SECONDS and path not in NOT_RUN_OK:
        return f"executed in {rec.get('seconds')} s, implausibly fast; add it to NOT_RUN_OK with a reason if real"
    return None


def ran_beside_other_work(nb: dict) -> str | None:
    """Why a notebook's live figures may not be its own (other processes used the CPU while it ran), or None."""
    rec = nb.get("metadata", {}).get("graphbook", {}).get("execution") or {}
    if "others_cores_mean" not in rec:
        return "its execution record does not say what else ran (re-run scripts/execute_notebooks.py)"
    if rec["others_cores_mean"] > QUIET_OTHERS_CORES:
        return (f"other processes used {rec['others_cores_mean']:.2f} cores on average while it ran: re-execute it "
                "on a quiet machine")
    return None


def figures_without_caption_or_alt(nb: dict) -> list[int]:
    """Code cells that show an image but lack a numbered caption (mystnb.figure) or alt text (mystnb.image.alt)."""
    bad = []
    for i, cell in enumerate(code_cells(nb)):
        tags = set(cell.get("metadata", {}).get("tags", []))
        shows_image = any(any(m.startswith("image/") for m in o.get("data", {})) for o in cell.get("outputs", []))
        if not shows_image or tags & {"remove-output", "remove-cell"}:
            continue
        meta = cell.get("metadata", {}).get("mystnb", {})
        figure, image = meta.get("figure", {}), meta.get("image", {})
        if not (figure.get("caption") and figure.get("name") and image.get("alt")):
            bad.append(i)
    return bad


# -- what nbval compares, and what must not be compared ---------------------------------------------
# nbval (strict) compares every output of every code cell, after the sanitizer's substitutions, except
# in cells tagged nbval-ignore-output / nbval-skip (or with the # NBVAL_IGNORE_OUTPUT / # NBVAL_SKIP
# comments). Glue records (``application/papermill.record/...``) are outputs like any other. Cells are
# numbered as nbval numbers them: the index among code cells, from 0.
SANITIZE_CFG = "tests/nbval_sanitize.cfg"
NOT_COMPARED_TAGS = {"nbval-ignore-output", "nbval-skip"}
NOT_COMPARED_COMMENTS = {"NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP", "PYTEST_VALIDATE_IGNORE_OUTPUT"}
GLUE_MIME = "application/papermill.record/"
NOT_COMPARED_MIME = ("image/png", "image/jpeg")  # nbval skips images unless --nbdime
def sanitize_patterns(path=None) -> list[tuple[str, str]]:
    """The (regex, replacement) pairs of the nbval sanitizer file, parsed as nbval parses them."""
    from pathlib import Path

    text = Path(path or paths.REPO_ROOT / SANITIZE_CFG).read_text()
    return re.findall(r"^regex: (.*)$\n^replace: (.*)$", text, flags=re.MULTILINE)


def sanitize(text: str, patterns) -> str:
    for regex, replace in patterns:
        text = re.sub(regex, replace, text)
    return text


def output_compared(cell: dict) -> bool:
    """Does nbval (strict) compare this code cell's outputs?"""
    if set(cell.get("metadata", {}).get("tags", [])) & NOT_COMPARED_TAGS:
        return False
    comments = {ln.strip().lstrip("#").strip() for ln in "".join(cell.get("source", "")).splitlines()
                if ln.strip().startswith("#")}
    return not comments & NOT_COMPARED_COMMENTS


# -- values with one home ------------------------------------------------------------------------------
# A tolerance and the serving batch sizes live in graphbook.config: a page that types its own (``atol=1e-4``,
# ``diff < 1e-5``, ``(1, 2, 3)``) can drift from what the package checks and serves with.
TOLERANCE_ARGS = {"atol", "rtol"}


def _small_float(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, float) and 0 < node.value < 1e-2


def literal_config_values(nb: dict) -> list[tuple[int, str]]:
    """Config values typed into code cells: (code-cell index, the expression), for a float literal below 0.01
    given as ``atol``/``rtol`` or compared with ``<``, ``<=``, ``>``, ``>=``, and for the batch sizes as a tuple."""
    found = []
    for index, cell in enumerate(code_cells(nb)):
        tree = _parse_cell("".join(cell.get("source", "")))
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Tuple):
                typed = tuple(getattr(e, "value", None) for e in node.elts) == BATCH_SIZES
            elif isinstance(node, ast.keyword) and node.arg in TOLERANCE_ARGS:
                typed = _small_float(node.value)
            elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE))
                                                       for op in node.ops):
                typed = any(_small_float(v) for v in (node.left, *node.comparators))
            else:
                continue
            if typed:
                found.append((index, ast.unparse(node)))
    return found


# -- ranking asserts ----------------------------------------------------------------------------------
# A chapter asserts only what holds on every supported CPU. An assert that orders two measured times
# (or a speed-up against a threshold) is a ranking that another CPU, or a loaded machine, can reverse.
# It is allowed only with its reason stated beside it: a comment "# physical reason: ..." (an effect
# with a physical margin, e.g. the bytes-moved model) or "# from data: <file>" (numbers read from data/,
# the same on every CPU) on the assert line or in the comment lines right above it, or the same words
# in the markdown cell just before the code cell.
PHYSICAL_REASON = re.compile(r"(?:physical reason|from data)\s*:", re.I)
TIMING_WORD = re.compile(r"(?:^|_)(?:ms|us|ns|s|sec|secs|seconds|time|times|latency|median|mean|fps|throughput|"
                         r"speed|speedup|speed_up|ratio|ratios|faster|slower|fastest|slowest|gain|share|pct|"
                         r"percent|overhead)(?:_|$)|(?:_ms|_us|_s)$|_over_", re.I)
RATIO_WORD = re.compile(r"(?:^|_)(?:speed|speedup|speed_up|ratio|ratios|faster|slower|gain|share|pct|percent|"
                        r"overhead)(?:_|$)|_over_", re.I)


def _words(node) -> set[str]:
    """Identifiers, attribute names and string keys inside an expression."""
    words = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            words.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            words.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            words.add(sub.value)
    return words


def _timing(node) -> bool:
    return any(TIMING_WORD.search(w) for w in _words(node))


def _ratio(node) -> bool:
    return any(RATIO_WORD.search(w) for w in _words(node))


def _containers(node) -> set[str]:
    """The names that are subscripted inside an expression (``t`` in ``0.9 * t["a"]``)."""
    return {ast.unparse(sub.value) for sub in ast.walk(node) if isinstance(sub, ast.Subscript)}


def _same_container(left, right) -> bool:
    return bool(_containers(left) & _containers(right))


def _is_constant(node) -> bool:
    return not any(isinstance(sub, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) for sub in ast.walk(node))


def _ranking_compare(test) -> bool:
    """Does this assert test order two measurements (or a measured ratio against a threshold)?"""
    for node in ast.walk(test):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if not isinstance(op, (ast.Lt, ast.Gt, ast.LtE, ast.GtE)):
                continue
            if _timing(left) and _timing(right):
                return True
            if _same_container(left, right) and _timing(test):
                return True  # two entries of one table of measurements, e.g. t[fastest] < 0.9 * t["disabled"]
            for side, other in ((left, right), (right, left)):
                if _ratio(side) and _is_constant(other):
                    return True
    return False


def _parse_cell(source: str):
    # IPython magics and shell lines are not Python: blank them, keeping line numbers
    lines = [("" if ln.lstrip().startswith(("%", "!")) else ln) for ln in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def ranking_asserts(nb: dict) -> list[tuple[int, int, str]]:
    """Ranking asserts without a stated physical reason: (code-cell index, line number from 1, line)."""
    found = []
    cells = nb.get("cells", [])
    code_index = -1
    for position, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        code_index += 1
        source = "".join(cell.get("source", ""))
        tree = _parse_cell(source)
        if tree is None:
            continue
        previous = cells[position - 1] if position > 0 else {}
        markdown_reason = previous.get("cell_type") == "markdown" and PHYSICAL_REASON.search(
            "".join(previous.get("source", "")))
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assert) or not _ranking_compare(node.test):
                continue
            if markdown_reason or _reason_beside(lines, node.lineno, getattr(node, "end_lineno", node.lineno)):
                continue
            found.append((code_index, node.lineno, lines[node.lineno - 1].strip()))
    return found


def _reason_beside(lines: list[str], first: int, last: int) -> bool:
    """A "# physical reason:" comment on the assert's lines or in the comment block right above it."""
    if any(PHYSICAL_REASON.search(ln) for ln in lines[first - 1:last]):
        return True
    row = first - 2
    while row >= 0 and lines[row].strip().startswith("#"):
        if PHYSICAL_REASON.search(lines[row]):
            return True
        row -= 1
    return False


#: Calls that reduce recorded rows to one machine's: the deciding machine, one machine's rows, one run, one file.
ONE_MACHINE_CALLS = {"deciding_machine", "single_machine", "latest_run", "latest_recording"}


def _call_names(tree) -> list:
    return [(node, node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", ""))
            for node in ast.walk(tree) if isinstance(node, ast.Call)]


def pooled_recorded_loads(nb: dict) -> list[str]:
    """Cells that compute from recorded CPU results without reducing them to one machine (the book's rule 6).

    A name bound to ``results.load("<kind>")`` (a CPU kind) is recorded rows of every machine. A code cell that
    uses such a name and aggregates (``summarize_runs``, ``choose_best``, ``paired_ratios``, ``.median()``,
    ``.mean()``, ``.loc``/``.iloc`` of a summary) must go through one of :data:`ONE_MACHINE_CALLS` in the same
    cell, or in the next code cell when the cell only loads. ``latest_run``/``latest_recording`` taken per
    group of a ``groupby`` loop (each group's newest run, possibly from different machines) does not count
    unless the cell also names the machine with ``deciding_machine`` or ``single_machine``.
    """
    code = [("".join(c.get("source", "")), _parse_cell("".join(c.get("source", ""))))
            for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    aggregates = {"summarize_runs", "choose_best", "paired_ratios", "median", "mean", "phrase_comparison"}
    recorded_names: set[str] = set()
    found = []
    for index, (source, tree) in enumerate(code):
        if tree is None:
            continue
        loads = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                call = node.value
                if (getattr(call.func, "attr", "") == "load" and getattr(getattr(call.func, "value", None), "id", "")
                        == "results" and call.args and isinstance(call.args[0], ast.Constant)
                        and not str(call.args[0].value).startswith("gpu-")):
                    loads.append(str(call.args[0].value))
                    recorded_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        names = {name for _, name in _call_names(tree)}
        window_names = set(names)
        if loads and index + 1 < len(code) and code[index + 1][1] is not None:
            window_names |= {name for _, name in _call_names(code[index + 1][1])}
        reads = bool(loads) or bool(used & recorded_names and names & aggregates)
        if not reads:
            continue
        per_group = any(isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call)
                        and getattr(loop.iter.func, "attr", "") == "groupby"
                        and any(name in ("latest_run", "latest_recording") for _, name in _call_names(loop))
                        for loop in ast.walk(tree))
        named = window_names & {"deciding_machine", "single_machine"}
        if not window_names & ONE_MACHINE_CALLS or (per_group and not named):
            what = ", ".join(loads) or ", ".join(sorted(used & recorded_names))
            found.append(f"code cell {index} reads {what} without reducing it to one machine")
    return found
