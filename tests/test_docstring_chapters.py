"""The package's public API is what a chapter, a script or another module calls.

Public: a module-level function or class of a graphbook module (any subpackage), defined in that module (not
imported into it), whose name has no leading underscore.
"""
import ast
import inspect
import json
import pkgutil
import re

import graphbook
from graphbook import paths

NOTEBOOKS = sorted(paths.REPO_ROOT.glob("chapters/*.ipynb")) + sorted(paths.REPO_ROOT.glob("appendix/*.ipynb"))


def _modules():
    for info in pkgutil.walk_packages(graphbook.__path__, prefix="graphbook."):
        yield pkgutil.resolve_name(info.name)


def public_helpers():
    for module in sorted(_modules(), key=lambda m: m.__name__):
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if obj.__module__ == module.__name__:
                yield module, name, obj


def _chapter_code() -> str:
    cells = []
    for path in NOTEBOOKS:
        cells += ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    return "\n".join(cells)


def _names_used_in(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a notebook's magics: fall back to words
        return set(re.findall(r"\b\w+\b", source))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
        {a.name.split(".")[-1] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}


def test_the_walk_finds_the_package_helpers_in_every_layer():
    names = {f"{m.__name__}.{n}" for m, n, _ in public_helpers()}
    assert {"graphbook.record.cli.multiple_of_8", "graphbook.compilers.miscompile.check_model",
            "graphbook.lab.gpu_measure.parse_args", "graphbook.measure.timing.repeated_runs"} <= names
    assert "graphbook.record.cli.Path" not in names  # imported names are not the module's own


def test_every_public_function_is_called_outside_its_module():
    """Used by a chapter, a script in code/ or scripts/, or another module of the package; else make it private."""
    chapter_words = _names_used_in(_chapter_code()) | set(re.findall(r"\b\w+\b", _chapter_code()))
    script_words = set()
    for path in [*paths.CODE_DIR.glob("*.py"), *(paths.REPO_ROOT / "scripts").glob("*.py")]:
        script_words |= set(re.findall(r"\b\w+\b", path.read_text()))
    module_words = {}
    for module in _modules():
        module_words[module.__name__] = set(re.findall(r"\b\w+\b", inspect.getsource(module)))
    unused = []
    for module, name, obj in public_helpers():
        if not inspect.isfunction(obj):
            continue  # classes are the types functions return; a function is what someone calls
        elsewhere = any(name in words for other, words in module_words.items() if other != module.__name__)
        if not (name in chapter_words or name in script_words or elsewhere):
            unused.append(f"{module.__name__}.{name}")
    assert not unused, "public functions nobody outside their module calls (make them private): " + ", ".join(unused)
