"""Tests for graphbook.teach.fusion_rules: TVM's classes and fusion groups on graphs with known answers."""
import operator

import pytest
import torch
import torch.fx
from torch import nn

from graphbook.compilers import inductor_tools
from graphbook.teach import fusion_rules as fr


class Fn(nn.Module):
    """Wrap a function so torch.export can capture it."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


class ConvBnReluAdd(nn.Module):
    def __init__(self, channels=4):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) + x


VEC = (torch.randn(8),)


def groups_of(fn_or_module, args=VEC):
    module = fn_or_module if isinstance(fn_or_module, nn.Module) else Fn(fn_or_module)
    gm = fr.capture_aten_graph(module, args)
    return gm, fr.fuse_groups(gm)


def test_classify_op_table_and_fallback_and_a_call_module_graph():
    assert fr.classify_op("relu") == (fr.OpClass.INJECTIVE, True, True)
    assert fr.classify_op("permute") == (fr.OpClass.INJECTIVE, False, True)
    assert fr.classify_op("sum")[0] is fr.OpClass.REDUCTION
    assert fr.classify_op("conv2d")[0] is fr.OpClass.COMPLEX_OUT_FUSABLE
    assert fr.classify_op("sort") == (fr.OpClass.OPAQUE, False, True)
    assert fr.classify_op("no_such_op") == (fr.OpClass.OPAQUE, False, False)
    # max with a dimension reduces; max of two tensors is element-wise
    assert fr.classify_op("max", "dim")[0] is fr.OpClass.REDUCTION
    assert fr.classify_op("max", "other")[0] is fr.OpClass.INJECTIVE
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3).eval(), nn.ReLU()))
    assert [i.op for i in fr.classify_graph(gm)] == ["conv2d", "batch_norm", "relu"]
    assert len(fr.fuse_groups(gm)) == 1


@pytest.mark.slow
def test_reduction_absorbs_injective_inputs_but_not_its_consumers_and_opaque_or_unknown_ops_break_a_chain():
    _, groups = groups_of(lambda x: (x * 2).exp().sum() * 3)
    assert [g.ops for g in groups] == [("mul", "exp", "sum"), ("mul",)]
    assert [g.kind for g in groups] == [fr.OpClass.REDUCTION, fr.OpClass.INJECTIVE]
    # cumsum is opaque in the table and breaks a chain: mul | cumsum | add relu
    _, groups = groups_of(lambda x: (torch.cumsum(x * 2, 0) + 1).relu())
    assert [g.ops for g in groups] == [("mul",), ("cumsum",), ("add", "relu")]
    assert groups[1].kind is fr.OpClass.OPAQUE
    # an operator the table does not know is opaque too, and listed
    gm, groups = groups_of(lambda x: torch.special.bessel_j0(x * 2) + 1)
    assert fr.unknown_ops(gm) == ["special_bessel_j0"]
    assert len(groups) == 3
    info = {i.op: i for i in fr.classify_graph(gm)}["special_bessel_j0"]
    assert info.op_class is fr.OpClass.OPAQUE and not info.known


@pytest.mark.slow
def test_diamond_with_injective_branches_fuses_whole_but_a_value_that_leaves_the_graph_ends_its_group():
    _, groups = groups_of(lambda x: (lambda y: y.sin() + y.cos())(x.exp()))
    assert len(groups) == 1 and groups[0].size == 4
    _, groups = groups_of(lambda x: (lambda y: (y, y.sin()))(x.exp()))
    assert [g.ops for g in groups] == [("exp",), ("sin",)]


@pytest.mark.slow
def test_data_movement_fuses_only_with_injective_neighbours():
    # permute is injective but not element-wise: a linear does not absorb it
    _, groups = groups_of(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),))
    assert [g.ops for g in groups] == [("linear", "relu")]
    _, groups = groups_of(lambda x: (x.relu() + 1).permute(1, 0).contiguous() * 2, (torch.randn(3, 4),))
    assert len(groups) == 1


@pytest.mark.slow
def test_groups_table_and_summary_columns_and_dynamo_graphs_group_like_the_exported_graph():
    gm, groups = groups_of(ConvBnReluAdd(), (torch.randn(1, 4, 6, 6),))
    table = fr.groups_table(groups)
    assert list(table.columns) == ["group", "kind", "anchor", "nodes", "ops"]
    assert table.loc[0, "nodes"] == 4
    summary = fr.fusion_summary(gm)
    assert summary["groups"] == 1 and summary["complex-out-fusable"] == 1 and summary["unknown_ops"] == "-"
    # the graph TorchDynamo hands Inductor groups like the exported one
    (gm,) = inductor_tools.dynamo_graphs(ConvBnReluAdd().eval(), torch.randn(1, 4, 6, 6))
    assert fr.unknown_ops(gm) == []
    assert [g.ops for g in fr.fuse_groups(gm)] == [("conv2d", "batch_norm", "relu", "add")]


@pytest.mark.slow
def test_bad_inputs_raise_clear_errors():
    with pytest.raises(TypeError, match="GraphModule"):
        fr.fuse_groups("not a graph")
    with pytest.raises(TypeError, match="tuple"):
        fr.capture_aten_graph(nn.ReLU(), torch.randn(2))


def test_pythons_augmented_assignment_is_the_operator_it_computes():
    graph = torch.fx.Graph()     # as Dynamo records ResNet's `hidden_state += residual`: operator.iadd
    x, y = graph.placeholder("x"), graph.placeholder("y")
    graph.output(graph.call_method("relu", (graph.call_function(operator.iadd, (x, y)),)))
    module = torch.fx.GraphModule(nn.Module(), graph)
    assert [fr.op_name(n, module) for n in fr.compute_nodes(module)] == ["add", "relu"]
    assert fr.unknown_ops(module) == [] and len(fr.fuse_groups(module)) == 1
