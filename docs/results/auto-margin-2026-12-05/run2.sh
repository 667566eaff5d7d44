#!/usr/bin/env bash
# 256 tokens with 2 prompts per category (the last 256-token run, auto-packed-2026-12-05/run5.sh,
# had one per category: single cells from 0.846 to 1.132 of the best fixed chain), T = 0 and 1,
# fixed chain:4 and chain:8 as then.  Run alone, under the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > run2-commit.txt
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  research.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --per-set 2 --fixed chain:4 chain:8 --tokens 256 \
  --temperatures 0 1 --out hf-256-2.json > hf-256-2.log 2>&1
echo "hf-256-2 rc $?"
