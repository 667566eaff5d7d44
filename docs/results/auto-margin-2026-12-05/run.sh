#!/usr/bin/env bash
# Issue 30's two open cells on the packed float32 target <- int8 draft, run alone under the
# benchmark lock: (1) HumanEval at T = 0 over 96 tokens with 12 prompts (the last run had 5:
# 0.927 [0.807, 1.046] of chain:6), with a control target-only run in the rotation; (2) batch 8
# at T = 1 with the batch start margin (BATCH_START_MARGIN), 4 repeats, with the control.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > commit.txt
run() {
  local name=$1
  shift
  ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
    research.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
    --profile-prompts 2 "$@" --out "$name.json" > "$name.log" 2>&1
  echo "$name rc $?"
}
run hf-96-humaneval-12 --sets humaneval --per-set 12 --control --fixed chain:4 chain:6 chain:8 \
  --tokens 96 --temperatures 0
run hf-b8-t1 --tokens 96 --batch 8 --repeats 4 --temperatures 1 --per-set 2 --control
