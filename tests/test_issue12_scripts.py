"""Argument rules of issue 12's scripts: bad input is one line on stderr and exit status 2."""
import subprocess
import sys
from pathlib import Path

import pytest

CODE = Path(__file__).resolve().parents[1] / "code"


@pytest.mark.parametrize("script, args", [
    ("bench_tvm.py", ["--trials", "-1"]),
    ("bench_tvm.py", ["--height", "30"]),
    ("bisect_freezing.py", ["--minifier-timeout", "-5"]),
    ("bisect_freezing.py", ["--model", "resnet"]),
    ("make_tlparse_report.py", ["--width", "0"]),
])
def test_bad_arguments_exit_2_with_one_line(script, args):
    proc = subprocess.run([sys.executable, str(CODE / script), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
