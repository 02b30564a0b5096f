"""Shared test set-up. The tests import the helper package as installed (``pip install -e .``, which
scripts/setup_env.sh runs); nothing here edits the import path."""
import importlib.util

import pytest


def pytest_configure(config):
    try:
        import graphbook  # noqa: F401
    except ImportError:
        raise pytest.UsageError("graphbook is not installed in this Python: run `bash scripts/setup_env.sh` "
                                "(or `pip install -e .` in the book checkout)") from None
    # A run with the instruction set capped (ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA, the README's AVX2
    # check) must not reuse graphs an uncapped run compiled: torch's FX graph cache ignores the cap and the
    # reused code computes wrong values. The tests and every process they start get their own cache folder.
    import os

    from graphbook.measure.environment import inductor_cache_dir_for_caps

    capped_cache = inductor_cache_dir_for_caps()
    if capped_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = capped_cache


#: Fixtures that export a model with the Dynamo ONNX exporter: every test that takes one is slow.
EXPORTING_FIXTURES = {"exported", "tiny_onnx", "blurball_dynamic_onnx"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if EXPORTING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
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
    """``script("03_fusion.py")``: a script of code/ loaded as a module (once), to call its ``main(argv)`` here."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            from graphbook import paths

            spec = importlib.util.spec_from_file_location(f"script_{name.removesuffix('.py')}", paths.script(name))
            loaded[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded[name])
        return loaded[name]
    return load
