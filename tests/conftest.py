"""Shared test set-up. The tests import the helper package as installed (``pip install -e .``, which
scripts/setup_env.sh runs); nothing here edits the import path."""
import pytest


def pytest_configure(config):
    try:
        import graphbook  # noqa: F401
    except ImportError:
        raise pytest.UsageError("graphbook is not installed in this Python: run `bash scripts/setup_env.sh` "
                                "(or `pip install -e .` in the book checkout)") from None
