"""The freezing minimizer's parts on small inputs: delta debugging on a fake predicate, programs and their
reductions, the step log, and the fresh-process check's time limit (no torch.compile here)."""
import sys

import pytest
import torch
from torch import nn

from graphbook import paths
from graphbook.freezing import minimizer as mm


def test_ddmin_finds_the_two_items_that_matter_and_tests_each_subset_once():
    calls = []

    def fails(subset):
        calls.append(tuple(subset))
        return {3, 11} <= set(subset)

    assert mm.ddmin(list(range(16)), fails) == [3, 11]
    assert len(calls) == len(set(calls)), "a sublist was tested twice"
    assert len(calls) < 16 * 4  # far fewer tests than trying every pair


def test_ddmin_result_is_one_minimal():
    fails = lambda s: 5 in s or {1, 2} <= set(s)
    found = mm.ddmin(list(range(8)), fails)
    assert fails(found)
    assert all(not fails([x for x in found if x != y]) for y in found)


class Tiny(nn.Module):
    """conv(x) + conv(x), a ReLU, and a side branch that dropping a summand removes."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(4, 4, 3, 1, 1), nn.Conv2d(4, 4, 3, 1, 1), nn.Conv2d(4, 4, 1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.a(x)) + self.c(self.b(x)))


@pytest.fixture
def tiny():
    return mm.capture(Tiny().eval(), torch.randn(1, 4, 8, 8))


def test_capture_and_source_round_trip(tiny):
    assert tiny.describe() == "6 nodes, 3 convolutions, input 1x4x8x8"
    source = mm.to_source(tiny)
    imports = {line for line in source.splitlines() if line.startswith(("import", "from"))}
    assert imports == {"import sys, torch", "from torch import nn"}
    scope = {}
    exec(compile(source.split("model, x =")[0], "<test>", "exec"), scope)
    assert scope["M"]()(torch.randn(1, 4, 8, 8)).shape == (1, 4, 8, 8)
    with pytest.raises(ValueError, match="GELU"):   # an operator the reproducer cannot write
        mm.capture(nn.Sequential(nn.Conv2d(2, 2, 1), nn.GELU()).eval(), torch.randn(1, 2, 4, 4))


def test_dropping_a_summand_removes_its_branch(tiny):
    drops = [r for r in mm._bypasses(tiny, "summand")]
    assert [r.label() for r in drops] == ["drop summand 0 of add", "drop summand 1 of add"]
    without_right = mm._apply(tiny, [drops[1]])      # relu(bn(a(x))): the c(b(x)) branch is dead code
    assert without_right.describe() == "3 nodes, 1 convolutions, input 1x4x8x8"
    assert not mm._has_conv_add(without_right) and mm._has_conv_add(tiny)


def test_halving_keeps_the_program_consistent(tiny):
    half = mm._apply(tiny, [mm.Reduction("channels"), mm.Reduction("size")])
    assert half.input_shape == (1, 2, 4, 4)
    assert "nn.Conv2d(2, 2, 3, 1, 1, bias=True)" in mm.to_source(half)
    assert mm._eager_ok(half)


def test_minimize_logs_every_step_and_keeps_the_smallest_failing_program(tiny):
    seen = []

    def fake_check(source, timeout):     # "the bug" needs two convolutions feeding one add
        seen.append(timeout)
        return (mm.FAILS, "max abs diff 0.5") if source.count("nn.Conv2d(") >= 2 else (mm.PASSES, "max abs diff 0")

    smallest, steps = mm.minimize(tiny, check=fake_check, candidate_timeout=7)
    assert steps[0].phase == "start" and steps[0].still_failing
    assert {s.outcome for s in steps} <= {mm.FAILS, mm.PASSES, mm.SKIPPED}
    assert all(s.seconds >= 0 and s.removed for s in steps)
    assert set(seen) == {7}
    assert smallest.input_shape == (1, 1, 1, 1) and smallest.describe().startswith("3 nodes, 2 convolutions")
    failing = [s for s in steps if s.still_failing]
    assert failing[-1].program == smallest.describe()


def test_minimize_refuses_a_program_that_does_not_fail_and_stops_when_the_budget_is_spent(tiny):
    with pytest.raises(ValueError, match="does not fail"):
        mm.minimize(tiny, check=lambda source, timeout: (mm.PASSES, "max abs diff 0"))
    smallest, steps = mm.minimize(tiny, check=lambda source, timeout: (mm.FAILS, ""), budget=0)
    assert len(steps) == 1 and smallest == tiny


@pytest.mark.parametrize("source, outcome", [("import sys; sys.exit(1)", mm.FAILS), ("pass", mm.PASSES),
                                             ("raise SystemExit(3)", mm.ERROR),
                                             ("import time; time.sleep(30)", mm.TIMED_OUT)])
@pytest.mark.slow
def test_fresh_process_check_reads_the_exit_status_and_enforces_the_time_limit(source, outcome):
    assert mm._check_in_fresh_process(source, timeout=2)[0] == outcome


def test_the_committed_minimal_reproducer_is_the_minimizers_own_output():
    from graphbook.freezing import miscompile

    source = miscompile.MINIMAL_SCRIPT.read_text()
    imports = {name.strip(" ,").split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))
               for name in line.split()[1:2] + (line.split(", ")[1:] if line.startswith("import ") else [])}
    assert imports == {"sys", "torch"}
    assert len(source.splitlines()) <= 40   # a maintainer reads it at a glance
    program = mm.load_program(miscompile.MINIMAL_SCRIPT)    # it parses back into a program
    assert source.startswith('"""') and mm.to_source(program).count("nn.") == source.count("nn.")


def test_a_written_program_loads_back_for_a_second_search(tiny, tmp_path):
    script = tmp_path / "smallest.py"
    script.write_text(mm.to_source(tiny, doc="A test program."))
    again = mm.load_program(script)
    assert again.describe() == tiny.describe()
    constructors = lambda text: [line for line in text.splitlines() if " = nn." in line]
    assert constructors(mm.to_source(again)) == constructors(script.read_text())   # same modules, same seed
    (tmp_path / "other.py").write_text("print('hello')\n")
    with pytest.raises(ValueError, match="not a script written by the minimizer"):
        mm.load_program(tmp_path / "other.py")


@pytest.mark.parametrize("argv, code, stream, text", [(["--help"], None, "out", "usage: A test program."),
                                                      (["--fast"], 2, "err", "error: no options")])
def test_the_written_reproducer_refuses_options_and_prints_usage(tiny, tmp_path, monkeypatch, capsys, argv, code,
                                                                 stream, text):
    import runpy

    script = tmp_path / "repro.py"
    script.write_text(mm.to_source(tiny, doc="A test program."))
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    with pytest.raises(SystemExit) as stop:  # before the reproducer builds or compiles anything
        runpy.run_path(str(script), run_name="__main__")
    assert stop.value.code == code and text in getattr(capsys.readouterr(), stream)


def test_the_upstream_report_carries_the_committed_reproducer_and_its_length():
    import re

    from graphbook.freezing import miscompile

    report = (paths.REPO_ROOT / "docs" / "upstream" / "freezing-miscompile-issue.md").read_text()
    source = miscompile.MINIMAL_SCRIPT.read_text()
    block = re.search(r"## Reproducer \((\d+) lines[^\n]*\n\n```python\n(.*?)```", report, re.DOTALL)
    assert block is not None and block.group(2) == source
    assert int(block.group(1)) == len(source.splitlines())
