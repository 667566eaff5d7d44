#!/usr/bin/env bash
# issue 30: MT-Bench at T = 1, 48 tokens, again (hf-mtbench-48-t1: auto 0.874 of plain), with
# the stored rank profile as `ersd models calibrate` makes it by default (2 calibration prompts,
# code and chat, 48 tokens each) instead of the benchmark's old one code prompt of 32 tokens.
# Run alone, under the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > run5-commit.txt
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  ersd.bench.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --per-set 6 --control --fixed chain:4 chain:6 --sets mtbench --tokens 48 \
  --temperatures 1 --out hf-mtbench-48-t1-calib2.json > hf-mtbench-48-t1-calib2.log 2>&1
echo "hf-mtbench-48-t1-calib2 rc $?"
