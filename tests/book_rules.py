"""The book's own rules as functions over notebook JSON, so each rule can be tested on a bad example.

Used by test_book_policy.py (on the real chapters and on deliberately broken notebooks).
"""
from __future__ import annotations

import re

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
