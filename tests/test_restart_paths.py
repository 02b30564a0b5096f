"""Restart paths in fresh processes (graphbook.startup.restart_paths, code/bench_restart_paths.py; Chapter 6)."""
import subprocess

import pandas as pd
import pytest

from graphbook import paths
from graphbook.startup import aoti_cpp
from graphbook.config import BATCH_SIZES, SAME_OUTPUT_ATOL
from graphbook.record import results
from graphbook.startup import restart_paths


def test_path_registry_names_are_unique_and_say_what_they_are_tied_to():
    assert len(set(restart_paths.PATH_NAMES)) == len(restart_paths.PATHS)
    for path in restart_paths.PATHS:
        assert path.runtime in ("eager", "compile", "aoti", "aoti-cpp", "ort", "openvino") and path.tied_to
        assert path.batch_sizes[0] == 1
    assert restart_paths.PATH_BY_NAME["ort-raw"].level == "all"
    assert restart_paths.PATH_BY_NAME["ort-optimized-ort"].level == "disabled"


def test_summarize_gives_median_spread_and_ratio_to_the_cold_compile():
    rows = []
    for path, firsts in (("compile-cold", [60.0, 80.0, 70.0]), ("ort-raw", [0.5, 0.7, 0.6])):
        for i, s in enumerate(firsts):
            rows.append({"path": path, "first_output_s": s, "import_s": 0.1, "load_s": 0.1, "first_call_s": 0.1,
                         "steady_median_ms": 10.0, "build_s": 1.0, "artifact_bytes": 2e6, "same_output": True,
                         "tied_to": "x", "repeat": i})
    table = restart_paths.summarize(pd.DataFrame(rows)).set_index("path")
    assert table.loc["ort-raw", "first_output_median_s"] == 0.6
    assert table.loc["ort-raw", "speedup_vs_cold"] == pytest.approx(70 / 0.6)
    assert table.loc["ort-raw", "speedup_vs_cold_min"] == pytest.approx(60 / 0.7)
    assert table.loc["compile-cold", "speedup_vs_cold"] == 1.0 and table.loc["ort-raw", "artifact_mb"] == 2.0


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory, script):
    """One small run of bench_restart_paths.py over the ONNX Runtime and OpenVINO paths, one export for all:
    ``(paths frame, serving-ready frame, workdir)``."""
    root = tmp_path_factory.mktemp("restart")
    chosen = ["eager", "ort-raw", "ort-optimized-ort", "ort-dynamic", "openvino", "openvino-cached"]
    assert script("bench_restart_paths.py").main([
        "--paths", ",".join(chosen), "--height", "32", "--width", "64", "--repeats", "1", "--steady-runs", "1",
        "--threads", "1", "--server-repeats", "1", "--workdir", str(root / "work"),
        "--results-dir", str(root / "results")]) == 0
    frame = results.load(restart_paths.KIND, root / "results")
    return frame.set_index("path"), results.load("serving-ready", root / "results"), root / "work"


@pytest.fixture(scope="module")
def cpp_run(tmp_path_factory):
    """The static package through the C++ loader, and its match with eager: ``(row, workdir)``."""
    work = tmp_path_factory.mktemp("cpp")
    (row,) = restart_paths.run_restart_paths(paths.TRAINED_CHECKPOINT, input_hw=(32, 64), repeats=1, threads=1,
                                             paths=("aoti-cpp",), steady_runs=1, workdir=work)
    return row, work


@pytest.mark.slow
def test_onnx_runtime_paths_are_correct_and_never_import_torch(bench_run):
    by_path = bench_run[0]
    for name in ("eager", "ort-raw", "ort-optimized-ort", "ort-dynamic"):
        assert by_path.loc[name, results.SAME_OUTPUT] and by_path.loc[name, "first_output_s"] > 0, name
        assert bool(by_path.loc[name, "torch_imported"]) is (name == "eager")
    assert by_path.loc["ort-dynamic", "batch_sizes"] == ",".join(map(str, BATCH_SIZES))
    assert by_path.loc["ort-optimized-ort", "nchwc_ops"] >= 0 and by_path.loc["ort-raw", "artifact_bytes"] > 1e6


@pytest.mark.slow
def test_openvino_paths_are_correct_never_import_torch_and_the_cache_is_used(bench_run):
    pytest.importorskip("openvino")
    by_path, _, work = bench_run
    for name in ("openvino", "openvino-cached"):
        row = by_path.loc[name]
        assert row[results.SAME_OUTPUT] and row["first_output_s"] > 0 and not row["torch_imported"], name
    assert any((work / "caches" / "openvino").iterdir()), "OpenVINO wrote nothing to its model cache"


@pytest.mark.slow
def test_bench_script_writes_one_restart_paths_file_and_the_server_starts(bench_run):
    by_path, servers, _ = bench_run
    assert len(set(by_path[results.SOURCE_FILE])) == 1 and by_path[results.SAME_OUTPUT].all()
    # the eager path brings the eager server start; without compile-cold no compiling server is started
    assert set(servers["server"]) == {"eager", "onnxruntime .onnx (dynamic batch)", "onnxruntime .ort (optimized, batch 1)"}
    assert (servers["time_to_ready_s"] > 0).all()


@pytest.mark.slow
def test_cpp_loader_runs_the_package_without_python_and_matches_eager(cpp_run):
    row, work = cpp_run
    assert row["path"] == "aoti-cpp" and row["batch_sizes"] == "1"
    assert row[results.SAME_OUTPUT] and row[results.MAX_ABS_DIFF] < SAME_OUTPUT_ATOL
    assert row["import_s"] == 0.0 and 0 < row["first_output_s"] <= row["ready_s"]
    # the build cost of the C++ path includes compiling the loader once
    assert row["build_s"] > 0
    # the package is machine code for one instruction set: it holds vector instructions of some width
    vector = aoti_cpp.package_vector_instructions(work / "aoti-static.pt2")
    assert vector is None or vector["zmm"] + vector["ymm"] + vector["xmm"] > 0


def test_openvino_paths_are_skipped_where_openvino_is_absent(tmp_path, monkeypatch):
    monkeypatch.setattr(restart_paths, "openvino_available", lambda: (False, "no wheel here"))
    said = []
    # only OpenVINO paths asked for: after skipping them nothing is left to start, and no checkpoint to read
    with pytest.raises(FileNotFoundError, match="x.pt"):
        restart_paths.run_restart_paths("x.pt", paths=("openvino",), workdir=tmp_path, progress=said.append)
    assert said[0] == "skipping the OpenVINO paths: no wheel here"


def test_cpp_loader_command_uses_the_wheels_headers_libraries_and_abi_and_needs_gplusplus(tmp_path, monkeypatch):
    import torch

    cmd = aoti_cpp._cpp_loader_command(aoti_cpp.CPP_LOADER_SOURCE, "/tmp/x")
    assert cmd[0] == "g++" and aoti_cpp.CPP_LOADER_SOURCE.is_file()
    assert f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}" in cmd
    assert any(c.startswith("-Wl,-rpath,") and c.endswith("lib") for c in cmd) and "-ltorch_cpu" in cmd
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++ on this PATH
    with pytest.raises(restart_paths.RestartPathError, match="needs g\\+\\+"):
        aoti_cpp.build_cpp_loader(tmp_path)


@pytest.mark.slow
def test_cpp_loader_refuses_bad_arguments_with_exit_2(cpp_run, tmp_path):
    loader = cpp_run[1] / "aoti_load"  # the loader the aoti-cpp path built
    proc = subprocess.run([str(loader)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr
    proc = subprocess.run([str(loader), str(tmp_path / "missing.pt2"), str(tmp_path), str(tmp_path), "0", "1", "1",
                           "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith("aoti_load: ") and "Traceback" not in proc.stderr


def _zip_with_library(tmp_path, source: str, flags=()):
    import zipfile

    (tmp_path / "k.c").write_text(source)
    lib = tmp_path / "k.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O3", *flags, str(tmp_path / "k.c"), "-o", str(lib)], check=True)
    package = tmp_path / "k.pt2"
    with zipfile.ZipFile(package, "w") as archive:
        archive.write(lib, "k/data/aotinductor/model/k.so")
    return package


@pytest.mark.slow
def test_package_vector_instructions_counts_by_widest_register(tmp_path):
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 registers only")
    add = "void add(float* a, const float* b, int n) { for (int i = 0; i < n; ++i) a[i] += b[i]; }"
    plain = aoti_cpp.package_vector_instructions(_zip_with_library(tmp_path, add, ["-mno-avx"]))
    wide = aoti_cpp.package_vector_instructions(_zip_with_library(tmp_path, add, ["-mavx512f", "-mprefer-vector-width=512"]))
    assert plain["zmm"] == 0 and plain["ymm"] == 0 and plain["xmm"] > 0 and plain["libraries"] == 1
    assert wide["zmm"] > 0   # compiling is enough; nothing here runs the AVX-512 code


def test_package_vector_instructions_without_objdump_or_library(tmp_path, monkeypatch):
    import zipfile

    empty = tmp_path / "empty.pt2"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("k/data/constants.bin", b"")
    with pytest.raises(ValueError, match="no compiled library"):
        aoti_cpp.package_vector_instructions(empty)
    monkeypatch.setenv("PATH", str(tmp_path))  # no objdump on this PATH
    assert aoti_cpp.package_vector_instructions(empty) is None
