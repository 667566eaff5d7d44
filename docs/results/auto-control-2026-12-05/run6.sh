#!/usr/bin/env bash
# issue 30: the 48-token matrix (4 categories x 2 prompts, T = 0 and 1) with the stored profile
# as `ersd models calibrate` makes it by default (2 prompts x 48 tokens), the control in the
# rotation -- the calibration that fixed MT-Bench must not cost the categories where drafting
# pays.  Run alone, under the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > run6-commit.txt
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  ersd.bench.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --per-set 2 --control --fixed chain:4 chain:6 --tokens 48 \
  --temperatures 0 1 --out hf-48-calib2.json > hf-48-calib2.log 2>&1
echo "hf-48-calib2 rc $?"
