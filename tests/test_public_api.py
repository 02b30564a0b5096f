"""Nothing public is dead: a public function of the package is called by a chapter, a script or another module.

Public: a module-level function of a graphbook module (any subpackage), defined in that module (not imported
into it), whose name has no leading underscore.
"""
import inspect
import json
import pkgutil
import re

import graphbook
from graphbook import paths


def _words(text: str) -> set[str]:
    return set(re.findall(r"\b\w+\b", text))


def test_every_public_function_is_called_outside_its_module():
    modules = [pkgutil.resolve_name(info.name) for info in pkgutil.walk_packages(graphbook.__path__, "graphbook.")]
    notebooks = [*paths.REPO_ROOT.glob("chapters/*.ipynb"), *paths.REPO_ROOT.glob("appendix/*.ipynb")]
    outside = _words("\n".join("".join(c["source"]) for p in notebooks for c in json.loads(p.read_text())["cells"]
                               if c["cell_type"] == "code"))
    for path in [*paths.CODE_DIR.glob("*.py"), *(paths.REPO_ROOT / "scripts").glob("*.py")]:
        outside |= _words(path.read_text())
    words = {m.__name__: _words(inspect.getsource(m)) for m in modules}
    unused = [f"{m.__name__}.{name}" for m in modules for name, obj in vars(m).items()
              if inspect.isfunction(obj) and obj.__module__ == m.__name__ and not name.startswith("_")
              and name not in outside and not any(name in w for other, w in words.items() if other != m.__name__)]
    assert not unused, "public functions nobody outside their module calls (make them private): " + ", ".join(unused)


_PAGE_IMPORT = re.compile(r"^from (graphbook(?:\.\w+)*) import ([\w, ]+)$", re.M)
_ATTRIBUTE = re.compile(r"(?<![\w.])(\w+)\.([A-Za-z_]\w*)")   # alias.name, not the tail of torch.x.config.name


def _module(name: str):
    try:
        found = pkgutil.resolve_name(name)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if inspect.ismodule(found) else None


def test_every_name_a_page_reads_from_a_package_module_exists():
    """A rename in the package fails here, in the fast tier, instead of in a page's execution under nbval."""
    missing = []
    for notebook in [*paths.REPO_ROOT.glob("chapters/*.ipynb"), *paths.REPO_ROOT.glob("appendix/*.ipynb")]:
        source = "\n".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"]
                           if c["cell_type"] == "code")
        modules = {name: _module(f"{package}.{name}") for package, names in _PAGE_IMPORT.findall(source)
                   for name in (n.strip() for n in names.split(","))}
        missing += sorted({f"{notebook.name}: {modules[alias].__name__}.{attr}"
                           for alias, attr in _ATTRIBUTE.findall(source)
                           if modules.get(alias) and not hasattr(modules[alias], attr)})
    assert not missing, "pages read names their package modules no longer have: " + ", ".join(missing)
