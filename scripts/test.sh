#!/usr/bin/env bash
# Run the test suite on a fresh machine: set up (.venv, torch CPU, ersd, llama-cpp-python, SmolLM2
# weights), then pytest on 2 workers. Extra arguments go to pytest (e.g. -m slow for the Qwen tests).
set -euo pipefail
cd "$(dirname "$0")/.."
# the llama.cpp backend's tests run too (ERSD_REQUIRE_LLAMACPP makes them fail, never skip, if
# the extra is missing); its first install compiles llama.cpp (~7 min), later ones use a cache
bash scripts/setup.sh --llamacpp smollm2-135m
export ERSD_REQUIRE_LLAMACPP=${ERSD_REQUIRE_LLAMACPP:-1}
# shellcheck disable=SC1091
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python -m pytest -n 2 -m "not slow" "$@"
