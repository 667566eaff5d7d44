#!/usr/bin/env bash
# run3: 96 tokens, 2 prompts per category, T = 0 and 1, the same configurations as run2.sh -- the
# longer requests that passed on the slower kernel, checked on the packed one.  Run alone, under
# the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > run3-commit.txt
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  ersd.bench.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --per-set 2 --control --fixed chain:4 chain:6 chain:8 --tokens 96 \
  --temperatures 0 1 --out hf-96.json > hf-96.log 2>&1
echo "hf-96 rc $?"
