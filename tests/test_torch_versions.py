"""scripts/torch_version_history.py with fake environments: the real older torch is recorded by the book's recording,
not in CI. Each fake interpreter answers as graphbook.freezing.torch_versions would."""
import json
import stat
import sys

import pytest

from graphbook.freezing import torch_versions
from graphbook.record import results


def _fake_python(folder, torch_version, *, freezing_wrong):
    """An executable that answers the child's protocol with one torch's rows."""
    rows = [{"torch": torch_version, "record": "reproducer", "case": "minimal", "exit_status": int(freezing_wrong),
             "max_abs_diff": 0.0349 if freezing_wrong else 3.7e-9, "date": "2026-12-05T10:00:00+00:00"}]
    for run in (1, 2, 3):
        for variant, ms in (("eager_fp32", 600.0), ("compile_default", 300.0), ("compile_freezing", 250.0)):
            wrong = freezing_wrong and variant == "compile_freezing"
            rows.append({"torch": torch_version, "record": "blurball", "case": variant, "variant": variant,
                         "run": run, "median_ms": ms, "same_output": not wrong, "max_abs_diff": 0.05 if wrong else 0.0,
                         "date": "2026-12-05T10:00:00+00:00"})
    answer = {"rows": rows, "failed": ["compile_freezing"] if freezing_wrong else []}
    path = folder / f"python-{torch_version}"
    path.write_text(f"#!{sys.executable}\nprint({torch_versions.TAG!r} + {json.dumps(json.dumps(answer))})\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.mark.slow
def test_both_torches_are_recorded_in_one_file_with_their_own_runs(script, tmp_path, monkeypatch, capsys):
    history = script("scripts/torch_version_history.py")
    older = _fake_python(tmp_path, "2.13.0+cpu", freezing_wrong=True)
    monkeypatch.setattr(history, "PINNED_PYTHON", str(_fake_python(tmp_path, "2.14.1+cu130", freezing_wrong=False)))
    assert history.main(["--older-python", str(older), "--results-dir", str(tmp_path / "out")]) == 0
    frame = results.load("torch-versions", tmp_path / "out")
    assert sorted(set(frame.torch)) == ["2.13.0+cpu", "2.14.1+cu130"]
    runs = frame[frame.record == "blurball"].groupby("torch").run_id.nunique()
    assert runs.to_dict() == {"2.13.0+cpu": 3, "2.14.1+cu130": 3}, "each torch keeps its own three run ids"
    assert "wrote" in capsys.readouterr().out
    # the pinned torch failing its check is the one failure the script reports
    monkeypatch.setattr(history, "PINNED_PYTHON", str(older))
    assert history.main(["--older-python", str(older), "--results-dir", str(tmp_path / "out")]) == 1
    assert "compile_freezing" in capsys.readouterr().err
    assert len(results.files("torch-versions", tmp_path / "out")) == 2, "a re-run writes a new file"


def test_an_older_python_that_is_not_a_file_is_refused(script, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        script("scripts/torch_version_history.py").main(["--older-python", str(tmp_path / "none")])
    assert stop.value.code == 2 and "is not a file" in capsys.readouterr().err
