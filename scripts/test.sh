#!/usr/bin/env bash
# Run the test suite on a fresh machine: set up (.venv, torch CPU, ersd, SmolLM2 weights), then
# pytest on 2 workers. Extra arguments go to pytest (e.g. -m slow for the Qwen tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh smollm2-135m
# shellcheck disable=SC1091
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python -m pytest -n 2 -m "not slow" "$@"
