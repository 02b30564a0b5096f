"""Find the freezing miscompile the way compiler engineers do: CompilerBisector, then the minifier."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch
from torch._inductor.compiler_bisector import CompilerBisector

from graphbook.compilers import inductor_tools
from graphbook.freezing import miscompile
from graphbook.measure import environment
from graphbook.record import results
from graphbook.record.cli import add_threads, int_at_least, make_parser, multiple_of_8
from graphbook import checks


def parse_args(argv=None):
    parser = make_parser("bisect_freezing.py", __doc__.splitlines()[0])
    parser.add_argument("--model", choices=["blurball", "repro"], default="blurball",
                        help="BlurBall (seeded weights) or the reproducer's small module")
    parser.add_argument("--height", type=multiple_of_8, default=32, help="BlurBall input height (default 32)")
    parser.add_argument("--width", type=multiple_of_8, default=64, help="BlurBall input width (default 64)")
    add_threads(parser)
    parser.add_argument("--minifier-timeout", type=int_at_least(0), default=300,
                        help="seconds for the accuracy minifier; 0 skips it (default 300)")
    parser.add_argument("--skip-bisector", action="store_true", help="run only the minifier")
    return parser.parse_args(argv)


def run_bisector(model, inputs) -> dict:
    """CompilerBisector on "compiled with freezing == eager"; returns what it named and how long it took."""
    with torch.no_grad():
        reference = model(*inputs)
    calls = {"n": 0}

    def check() -> bool:
        calls["n"] += 1
        torch._dynamo.reset()
        with inductor_tools.freezing():
            output = torch.compile(model)(*inputs)
        verdict = checks.compare_to_reference(output, reference)
        print(f"  bisector check {calls['n']}: max abs diff {verdict['max_abs_diff']:.3g}", flush=True)
        return bool(verdict["same_output"])

    start = time.perf_counter()
    found = CompilerBisector.do_bisect(check)
    seconds = time.perf_counter() - start
    return {"tool": "CompilerBisector", "status": "found" if found else "nothing found",
            "backend": getattr(found, "backend", ""), "subsystem": getattr(found, "subsystem", "") or "",
            "bisect_number": getattr(found, "bisect_number", "") if found else "",
            "debug_info": (getattr(found, "debug_info", "") or "")[:2000].replace("\n", " | "),
            "compiles": calls["n"], "seconds": round(seconds, 1)}


# The minifier's process: graphbook is installed (pyproject.toml), so no path set-up is needed.
_MINIFIER_SCRIPT = textwrap.dedent("""
    import torch
    from graphbook.compilers import inductor_tools
    from graphbook.freezing import miscompile
    model, inputs = miscompile.check_model({model!r}, {height}, {width})
    torch.set_num_threads({threads})
    with inductor_tools.freezing():
        torch.compile(model)(*inputs)
""")


def run_minifier(args) -> dict:
    """The accuracy minifier in a fresh process with a time limit; what it reported and wrote."""
    if args.minifier_timeout == 0:
        return {"tool": "accuracy minifier", "status": "skipped (--minifier-timeout 0)"}
    workdir = Path(tempfile.mkdtemp(prefix="graphbook-minifier-"))
    script = workdir / "compile_frozen.py"
    script.write_text(_MINIFIER_SCRIPT.format(model=args.model, height=args.height,
                                              width=args.width, threads=args.threads))
    env = {**os.environ, "TORCHDYNAMO_REPRO_AFTER": "aot", "TORCHDYNAMO_REPRO_LEVEL": "4"}
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(script)], cwd=workdir, env=env, capture_output=True,
                              text=True, timeout=args.minifier_timeout)
        status, tail = f"exit {proc.returncode}", (proc.stdout + proc.stderr)[-20000:]
    except subprocess.TimeoutExpired as expired:
        out = (expired.stdout or b"") + (expired.stderr or b"")  # bytes, whatever text= said
        status = f"timed out after {args.minifier_timeout} s"
        tail = (out.decode(errors="replace") if isinstance(out, bytes) else out)[-20000:]
    seconds = time.perf_counter() - start
    (workdir / "minifier_output.txt").write_text(tail)
    repros = sorted(workdir.rglob("repro.py")) + sorted(workdir.rglob("minifier_launcher.py"))
    lines = [line.strip() for line in tail.splitlines()
             if line.strip() and not line.startswith((" ", "Traceback"))]  # messages, not stack frames
    errors = [line.strip() for line in tail.splitlines()
              if re.match(r"^[A-Za-z_.]*(Error|Exception)\b.*:", line.strip())]
    if errors:  # e.g. the minifier's own deepcopy of the frozen graph failing on oneDNN's opaque tensors
        status = f"minifier failed ({status}): {errors[-1][:200]}"
    return {"tool": "accuracy minifier (REPRO_AFTER=aot, LEVEL=4)", "status": status,
            "seconds": round(seconds, 1), "files_written": ";".join(str(p.relative_to(workdir)) for p in repros),
            "repro_lines": sum(len(p.read_text().splitlines()) for p in repros[:1]),
            "debug_info": " | ".join(lines[-8:])[:2000], "workdir": str(workdir)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    torch.set_num_threads(args.threads)
    model, inputs = miscompile.check_model(args.model, args.height, args.width)
    rows = []
    if not args.skip_bisector:
        print("CompilerBisector ...", flush=True)
        rows.append(run_bisector(model, inputs))
        print(rows[-1], flush=True)
    print("accuracy minifier ...", flush=True)
    rows.append(run_minifier(args))
    print({k: v for k, v in rows[-1].items() if k != "debug_info"}, flush=True)
    shape = "x".join(str(s) for s in inputs[0].shape)
    for row in rows:
        row.update({"model": args.model, "input_shape": shape})
    path = results.write_run("freezing-bisect", rows, environment.fingerprint(args.threads),
                             results_dir=args.results_dir)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
