#!/usr/bin/env bash
# Run the test suite on a fresh machine: set up (.venv, torch CPU, ersd with its extras,
# llama-cpp-python, SmolLM2 weights), then pytest on 2 workers, without the slow tests; then the
# vLLM plugin's tests in their own environment (.venv-vllm, scripts/setup-vllm.sh).
# Extra arguments go to the first pytest run.
#
#   bash scripts/test.sh                 # the suite (pytest -n 2; slow tests deselected) + vLLM
#   ERSD_VLLM_TESTS=0 bash scripts/test.sh tests/test_cli_errors.py -x   # a narrow run
#   bash scripts/test.sh --slow          # only the slow tests on the real Qwen pair: installs and
#                                        # prepares Qwen2.5-Coder 1.5B + 0.5B, runs them in ONE
#                                        # process (they load ~8 GB; two workers would load 16)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--slow" ]]; then
  shift
  bash scripts/setup.sh --llamacpp smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b
  # shellcheck disable=SC1091
  . .venv/bin/activate
  ersd models prepare --quiet --no-verify qwen2.5-coder-0.5b qwen2.5-coder-1.5b
  exec python -m pytest -n 0 -m slow "$@"
fi
# the llama.cpp backend's tests run too (ERSD_REQUIRE_LLAMACPP makes them fail, never skip, if
# the extra is missing); its first install compiles llama.cpp (~7 min), later ones use a cache
bash scripts/setup.sh --llamacpp smollm2-135m
export ERSD_REQUIRE_LLAMACPP=${ERSD_REQUIRE_LLAMACPP:-1}
# shellcheck disable=SC1091
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python -m pytest -n 2 -m "not slow" --ignore=tests/test_vllm.py --ignore=tests/test_vllm_watermark.py \
  --ignore=tests/test_vllm_watermark_baselines.py "$@"
if [[ "${ERSD_VLLM_TESTS:-1}" != "0" ]]; then
  bash scripts/setup-vllm.sh
  ERSD_REQUIRE_VLLM=1 .venv-vllm/bin/python -m pytest -p no:cacheprovider tests/test_vllm.py \
    tests/test_vllm_watermark.py tests/test_vllm_watermark_baselines.py
fi
