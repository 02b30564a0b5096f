"""seconds_to_ready (graphbook.measure.compiletime): its deadline holds for a quiet child and a noisy one."""
import sys
import threading

import pytest

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


@pytest.mark.parametrize("code, timeout, error", [
    ("import time; print('starting', flush=True); time.sleep(600)", 1.0, "timeout"),  # goes quiet
    # 1 MiB on stderr fills any pipe buffer (64 KiB on Linux) long before READY is printed
    ("import sys, time; sys.stderr.write('warning: noise\\n' * 75000); sys.stderr.flush(); print('READY', flush=True); "
     "time.sleep(600)", 60, None),
    ("import sys; sys.exit('weights are corrupt')", 60, "weights are corrupt"),  # exits: the end of its stderr
], ids=["quiet", "flooding stderr", "exiting"])
@pytest.mark.slow
def test_seconds_to_ready_holds_its_deadline_and_says_why_a_child_was_not_ready(code, timeout, error):
    outcome = _bounded(lambda: seconds_to_ready([sys.executable, "-c", code], timeout=timeout, what="child"))
    if error is None:
        assert isinstance(outcome, float) and outcome > 0
    else:
        assert isinstance(outcome, RuntimeError) and error in str(outcome)
