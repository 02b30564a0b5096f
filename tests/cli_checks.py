"""What every script's command line promises on bad input (README, "The scripts' command lines"; graphbook.record.cli).

Used by tests/test_script_usage.py, the table of every script's refusals: a bad option ends with exit status 2, one line on stderr that says
``error``, nothing on stdout and never a traceback.
"""
import subprocess


def assert_usage_error(proc: subprocess.CompletedProcess, message: str | None = None) -> None:
    """Exit 2, one stderr line naming the error (containing ``message`` when given), empty stdout, no traceback."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], proc.stderr
    if message is not None:
        assert message in lines[0], proc.stderr
