"""Fresh-process compile timing (graphbook.compilers.compile_cache, Chapter 6).

The child-process protocol is tested with ``backend="eager"`` (no code generation, seconds); the full
cold / warm / artifacts experiment with Inductor runs in Chapter 6 (BlurBall's in ``code/bench_restart_paths.py``).
"""

import subprocess
import sys

import pytest

from graphbook.compilers import compile_cache as cc

TINY = cc.RestartSpec("graphbook.measure.warmup:tiny_clip_net", (9, 8, 12), (1, 2), factory_kwargs={"hidden": 4},
                      compile_kwargs={"backend": "eager"}, threads=1)


@pytest.mark.slow
def test_fresh_process_reports_first_calls_and_graphs(tmp_path):
    result = cc.fresh_process_compile(TINY, tmp_path / "cache")
    assert sorted(result["first_call_s"]) == ["1", "2"]
    assert result["graphs_after"] == {"1": 1, "2": 2}  # automatic dynamic: static 1, then dynamic
    assert result["process_wall_s"] > result["import_s"] > 0
    assert cc._restart_seconds(result) == pytest.approx(sum(result["first_call_s"].values()))
    # import_s times torch's import only if the child's module does not import torch before _child_main starts
    probe = subprocess.run([sys.executable, "-c", "import sys, graphbook.compilers.compile_cache as m; "
                            "print('torch' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False", probe.stderr[-500:]


@pytest.mark.parametrize("kwargs, error", [
    ({"factory": "no_colon"}, "module:function"),
    ({"input_chw": ()}, "input_chw"),
    ({"batch_sizes": (0,)}, "batch_sizes"),
    ({"threads": 0}, "threads"),
])
def test_spec_validation(kwargs, error):
    spec = cc.RestartSpec(**{**TINY.__dict__, **kwargs})
    with pytest.raises(ValueError, match=error):
        spec.validate()


def test_resolve_factory_errors():
    assert cc._resolve_factory("graphbook.measure.warmup:tiny_clip_net").__name__ == "tiny_clip_net"
    with pytest.raises(ValueError, match="cannot import"):
        cc._resolve_factory("graphbook.nonexistent:f")
    with pytest.raises(ValueError, match="no attribute"):
        cc._resolve_factory("graphbook.measure.warmup:nope")


def test_missing_artifact_file_and_failing_child(tmp_path):
    with pytest.raises(FileNotFoundError, match="artifact"):
        cc.fresh_process_compile(TINY, tmp_path / "c", load_artifacts=tmp_path / "missing.bin")
    broken = cc.RestartSpec("graphbook.measure.warmup:nope", (9, 8, 12), (1,), threads=1)
    with pytest.raises(cc.CompileCacheError, match="nope"):
        cc.fresh_process_compile(broken, tmp_path / "c")


def test_module_cli_without_child_flag_exits_2(capsys):
    from graphbook.measure.compiletime import answer_as_child

    assert answer_as_child([], "graphbook.compilers.compile_cache", cc.RESULT_MARKER, cc._child_main) == 2
    assert "usage: python -m graphbook.compilers.compile_cache" in capsys.readouterr().err


