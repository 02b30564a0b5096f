"""The attribution ladder: rungs that keep the output, steps that multiply, one machine per ladder."""
import pandas as pd
import pytest
import torch

from graphbook.model import blurball
from graphbook.record import results, runs
from graphbook.teach import attribution, plots
from conftest import slow_fixture

MACHINE_A = {"cpu_model": "CPU A", "cpu_family": 6, "cpu_model_id": 1, "cpu_isa": "avx2", "threads": 2}
MACHINE_B = {**MACHINE_A, "cpu_model_id": 2}


def ladder_rows(times_per_run, machine=MACHINE_A, prefix="f"):
    rows = []
    for run, times in enumerate(times_per_run, start=1):
        for rung, ms in zip(attribution.RUNGS, times):
            rows.append({"run_id": f"{prefix}/r{run}", "variant": rung, "median_ms": ms, **machine})
    return pd.DataFrame(rows)


def test_dead_outputs_skipped_keep_the_logits_and_drop_three_fuse_layers():
    model = blurball.build_blurball()
    x = blurball.example_input(height=32, width=64)
    pruned = attribution.skip_dead_outputs(model)
    with torch.no_grad():
        assert torch.equal(pruned(x), model(x))
    dead = [name for name, _ in pruned.named_modules() if name.startswith(blurball.DEAD_MODULE_PREFIXES)]
    assert dead == []
    assert any(name.startswith(blurball.DEAD_MODULE_PREFIXES) for name, _ in model.named_modules())


def test_steps_telescope_to_the_total_and_a_residual_appears_only_when_runs_disagree():
    steps, total = attribution.ladder(ladder_rows([[400, 200, 160, 150, 100]] * 3))
    assert [s.rung for s in steps] == list(attribution.RUNGS)
    assert [round(s.step, 3) for s in steps[1:]] == [2.0, 1.25, round(160 / 150, 3), 1.5]
    assert total["total"] == pytest.approx(4.0)
    assert total["product"] == pytest.approx(4.0)
    assert total["residual"] == pytest.approx(1.0)
    assert total["runs"] == 3
    # when runs disagree, medians of the steps need not multiply to the median of the totals: the gap is shown
    _, total = attribution.ladder(ladder_rows([[400, 200, 160, 150, 100], [400, 400, 160, 150, 100],
                                               [400, 400, 320, 150, 100]]))
    assert total["product"] == pytest.approx(2.0)
    assert total["residual"] == pytest.approx(2.0)
    assert total["total"] == pytest.approx(4.0)
    rows = [{"run_id": f"o/r{run}", "variant": v, "median_ms": ms, **MACHINE_A}
            for run in (1, 2, 3) for v, ms in zip(attribution.ORT_RUNGS, (600, 300, 280, 250, 150, 150))]
    steps, total = attribution.ladder(pd.DataFrame(rows), rungs=attribution.ORT_RUNGS)
    assert [s.cause for s in steps[1:]][2] == attribution.ORT_CAUSES["ort_extended"]
    assert total["total"] == pytest.approx(4.0) and total["residual"] == pytest.approx(1.0)


def test_a_ladder_never_mixes_machines_and_the_recorded_one_leaves_loaded_runs_out(tmp_path):
    frame = pd.concat([ladder_rows([[400, 200, 160, 150, 100]] * 3),
                       ladder_rows([[800, 400, 320, 300, 100]] * 3, MACHINE_B, prefix="g")])
    with pytest.raises(runs.MixedMachines, match="2 machines"):
        attribution.ladder(frame)
    label = runs.machine_label(MACHINE_B)
    _, total = attribution.ladder(frame, machine=label)
    assert total["total"] == pytest.approx(8.0) and total["machine"] == label
    with pytest.raises(ValueError, match="no rows of machine"):
        attribution.ladder(frame, machine="a CPU nobody recorded")
    with pytest.raises(ValueError, match="BN folded"):  # a missing rung is named
        attribution.ladder(frame[frame.variant != attribution.BN_FOLDED], machine=label)
    quiet = ladder_rows([[400, 200, 160, 150, 100]] * 3)
    loaded = ladder_rows([[4000, 2000, 1600, 1500, 500]], prefix="z")  # every rung slow: a loaded run
    other = ladder_rows([[800, 400, 320, 300, 100]] * 3, MACHINE_B, prefix="g")
    for name, frame in (("a", quiet), ("b", loaded), ("c", other)):
        frame = frame.assign(height=288, run=1)
        frame.to_csv(tmp_path / f"cpu-attribution-2026-12-0{'abc'.index(name) + 1}.csv", index=False)
    recorded = results.load("attribution", tmp_path)
    assert recorded["run_id"].nunique() == 7
    steps, summary, rows = attribution.recorded_ladder(recorded, here=MACHINE_A)
    assert summary["machine"] == runs.machine_label(MACHINE_A)
    assert summary["total"] == pytest.approx(4.0) and summary["runs"] == 3
    assert attribution.recorded_ladder(recorded, here=MACHINE_A, height=96) is None


def test_waterfall_ends_at_the_product_and_refuses_bad_steps():
    import matplotlib

    matplotlib.use("Agg")
    ax = plots.speedup_waterfall(["a", "b"], [2.0, 0.5], 1.2)
    texts = [t.get_text() for t in ax.texts]
    assert "2.00x" in texts and "0.50x" in texts
    assert any("residual 1.20" in t for t in texts)
    with pytest.raises(ValueError):
        plots.speedup_waterfall(["a"], [0.0], 1.0)
    with pytest.raises(ValueError):
        plots.speedup_waterfall(["a", "b"], [1.0], 1.0)


@pytest.fixture(scope="module")
@slow_fixture
def rungs():
    """BlurBall at 32x64, its eager output, every rung's runner, and the Inductor settings each compiled rung ran
    under, recorded by a stand-in for ``torch.compile`` (bench_attribution.py compiles and checks the real ones)."""
    import torch._inductor.config as config

    seen = {}

    def fake_compile(module):
        def call(x):
            seen.setdefault(id(module), []).append((config.freezing, config.layout_optimization,
                                                    config.fallback_by_default))
            return module(x)
        return call

    model = blurball.build_blurball()
    x = blurball.example_input(height=32, width=64)
    with torch.no_grad():
        reference = model(x)
    return x, reference, attribution.build_rungs(model, x, compile=fake_compile), seen


def test_hand_made_rungs_match_eager_and_compiled_ones_run_under_their_own_inductor_settings(rungs):
    import torch._inductor.config as config

    from graphbook import checks

    x, reference, runners, seen = rungs
    for name in [r for r in attribution.RUNGS if r != attribution.INDUCTOR]:
        assert checks.compare_to_reference(runners[name](x), reference)["same_output"], name
    assert list(runners)[:len(attribution.RUNGS)] == list(attribution.RUNGS)
    settings = {}
    for name in [attribution.INDUCTOR, *attribution.INDUCTOR_WITHOUT]:
        before = {key: len(calls) for key, calls in seen.items()}
        runners[name](x)
        (key,) = [k for k, calls in seen.items() if len(calls) != before.get(k, 0)]
        settings[name] = seen[key][-1]
    default_layout = config.layout_optimization
    assert settings == {attribution.INDUCTOR: (False, default_layout, False),
                        "Inductor without layout optimization": (False, False, False),
                        "Inductor without generated code": (False, default_layout, True)}
    assert len(seen) == 3  # one compiled copy per setting, never a shared cache entry
