#!/usr/bin/env bash
# run4: HumanEval at T = 0 over 96 tokens, 5 prompts -- the one cell run3.sh left below 0.95 of
# the best fixed tree with n = 2 (0.865 of chain:8).  Run alone, under the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > run4-commit.txt
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  ersd.bench.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --sets humaneval --per-set 5 --control --fixed chain:4 chain:6 chain:8 \
  --tokens 96 --temperatures 0 --out hf-96-humaneval.json > hf-96-humaneval.log 2>&1
echo "hf-96-humaneval rc $?"
