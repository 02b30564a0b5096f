"""Every public helper of graphbook names the chapter that introduces it ("Introduced in Chapter N.").

Public: a module-level function or class of a graphbook module, defined in that module (not imported into
it), whose name has no leading underscore. Its docstring must mention "Chapter N" (or "Chapters N ..."),
or the appendix for the helpers only an appendix page uses (graphbook.record.provenance).
"""
import inspect
import pkgutil
import re

import graphbook

CHAPTER = re.compile(r"\bChapters? \d|\b[Aa]ppendix\b")


def public_helpers():
    for info in sorted(pkgutil.iter_modules(graphbook.__path__), key=lambda i: i.name):
        module = pkgutil.resolve_name(f"graphbook.{info.name}")  # imports the module
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if obj.__module__ == module.__name__:
                yield f"{module.__name__}.{name}", obj


def test_the_walk_finds_the_package_helpers():
    names = dict(public_helpers())
    assert "graphbook.record.cli.multiple_of_8" in names and "graphbook.miscompile.check_model" in names
    assert "graphbook.record.cli.Path" not in names  # imported names are not the module's own


def test_every_public_helper_names_its_chapter():
    missing = [name for name, obj in public_helpers() if not CHAPTER.search(inspect.getdoc(obj) or "")]
    assert not missing, "public helpers whose docstring names no chapter (add 'Chapter N'): " + ", ".join(missing)
