import pytest
"""seconds_to_ready (graphbook.measure.compiletime): its deadline holds for a quiet child and for one that floods
stderr."""
import sys
import threading

from graphbook.measure.compiletime import seconds_to_ready


def _bounded(call, bound_s=60):
    """Run ``call`` in a thread; return what it returned or raised, failing if it outlives ``bound_s``."""
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


@pytest.mark.slow
def test_seconds_to_ready_times_out_on_a_child_that_goes_quiet():
    quiet = [sys.executable, "-c", "import time; print('starting', flush=True); time.sleep(600)"]
    outcome = _bounded(lambda: seconds_to_ready(quiet, timeout=1.0, what="quiet child"))
    assert isinstance(outcome, RuntimeError) and "timeout" in str(outcome)


@pytest.mark.slow
def test_seconds_to_ready_drains_a_flood_of_warnings_on_stderr():
    # 1 MiB on stderr fills any pipe buffer (64 KiB on Linux) long before READY is printed
    noisy = [sys.executable, "-c", "import sys, time; sys.stderr.write('warning: noise\\n' * 75000); "
                                   "sys.stderr.flush(); print('READY', flush=True); time.sleep(600)"]
    outcome = _bounded(lambda: seconds_to_ready(noisy, timeout=60, what="noisy child"))
    assert isinstance(outcome, float) and outcome > 0


@pytest.mark.slow
def test_seconds_to_ready_reports_the_end_of_stderr_of_a_child_that_exits():
    failing = [sys.executable, "-c", "import sys; sys.exit('weights are corrupt')"]
    outcome = _bounded(lambda: seconds_to_ready(failing, timeout=60, what="failing child"))
    assert isinstance(outcome, RuntimeError) and "weights are corrupt" in str(outcome)
