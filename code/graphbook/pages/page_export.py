"""The code a chapter teaches is written on its page and exported into the package, d2l's way: each ``#@save
MODULE`` cell goes into that module's block marked as taught on the page, so the package runs what the reader read."""
from __future__ import annotations

import json
import re
from pathlib import Path

from graphbook.paths import CODE_DIR, REPO_ROOT

SAVE_LINE = re.compile(r"#@save ([\w.]+)[ \t]*\n")
PACKAGE_DIR = CODE_DIR / "graphbook"
PAGE_DIRS = ("chapters", "appendix")


def _taught_cells(notebook: Path) -> dict[str, list[str]]:
    """The ``#@save`` cells of one notebook, grouped by target module, in page order."""
    found: dict[str, list[str]] = {}
    for cell in json.loads(notebook.read_text())["cells"]:
        source = "".join(cell["source"])
        match = SAVE_LINE.match(source) if cell["cell_type"] == "code" else None
        if match:
            found.setdefault(match.group(1), []).append(source[match.end():].strip("\n"))
    return found


def pages(root: Path = REPO_ROOT) -> list[Path]:
    """Every chapter and appendix notebook of the checkout."""
    return sorted(path for folder in PAGE_DIRS for path in (root / folder).glob("*.ipynb"))


def exported_modules(notebooks: list[Path], root: Path = REPO_ROOT, package: Path = PACKAGE_DIR) -> dict[Path, str]:
    """The text every target module should have; ValueError where a page and a block do not match up."""
    texts: dict[Path, str] = {}
    for notebook in notebooks:
        page = notebook.relative_to(root).as_posix()
        for module, cells in _taught_cells(notebook).items():
            path = package / f"{module.replace('.', '/')}.py"
            if not path.is_file():
                raise ValueError(f"{page} saves code into {module!r}, but there is no {path.relative_to(root)}")
            text = texts.get(path, path.read_text())
            begin = f"# >>> taught on {page}: edit it there, then run scripts/export_taught_code.py\n"
            end = f"# <<< end of the code taught on {page}\n"
            if text.count(begin) != 1 or text.count(end) != 1:
                raise ValueError(f"{path.relative_to(root)} needs one block marked as taught on {page}")
            head, rest = text.split(begin)
            tail = rest.split(end)[1]
            texts[path] = head + begin + "\n\n\n".join(cells) + "\n" + end + tail
    saved = {(notebook.relative_to(root).as_posix(), module) for notebook in notebooks
             for module in _taught_cells(notebook)}
    for path in package.rglob("*.py"):
        for page in re.findall(r"^# >>> taught on (\S+):", path.read_text(), flags=re.M):
            if (page, path.relative_to(package).with_suffix("").as_posix().replace("/", ".")) not in saved:
                raise ValueError(f"{path.relative_to(root)} has a block taught on {page}, which saves nothing into it")
    return texts


def stale_modules(notebooks: list[Path], root: Path = REPO_ROOT, package: Path = PACKAGE_DIR) -> list[Path]:
    """The modules whose taught blocks differ from their pages."""
    return sorted(path for path, text in exported_modules(notebooks, root, package).items() if path.read_text() != text)
