"""Every public helper of graphbook names the chapter that introduces it ("Introduced in Chapter N.").

Public: a module-level function or class of a graphbook module, defined in that module (not imported into
it), whose name has no leading underscore. Its docstring must mention "Chapter N" (or "Chapters N ..."),
or the appendix for the helpers only an appendix page uses (graphbook.provenance).
"""
import inspect
import pkgutil
import re

import graphbook

CHAPTER = re.compile(r"\bChapters? \d|\b[Aa]ppendix\b")


def public_helpers():
    infos = pkgutil.walk_packages(graphbook.__path__, prefix="graphbook.")  # subpackages' modules too
    for info in sorted(infos, key=lambda i: i.name):
        module = pkgutil.resolve_name(info.name)  # imports the module
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if obj.__module__ == module.__name__:
                yield f"{module.__name__}.{name}", obj


def test_the_walk_finds_the_package_helpers():
    names = dict(public_helpers())
    assert "graphbook.cli.multiple_of_8" in names and "graphbook.miscompile.check_model" in names
    assert "graphbook.cli.Path" not in names  # imported names are not the module's own
    assert "graphbook.serving.batcher.InferenceService" in names  # a subpackage's modules are walked


def test_every_public_helper_names_its_chapter():
    missing = [name for name, obj in public_helpers() if not CHAPTER.search(inspect.getdoc(obj) or "")]
    assert not missing, "public helpers whose docstring names no chapter (add 'Chapter N'): " + ", ".join(missing)
