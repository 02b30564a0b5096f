"""Which eager operators each Inductor kernel holds, read from the compiler's own provenance record
(``INDUCTOR_PROVENANCE=1``), set beside the book's TVM-style groups (Chapter 3)."""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping

import pandas as pd
import torch

from graphbook.compilers import inductor_tools
from graphbook.config import THREADS
from graphbook.record import recording
from graphbook.teach import fusion_rules
from graphbook.teach.diagnostics import tlparse_command, traced_compile_log

#: The provenance page relative to the site root (``html_extra_path`` copies ``images/extra/``); a chapter
#: page links it as ``../tlparse_provenance/index.html``.
PROVENANCE_SITE_PATH = "tlparse_provenance/index.html"
#: A run's page sits beside its results file, ``<stem>.view/``: a sitting keeps it in its recording, and
#: ``scripts/publish_provenance_view.py`` copies the reference recording's to where the book serves it.
VIEW_SUFFIX = ".view"

# The child: BlurBall compiled by Inductor behind a backend that first notes each pre-grad node's operator
# and module (the mapping names nodes only), so the rows can say "stage2...se: mean".
_TRACE_SCRIPT = """\
import json, sys, torch
from torch._inductor.compile_fx import compile_fx
from graphbook.measure import warmup
from graphbook.model import blurball
from graphbook.teach.kernel_provenance import pre_grad_nodes
torch.set_num_threads({threads})
model = {model}
x = blurball.example_input(height={height}, width={width})
nodes = {{}}
def backend(gm, example_inputs):
    nodes.update(pre_grad_nodes(gm))
    return compile_fx(gm, example_inputs)
with torch.no_grad():
    torch.compile(model, backend=backend)(x)
json.dump(nodes, open(sys.argv[1], "w"))
"""


def pre_grad_nodes(graph: torch.fx.GraphModule) -> dict[str, dict]:
    """Pre-grad node -> its operator and the module it runs in."""
    table = {}
    for node in fusion_rules.compute_nodes(graph):
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        path = stack[-1][0] if stack else ""
        table[node.name] = {"op": fusion_rules.op_name(node, graph),
                            "module": path.removeprefix("L['self']").lstrip(".")}
    return table


#: The models a trace can compile: BlurBall for the book's record, a three-layer stand-in for a quick check.
TRACED_MODELS = {"blurball": "blurball.build_blurball()", "tiny": "warmup.tiny_clip_net()"}


def trace_blurball(*, height: int = 96, width: int = 160, threads: int = THREADS, timeout: float = 1800,
                   model: str = "blurball") -> dict:
    """Compile BlurBall (or ``model="tiny"``) in a fresh process with provenance on: ``{"mapping", "nodes", "page"}``.
    Caches are off: a cache hit would leave the trace without the mapping."""
    tlparse = tlparse_command()
    if tlparse is None:
        raise RuntimeError("tlparse is not installed (pip install tlparse; see requirements.txt)")
    with tempfile.TemporaryDirectory(prefix="graphbook-provenance-") as work:
        work = Path(work)
        script = _TRACE_SCRIPT.format(threads=threads, height=height, width=width, model=TRACED_MODELS[model])
        log = traced_compile_log(script, work / "trace", str(work / "nodes.json"), timeout=timeout,
                                 env={"INDUCTOR_PROVENANCE": "1", "OMP_NUM_THREADS": str(threads)})
        out = work / "tlparse"
        proc = subprocess.run([tlparse, str(log), "-o", str(out), "--inductor-provenance", "--overwrite",
                               "--no-browser"], capture_output=True, text=True, timeout=timeout)
        mappings = sorted(out.glob("*/inductor_provenance_tracking_node_mappings_*.json"))
        pages = [p for p in out.glob("provenance_tracking_*.html") if p.name != "provenance_tracking_-_-_-_-.html"]
        if proc.returncode != 0 or len(mappings) != 1 or len(pages) != 1:
            raise RuntimeError(f"expected one compiled frame's mapping and page, found {len(mappings)} and "
                               f"{len(pages)}: {(proc.stdout + proc.stderr)[-800:]}")
        return {"mapping": json.loads(mappings[0].read_text()),
                "nodes": json.loads((work / "nodes.json").read_text()), "page": pages[0].read_text()}


def provenance_rows(mapping: Mapping, nodes: Mapping[str, Mapping]) -> list[dict]:
    """One row per (kernel launch, post-grad node, pre-grad node), one too per post-grad node without origin."""
    code_to_post = next((v for k, v in mapping.items() if k.endswith("CodeToPost")), None)
    if code_to_post is None or "postToPre" not in mapping:
        raise ValueError(f"not an Inductor provenance mapping: keys {sorted(mapping)}")
    order = {name: i for i, name in enumerate(nodes)}   # the pre-grad graph's order: eager's
    rows = []
    for launch, post_nodes in code_to_post.items():
        kernel, _, handle = launch.rpartition(":")
        for post in sorted(post_nodes):
            for pre in mapping["postToPre"].get(post) or [""]:
                info = nodes.get(pre, {})
                rows.append({"kernel": kernel, "launch": int(handle), "post_grad_node": post, "pre_grad_node": pre,
                             "node_index": order.get(pre, -1), "op": info.get("op", ""), "module": info.get("module", "")})
    return sorted(rows, key=lambda r: (r["launch"], r["node_index"], r["post_grad_node"]))


def launches(source: str) -> list[str]:
    """The kernels the wrapper's ``call`` launches, in order, named as the mapping names them."""
    return [call[:-len("(...)")] for call in inductor_tools.call_sequence(source)]


def page_output_code(page: str) -> str:
    """The generated wrapper code in the right-hand pane of tlparse's provenance page."""
    match = re.search(r'<div id="generatedCode" class="editor">\s*<pre[^>]*>(.*?)</pre>', page, re.S)
    if match is None:
        raise ValueError("no generated code pane in this provenance page")
    return html.unescape(re.sub(r"<[^>]+>", "", match.group(1)))   # the pane is syntax-highlighted spans


def book_groups_by_node(model: torch.nn.Module, example: torch.Tensor) -> dict[str, fusion_rules.FusionGroup]:
    """Pre-grad node -> the book's fusion group, from the graph TorchDynamo hands Inductor (the mapping's names)."""
    with torch.no_grad():
        (graph,) = inductor_tools.dynamo_graphs(model, example)
    return {node: group for group in fusion_rules.fuse_groups(graph) for node in group.nodes}


def block_table(frame: pd.DataFrame, module: str,
                groups: Mapping[str, fusion_rules.FusionGroup] | None = None) -> pd.DataFrame:
    """One module's eager operators in order: post-grad nodes, launches computing them, the book's group if given."""
    inside = (frame["module"] == module) | frame["module"].str.startswith(module + ".")
    rows = frame[inside & (frame["pre_grad_node"] != "")]
    if rows.empty:
        raise ValueError(f"no traced operator in module {module!r}")
    table = []
    for pre, ops in rows.sort_values(["node_index", "launch"]).groupby("pre_grad_node", sort=False):
        where = ops["module"].iloc[0].removeprefix(module).lstrip(".") or "(block)"
        post = list(dict.fromkeys(ops["post_grad_node"]))
        entry = {"eager operator": f"{where}: {ops['op'].iloc[0]}", "pre-grad node": pre,
                 "post-grad nodes": ", ".join(post[:3]) + (f" +{len(post) - 3} more" if len(post) > 3 else ""),
                 "Inductor kernels": ", ".join(dict.fromkeys(f"{k} #{n}" for k, n in zip(ops["kernel"], ops["launch"])))}
        if groups is not None:
            group = groups.get(pre)
            entry["book group"] = f"{group.index}: {' + '.join(group.ops)}" if group else "-"
        table.append(entry)
    return pd.DataFrame(table)


def fusion_differences(table: pd.DataFrame) -> list[dict]:
    """Launches holding several book groups (Inductor fused more) and book groups spread over several launches."""
    pairs = [(kernel, row["book group"], row["eager operator"]) for _, row in table.iterrows()
             for kernel in row["Inductor kernels"].split(", ")]
    found = []
    for side, key, other in (("Inductor fused, the book splits", 0, 1), ("the book fuses, Inductor splits", 1, 0)):
        for name in dict.fromkeys(p[key] for p in pairs):
            across = sorted({p[other] for p in pairs if p[key] == name})
            if len(across) > 1:
                found.append({"difference": side, "where": name, "across": "; ".join(across),
                              "operators": ", ".join(dict.fromkeys(p[2] for p in pairs if p[key] == name))})
    return found


def publish_page(page: str, out_dir: str | Path, record: Mapping) -> Path:
    """Write the page as ``out_dir/index.html`` (replacing the folder) with ``provenance.json`` beside it."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    (out_dir / "index.html").write_text(page)
    (out_dir / "provenance.json").write_text(json.dumps(dict(record), indent=1) + "\n")
    return out_dir / "index.html"


def untraced_launches(frame: pd.DataFrame, source: str) -> list[str]:
    """The wrapper's launches (``name #k``) the rows trace to no eager operator, or under another kernel's name."""
    traced = {(k, n) for k, n, pre in zip(frame["kernel"], frame["launch"], frame["pre_grad_node"]) if pre}
    return [f"{name} #{k}" for k, name in enumerate(launches(source), start=1) if (name, k) not in traced]


def recorded_view(found: recording.Recording) -> Path | None:
    """The provenance page a recording's kernel-provenance run wrote beside its results file, or None (the
    reference recorded before the page was kept in the recording wrote it straight into the book's folder)."""
    views = [found.folder / Path(entry["file"]).with_suffix(VIEW_SUFFIX) for entry in found.manifest["files"]
             if entry["kind"] == "kernel-provenance"]
    return next((view for view in reversed(views) if (view / "index.html").is_file()), None)
