"""The package's shape: no import cycle, and imports at module top except of optional packages."""
import ast

import grimp

from graphbook.paths import CODE_DIR

OPTIONAL_PACKAGES = {"tensorrt", "openvino", "tvm", "playwright", "litserve", "onnxscript",
                     "resource"}  # resource: Windows has none
# Imports a function makes on purpose, by file and name: a restart path's fresh process and the server time their own
# start-up, so their imports are the measurement; and a server or restart path on an ONNX file runs without torch,
# so the runtimes it uses import torch only where a torch tensor is made.
ALLOWED_INSIDE_FUNCTIONS = {
    "graphbook/startup/restart_child.py": {"graphbook.model.blurball", "graphbook.runtimes", "importlib", "numpy",
                                           "graphbook.runtimes.openvino_runtime", "graphbook.runtimes.ort_sessions",
                                           "onnxruntime", "torch", "torch._dynamo.utils", "torch.export"},
    "graphbook/runtimes/openvino_runtime.py": {"graphbook.measure", "torch"},
    "graphbook/serving/runners.py": {"graphbook.measure.warmup", "torch"},
    "serve_blurball.py": {"graphbook.measure.environment", "graphbook.measure.warmup", "graphbook.model.blurball",
                          "torch"},
}


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


def test_imports_sit_at_module_top_except_optional_packages_and_the_named_ones():
    inside = {path.relative_to(CODE_DIR).as_posix(): {name for name in _nested_imports(path)
                                                    if name.split(".")[0] not in OPTIONAL_PACKAGES}
              for path in CODE_DIR.rglob("*.py")}
    lazy = sorted(f"{file}: {name}" for file, names in inside.items()
                  for name in names - ALLOWED_INSIDE_FUNCTIONS.get(file, set()))
    assert not lazy, f"imports inside functions: {lazy}"
    stale = sorted(f"{file}: {name}" for file, names in ALLOWED_INSIDE_FUNCTIONS.items()
                   for name in names - inside.get(file, set()))
    assert not stale, f"allowed inside functions but no longer imported there: {stale}"
