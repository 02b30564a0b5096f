"""Tests of graphbook.method.bench: the CPU benchmarks' one path from building to the recorded frame."""
import torch

from graphbook.record import results, runs
from graphbook.method import bench
from graphbook.method.variants import REFERENCE, VariantUnavailable

X = torch.ones(4)


def _builders(calls):
    def runner(name, output):
        return lambda x: calls.append(name) or output

    def unavailable():
        raise VariantUnavailable("no such package here")
    return {REFERENCE: lambda: (runner(REFERENCE, X), {"compile_s": 0.0}),
            "wrong": lambda: (runner("wrong", X + 1), {"compile_s": 2.0, "note": "freezing on"}),
            "absent": unavailable,
            "bf16": lambda: (runner("bf16", X + 1), {})}


def test_every_version_is_checked_and_a_missing_one_is_never_timed(tmp_path):
    calls = []
    frame, failed = bench.build_check_time(_builders(calls), X, X, columns={"bf16": {"expected_to_match_eager": False}},
                                           runs=3, warmup=0, repeats=1, probe_bytes=2**20, log=lambda line: None)
    assert failed == ["wrong"]  # a lower precision that differs is no failure
    assert "absent" not in calls and frame.groupby("variant").size().to_dict() == {v: 3 for v in _builders([])}
    wrong = frame[frame["variant"] == "wrong"]
    # a version that fails its check is timed all the same, and its row says why it failed
    assert wrong["median_ms"].notna().all() and set(wrong["note"]) == {"freezing on; output differs from eager FP32"}
    absent = frame[frame["variant"] == "absent"]
    assert absent["median_ms"].isna().all() and set(absent["note"]) == {"skipped: no such package here"}
    assert absent["copy_gbps"].gt(0).all()  # the run's own probe, as on every row of that run
    # each run in the builders' order; the timing order rotates; speed-ups against eager of the same run
    assert frame["variant"].tolist()[:4] == [REFERENCE, "wrong", "absent", "bf16"]
    firsts = frame[frame["run_order"] == 1].sort_values("run")["variant"].tolist()
    assert firsts == [REFERENCE, "wrong", "bf16"]
    assert frame[frame["variant"] == REFERENCE]["speedup_vs_eager"].eq(1.0).all()
    path = results.write_run("cpu-blurball", frame, {"date": "2026-12-03T00:00:00+00:00"}, results_dir=tmp_path,
                             per_run=True)
    back = results.load("cpu-blurball", tmp_path)
    assert sorted(back[results.RUN_ID].unique()) == [f"{path.stem}/r{k}" for k in (1, 2, 3)]
    assert runs.summarize_runs(back.dropna(subset=["median_ms"]))["runs"].eq(3).all()
    assert back.set_index("variant")["same_output"].loc[["wrong", REFERENCE]].tolist() == [False] * 3 + [True] * 3


def test_one_variant_at_several_thread_counts_is_compared_with_eager_at_the_same_count():
    builders = {f"{name}@{t}": (lambda: (lambda x: x, {})) for name in (REFERENCE, "other") for t in (1, 2)}
    columns = {key: {"variant": key.split("@")[0], "threads": int(key.split("@")[1])} for key in builders}
    frame, _ = bench.build_check_time(builders, X, X, columns=columns, runs=3, warmup=0, repeats=1, probe_bytes=None,
                                      threads={key: c["threads"] for key, c in columns.items()}, log=lambda line: None)
    assert frame.groupby(["variant", "threads"]).size().eq(3).all()
    eager = frame[frame["variant"] == REFERENCE].set_index(["run", "threads"])["median_ms"]
    other = frame[frame["variant"] == "other"].set_index(["run", "threads"])
    assert (other["speedup_vs_eager"] == eager / other["median_ms"]).all()
