"""AOTInductor's C++ loader: the program that loads a ``.pt2`` without Python, built here with g++ (Chapter 6)."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import torch

from graphbook.startup.restart_child import RestartPathError

#: The C++ loader's source, shipped inside the package.
CPP_LOADER_SOURCE = Path(__file__).resolve().parents[1] / "cpp" / "aoti_load.cpp"  # graphbook/cpp, beside the layers


def _cpp_loader_command(source, output) -> list[str]:
    """The g++ command that builds :data:`CPP_LOADER_SOURCE` against the installed torch wheel (Chapter 6)."""
    root = Path(torch.__file__).resolve().parent
    abi = int(torch.compiled_with_cxx11_abi())
    return ["g++", "-std=c++20", "-O2", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w",
            f"-I{root / 'include'}", f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
            str(source), "-o", str(output), f"-L{root / 'lib'}", f"-Wl,-rpath,{root / 'lib'}",
            "-ltorch", "-ltorch_cpu", "-lc10"]


def package_vector_instructions(package) -> dict | None:
    """Instructions in a ``.pt2``'s compiled libraries, by their widest x86 vector register (Chapter 6)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return None
    counts = {"zmm": 0, "ymm": 0, "xmm": 0}
    with zipfile.ZipFile(package) as archive, tempfile.TemporaryDirectory(prefix="graphbook-pt2-") as tmp:
        libraries = [n for n in archive.namelist() if n.endswith(".so")]
        if not libraries:
            raise ValueError(f"{package} holds no compiled library (.so); is it an AOTInductor package?")
        for name in libraries:
            path = archive.extract(name, tmp)
            listing = subprocess.run([objdump, "-d", "--no-show-raw-insn", path], capture_output=True, text=True,
                                     check=True).stdout
            for line in listing.splitlines():  # an instruction counts once, at its widest register
                widest = next((r for r in counts if f"%{r}" in line), None)
                if widest:
                    counts[widest] += 1
    return {**counts, "libraries": len(libraries)}


def build_cpp_loader(work: Path, timeout: float = 600.0) -> dict:
    """Compile the C++ loader once; ``{"path", "build_s", "bytes"}`` (RestartPathError if g++ fails; Chapter 6)."""
    if shutil.which("g++") is None:
        raise RestartPathError("the C++ loader needs g++ to build it once (the aoti-cpp paths); install g++ "
                               "or leave those paths out of --paths")
    output = Path(work) / "aoti_load"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(_cpp_loader_command(CPP_LOADER_SOURCE, output), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RestartPathError(f"building the C++ loader took more than {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise RestartPathError(f"building the C++ loader failed: {proc.stderr[-1500:]}")
    return {"path": output, "build_s": time.perf_counter() - t0, "bytes": output.stat().st_size}
