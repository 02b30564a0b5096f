#!/usr/bin/env bash
# Re-record every CPU benchmark the chapters show as "recorded" (each run writes a new file under
# data/results/ through graphbook.results.write_run, never touching an existing one). 03_fusion.py,
# bench_blurball_cpu.py, bench_onnxruntime.py and bench_ablation.py each build their variants once and
# then record 3 independent runs per invocation (--runs, default and minimum 3; the order of the
# variants rotates between runs, each run has its own copy_ bandwidth probe and run_id <file>/r<k>),
# so the chapters decide on medians across runs; bench_int8.py records one run per call and runs three times.
# Run it on a quiet machine: on a 2-core AMD EPYC (family 26 model 2, Zen 5) the whole script took about 40
# minutes, 16 of them the restart paths and server starts (3 fresh processes per path, cold compiles
# included); a first run on a new machine compiles for several minutes more. A benchmark that
# finds a variant disagreeing with eager exits 1; the others still run, and this script exits 1 at the
# end naming it.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh || exit 2
bash scripts/setup_web.sh || exit 2    # onnxruntime-web and the exported models for bench_browser_ort
PY=.venv/bin/python
failed=()
run() {
  echo "== $*"
  local start=$(date +%s)
  "$PY" "$@" || failed+=("$1")
  echo "   ($(( $(date +%s) - start )) s)"
}
run code/03_fusion.py
run code/bench_blurball_cpu.py
run code/bench_onnxruntime.py
for _ in 1 2 3; do run code/bench_int8.py; done   # one timed run per call; the book decides on three
run code/bench_ablation.py
run code/bench_attribution.py          # the causes of the compile speed-up (about five minutes at 288x512)
run code/bench_restart_paths.py
run code/bench_serving_load.py
run code/bench_browser_ort.py           # Chapter 4's WASM/native ratio (headless Chromium, about 2 minutes)
run code/bench_litserve.py
run code/bench_litserve.py --faults --max-queue 16   # the same hostile clients against both servers
if [ ${#failed[@]} -gt 0 ]; then
  echo "benchmarks that reported a problem (see above): ${failed[*]}" >&2
  exit 1
fi
