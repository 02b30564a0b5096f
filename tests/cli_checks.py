"""What every script's command line promises on bad input (README, "The scripts' command lines"; graphbook.record.cli).

Used by tests/test_script_usage.py, the table of every script's refusals: a bad option ends with exit status 2, one
line on stderr that says ``error``, nothing on stdout and never a traceback.

Starting a fresh Python per case costs a torch import (about 1.5 s) for a check that takes milliseconds, so
:func:`run_cases` runs all of one script's cases in one fresh Python: this file, run as a program, executes the
script once per case as ``__main__`` (``runpy``), each with its own ``sys.argv``, working folder and captured
streams, and reports each case's exit status and output. An exception that escapes the script is reported as
its traceback on stderr, exactly what a real run would print.
"""
import json
import os
import subprocess
import sys


def assert_usage_error(proc: subprocess.CompletedProcess, message: str | None = None) -> None:
    """Exit 2, one stderr line naming the error (containing ``message`` when given), empty stdout, no traceback."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0], proc.stderr
    if message is not None:
        assert message in lines[0], proc.stderr


def run_cases(script: str, cases: list[tuple[list[str], str]], timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Run ``script`` once per ``(argv, working folder)`` in one fresh Python; one CompletedProcess per case.

    Whatever the script writes outside Python's own streams (a C library on file descriptor 2) reaches the
    child's stderr; a traceback there fails every case, since no case can be told apart from it.
    """
    script = os.path.abspath(script)
    proc = subprocess.run([sys.executable, __file__, script, json.dumps(cases)], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    reports = json.loads(proc.stdout.splitlines()[-1])
    return [subprocess.CompletedProcess([script, *argv], r["returncode"], r["stdout"], r["stderr"])
            for (argv, _), r in zip(cases, reports)]


def _run_one(script: str, argv: list[str], cwd: str) -> dict:
    import contextlib
    import io
    import runpy
    import traceback

    out, err, code = io.StringIO(), io.StringIO(), 0
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    sys.argv = [script, *argv]
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as stop:
                if isinstance(stop.code, int) or stop.code is None:
                    code = stop.code or 0
                else:  # sys.exit("message") prints the message and exits 1, as the interpreter does
                    print(stop.code, file=sys.stderr)
                    code = 1
            except BaseException:  # noqa: BLE001 - what the interpreter would print for an uncaught exception
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
    return {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


if __name__ == "__main__":
    script_path, cases_json = sys.argv[1], sys.argv[2]
    reports = [_run_one(script_path, argv, cwd) for argv, cwd in json.loads(cases_json)]
    sys.stdout.write("\n" + json.dumps(reports) + "\n")
