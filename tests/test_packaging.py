"""graphbook is an installed package: importable from any folder, the scripts in code/ are not modules,
CONTRIBUTING.md lists every module, and chapters and tests never edit the import path (except the one
documented fallback of a lone notebook)."""
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "code" / "graphbook"
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "appendix").glob("*.ipynb"))
# Spelled in pieces so that this file does not match the search it performs.
PATH_EDIT, IMPORTLIB = "sys." + "path", "import" + "lib"


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}  # no PYTHONPATH: only what is installed
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_graphbook_imports_from_any_folder_and_is_this_checkout(tmp_path):
    proc = _python("import graphbook, graphbook.cli; print(graphbook.__file__)", tmp_path)
    assert proc.returncode == 0, f"graphbook is not installed (run scripts/setup_env.sh): {proc.stderr}"
    assert Path(proc.stdout.strip()) == PACKAGE / "__init__.py"


def test_scripts_in_code_are_not_importable_modules(tmp_path):
    proc = _python("import bench_blurball_cpu", tmp_path)
    assert proc.returncode != 0 and "No module named 'bench_blurball_cpu'" in proc.stderr


def test_pyproject_maps_only_the_package_and_declares_no_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["name"] == "graphbook"
    assert project["project"]["dependencies"] == [], "requirements.txt is the one dependency list"
    assert project["tool"]["setuptools"]["package-dir"] == {"graphbook": "code/graphbook"}
    assert "-e ." in (ROOT / "scripts" / "setup_env.sh").read_text()


def _modules() -> set[str]:
    """Every module of the package: ``name`` for a top-level module or subpackage, ``sub.name`` inside one."""
    names = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    for init in PACKAGE.glob("*/__init__.py"):
        sub = init.parent.name
        names |= {sub} | {f"{sub}.{p.stem}" for p in init.parent.glob("*.py") if p.stem != "__init__"}
    return names


def test_subpackages_are_declared_in_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    subpackages = {f"graphbook.{init.parent.name}" for init in PACKAGE.glob("*/__init__.py")}
    assert subpackages <= set(project["tool"]["setuptools"]["packages"])


def test_contributing_lists_every_module():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    listed = set(re.findall(r"^\s*\| `([\w.]+)` \|", text, re.M))
    modules = _modules()
    assert not modules - listed, f"CONTRIBUTING.md does not list these graphbook modules: {sorted(modules - listed)}"
    assert not listed - modules, f"CONTRIBUTING.md lists modules that do not exist: {sorted(listed - modules)}"


def _documented_first_cell() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("## The first code cell of every chapter", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def _fallback(source: str) -> str:
    """The try/except block of a first cell, with the imported names replaced by a placeholder."""
    block = source.split("\nenv = ", 1)[0]
    return re.sub(r"from graphbook import [\w, ]+", "from graphbook import NAMES", block)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.relative_to(ROOT).as_posix() for p in NOTEBOOKS])
def test_first_cell_is_the_documented_import_and_nothing_else_touches_the_path(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    sources = ["".join(c["source"]) for c in cells]
    assert _fallback(sources[0]) == _fallback(_documented_first_cell()), \
        "the first code cell must be CONTRIBUTING.md's import with its lone-notebook fallback"
    assert sources[0].count(PATH_EDIT) == 1 and IMPORTLIB not in sources[0]
    for index, source in enumerate(sources[1:], start=2):
        assert PATH_EDIT not in source and IMPORTLIB not in source, \
            f"code cell {index} edits the import path or loads a file with {IMPORTLIB}: import from graphbook"


def test_no_test_edits_the_import_path_or_loads_a_script():
    offenders = [p.name for p in sorted((ROOT / "tests").glob("*.py"))
                 if p.name != Path(__file__).name and (PATH_EDIT in p.read_text() or IMPORTLIB in p.read_text())]
    assert not offenders, f"tests that edit {PATH_EDIT} or use {IMPORTLIB} (import graphbook instead): {offenders}"


def test_package_docstring_lists_every_module():
    import graphbook

    listed = set(re.findall(r"^\s*- ``([\w.]+)``", graphbook.__doc__, re.M))
    modules = _modules()
    assert listed == modules, (f"graphbook/__init__.py's list lacks {sorted(modules - listed)} "
                               f"and names missing modules {sorted(listed - modules)}")
