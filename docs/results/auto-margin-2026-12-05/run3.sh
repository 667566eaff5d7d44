#!/usr/bin/env bash
# Maths over 256 tokens, 4 prompts, T = 0 and 1: the one category below 0.95 of the best fixed
# chain in run2 (0.926 at T = 0, n = 2; 0.947 at T = 1 pooled with auto-packed's run5, n = 3).
# Run alone, under the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > run3-commit.txt
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  research.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --sets math --per-set 4 --fixed chain:4 chain:8 --tokens 256 \
  --temperatures 0 1 --out hf-256-math.json > hf-256-math.log 2>&1
echo "hf-256-math rc $?"
