#!/usr/bin/env bash
# Re-record every CPU benchmark the chapters show as "recorded" (each run writes a new file under
# data/results/ through graphbook.results.write_run, never touching an existing one). Run it on a
# quiet machine: about half an hour on two cores. A benchmark that finds a variant disagreeing with
# eager exits 1; the others still run, and this script exits 1 at the end naming it.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh || exit 2
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
run code/bench_int8.py
run code/bench_ablation.py
run code/bench_compile_cache.py --server
if [ ${#failed[@]} -gt 0 ]; then
  echo "benchmarks that reported a problem (see above): ${failed[*]}" >&2
  exit 1
fi
