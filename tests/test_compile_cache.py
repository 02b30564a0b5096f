"""Fresh-process compile timing (graphbook.startup.compile_cache, Chapter 6), tested with ``backend="eager"``."""
import subprocess
import sys

import pytest

from graphbook.startup import compile_cache as cc
from graphbook.startup.restart_child import RestartPathError

TINY = cc.RestartSpec("graphbook.measure.warmup:tiny_clip_net", (9, 8, 12), (1, 2), factory_kwargs={"hidden": 4},
                      backend="eager", threads=1)


@pytest.mark.slow
def test_fresh_process_reports_first_calls_and_graphs_and_refuses_a_missing_artifact_or_a_failing_child(tmp_path):
    result = cc.fresh_process_compile(TINY, tmp_path / "cache")
    assert sorted(result["first_call_s"]) == ["1", "2"]
    assert result["graphs_after"] == {"1": 1, "2": 2}  # automatic dynamic: static 1, then dynamic
    assert result["process_wall_s"] > result["import_s"] > 0
    assert cc._restart_seconds(result) == pytest.approx(sum(result["first_call_s"].values()))
    # import_s times torch's import only if the child's module does not import torch before it starts
    probe = subprocess.run([sys.executable, "-c", "import sys, graphbook.startup.restart_child as m; "
                            "print('torch' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False", probe.stderr[-500:]
    with pytest.raises(FileNotFoundError, match="artifact"):
        cc.fresh_process_compile(TINY, tmp_path / "c", load_artifacts=tmp_path / "missing.bin")
    broken = cc.RestartSpec("graphbook.measure.warmup:nope", (9, 8, 12), (1,), threads=1)
    with pytest.raises(RestartPathError, match="nope"):
        cc.fresh_process_compile(broken, tmp_path / "c")
