"""The book's recordings. A recording is one sitting of ``scripts/run_benchmarks.sh``: one machine, one torch, its
result files in a folder of their own, and a manifest that says what was run, when, under which versions and at
which commit, and for each file its kind, sha256, start and end times and the runs flagged as under load. A row
carries its recording's id, so rows cannot be borrowed into a recording without the manifest disagreeing."""
from __future__ import annotations

import collections
import datetime as _dt
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from graphbook import paths
from graphbook.measure.environment import QUIET_OTHERS_CORES, others_load
from graphbook.record import results, runs

RECORDINGS_DIR = paths.DATA_DIR / "recordings"
MANIFEST = "manifest.json"
#: The one file that names the book's reference recording: the pages' recorded figures, asserts and claims come
#: from it alone.
REFERENCE_FILE = RECORDINGS_DIR / "REFERENCE.txt"
#: Runs kept as history: before the first recording, or of a bug that today's torch no longer has. Its README names
#: every file and why it is kept; only :data:`HISTORY_KINDS` are read by a page.
HISTORY_DIR = paths.DATA_DIR / "history"
#: The history a page reads: torch 2.13.0's freezing bug, hunted down (Chapter 5, the anatomy appendix).
HISTORY_KINDS = ("freezing-fixes", "freezing-bisect", "freezing-minimize")

#: The kinds the pages quote as recorded: a recording is complete when its manifest holds each of them.
PAGE_KINDS = ("fusion-demo", "cpu-blurball", "cpu-onnxruntime", "int8-matrix", "int8-tensor-errors", "ablation",
              "attribution", "restart-paths", "serving-ready", "serving-load", "browser-ort", "litserve-compare",
              "hostile-clients", "tvm", "kernel-provenance", "torch-versions", "your-model")

#: The distributions whose versions a manifest names (the timings depend on each).
VERSIONED = ("torch", "onnxruntime", "openvino", "apache-tvm", "litserve", "transformers")

#: The fingerprint fields every row of a recording shares with its manifest.
IDENTITY = ("cpu_vendor", "cpu_family", "cpu_model_id", "cpu_microarch", "cpu_isa", "torch")
MACHINE_FIELDS = ("cpu_model", "cpu_vendor", "cpu_family", "cpu_model_id", "cpu_stepping", "cpu_microarch",
                  "cpu_l1d_kib", "cpu_l2_kib", "cpu_l3_kib", "cpu_isa", "torch_isa", "isa_caps", "cpu_ghz",
                  "cpu_cores", "platform")
#: Kinds whose rows span torches on purpose (the version history): their torch column is not checked.
SPANS_TORCHES = ("torch-versions",)


class RecordingError(ValueError):
    """A recording that is missing, or whose files disagree with its manifest."""


@dataclass(frozen=True)
class Recording:
    """One sitting's folder and its manifest."""

    id: str
    folder: Path
    manifest: dict

    @property
    def cpu(self) -> str:
        """The machine as :func:`graphbook.record.runs.machine_label` names it, without the thread count."""
        return runs.machine_label({**self.manifest["machine"], "threads": 0}).rsplit(", ", 1)[0] + ")"

    @property
    def torch(self) -> str:
        return self.manifest["versions"]["torch"]

    def files(self, kind: str) -> list[Path]:
        return [self.folder / entry["file"] for entry in self.manifest["files"] if entry["kind"] == kind]


def _open(folder: str | Path) -> Recording:
    """The recording in ``folder``; RecordingError when it holds no manifest."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise RecordingError(f"{folder} holds no {MANIFEST}: not a recording (scripts/run_benchmarks.sh writes one)")
    manifest = json.loads(path.read_text())
    return Recording(manifest["id"], folder, manifest)


def reference() -> Recording:
    """The book's reference recording, as :data:`REFERENCE_FILE` names it."""
    return _open(RECORDINGS_DIR / REFERENCE_FILE.read_text().strip())


def recordings(root: str | Path = RECORDINGS_DIR) -> list[Recording]:
    """Every recording under ``root``, oldest first: the reference and any a reader made beside it."""
    return sorted((_open(p.parent) for p in Path(root).glob(f"*/{MANIFEST}")), key=lambda r: r.manifest["started"])


def load(kind: str, recording: Recording | None = None) -> pd.DataFrame:
    """Every row of ``kind`` in ``recording`` (default: the reference), each file checked against the manifest's
    sha256 before it is read: the one way a page reads a recorded figure."""
    recording = recording or reference()
    found = recording.files(kind)
    if not found:
        raise RecordingError(f"recording {recording.id} holds no {kind!r} file")
    hashes = {entry["file"]: entry["sha256"] for entry in recording.manifest["files"]}
    for path in found:
        if sha256(path) != hashes[path.name]:
            raise RecordingError(f"{path} is not the file recording {recording.id}'s manifest hashed")
    return pd.concat([results.load_file(path) for path in found], ignore_index=True)


def named(machine: str) -> str:
    """How prose names a machine label: the reference recording's machine as "the reference machine" (the chapter's
    top and the glossary give its fingerprint), any other by its label."""
    cpu = reference().cpu[:-1] + ", "
    if not str(machine).startswith(cpu):
        return machine
    return "the reference machine" + (" on one thread" if str(machine).endswith(" 1 thread)") else "")


def every_run(kind: str) -> pd.DataFrame:
    """Every recording's rows of ``kind`` (the machines appendix): the reference's and any a reader made, then the
    runs kept from before the first recording, whose ``recording_id`` is empty."""
    frames = [load(kind, found) for found in recordings() if found.files(kind)]
    return pd.concat([*frames, results.load(kind, HISTORY_DIR)], ignore_index=True)


def every_file(kind: str) -> list[str]:
    """The names of the files :func:`every_run` reads."""
    return [p.name for found in recordings() for p in found.files(kind)] + [p.name for p in
                                                                            results.files(kind, HISTORY_DIR)]


def history(kind: str) -> pd.DataFrame:
    """The runs of a :data:`HISTORY_KINDS` kind kept in :data:`HISTORY_DIR`."""
    if kind not in HISTORY_KINDS:
        raise RecordingError(f"{kind!r} is not kept as history; the history a page reads: {', '.join(HISTORY_KINDS)}")
    return results.load(kind, HISTORY_DIR)


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def disagreements(recording: Recording, needed: Sequence[str] = PAGE_KINDS) -> list[str]:
    """Everything in which the recording's files disagree with its manifest (a hash, a row's recording id, machine
    or torch), each ``needed`` kind it lacks, and each command that ran beside other work (where the manifest
    says). An empty list: the recording is whole and its own."""
    held = {entry["kind"] for entry in recording.manifest["files"]}
    problems = [f"no {kind!r} file" for kind in needed if kind not in held]
    problems += [f"{c['command']}: other processes used {c['others_cores_mean']:.2f} cores beside it"
                 for c in recording.manifest["commands"] if c.get("others_cores_mean", 0) > QUIET_OTHERS_CORES]
    expected = {**recording.manifest["machine"], "torch": recording.manifest["versions"]["torch"]}
    for entry in recording.manifest["files"]:
        path = recording.folder / entry["file"]
        if not path.is_file() or sha256(path) != entry["sha256"]:
            problems.append(f"{entry['file']}: missing or not the file the manifest hashed")
            continue
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        ids = set(frame[results.RECORDING_ID]) if results.RECORDING_ID in frame else {""}
        if ids != {recording.id}:
            problems.append(f"{entry['file']}: recording ids {sorted(ids)}, not {recording.id}")
        checked = [c for c in IDENTITY if c in frame and not (c == "torch" and entry["kind"] in SPANS_TORCHES)]
        for column in checked:
            seen = set(frame[column]) - {""}
            if seen and seen != {str(expected[column])}:
                problems.append(f"{entry['file']}: {column} {sorted(seen)}, not {expected[column]}")
    return problems


# -- a sitting --
@dataclass(frozen=True)
class Step:
    """One command of a sitting: ``argv`` run from the repository root (a ``.py`` first argument runs under this
    interpreter), after ``prepare`` (given the sitting's scratch folder) has made its inputs."""

    argv: tuple[str, ...]
    prepare: Callable[[Path], None] | None = None

    @property
    def name(self) -> str:
        return " ".join(self.argv)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def sit(steps: Sequence[Step], root: str | Path, *, fingerprint: dict, scratch: Path,
        recording_id: str | None = None, resume: bool = False) -> Recording:
    """Run ``steps`` one after the other with every result file going to a new folder ``root/<id>``, each row
    stamped with the id, then write the manifest. A step that fails is logged with its exit status and the
    sitting goes on; a folder that already exists is refused, so no recording is ever rewritten. ``resume``
    continues the sitting ``recording_id`` instead: it runs only the steps its manifest lacks and adds them to it,
    leaving every earlier file and entry as it was."""
    recording_id = recording_id or _dt.datetime.now(_dt.timezone.utc).strftime("rec-%Y-%m-%dT%H%MZ")  # its start
    folder = Path(root) / recording_id
    log = []
    if resume:
        log = _open(folder).manifest["commands"]
        # a command listed twice (the three INT8 runs) is done as many times as the manifest holds it
        done, pending = collections.Counter(entry["command"] for entry in log), []
        for step in steps:
            if done[_named(step, scratch)]:
                done[_named(step, scratch)] -= 1
            else:
                pending.append(step)
        steps = pending
    else:
        folder.mkdir(parents=True, exist_ok=False)
    env = {**os.environ, "GRAPHBOOK_RESULTS_DIR": str(folder.resolve()), results.RECORDING_ENV: recording_id}
    for step in steps:
        before = {p.name for p in folder.iterdir()}
        entry = {"command": _named(step, scratch), "start": _now(), "load_before": round(os.getloadavg()[0], 2)}
        print(f"== {entry['command']}", flush=True)
        if step.prepare:
            step.prepare(scratch)
        argv = [sys.executable, *step.argv] if step.argv[0].endswith(".py") else list(step.argv)
        # each command compiles from an empty Inductor cache: one the machine's cache served is not a cold compile
        with others_load() as others, tempfile.TemporaryDirectory(prefix="sitting-inductor-") as cache:
            entry["exit"] = subprocess.run(argv, cwd=paths.REPO_ROOT, env={**env, "TORCHINDUCTOR_CACHE_DIR": cache},
                                           check=False).returncode
        entry.update(others, end=_now(), inductor_cache="empty at the command's start")
        entry["files"] = sorted({p.name for p in folder.iterdir()} - before)
        log.append(entry)
        print(f"   exit {entry['exit']}, {_seconds(entry)} s, wrote {', '.join(entry['files']) or 'nothing'}",
              flush=True)
    return _write_manifest(folder, log, fingerprint, extend=resume)


def _named(step: Step, scratch: Path) -> str:
    """The step's command as the manifest names it: the same in every sitting, whatever its scratch folder."""
    return step.name.replace(str(scratch), "<scratch>")


def completed(command: dict) -> bool:
    """Whether a sitting's command ran to its end: exit 0, or 1 with its files written (a variant failed its check,
    which is a finding); a crash writes nothing."""
    return command["exit"] == 0 or (command["exit"] == 1 and bool(command["files"]))


def _seconds(entry: dict) -> int:
    start, end = (_dt.datetime.fromisoformat(entry[k]) for k in ("start", "end"))
    return round((end - start).total_seconds())


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _write_manifest(folder: Path, log: list[dict], fingerprint: dict, *, extend: bool = False) -> Recording:
    """The manifest of the sitting in ``folder`` from its command ``log``; refused where one exists already, unless
    ``extend`` (a resumed sitting, whose log starts with the existing manifest's commands)."""
    path = folder / MANIFEST
    if path.exists() and not extend:
        raise RecordingError(f"{path} exists: a recording is written once")
    files = []
    for entry in log:
        for name in entry["files"]:
            kind = next((k.name for k in results.KINDS.values() if k.matches(name)), None)
            if kind is not None:
                files.append({"file": name, "kind": kind, "sha256": sha256(folder / name),
                              "command": entry["command"], "start": entry["start"], "end": entry["end"],
                              "runs_under_load": _runs_under_load(folder / name)})
    manifest = {"id": folder.name, "started": log[0]["start"] if log else "", "ended": log[-1]["end"] if log else "",
                "commit": fingerprint.get("git_commit", ""),
                "machine": {k: fingerprint.get(k) for k in MACHINE_FIELDS},
                "versions": {"python": fingerprint.get("python", ""), "torch": fingerprint.get("torch", ""),
                             **{d: _version(d) for d in VERSIONED if d != "torch"}},
                "commands": [{**entry, "seconds": _seconds(entry)} for entry in log], "files": files,
                "missing_kinds": [k for k in PAGE_KINDS if k not in {f["kind"] for f in files}]}
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return Recording(manifest["id"], folder, manifest)


def _runs_under_load(path: Path) -> list[str]:
    """The runs of a timed file that :func:`graphbook.record.runs.flag_under_load` flags."""
    frame = results.load_file(path)
    needed = {results.MEDIAN_MS, results.VARIANT, results.RUN_ID}
    if not needed <= set(frame.columns) or frame[results.MEDIAN_MS].isna().all():
        return []
    flagged = runs.flag_under_load(frame.dropna(subset=[results.MEDIAN_MS]))
    return sorted(set(flagged.loc[flagged[runs.UNDER_LOAD], results.RUN_ID]))
