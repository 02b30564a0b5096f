"""Tests of the cold / warm compile-time helpers (graphbook.measure.compiletime).

The fresh-process test compiles twice in child processes (tens of seconds on a 2-core machine): it is
marked slow; the in-process tests use a two-op function.
"""
import textwrap

import pytest

from graphbook.measure import compiletime


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


# --------------------------------------------------------------------------------------------------
# seconds_to_ready: the deadline holds for a quiet child and for one that floods stderr
def _bounded(call, bound_s=60):
    """Run ``call`` in a thread; return what it returned or raised, failing if it outlives ``bound_s``."""
    import threading

    box = []

    def run():
        try:
            box.append(call())
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound_s)
    assert not thread.is_alive(), "seconds_to_ready outlived its own timeout many times over"
    return box[0]


def test_seconds_to_ready_times_out_on_a_child_that_goes_quiet():
    import sys

    from graphbook.measure.compiletime import seconds_to_ready

    quiet = [sys.executable, "-c", "import time; print('starting', flush=True); time.sleep(600)"]
    outcome = _bounded(lambda: seconds_to_ready(quiet, timeout=1.0, what="quiet child"))
    assert isinstance(outcome, RuntimeError) and "timeout" in str(outcome)


def test_seconds_to_ready_drains_a_flood_of_warnings_on_stderr():
    import sys

    from graphbook.measure.compiletime import seconds_to_ready

    # 1 MiB on stderr fills any pipe buffer (64 KiB on Linux) long before READY is printed
    noisy = [sys.executable, "-c", "import sys, time; sys.stderr.write('warning: noise\\n' * 75000); "
                                   "sys.stderr.flush(); print('READY', flush=True); time.sleep(600)"]
    outcome = _bounded(lambda: seconds_to_ready(noisy, timeout=60, what="noisy child"))
    assert isinstance(outcome, float) and outcome > 0


def test_seconds_to_ready_reports_the_end_of_stderr_of_a_child_that_exits():
    import sys

    from graphbook.measure.compiletime import seconds_to_ready

    failing = [sys.executable, "-c", "import sys; sys.exit('weights are corrupt')"]
    outcome = _bounded(lambda: seconds_to_ready(failing, timeout=60, what="failing child"))
    assert isinstance(outcome, RuntimeError) and "weights are corrupt" in str(outcome)
