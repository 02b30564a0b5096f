"""What the compilers see of a reader's model (Chapter 8): TorchDynamo's graphs and breaks, the operator census
under the book's fusion rules, the BN fold inventory, and Inductor's kernels traced back to the predicted groups."""
from __future__ import annotations

import contextlib
from collections import defaultdict
from unittest import mock

import pandas as pd
import torch
import torch._inductor.config as inductor_config
from torch._inductor import debug as inductor_debug

from graphbook.compilers import inductor_tools
from graphbook.method import folding
from graphbook.method.variants import arguments
from graphbook.teach import fusion_rules
from graphbook.teach.kernel_provenance import pre_grad_nodes, provenance_rows


def capture(model: torch.nn.Module, example) -> tuple[dict, list[torch.fx.GraphModule]]:
    """One row of counts (graphs, breaks and why, operators per fusion class, groups, unknown operators) and the
    graphs TorchDynamo hands Inductor, in order."""
    args = arguments(example)
    with torch.no_grad():
        explained = inductor_tools.explain(model, *args)
        graphs = inductor_tools.dynamo_graphs(model, *args)
    infos = [info for graph in graphs for info in fusion_rules.classify_graph(graph)]
    row = {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count,
           "break_reasons": " | ".join(dict.fromkeys(explained.break_reasons)), "operators": len(infos),
           "groups": sum(len(fusion_rules.fuse_groups(graph)) for graph in graphs),
           "unknown_operators": ", ".join(sorted({i.op for i in infos if not i.known})),
           **{f"{cls.value}_operators": sum(i.op_class is cls for i in infos) for cls in fusion_rules.OpClass}}
    return row, graphs


def fold_inventory(model: torch.nn.Module, example) -> list[dict]:
    """One row per BatchNorm2d call: the convolution it folds into, or the reason it stays."""
    plan = folding.conv_bn_plan(model, arguments(example))
    return ([{"conv": conv, "bn": bn, "folded": True, "reason": ""} for conv, bn in plan.pairs]
            + [{"conv": "", "bn": bn, "folded": False, "reason": reason} for bn, reason in plan.skipped])


@contextlib.contextmanager
def provenance(mappings: list[dict]):
    """Inductor's provenance tracking on for what compiles inside: each compiled graph's node mapping (kernel launch
    -> post-grad nodes -> pre-grad nodes) is appended to ``mappings``. The mapping lives only during a compile, so
    it is read where Inductor writes it; the FX graph cache is off, since a hit would skip the code generation."""
    dump = inductor_debug.dump_inductor_provenance_info

    def keep():
        mapping = dump()
        mappings.append(mapping)
        return mapping

    with inductor_config.patch({"trace.provenance_tracking_level": 1, "fx_graph_cache": False}), \
            mock.patch.object(inductor_debug, "dump_inductor_provenance_info", keep):
        yield


#: Library calls in Inductor's wrapper. The mapping lists, beside the nodes a launch computes, nodes whose buffers it
#: reads or prepares; a library call computes only its own operator, and a node it computes is its alone.
_LIBRARY_PREFIXES = ("extern_kernels.", "torch.ops.")


def kernel_rows(mappings: list[dict], graphs: list[torch.fx.GraphModule]) -> pd.DataFrame:
    """One row per (graph, launch, post-grad node, pre-grad node), each with its book group (``group``) and
    whether the launch is a library call (kept only for the nodes of its own operator). A node a library call
    computes is left out of the generated kernels that list it: they prepare its input or its weights."""
    frames = []
    for index, (mapping, graph, nodes) in enumerate(zip(mappings, graphs, map(pre_grad_nodes, graphs))):
        rows = pd.DataFrame(provenance_rows(mapping, nodes)) if "postToPre" in mapping else pd.DataFrame()
        if rows.empty:  # a graph Inductor compiled to no kernel
            continue
        groups = {node: group.index for group in fusion_rules.fuse_groups(graph) for node in group.nodes}
        library = rows["kernel"].str.startswith(_LIBRARY_PREFIXES)
        own_op = pd.Series([post.startswith(kernel.rpartition(".")[2]) for kernel, post in
                            zip(rows["kernel"], rows["post_grad_node"])], index=rows.index)
        computed_by_library = set(rows.loc[library & own_op, "post_grad_node"])
        keep = (library & own_op) | (~library & ~rows["post_grad_node"].isin(computed_by_library))
        frames.append(rows[keep].assign(graph=index, library=library[keep],
                                        group=rows.loc[keep, "pre_grad_node"].map(groups)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def kernels_against_groups(rows: pd.DataFrame) -> dict:
    """How the predicted groups came out: computed by one launch, or split over several; launches that hold several
    groups; and the launches of generated code and of library calls."""
    grouped = rows.dropna(subset=["group"])
    launches_per_group = grouped.groupby(["graph", "group"])["launch"].nunique()
    groups_per_launch = grouped.groupby(["graph", "launch"])["group"].nunique()
    launches = rows.drop_duplicates(["graph", "launch"])
    return {"predicted_groups": int(len(launches_per_group)), "groups_one_launch": int((launches_per_group == 1).sum()),
            "groups_split": int((launches_per_group > 1).sum()),
            "launches_fusing_groups": int((groups_per_launch > 1).sum()),
            "generated_kernels": int((~launches["library"]).sum()), "library_calls": int(launches["library"].sum())}


def split_groups(rows: pd.DataFrame, graphs: list[torch.fx.GraphModule], limit: int = 8) -> list[dict]:
    """The first ``limit`` groups computed by several launches: the group's operators and the launches."""
    ops = {(i, g.index): " + ".join(g.ops) for i, graph in enumerate(graphs) for g in fusion_rules.fuse_groups(graph)}
    launched: dict = defaultdict(list)
    for row in rows.dropna(subset=["group"]).itertuples():
        key = (row.graph, int(row.group))
        if f"{row.kernel} #{row.launch}" not in launched[key]:
            launched[key].append(f"{row.kernel} #{row.launch}")
    split = [(key, names) for key, names in launched.items() if len(names) > 1]
    return [{"group": ops[key], "launches": ", ".join(names)} for key, names in split[:limit]]
