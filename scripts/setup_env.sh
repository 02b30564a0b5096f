#!/usr/bin/env bash
# Create .venv (if missing), install the pinned requirements and then graphbook (editable) into it.
# Idempotent and quiet.
# Both README commands start here, so a fresh clone needs nothing installed by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 10) else 1)'; then
  echo "error: Python 3.10 or newer is needed (found $("$PY" --version 2>&1))" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# uv installs the pins: on a fresh machine it takes about a third of pip's time (40 s against 115 s on two cores),
# downloading and unpacking in parallel. pip installs uv itself, at the version requirements.txt pins.
.venv/bin/python -m pip install --quiet --disable-pip-version-check "$(grep -E '^uv==' requirements.txt | cut -d' ' -f1)"
# uv does not read pip's configuration (a private index, say): where uv fails, pip installs the same pins.
install() {
  .venv/bin/uv pip install --python .venv/bin/python --quiet --compile-bytecode "$@" && return
  echo "uv could not install ($*); installing with pip, which reads pip's configuration" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"
}
# torch is pinned to the CPU build's version; on a GPU lab machine install the CUDA build first
# (see README) and the installer keeps it because the version already satisfies the pin.
install -r requirements.txt
# The helper package graphbook (code/graphbook), editable, so that chapters, tests and scripts import it
# from any folder. --no-deps: requirements.txt above is the only dependency list. --no-build-isolation:
# setuptools is pinned there too, so this step needs no download.
install --no-deps --no-build-isolation -e .
# Optional real TVM (Chapter 3's referee of the fusion rules): its wheels exist for x86-64 Linux only, and the
# markers in requirements-tvm.txt skip it elsewhere; the chapter then says by code that TVM is absent.
# `-c requirements.txt` keeps every pin above as it is.
install -r requirements-tvm.txt -c requirements.txt
