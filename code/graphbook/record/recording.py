"""The book's recordings. A recording is one sitting of ``scripts/run_benchmarks.sh``: one machine, one boot, one
clean commit, its result files in a folder of their own, and an append-only manifest (``manifest.jsonl``): a line
when an invocation starts (commit, boot, machine, versions) and a line when each command ends (its times, exit,
other processes' CPU, host steal, Inductor cache, and each file it wrote with its sha256). No line is ever
rewritten, so a resumed sitting adds lines and cannot restate what an earlier invocation was. A row carries its
recording's id, so rows cannot be borrowed into a recording without the manifest disagreeing. Recordings made before
the append-only manifest (a single rewritable ``manifest.json``) load as they are, marked as predating its checks."""
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
from graphbook.measure import environment
from graphbook.measure.environment import QUIET_OTHERS_CORES, others_load
from graphbook.record import results, runs

RECORDINGS_DIR = paths.DATA_DIR / "recordings"
#: The append-only manifest: one JSON object a line, each written once.
LOG = "manifest.jsonl"
#: The manifest of the recordings made before it, one JSON document rewritten by each resume.
MANIFEST = "manifest.json"
#: The one file that names the book's reference recording, ``<id> <sha256 of its manifest>``: the pages' recorded
#: figures, asserts and claims come from it alone, and a manifest edited after it was named no longer matches.
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
#: What a file written beside the results files is, when it is no results kind: a timed file's readings, or a
#: report (the fusion demo's text, the your-model command's report and plots).
RAW_TIMES_KIND, REPORT_KIND = "raw-times", "report"
#: The most of the machine's CPU time the host may give other guests (steal) during a command before its runs count
#: as under load: well inside the 5 % band within which the book calls two variants the same.
MAX_STEAL_FRACTION = 0.02
#: The most CPU, in cores, that may be used on average between two invocations of one sitting: an idle machine's
#: background (0.01-0.05 cores measured here), not a page execution or a test run.
IDLE_BETWEEN_CORES = 0.05
UNKNOWN = "unknown"   #: what a field the manifest lacks reads as: never as quiet, never as clean


class RecordingError(ValueError):
    """A recording that is missing, or whose files disagree with its manifest."""


@dataclass(frozen=True)
class Recording:
    """One sitting's folder and its manifest: for an append-only one, its lines assembled (``invocations``,
    ``commands`` and ``files``, with the first invocation's ``commit``, ``machine`` and ``versions``)."""

    id: str
    folder: Path
    manifest: dict

    @property
    def manifest_path(self) -> Path:
        return self.folder / (MANIFEST if self.predates_checks else LOG)

    @property
    def predates_checks(self) -> bool:
        """Made before the append-only manifest: nothing proves it one commit, one boot or one invocation."""
        return self.manifest.get("schema", 1) < 2

    @property
    def cpu(self) -> str:
        """The machine as :func:`graphbook.record.runs.machine_label` names it, without the thread count."""
        return runs.machine_label({**self.manifest["machine"], "threads": 0}).rsplit(", ", 1)[0] + ")"

    @property
    def torch(self) -> str:
        return self.manifest["versions"]["torch"]

    def files(self, kind: str) -> list[Path]:
        return [self.folder / entry["file"] for entry in self.manifest["files"] if entry["kind"] == kind]


def read(folder: str | Path) -> Recording:
    """The recording in ``folder`` as its manifest says, whether or not it is one sitting (the verifier reads it so);
    RecordingError when it holds no manifest or a line that is not JSON."""
    folder = Path(folder)
    if (folder / LOG).is_file():
        try:
            lines = [json.loads(line) for line in (folder / LOG).read_text().splitlines() if line.strip()]
        except json.JSONDecodeError as error:
            raise RecordingError(f"{folder / LOG}: line {error.lineno}... is not JSON: {error.msg}") from None
        return Recording(folder.name, folder, _assembled(folder.name, lines))
    if (folder / MANIFEST).is_file():
        manifest = json.loads((folder / MANIFEST).read_text())
        # its commands name their files; the append-only manifest's hold each file's entry, as here
        entries = {entry["file"]: entry for entry in manifest["files"]}
        commands = [{**c, "files": [entries.get(name, {"file": name}) for name in c["files"]]}
                    for c in manifest["commands"]]
        return Recording(manifest["id"], folder, {"schema": 1, **manifest, "commands": commands})
    raise RecordingError(f"{folder} holds no {LOG}: not a recording (scripts/run_benchmarks.sh writes one)")


def _open(folder: str | Path) -> Recording:
    """The recording in ``folder``, refused when its manifest shows it is not one sitting
    (:func:`sitting_problems`); one made before the append-only manifest loads as it is, marked as predating it."""
    found = read(folder)
    problems = sitting_problems(found)
    if problems:
        raise RecordingError(f"recording {found.id} is not one sitting: " + "; ".join(problems))
    return found


def _assembled(recording_id: str, lines: list[dict]) -> dict:
    invocations = [line for line in lines if line.get("record") == "invocation"]
    commands = [line for line in lines if line.get("record") == "command"]
    first = invocations[0] if invocations else {}
    files = [{**entry, "command": c["command"], "start": c["start"], "end": c["end"], "invocation": c["invocation"]}
             for c in commands for entry in c.get("files", [])]
    return {"schema": 2, "id": recording_id, "started": first.get("started", ""),
            "ended": commands[-1]["end"] if commands else "", "commit": first.get("commit", UNKNOWN),
            "machine": first.get("machine", {}), "versions": first.get("versions", {}), "invocations": invocations,
            "commands": commands, "files": files,
            "missing_kinds": [k for k in PAGE_KINDS if k not in {f["kind"] for f in files}]}


def reference_line(file: str | Path | None = None) -> tuple[str, str]:
    """The id and manifest sha256 that ``file`` (default :data:`REFERENCE_FILE`) names."""
    fields = Path(file or REFERENCE_FILE).read_text().split()
    return fields[0], (fields[1] if len(fields) > 1 else "")


def reference() -> Recording:
    """The book's reference recording, as :data:`REFERENCE_FILE` names it; RecordingError when its manifest is not
    the one that was named."""
    named, digest = reference_line()
    found = _open(RECORDINGS_DIR / named)
    if sha256(found.manifest_path) != digest:
        raise RecordingError(f"{found.manifest_path} is not the manifest {REFERENCE_FILE.name} named "
                             f"(sha256 {digest[:12] or 'none'})")
    return found


def recordings(root: str | Path = RECORDINGS_DIR) -> list[Recording]:
    """Every recording under ``root``, oldest first: the reference and any a reader made beside it."""
    folders = {p.parent for name in (LOG, MANIFEST) for p in Path(root).glob(f"*/{name}")}
    return sorted((_open(folder) for folder in folders), key=lambda r: r.manifest["started"])


def sitting_problems(recording: Recording) -> list[str]:
    """Why an append-only recording is not one sitting: invocations at more than one commit or on more than one boot
    (or a boot that cannot be told), other work between its invocations, a command that changed the repository's
    tree, or a repeated command whose runs span invocations (the book pools them, and no ratio may cross two).
    Empty for one that predates the append-only manifest: nothing there can be proved either way."""
    if recording.predates_checks:
        return []
    invocations, commands = recording.manifest["invocations"], recording.manifest["commands"]
    if not invocations:
        return ["no invocation line: the manifest does not say at which commit or on which boot it ran"]
    problems = []
    commits = sorted({i.get("commit", UNKNOWN) for i in invocations})
    if len(commits) > 1 or UNKNOWN in commits:
        problems.append(f"invocations at {len(commits)} commits ({', '.join(c[:12] for c in commits)}): "
                        "one sitting is one commit")
    boots = sorted({i.get("machine", {}).get("boot_id", UNKNOWN) for i in invocations})
    if len(boots) > 1 or UNKNOWN in boots:
        problems.append(f"invocations on {len(boots)} boots ({', '.join(boots)}): one sitting is one boot")
    for earlier, later in zip(invocations, invocations[1:]):
        cores = _cores_between(earlier, later, commands)
        if cores is None or cores > IDLE_BETWEEN_CORES:
            used = UNKNOWN if cores is None else f"{cores:.2f} cores"
            problems.append(f"between invocations {earlier['invocation']} and {later['invocation']} the machine "
                            f"used {used} on average, above an idle machine's {IDLE_BETWEEN_CORES}")
    problems += [f"{c['command']}: changed the repository's tree ({', '.join(c['tree_changes'])})"
                 for c in commands if c.get("tree_changes", [UNKNOWN])]
    spans = collections.defaultdict(set)
    for c in commands:
        spans[c["command"]].add(c["invocation"])
    problems += [f"{name}: its runs span invocations {sorted(numbers)}" for name, numbers in spans.items()
                 if len(numbers) > 1]
    return problems


def _cores_between(earlier: dict, later: dict, commands: list[dict]) -> float | None:
    """The machine's mean busy cores from the end of invocation ``earlier`` (its last command, or its start) to the
    start of ``later``; None where a reading is missing."""
    last = next((c for c in reversed(commands) if c["invocation"] == earlier["invocation"]), earlier)
    when = "end" if last is not earlier else "started"
    try:
        busy = later["cpu_seconds"]["busy"] - last["cpu_seconds"]["busy"]
        wall = (_dt.datetime.fromisoformat(later["started"]) - _dt.datetime.fromisoformat(last[when])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None
    return busy / max(wall, 1.0)


def command_flags(command: dict) -> list[str]:
    """Why a command's runs count as under load: other processes' CPU beside it or the host's steal above their
    limits, or either unrecorded (unknown is never read as quiet)."""
    flags = []
    others = command.get("others_cores_mean")
    if others is None:
        flags.append("other processes' CPU beside it unknown")
    elif others > QUIET_OTHERS_CORES:
        flags.append(f"other processes used {others:.2f} cores beside it")
    steal = command.get("steal_fraction")
    if steal is None:
        flags.append("host steal unknown")
    elif steal > MAX_STEAL_FRACTION:
        flags.append(f"the host stole {steal:.1%} of the CPU time")
    return flags


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
    or torch) and each ``needed`` kind it lacks. An empty list: the recording is whole and its own (whether it was
    measured quietly is :mod:`graphbook.record.verify`'s to say)."""
    held = {entry["kind"] for entry in recording.manifest["files"]}
    problems = [f"no {kind!r} file" for kind in needed if kind not in held]
    expected = {**recording.manifest["machine"], "torch": recording.manifest["versions"].get("torch", UNKNOWN)}
    for entry in recording.manifest["files"]:
        path = recording.folder / entry["file"]
        if not path.is_file() or sha256(path) != entry["sha256"]:
            problems.append(f"{entry['file']}: missing or not the file the manifest hashed")
            continue
        if entry["kind"] not in results.KINDS:
            continue   # readings and reports: no rows of their own
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


def git(repo: str | Path, *args: str) -> str:
    """``git args`` in ``repo``, its output; RecordingError with git's own message when it fails."""
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RecordingError(f"git {' '.join(args)} in {repo} failed: {done.stderr.strip()}")
    return done.stdout


def _tree_changes(repo: Path, *, besides: Path | None = None) -> list[str]:
    """What ``git status`` lists in ``repo`` (changed, staged and untracked files; ignored ones are not), apart from
    the folder ``besides`` (the recording being written)."""
    spec = ["--", "."]
    if besides is not None and Path(besides).resolve().is_relative_to(Path(repo).resolve()):
        spec.append(f":(exclude){Path(besides).resolve().relative_to(Path(repo).resolve())}")
    return [line[3:] for line in git(repo, "status", "--porcelain", *spec).splitlines()]


def sit(steps: Sequence[Step], root: str | Path, *, fingerprint: dict, scratch: Path, versions: dict | None = None,
        plan: str = "book", recording_id: str | None = None, resume: bool = False,
        repo: str | Path = paths.REPO_ROOT) -> Recording:
    """Run ``steps`` one after the other with every result file going to a new folder ``root/<id>``, each row
    stamped with the id, appending a manifest line as the invocation starts and as each command ends. A step that
    fails is logged with its exit status and the sitting goes on. Refused, before anything runs: a ``repo`` whose
    tree has changes (the code behind the figures must be a commit), and a folder that exists already. ``resume``
    continues the sitting ``recording_id`` as a new invocation, at the same commit on the same boot or not at all:
    it runs only the steps its manifest lacks and adds their lines, leaving every earlier line as it was."""
    repo = Path(repo)
    recording_id = recording_id or _dt.datetime.now(_dt.timezone.utc).strftime("rec-%Y-%m-%dT%H%MZ")  # its start
    folder = Path(root) / recording_id
    changed = _tree_changes(repo, besides=folder)
    if changed:
        raise RecordingError(f"{repo} has changes ({', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}): "
                             "a sitting records a commit, so commit or stash them first")
    commit = git(repo, "rev-parse", "HEAD").strip()
    machine = {**{k: fingerprint.get(k) for k in MACHINE_FIELDS}, **environment.machine_record()}
    number = 1
    if resume:
        earlier = read(folder)
        if earlier.predates_checks:
            raise RecordingError(f"{recording_id} predates the append-only manifest: start a new sitting")
        first = earlier.manifest["invocations"][0]
        if first["commit"] != commit:
            raise RecordingError(f"{recording_id} was recorded at {first['commit'][:12]}, HEAD is {commit[:12]}: "
                                 "one sitting is one commit")
        if first["machine"].get("boot_id") != machine["boot_id"]:
            raise RecordingError(f"{recording_id} was recorded on boot {first['machine'].get('boot_id')}, this is "
                                 f"{machine['boot_id']}: one sitting is one boot")
        number = len(earlier.manifest["invocations"]) + 1
        # a command listed twice (the three INT8 runs) is done as many times as the manifest holds it
        done, pending = collections.Counter(c["command"] for c in earlier.manifest["commands"]), []
        for step in steps:
            if done[_named(step, scratch)]:
                done[_named(step, scratch)] -= 1
            else:
                pending.append(step)
        steps = pending
    else:
        folder.mkdir(parents=True, exist_ok=False)
    _append(folder, {"record": "invocation", "invocation": number, "started": _now(), "commit": commit,
                     "plan": plan, "machine": machine,
                     "versions": {"python": fingerprint.get("python", UNKNOWN),
                                  "torch": fingerprint.get("torch", UNKNOWN),
                                  **{d: _version(d) for d in VERSIONED if d != "torch"}, **(versions or {})},
                     "cpu_seconds": environment.cpu_seconds()})
    # every row names the commit its command saw, never one a caller's environment passed down
    env = {**{k: v for k, v in os.environ.items() if k != environment.EXECUTION_COMMIT_VARIABLE},
           "GRAPHBOOK_RESULTS_DIR": str(folder.resolve()), results.RECORDING_ENV: recording_id}
    for step in steps:
        before = _written(folder)
        entry = {"record": "command", "invocation": number, "command": _named(step, scratch), "start": _now()}
        print(f"== {entry['command']}", flush=True)
        if step.prepare:
            step.prepare(scratch)
        argv = [sys.executable, *step.argv] if step.argv[0].endswith(".py") else list(step.argv)
        cpu_before = environment.cpu_seconds()
        # each command compiles from an empty Inductor cache: one the machine's cache served is not a cold compile
        with others_load() as others, tempfile.TemporaryDirectory(prefix="sitting-inductor-") as cache:
            entry["exit"] = subprocess.run(argv, cwd=repo, env={**env, "TORCHINDUCTOR_CACHE_DIR": cache},
                                           check=False).returncode
        cpu_after = environment.cpu_seconds()
        entry.update(others, end=_now(), steal_fraction=_steal_fraction(cpu_before, cpu_after),
                     inductor_cache="empty at the command's start", tree_changes=_tree_changes(repo, besides=folder),
                     cpu_seconds=cpu_after)
        entry["seconds"] = _seconds(entry)
        entry["files"] = [_file_entry(folder, name, loaded=bool(command_flags(entry)))
                          for name in sorted(_written(folder) - before)]
        _append(folder, entry)
        print(f"   exit {entry['exit']}, {entry['seconds']} s, wrote "
              f"{', '.join(f['file'] for f in entry['files']) or 'nothing'}", flush=True)
    return read(folder)


def _append(folder: Path, line: dict) -> None:
    """Add one line to the manifest; the file is only ever opened to append, so no earlier line can change."""
    with (folder / LOG).open("a") as handle:
        handle.write(json.dumps(line) + "\n")


def _written(folder: Path) -> set[str]:
    """Every file under ``folder``, as paths relative to it, the manifest apart."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != LOG}


def _file_entry(folder: Path, name: str, *, loaded: bool) -> dict:
    """A written file's manifest entry; ``loaded``: its command ran beside other work or under host steal (or
    either is unknown), so every run it timed counts as under load."""
    kind = next((k.name for k in results.KINDS.values() if k.matches(name)), None)
    if kind is None:
        kind = RAW_TIMES_KIND if name.endswith(results.RAW_TIMES_SUFFIX) else REPORT_KIND
    under_load = _runs_under_load(folder / name, every_run=loaded) if kind in results.KINDS else None
    return {"file": name, "kind": kind, "sha256": sha256(folder / name), "runs_under_load": under_load}


def _steal_fraction(before: dict, after: dict) -> float | None:
    """The share of the machine's CPU time the host gave to other guests between two readings."""
    if before["steal"] is None or after["steal"] is None or after["total"] <= before["total"]:
        return None
    return round((after["steal"] - before["steal"]) / (after["total"] - before["total"]), 4)


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
        return UNKNOWN


def _runs_under_load(path: Path, *, every_run: bool = False) -> list[str] | None:
    """The runs of a timed file that :func:`graphbook.record.runs.flag_under_load` flags, or all of them
    (``every_run``); None where the file has no timed runs to judge (not evaluated is not "none flagged")."""
    frame = results.load_file(path)
    needed = {results.MEDIAN_MS, results.VARIANT, results.RUN_ID}
    if not needed <= set(frame.columns) or frame[results.MEDIAN_MS].isna().all():
        return None
    if every_run:
        return sorted(set(frame.dropna(subset=[results.MEDIAN_MS])[results.RUN_ID]))
    flagged = runs.flag_under_load(frame.dropna(subset=[results.MEDIAN_MS]))
    return sorted(set(flagged.loc[flagged[runs.UNDER_LOAD], results.RUN_ID]))
