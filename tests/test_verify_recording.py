"""The verifier proves a recording from its own files: a mini sitting of the plan's small commands, made at a commit
of this tree, passes it and leaves the tree clean; each planted corruption fails it with its own line; and the
reference recording, made before the append-only manifest, is told what it cannot prove."""
import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
from graphbook import paths
from graphbook.measure import summaries
from graphbook.record import recording, results, verify

SLOW = pytest.mark.slow   # git, a clone and a sitting's commands run as processes


def _git(*args, cwd=paths.REPO_ROOT, env=None):
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _commit_of_this_tree(scratch):
    """A commit of the working tree as it is, untracked files included, made without touching HEAD or the index:
    the mini sitting runs this code, and a sitting records only a commit."""
    env = {**os.environ, "GIT_INDEX_FILE": str(scratch / "index")}
    _git("read-tree", "HEAD", env=env)
    _git("add", "-A", env=env)
    tree = _git("write-tree", env=env)
    return _git("-c", "user.name=test", "-c", "user.email=test@example.invalid", "commit-tree", tree, "-p", "HEAD",
                "-m", "the tree the mini sitting runs")


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """(clone, recording folder): ``record_sitting.py --plan mini`` run in a clean clone at a commit of this tree."""
    root = tmp_path_factory.mktemp("mini")
    clone, recordings = root / "clone", root / "recordings"
    commit = _commit_of_this_tree(root)
    _git("clone", "-q", "--shared", "--no-checkout", str(paths.REPO_ROOT), str(clone))
    _git("checkout", "-q", commit, cwd=clone)
    recordings.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "GRAPHBOOK_RESULTS_DIR"}
    done = subprocess.run([sys.executable, "scripts/record_sitting.py", "--plan", "mini", "--recordings-dir",
                           str(recordings)], cwd=clone, env={**env, "PYTHONPATH": str(clone / "code")},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (folder,) = [p for p in recordings.iterdir() if p.is_dir()]
    _name(folder)
    return clone, folder


def _name(folder):
    """Write the REFERENCE.txt beside ``folder`` that names it with its manifest's sha256."""
    (folder.parent / "REFERENCE.txt").write_text(f"{folder.name} {recording.sha256(folder / recording.LOG)}\n")


def _lines(folder):
    return [json.loads(line) for line in (folder / recording.LOG).read_text().splitlines()]


def _write_lines(folder, lines):
    (folder / recording.LOG).write_text("".join(json.dumps(line) + "\n" for line in lines))


def _rehash(folder, name):
    """Hide an edit of ``name`` from the hashes: what a forger would do."""
    lines = _lines(folder)
    for entry in (f for line in lines for f in line.get("files", []) if f["file"] == name):
        entry["sha256"] = recording.sha256(folder / name)
    _write_lines(folder, lines)


def _file(folder, prefix):
    return next(p.name for p in sorted(folder.iterdir()) if p.name.startswith(prefix) and p.suffix == ".csv")


def _beside_other_work(finding):
    """A load or steal finding: the other pytest worker and the host are beside the mini sitting here, which a real
    sitting must not have (the planted corruption below shows the verifier names it)."""
    return finding.check == "controls" and (finding.detail.endswith("beside it") or "stole" in finding.detail)


@SLOW
def test_the_mini_sitting_runs_the_plans_commands_at_one_clean_commit_and_passes_the_verifier(mini):
    clone, folder = mini
    found = recording.read(folder)
    assert [c["command"] for c in found.manifest["commands"]] == verify._plan_at(_git("rev-parse", "HEAD", cwd=clone),
                                                                               "mini", clone)
    assert [f for f in verify.verify(found, repo=clone) if not _beside_other_work(f)] == []
    assert all(isinstance(c["others_cores_mean"], float) and isinstance(c["steal_fraction"], float)
               for c in found.manifest["commands"])   # measured, not unknown
    kinds = {entry["kind"] for entry in found.manifest["files"]}
    assert {"fusion-demo", "cpu-blurball", recording.RAW_TIMES_KIND, recording.REPORT_KIND} <= kinds


@SLOW
def test_the_sittings_commands_leave_the_tree_clean(mini):
    clone, folder = mini
    assert _git("status", "--porcelain", cwd=clone) == ""
    assert all(c["tree_changes"] == [] for c in recording.read(folder).manifest["commands"])


def _one_byte(folder):
    path = folder / _file(folder, "cpu-fusion-demo")
    data = bytearray(path.read_bytes())
    data[-2] = ord("7") if data[-2] != ord("7") else ord("8")
    path.write_bytes(bytes(data))
    return path.name, "sha256", "not the file the manifest hashed"


def _row_at_another_commit(folder):
    name = _file(folder, "cpu-blurball")
    frame = pd.read_csv(folder / name, dtype=str, keep_default_na=False)
    frame.loc[0, "git_commit"] = "0123456789ab"
    frame.to_csv(folder / name, index=False)
    _rehash(folder, name)
    return name, "commit", "rows at 0123456789ab"


def _second_boot(folder):
    lines = _lines(folder)
    later = {**lines[0], "invocation": 2, "machine": {**lines[0]["machine"], "boot_id": "another-boot"}}
    _write_lines(folder, [*lines, later])
    return recording.LOG, "sitting", "invocations on 2 boots"


def _changed_median(folder):
    name = _file(folder, "cpu-blurball")
    frame = pd.read_csv(folder / name, dtype=str, keep_default_na=False)
    frame.loc[0, "median_ms"] = str(float(frame.loc[0, "median_ms"]) * 1.01)
    frame.to_csv(folder / name, index=False)
    _rehash(folder, name)
    return name, "raw times", "row 0: median_ms"


def _a_command_beside_other_work(folder):
    lines = _lines(folder)
    lines[1]["others_cores_mean"] = 1.5
    _write_lines(folder, lines)
    return recording.LOG, "controls", "other processes used 1.50 cores beside it"


def _command_run_twice(folder):
    lines = _lines(folder)
    _write_lines(folder, [*lines, lines[-1]])
    return recording.LOG, "commands", "recorded 2 times"


@SLOW
@pytest.mark.parametrize("corrupt", [_one_byte, _row_at_another_commit, _second_boot, _changed_median,
                                     _command_run_twice, _a_command_beside_other_work])
def test_each_planted_corruption_fails_the_verifier_with_its_own_line(mini, tmp_path, corrupt):
    clone, folder = mini
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    file, check, fact = corrupt(copy)
    _name(copy)   # the forger names the edited manifest, so only the verifier's own checks can catch it
    findings = verify.verify(recording.read(copy), repo=clone)
    assert any(f.file == file and f.check == check and fact in f.detail for f in findings), findings


@SLOW
def test_a_manifest_edited_after_it_was_named_fails_the_verifier(mini, tmp_path):
    clone, folder = mini
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    (tmp_path / "REFERENCE.txt").write_text(f"{folder.name} {recording.sha256(folder / recording.LOG)}\n")
    _write_lines(copy, _lines(copy)[:-1])
    findings = verify.verify(recording.read(copy), repo=clone)
    assert [f.detail for f in findings if f.check == "reference"] == [
        f"its sha256 is not the {recording.sha256(folder / recording.LOG)[:12]} that REFERENCE.txt names"]


@SLOW
def test_the_verifier_lists_what_the_reference_recording_cannot_prove(script, capsys):
    reference = recording.reference()
    code = script("scripts/verify_recording.py").main([str(reference.folder)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    expected = ["manifest.json: sitting: predates the append-only manifest",
                "manifest.json: commit: 9b24c28928d8+dirty: uncommitted changes",
                "manifest.json: commands: recorded 2 times",                       # the resume bug's your-model pair
                "/report.md: sha256: in the recording's folder, not hashed by its manifest",
                "raw times: 42 timed rows and no readings",
                "controls: code/bench_blurball_cpu.py: other processes' CPU beside it unknown"]
    assert [e for e in expected if not any(e in line for line in lines)] == [], lines
    assert not any(": reference:" in line for line in lines)   # REFERENCE.txt names the manifest it was made from


@SLOW
def test_bad_arguments_exit_2_with_one_line(script, capsys, tmp_path):
    with pytest.raises(SystemExit) as stopped:
        script("scripts/verify_recording.py").main([str(tmp_path)])   # a folder with no manifest
    err = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(err) == 1 and "not a recording" in err[0]


@pytest.mark.parametrize("kind, row, edited, value, found", [
    # the ablation: a row timing two things, each series under its prefix
    ("ablation", {"variant": "all", "eager_median_ms": 2.0, "eager_q1_ms": 1.5, "eager_q3_ms": 2.5,
                  "eager_times_ms": (1.0, 2.0, 3.0), "compiled_median_ms": 1.0, "compiled_q1_ms": 1.0,
                  "compiled_q3_ms": 3.0, "compiled_times_ms": (1.0, 1.0, 5.0)},
     "compiled_q3_ms", 4.0, "row 0: compiled_q3_ms 4.0 recorded, 3.0 from its 3 readings"),
    # the INT8 matrix: its median is latency_ms, beside latency_min_ms and latency_max_ms
    ("int8-matrix", {"config": "no-head", "latency_ms": 2.0, "latency_min_ms": 1.0, "latency_max_ms": 3.0,
                     "latency_times_ms": (3.0, 1.0, 2.0)},
     "latency_ms", 2.5, "row 0: latency_ms 2.5 recorded, 2.0 from its 3 readings"),
    # a load test: its percentiles of the requests' latencies
    ("serving-load", {"concurrency": 2, **summaries.percentiles((12.0, 15.0, 11.0, 40.0, 13.0)),
                      "times_ms": (12.0, 15.0, 11.0, 40.0, 13.0)},
     "p99_ms", 25.0, "row 0: p99_ms 25.0 recorded, 39.0 from its 5 readings"),
])
def test_every_timed_series_recomputes_from_its_readings_and_a_changed_statistic_or_lost_readings_are_named(
        tmp_path, kind, row, edited, value, found):
    path = results.write_run(kind, [row], results_dir=tmp_path)
    entries = [{"file": p.name, "kind": k, "sha256": recording.sha256(p)} for p, k in
               ((path, kind), (results.raw_times_path(path), recording.RAW_TIMES_KIND))]
    _write_lines(tmp_path, [{"record": "command", "invocation": 1, "command": "x", "start": "", "end": "",
                             "files": entries}])
    assert verify._statistic_checks(recording.read(tmp_path)) == []
    frame = pd.read_csv(path)
    frame.loc[0, edited] = value
    frame.to_csv(path, index=False)
    assert [f.detail for f in verify._statistic_checks(recording.read(tmp_path))] == [found]
    results.raw_times_path(path).unlink()
    assert [f.detail for f in verify._statistic_checks(recording.read(tmp_path))] == [
        "1 timed rows and no readings: no statistic can be recomputed"]
