#!/usr/bin/env bash
# run5: 256 tokens, 1 prompt per category, T = 0 and 1 -- the long requests, not yet measured on
# the packed target.  Run alone, under the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > run5-commit.txt
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  ersd.bench.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --per-set 1 --control --fixed chain:4 chain:8 --tokens 256 \
  --temperatures 0 1 --out hf-256.json > hf-256.log 2>&1
echo "hf-256 rc $?"
