"""Tests of the cold / warm compile-time helpers (graphbook.compiletime).

The fresh-process test compiles twice in child processes (tens of seconds on a 2-core machine): it is
marked slow; the in-process tests use a two-op function.
"""
import textwrap

import pytest

from graphbook import compiletime


def _double_plus_one(x):
    return x * 2 + 1


def test_fresh_process_rejects_missing_script(tmp_path):
    with pytest.raises(FileNotFoundError):
        compiletime.compile_in_fresh_process(tmp_path / "nope.py", "f", [[4]], tmp_path / "cache")
    script = tmp_path / "ok.py"
    script.write_text("def f(x):\n    return x\n")
    with pytest.raises(ValueError, match="threads"):
        compiletime.compile_in_fresh_process(script, "f", [[4]], tmp_path / "cache", threads=0)


def test_fresh_process_failure_is_a_runtime_error(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("raise SystemExit('deliberately broken')\n")
    with pytest.raises(RuntimeError, match="failed"):
        compiletime.compile_in_fresh_process(script, "f", [[4]], tmp_path / "cache")


@pytest.mark.slow
def test_fresh_process_cold_then_warm_hits_the_cache(tmp_path):
    script = tmp_path / "target.py"
    script.write_text(textwrap.dedent("""
        import torch
        def chain(x):
            return torch.relu(x * 2 + 1) * 3
    """))
    cache = tmp_path / "cache"
    cold = compiletime.compile_in_fresh_process(script, "chain", [[1024]], cache)
    warm = compiletime.compile_in_fresh_process(script, "chain", [[1024]], cache)
    assert cold["fxgraph_cache_miss"] >= 1 and cold["fxgraph_cache_hit"] == 0
    assert warm["fxgraph_cache_hit"] >= 1 and warm["fxgraph_cache_miss"] == 0
    assert warm["seconds"] < cold["seconds"]
