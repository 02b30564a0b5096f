"""The freezing miscompile under one torch, for the version history (appendix, Chapter 5): both reproducers, the
scheduler change that fixed it switched both ways, and BlurBall's eager, default compile and freezing, each checked
against eager and timed. ``scripts/torch_version_history.py`` runs this in each torch's own interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import pandas as pd
import torch

from graphbook.freezing import miscompile
from graphbook.measure import compiletime
from graphbook.measure.environment import fingerprint, set_threads
from graphbook.model import blurball
from graphbook.method import variants
from graphbook.method.bench import build_check_time

#: The tag of the child's answer line (``measure.compiletime``'s protocol).
TAG = "TORCH-VERSION-ROWS "
#: BlurBall's variants the history times: the reference, compile's default, and freezing.
BLURBALL_VARIANTS = ("eager_fp32", "compile_default", "compile_freezing")


def _reproducer_rows(timeout: float) -> list[dict]:
    rows = []
    for case, script in (("minimal", miscompile.MINIMAL_SCRIPT), ("hrnet", miscompile.REPRO_SCRIPT)):
        command = [sys.executable, str(script)] + (["--skip-control"] if case == "hrnet" else [])
        start = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        match = miscompile._DIFF_LINE.search(proc.stdout)
        rows.append({"record": "reproducer", "case": case, "exit_status": proc.returncode,
                     "max_abs_diff": float(match.group(1)) if match else float("nan"),
                     "seconds": round(time.perf_counter() - start, 1)})
    # The order of the launches on the buffer the in-place conv + add writes, from the generated wrapper.
    wrapper = miscompile.run_minimal(wrapper=True, timeout=timeout)["code"]
    rows += [{"record": "launch-order", "case": "minimal", "launch": k, "text": line}
             for k, line in enumerate(miscompile.inplace_launch_order(wrapper), start=1)]
    # The one scheduler change, switched the other way from what this torch does: on in a torch without it, off in
    # a torch with it. If it is the fix, the verdict flips.
    for kept in (True, False):
        run = miscompile.run_minimal(renames_kept=kept, timeout=timeout)
        rows.append({"record": "scheduler-change", "case": "minimal, renames kept" if kept else
                     "minimal, renames dropped", "exit_status": int(run["present"]),
                     "max_abs_diff": run["max_abs_diff"], "seconds": run["seconds"]})
    return rows


def _blurball_rows(spec: dict) -> tuple[list[dict], list[str]]:
    model = blurball.build_blurball()
    x = blurball.example_input(height=spec["height"], width=spec["width"])
    with torch.no_grad():
        reference = model(x)

    built = {}

    def builder(name):
        def build():
            built[name] = variants.build(name, model, x)
            return built[name].run, {"compile_s": round(built[name].compile_s, 3), "note": built[name].note}
        return build

    frame, failed = build_check_time({name: builder(name) for name in BLURBALL_VARIANTS}, x, reference,
                                     runs=spec["runs"], warmup=spec["warmup"], repeats=spec["repeats"],
                                     log=lambda line: print(line, file=sys.stderr, flush=True))
    frame = frame.assign(record="blurball", case=frame["variant"], height=spec["height"], width=spec["width"])
    rows = json.loads(frame.to_json(orient="records"))  # plain Python values for the answer line
    # Which fuse-layer summand, left out of eager, gives freezing's output: one under a torch that drops it.
    frozen = built["compile_freezing"].run(x)
    dropped = miscompile.dropped_summand(model, x, frozen)
    rows += [{"record": "dropped-summand", "case": f"{d.stage} output {d.output} branch {d.branch}",
              "diff_without": d.diff_without, "max_abs_diff": d.diff_with} for d in dropped] or [
        {"record": "dropped-summand", "case": "none", "max_abs_diff": float((frozen - reference).abs().max())}]
    return rows, failed


def measure(spec: dict) -> dict:
    """This interpreter's rows, each with this torch's fingerprint, and the variants that failed their check."""
    set_threads(spec["threads"])
    env = fingerprint(spec["threads"])
    env["torch_cuda"] = torch.version.cuda or ""
    rows = _reproducer_rows(spec["timeout"])
    blurball_rows, failed = _blurball_rows(spec)
    return {"rows": [{**env, **row} for row in rows + blurball_rows], "failed": failed}


def run_in(python: str, spec: dict, *, timeout: float) -> dict:
    """:func:`measure` in the interpreter ``python`` (a torch's own environment), read back from its tagged line."""
    with tempfile.TemporaryDirectory(prefix="graphbook-inductor-") as cache:   # every torch compiles cold
        answer, _ = compiletime.run_tagged_child(
            [python, "-m", __name__, "--child", json.dumps(spec)], TAG, timeout=timeout,
            env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache},
            timeout_message=f"{python} did not finish the version history within {timeout:g} s",
            failure_message=lambda proc: f"{python} failed (exit {proc.returncode}): "
                                         f"{(proc.stdout + proc.stderr)[-800:]}")
    return answer


if __name__ == "__main__":
    sys.exit(compiletime.answer_as_child(sys.argv[1:], __name__, TAG, measure))


# ------------------------------------------------------------------------------------------ reading the history
def _torches(frame: pd.DataFrame) -> list[str]:
    """The torches of a recorded history, oldest first."""
    return sorted(set(frame["torch"]), key=lambda v: tuple(int(p) for p in v.split("+")[0].split(".")))


def verdicts(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per torch of a recorded history, oldest first: each reproducer's and switch's exit status and max abs
    diff, freezing's check on BlurBall, and which summand eager must leave out to give freezing's output."""
    rows = []
    for version in _torches(frame):
        mine = frame[frame["torch"] == version]
        row = {"torch": version}
        for record, case, key in (("reproducer", "minimal", "minimal"), ("reproducer", "hrnet", "hrnet"),
                                  ("scheduler-change", "minimal, renames kept", "renames_kept"),
                                  ("scheduler-change", "minimal, renames dropped", "renames_dropped")):
            found = mine[(mine.record == record) & (mine.case == case)].iloc[0]
            row[f"{key}_exit"], row[f"{key}_diff"] = int(found["exit_status"]), float(found["max_abs_diff"])
        frozen = mine[(mine.record == "blurball") & (mine.case == "compile_freezing")]
        row["freezing_diff"] = float(frozen["max_abs_diff"].max())
        row["freezing_passed"] = bool(frozen["same_output"].astype(bool).all())
        summand = mine[mine.record == "dropped-summand"]
        row["dropped_summand"] = ", ".join(summand["case"])
        row["dropped_summand_diff"] = float(summand["diff_without"].max())
        rows.append(row)
    return pd.DataFrame(rows)


def speeds(frame: pd.DataFrame) -> pd.DataFrame:
    """BlurBall's variants per torch, oldest first: median ms over the runs, each run's speed-up over the same
    torch's eager (median, min, max), the cold compile and the variant's check."""
    timed = frame[frame.record == "blurball"]
    per_run = timed.pivot_table(index=["torch", "run_id"], columns="variant", values="median_ms")
    rows = []
    for version in _torches(timed):
        for variant in BLURBALL_VARIANTS:
            group = timed[(timed["torch"] == version) & (timed["variant"] == variant)]
            ratios = per_run.loc[version, "eager_fp32"] / per_run.loc[version, variant]
            rows.append({"torch": version, "variant": variant, "median_ms": float(group["median_ms"].median()),
                         "runs": int(group["run_id"].nunique()), "speedup": float(ratios.median()),
                         "speedup_min": float(ratios.min()), "speedup_max": float(ratios.max()),
                         "compile_s": float(group["compile_s"].median()),
                         "passed": bool(group["same_output"].astype(bool).all())})
    return pd.DataFrame(rows)


def launch_orders(frame: pd.DataFrame) -> dict[str, list[str]]:
    """torch -> the minimal reproducer's launches on the buffer its in-place conv + add writes, in order."""
    orders = frame[frame.record == "launch-order"].sort_values("launch")
    return {version: list(group["text"]) for version, group in orders.groupby("torch", sort=False)}

