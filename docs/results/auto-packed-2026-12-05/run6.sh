#!/usr/bin/env bash
# run6: batch 8 on the packed target (96 tokens, 2 prompts per category as one batch of 8 rows,
# T = 1 and 0, 3 repeats) -- the command auto-final-2026-12-05/run.sh ran on the plain layout.
# Run alone, under the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > run6-commit.txt
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  ersd.bench.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --tokens 96 --batch 8 --repeats 3 --temperatures 1 0 --per-set 2 \
  --fixed chain:4 --out hf-b8.json > hf-b8.log 2>&1
echo "hf-b8 rc $?"
