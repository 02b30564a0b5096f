"""The package's shape: no import cycle, and imports at module top except of optional packages."""
import ast

import grimp

from graphbook.paths import CODE_DIR

OPTIONAL_PACKAGES = {"tensorrt", "openvino", "tvm", "playwright", "litserve", "onnxscript",
                     "resource"}  # resource: Windows has none
# A restart path's fresh process and the server time their own start-up, so their imports are the measurement;
# and a server or restart path on an ONNX file runs without torch, so the runtimes it uses import torch only
# where a torch tensor is made.
LAZY_ON_PURPOSE = {"restart_child.py", "compile_cache.py", "compiletime.py", "serve_blurball.py", "runners.py", "openvino_runtime.py"}


def test_no_module_of_the_package_imports_itself_back():
    graph = grimp.build_graph("graphbook")
    cycles = sorted({tuple(sorted((a, b))) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
                     if a != b and not (a.startswith(b + ".") or b.startswith(a + "."))
                     and graph.find_shortest_chain(importer=b, imported=a)})
    assert not cycles, f"import cycles: {cycles}"


def _nested_imports(path):
    tree = ast.parse(path.read_text())
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    yield from (alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom):
                    yield node.module or ""


def test_imports_sit_at_module_top_except_optional_packages():
    lazy = {f"{path.relative_to(CODE_DIR)}: {name}" for path in CODE_DIR.rglob("*.py")
            if path.name not in LAZY_ON_PURPOSE
            for name in _nested_imports(path) if name.split(".")[0] not in OPTIONAL_PACKAGES}
    assert not lazy, f"imports inside functions: {sorted(lazy)}"
