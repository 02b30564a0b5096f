"""Shared test set-up. The tests import the helper package as installed (``pip install -e .``, which
scripts/setup_env.sh runs); nothing here edits the import path."""
import contextlib
import importlib.util
import os
import subprocess
import traceback
from pathlib import Path
from unittest import mock

import pytest
import torch


def pytest_configure(config):
    try:
        import graphbook  # noqa: F401
    except ImportError:
        raise pytest.UsageError("graphbook is not installed in this Python: run `bash scripts/setup_env.sh` "
                                "(or `pip install -e .` in the book checkout)") from None
    # A run with the instruction set capped (ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA, the README's AVX2
    # check) must not reuse graphs an uncapped run compiled: torch's FX graph cache ignores the cap and the
    # reused code computes wrong values. The tests and every process they start get their own cache folder.
    from graphbook.measure.environment import inductor_cache_dir_for_caps

    capped_cache = inductor_cache_dir_for_caps()
    if capped_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = capped_cache
    # What a fingerprint carries and only a process can tell, looked up once before any test: the commit (git),
    # the clock (a small C program) and the platform (uname). The fast tier then starts no process.
    from graphbook.measure import environment

    os.environ.setdefault(environment.EXECUTION_COMMIT_VARIABLE, environment.git_commit())
    environment.fingerprint(1)


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """A test that pins torch to one thread (for a steady comparison) leaves the next one the threads it found."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# -- the tiers: `pytest -m "not slow"` is the edit loop (under a minute on two cores), the rest is `slow` ------
# A test that compiles, exports, starts a process or a browser carries @pytest.mark.slow; a test is slow too when a
# fixture it uses does that work, which the fixture says with @slow_fixture. An unmarked test that does such work
# fails at run time (below), naming the call.
def slow_fixture(fixture):
    """Mark a fixture as doing slow work, so that every test using it is in the slow tier."""
    fixture.graphbook_slow = True
    return fixture


def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
        if any(getattr(f, "graphbook_slow", False) for f in fixtures):
            item.add_marker(pytest.mark.slow)


def _refuse(item, what):
    def refused(*args, **kwargs):
        caller = next(f for f in reversed(traceback.extract_stack()[:-1]) if "/graphbook/" in f.filename
                      or "/tests/" in f.filename and not f.filename.endswith("conftest.py"))
        pytest.fail(f"{item.nodeid} {what} (in {caller.name}, {Path(caller.filename).name}:{caller.lineno}) but is "
                    'not marked slow: mark it @pytest.mark.slow (the fast tier, `pytest -m "not slow"`, runs no '
                    "compile, export, subprocess or browser)", pytrace=False)
    return refused


@contextlib.contextmanager
def _no_slow_work(item):
    """While an unmarked test (and the fixtures it sets up) runs, a compile, an export or a process fails it."""
    if item.get_closest_marker("slow"):
        yield
        return
    import torch
    import torch._dynamo.convert_frame  # where Dynamo compiles a frame, whatever the backend

    with contextlib.ExitStack() as stack:
        for owner, name, what in ((torch._dynamo.convert_frame, "_compile", "compiles with torch.compile"),
                                  (torch.export, "export", "exports with torch.export"),
                                  (torch.onnx, "export", "exports to ONNX"),
                                  (subprocess, "Popen", "starts a process")):
            stack.enter_context(mock.patch.object(owner, name, _refuse(item, what)))
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _no_slow_work(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _no_slow_work(item):
        yield


@pytest.fixture(scope="session")
@slow_fixture
def blurball_dynamic_onnx(tmp_path_factory):
    """BlurBall (seeded weights) exported once with a dynamic batch at 32x64: ``(model, path)``. A Dynamo
    export of BlurBall takes tens of seconds, so the tests that only read such a file share this one."""
    import torch

    from graphbook.model import blurball
    from graphbook.runtimes import onnx_utils

    model = blurball.build_blurball()
    path = onnx_utils.export_dynamic_batch(model, torch.randn(2, 9, 32, 64),
                                           tmp_path_factory.mktemp("export") / "blurball-dyn.onnx")
    return model, path


@pytest.fixture(scope="session")
def script():
    """``script("03_fusion.py")``: a script of code/ (or ``scripts/...``) loaded as a module once, to call its
    ``main(argv)`` in the test process."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            from graphbook import paths

            path = paths.REPO_ROOT / name if "/" in name else paths.script(name)
            spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
            loaded[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded[name])
        return loaded[name]
    return load


@pytest.fixture
def run_main(script, capsys):
    """``run_main("bench_x.py", *argv)``: the script's ``main(argv)`` in this process, as ``(exit status, stdout,
    stderr)``. A script pins torch's thread count for its process: the test process gets its own back."""
    def run(name: str, *argv):
        import torch

        threads = torch.get_num_threads()
        try:
            code = script(name).main([str(a) for a in argv])
        finally:
            torch.set_num_threads(threads)
        out, err = capsys.readouterr()
        return code, out, err
    return run
