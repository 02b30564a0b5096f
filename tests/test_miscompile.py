"""Tests of graphbook.freezing.miscompile: reading the two wrappers, the verdict cache, the reproducer's exit codes."""
import json
import re

import pytest
import torch

from graphbook import paths
from graphbook.freezing import miscompile as mc

# A shortened wrapper with the shape of BlurBall's (fusion on): the fused kernel reads buf187 early.
_HEAD = "from torch import empty\n\nclass Runner:\n    def call(self, args):\n"
_FUSED = _HEAD + """\
        buf186 = torch.ops.mkldnn._convolution_pointwise.default(buf185, _frozen_param1125, _frozen_param1035, [1, 1], [2, 2], [1, 1], 1, 'none', [None], '')
        buf187 = buf186
        del buf186
        cpp_fused_add_mul_relu_sigmoid_unsqueeze_13(buf131, buf130, buf120, buf187, buf191)
        buf132 = torch.ops.mkldnn._convolution_pointwise.default(buf131, _frozen_param1121, _frozen_param1031, [0, 0], [1, 1], [1, 1], 1, 'none', [None], '')
        torch.ops.mkldnn._convolution_pointwise_.binary(buf187, buf105, _frozen_param1126, _frozen_param1036, [1, 1], [2, 2], [1, 1], 1, 'add', 1.0, None, [None], None)
        del buf187
        return (buf191, )
runner = Runner()
"""
_UNFUSED = _HEAD + """\
        buf186 = torch.ops.mkldnn._convolution_pointwise.default(buf185, _frozen_param1125, _frozen_param1035, [1, 1], [2, 2], [1, 1], 1, 'none', [None], '')
        buf187 = buf186
        del buf186
        torch.ops.mkldnn._convolution_pointwise_.binary(buf187, buf105, _frozen_param1126, _frozen_param1036, [1, 1], [2, 2], [1, 1], 1, 'add', 1.0, None, [None], None)
        cpp_fused_add_relu_14(buf191, buf187)
        return (buf191, )
runner = Runner()
"""


def test_the_launch_order_on_the_buffer_the_inplace_add_writes():
    calls = mc._inplace_binary_calls(_FUSED)
    assert [(c.other, c.input) for c in calls] == [("buf187", "buf105")]
    fused = [re.sub(r"^#\s*\d+\s+", "", line) for line in mc.inplace_launch_order(_FUSED)]
    assert fused[0].startswith("buf186 = torch.ops.mkldnn._convolution_pointwise")   # alias of buf187
    assert fused[1].startswith("cpp_fused_add_mul_relu") and "binary" in fused[2]        # read, then add
    unfused = [re.sub(r"^#\s*\d+\s+", "", line) for line in mc.inplace_launch_order(_UNFUSED)]
    assert "binary" in unfused[1] and unfused[2].startswith("cpp_fused_add_relu_14")     # add, then read
    assert mc.inplace_launch_order(_HEAD + "        return ()\n") == []


def test_the_fixing_change_is_switched_only_inside_its_context():
    from torch._inductor.scheduler import SchedulerNode

    stock = SchedulerNode.recompute_size_and_body
    for kept in (True, False):
        with mc._renames_after_recompute(kept):
            assert SchedulerNode.recompute_size_and_body is not stock
        assert SchedulerNode.recompute_size_and_body is stock


def test_verdict_is_cached_per_torch_version_and_cpu_capability(monkeypatch, tmp_path):
    monkeypatch.setattr(mc, "CACHE_DIR", tmp_path)
    runs = []

    def fake_run(timeout):
        runs.append(1)
        return {"present": True, "torch": torch.__version__, "max_abs_diff": 0.05, "cpu_capability": "X",
                "seconds": 1.0, "output": ""}

    monkeypatch.setattr(mc, "_run_reproducer", fake_run)
    first = mc.freezing_bug_verdict()
    second = mc.freezing_bug_verdict()
    assert first["present"] and second["present"] and len(runs) == 1
    assert first["source"] == "run now" and second["source"].startswith("cache")
    assert json.loads(mc._cache_file().read_text())["max_abs_diff"] == 0.05
    mc.freezing_bug_verdict(refresh=True)
    assert len(runs) == 2
    # another CPU capability (e.g. ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine) does not reuse the verdict
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "CAPPED")
    assert mc.freezing_bug_verdict()["source"] == "run now" and len(runs) == 3


@pytest.mark.slow
def test_the_scheduler_change_is_the_fix_the_reproducer_fails_again_without_it(monkeypatch, tmp_path):
    """The pinned torch passes the minimal reproducer, and the verdict the chapters read says so; with the one
    change of 2.14.1 switched off (the renames dropped after a recompute) the same 0.0349 comes back."""
    monkeypatch.setattr(mc, "CACHE_DIR", tmp_path)
    plain = mc.freezing_bug_verdict(refresh=True)
    assert plain["torch"] == torch.__version__ and not plain["present"], plain
    dropped = mc.run_minimal(renames_kept=False)
    assert dropped["present"] and dropped["max_abs_diff"] > 1e-2, dropped


def test_the_verdict_comes_from_the_minimal_reproducer_not_a_recorded_model_scale_run(monkeypatch, tmp_path):
    from graphbook.record import results

    monkeypatch.setattr(mc, "CACHE_DIR", tmp_path / "cache")
    ran = []
    monkeypatch.setattr(mc, "_run_reproducer", lambda *a: ran.append(1) or {
        "present": False, "torch": torch.__version__, "max_abs_diff": 1e-6, "cpu_capability": "X", "seconds": 8.0,
        "script": mc.MINIMAL_SCRIPT.name})
    row = {"present": True, "torch": torch.__version__, "max_abs_diff": 0.0793,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "seconds": 40.0}
    results.write_run("freezing-repro", [row], {"date": "2026-11-30T18:00:00+00:00"}, results_dir=tmp_path)
    monkeypatch.setenv("GRAPHBOOK_RESULTS_DIR", str(tmp_path))
    verdict = mc.freezing_bug_verdict()
    assert ran == [1] and not verdict["present"] and verdict["script"] == "repro_freezing_minimal.py"


# ------------------------------------------------------------- the reproducer's model, one definition
def test_load_reproducer_gives_the_standalone_script_without_running_it():
    repro = mc._load_reproducer()
    assert repro.__file__ == str(mc.REPRO_SCRIPT)
    assert callable(repro.build) and callable(repro.main)
    # the file stays fileable upstream as it is: torch and the standard library only
    imports = re.findall(r"^(?:import|from) (\w+)", mc.REPRO_SCRIPT.read_text(), re.MULTILINE)
    assert set(imports) <= {"__future__", "argparse", "platform", "sys", "time", "torch"}, imports


def test_check_model_repro_is_the_reproducers_model():
    model, (x,) = mc.check_model("repro", 16, 32)
    again, (y,) = mc._load_reproducer().build(16, 32)
    assert type(model).__name__ == "SmallHRNet" and x.shape == (1, 9, 16, 32) and torch.equal(x, y)
    with torch.no_grad():
        assert torch.equal(model(x), again(y))


def test_check_model_refuses_an_unknown_name():
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        mc.check_model("resnet")


def test_bisect_freezing_keeps_no_copy_and_no_path_setup():
    source = paths.script("bisect_freezing.py").read_text()
    # (a regex for the import-path edit, so that this test does not itself contain the text it bans)
    assert not re.search(r"sys\.path", source), "bisect_freezing.py edits the import path"
    for banned in ("spec_from_file_location", "freezing=True", "class SmallHRNet"):
        assert banned not in source, banned
    assert "inductor_tools.freezing()" in source and "miscompile.check_model" in source


@pytest.mark.slow
def test_run_minimal_sets_inductor_config_first_and_reads_the_verdict(monkeypatch, tmp_path):
    fake = tmp_path / "fake_repro.py"
    fake.write_text("import sys, torch._inductor.config as c\n"
                    "print(f'max abs diff, freezing: {0.5 if c.max_fusion_size > 1 else 0.0}')\n"
                    "sys.exit(1 if c.max_fusion_size > 1 else 0)\n")
    monkeypatch.setattr(mc, "MINIMAL_SCRIPT", fake)
    default, unfused = mc.run_minimal(), mc.run_minimal({"max_fusion_size": 1})
    assert default["present"] and default["max_abs_diff"] == 0.5 and default["code"] == ""
    assert not unfused["present"] and unfused["max_abs_diff"] == 0.0
    fake.write_text("raise SystemExit(3)\n")
    with pytest.raises(RuntimeError, match="exit 3"):
        mc.run_minimal()


@pytest.mark.slow
def test_run_minimal_edits_the_program_and_variants_run_side_by_side(monkeypatch, tmp_path):
    fake = tmp_path / "fake_repro.py"
    fake.write_text("import sys\nsize = 4\nprint(f'max abs diff, freezing: {0.5 if size == 4 else 0.0}')\n"
                    "sys.exit(1 if size == 4 else 0)\n")
    monkeypatch.setattr(mc, "MINIMAL_SCRIPT", fake)
    results = mc.run_minimal_variants({"as written": {}, "bigger": {"replace": {"size = 4": "size = 8"}}})
    assert list(results) == ["as written", "bigger"]
    assert results["as written"]["present"] and not results["bigger"]["present"]
    with pytest.raises(ValueError, match="exactly once"):
        mc.run_minimal(replace={"size = 5": "size = 8"})
