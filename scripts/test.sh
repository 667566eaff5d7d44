#!/usr/bin/env bash
# Run the test suite on a fresh machine: set up (.venv, torch CPU, ersd, SmolLM2 weights), then
# pytest on 2 workers. Extra arguments go to pytest (e.g. -m slow for the Qwen tests).
# Then the vLLM plugin's tests in their own environment (.venv-vllm, scripts/setup-vllm.sh);
# ERSD_VLLM_TESTS=0 leaves them out (e.g. when passing pytest arguments for a narrow run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh smollm2-135m
# shellcheck disable=SC1091
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python -m pytest -n 2 -m "not slow" --ignore=tests/test_vllm.py "$@"
if [[ "${ERSD_VLLM_TESTS:-1}" != "0" ]]; then
  bash scripts/setup-vllm.sh
  ERSD_REQUIRE_VLLM=1 .venv-vllm/bin/python -m pytest -p no:cacheprovider tests/test_vllm.py
fi
