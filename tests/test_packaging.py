"""graphbook is an installed package: importable from any folder, CONTRIBUTING.md lists every module, and
chapters and tests never edit the import path (except the one documented fallback of a lone notebook)."""
import json
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from graphbook import paths

ROOT = paths.REPO_ROOT
PACKAGE = ROOT / "code" / "graphbook"
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "appendix").glob("*.ipynb"))
# Spelled in pieces so that this file does not match the search it performs.
PATH_EDIT, IMPORTLIB = "sys." + "path", "import" + "lib"


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}  # no PYTHONPATH: only what is installed
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_graphbook_imports_from_any_folder_and_is_this_checkout(tmp_path):
    proc = _python("import graphbook, graphbook.record.cli; print(graphbook.__file__)", tmp_path)
    assert proc.returncode == 0, f"graphbook is not installed (run scripts/setup_env.sh): {proc.stderr}"
    assert Path(proc.stdout.strip()) == PACKAGE / "__init__.py"


def test_pyproject_maps_only_the_package_and_declares_no_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["name"] == "graphbook"
    assert project["project"]["dependencies"] == [], "requirements.txt is the one dependency list"
    assert project["tool"]["setuptools"]["package-dir"] == {"graphbook": "code/graphbook"}
    subpackages = {".".join(("graphbook",) + p.parent.relative_to(PACKAGE).parts) for p in PACKAGE.rglob("__init__.py")}
    assert set(project["tool"]["setuptools"]["packages"]) == subpackages, "pyproject.toml must list every subpackage"
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    assert all((folder / "__init__.py").exists() for folder in folders), "every package folder has an __init__.py"
    assert "-e ." in (ROOT / "scripts" / "setup_env.sh").read_text()


def _modules() -> set[str]:
    """Every module of the package, dotted below graphbook (``results`` in record/ is ``record.results``)."""
    return {".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")
            if p.stem != "__init__"}


def test_no_test_edits_the_import_path_and_contributing_lists_every_module():
    offenders = [p.name for p in sorted((ROOT / "tests").glob("*.py"))
                 if p.name != Path(__file__).name and PATH_EDIT in p.read_text()]
    assert not offenders, f"tests that edit {PATH_EDIT} (import graphbook instead): {offenders}"
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


# The platforms the book's readers install on, as pip's environment markers see them.
READER_PLATFORMS = {
    "x86-64 Linux": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"},
    "aarch64 Linux": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"},
    "macOS arm64": {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"},
    "Windows x86-64": {"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64"},
}
# Pins whose wheels do not cover every platform torch's do, and where they are left out. OpenVINO 2026.4.1's
# aarch64 Linux wheel needs glibc 2.35 while torch's needs 2.28: without the marker an older aarch64 server
# would fail the whole install instead of reading "OpenVINO is absent" in the chapters.
LEFT_OUT_ON = {"openvino": {"aarch64 Linux"}, "openvino-telemetry": {"aarch64 Linux"}}


def test_every_pin_installs_on_every_reader_platform_except_where_its_wheels_are_missing():
    pins = _pins("requirements.txt")
    assert {p.name for p in pins} >= {"torch", "onnxruntime", "openvino"}
    for pin in pins:
        assert str(pin.specifier).startswith("=="), f"{pin.name} is not pinned with =="
        for platform, environment in READER_PLATFORMS.items():
            wanted = platform not in LEFT_OUT_ON.get(pin.name, set())
            installed = pin.marker is None or pin.marker.evaluate(environment)
            assert installed == wanted, f"{pin.name} {'is not' if wanted else 'is'} installed on {platform}"


def _pins(name: str) -> list:
    from packaging.requirements import Requirement

    lines = (line.split("#", 1)[0].strip() for line in (ROOT / name).read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def test_the_environment_is_the_lock_every_installed_package_at_its_pinned_version():
    """A clean install takes nothing no file pins: requirements.txt, torch's CUDA libraries (-c), the optional TVM."""
    from importlib import metadata

    from packaging.utils import canonicalize_name

    text = (ROOT / "requirements.txt").read_text()
    assert "-c requirements-torch-cuda.txt" in text.splitlines()
    pinned = {canonicalize_name(p.name): str(p.specifier)[2:] for name in
              ("requirements.txt", "requirements-torch-cuda.txt", "requirements-tvm.txt") for p in _pins(name)}
    site = [sysconfig.get_paths()["purelib"]]  # not the copies setuptools vendors and puts on the path
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions(path=site)}
    installed.pop("graphbook")
    for unpinned in ("pip", "wheel"):  # the venv's own installer
        installed.pop(unpinned, None)
    wrong = {name: version for name, version in installed.items()
             if name in pinned and pinned[name] != version.split("+")[0]}
    assert not set(installed) - set(pinned), f"installed but pinned nowhere: {sorted(set(installed) - set(pinned))}"
    assert not wrong, f"installed at another version than pinned: {wrong}"


def test_an_absent_openvino_is_explained_and_the_lab_gpu_runtime_is_the_version_of_the_cpu_one(monkeypatch):
    from graphbook.runtimes import openvino_runtime

    monkeypatch.setitem(sys.modules, "openvino", None)  # what an install without the package looks like
    ok, why = openvino_runtime.available()
    assert not ok and "aarch64 Linux" in why and "requirements.txt" in why
    def pin(text, name):
        return re.search(rf"^{name}==([\w.]+)", text, re.M).group(1)
    cpu = (paths.REPO_ROOT / "requirements.txt").read_text()
    lab = (paths.REPO_ROOT / "requirements-lab.txt").read_text()
    assert pin(lab, "onnxruntime-gpu") == pin(cpu, "onnxruntime")


@pytest.mark.slow
def test_where_uv_cannot_install_a_pin_pip_installs_it_and_says_so(tmp_path):
    """uv does not read pip's configuration, so a reader's private index would fail it: set-up then uses pip."""
    source = tmp_path / "source"
    (source / "tinypin").mkdir(parents=True)
    (source / "tinypin" / "__init__.py").write_text("")
    (source / "pyproject.toml").write_text('[project]\nname = "tinypin"\nversion = "1.0"\n')
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                    tmp_path / "wheels", source], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "venv", tmp_path / ".venv"], check=True)
    (tmp_path / ".venv" / "bin" / "uv").symlink_to(Path(sys.executable).with_name("uv"))
    install = re.search(r"^install\(\) \{.*?^\}$", (ROOT / "scripts" / "setup_env.sh").read_text(), re.M | re.S)
    # uv offline with no cache cannot install; pip finds the pin where its configuration (here PIP_*) points
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "UV_OFFLINE": "1", "UV_NO_CACHE": "1",
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "wheels")}
    proc = subprocess.run(["bash", "-c", f"set -eu\n{install.group(0)}\ninstall tinypin==1.0"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "uv could not install (tinypin==1.0); installing with pip" in proc.stderr
    assert subprocess.run([tmp_path / ".venv" / "bin" / "python", "-c", "import tinypin"]).returncode == 0
