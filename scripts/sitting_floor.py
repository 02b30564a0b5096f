#!/usr/bin/env python
"""How much of a sitting is measurement itself: per command, from the recording's own rows, the minutes of timed
calls (warm-ups included), of the cold compiles the rows record, of INT8 quantization, of fresh-process starts and of
server starts to ready, beside the command's wall time. Load tests are not counted, so the sum is a lower bound on
what a sitting with today's runs and sizes needs, however its builds are shared.

Exit status: 0; 2 bad arguments.
"""
from __future__ import annotations

import sys

import pandas as pd

from graphbook.record import cli, recording, results

PROG = "sitting_floor.py"


def measured_seconds(frame: pd.DataFrame) -> dict[str, float]:
    """Seconds of measurement in one results file, by part; a compile counted once per variant however many runs
    quote it."""
    parts = {}
    if {"median_ms", "repeats"} <= set(frame):
        timed = frame.dropna(subset=["median_ms"])
        parts["timed calls"] = (timed["median_ms"] * (timed["repeats"] + timed["warmup"].fillna(0))).sum() / 1e3
    if {"eager_median_ms", "compiled_median_ms"} <= set(frame):
        parts["timed calls"] = ((frame["eager_median_ms"] + frame["compiled_median_ms"])
                                * (frame["repeats"] + frame["warmup"])).sum() / 1e3
    if "latency_ms" in frame:
        parts["timed calls"] = (frame["latency_ms"] * frame["timing_runs"]).sum() / 1e3
        parts["quantization"] = frame["quantize_s"].sum()
    if "compile_s" in frame:
        compiled = frame.dropna(subset=["compile_s"])
        same = [c for c in ("variant", "part", "size_elements", "torch") if c in compiled]
        parts["cold compiles"] = compiled.drop_duplicates(subset=[*same, "compile_s"])["compile_s"].sum()
    if "process_wall_s" in frame:
        parts["fresh-process starts"] = frame["process_wall_s"].sum()
    if "time_to_ready_s" in frame:
        parts["server starts"] = frame["time_to_ready_s"].sum()
    return {part: float(seconds) for part, seconds in parts.items()}


def floor(rec: recording.Recording) -> pd.DataFrame:
    """One row per command of ``rec``: its wall minutes, and the minutes of each part of measurement in its files."""
    rows = []
    for command in rec.manifest["commands"]:
        parts: dict[str, float] = {}
        for name in (entry["file"] for entry in command["files"]):
            if name.endswith(".csv"):
                for part, seconds in measured_seconds(results.load_file(rec.folder / name)).items():
                    parts[part] = parts.get(part, 0.0) + seconds / 60
        rows.append({"command": command["command"], "wall_min": command["seconds"] / 60,
                     "measured_min": sum(parts.values()), **parts})
    return pd.DataFrame(rows).fillna(0.0)


def main(argv: list[str] | None = None) -> int:
    parser = cli.make_parser(PROG, __doc__.splitlines()[0], results_dir=False)
    parser.add_argument("--recording", metavar="ID", help="a recording under data/recordings (default: the reference)")
    args = parser.parse_args(argv)
    chosen = [r for r in recording.recordings() if r.id == args.recording] if args.recording else [recording.reference()]
    if not chosen:
        parser.error(f"--recording {args.recording}: no recording of that id under {recording.RECORDINGS_DIR}")
    table = floor(chosen[0])
    shown = table.assign(command=table["command"].str.slice(0, 50)).round(1)
    print(shown.to_string(index=False, justify="left", formatters={"command": "{:<50}".format}))
    print(f"recording {chosen[0].id}: {table['wall_min'].sum():.1f} minutes of wall time, "
          f"{table['measured_min'].sum():.1f} of them measurement")
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
