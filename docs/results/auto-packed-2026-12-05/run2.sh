#!/usr/bin/env bash
# run2: the same matrix after the early plain step was gated (EXPLORE_PLAIN_DOUBT) and lost_share reported.
# issue 30 after the target's linears were packed for a tree (docs/results/packed-linears-2026-12-05):
# the 48-token matrix where MT-Bench missed (auto 0.85 of plain), now 3 prompts per category,
# T = 0 and 1, the control in the rotation, chain:8 among the fixed trees (a cheaper verification
# favours deeper trees), curves and the rank profile measured afresh as `ersd models calibrate`
# would.  Run alone, under the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > run2-commit.txt
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  ersd.bench.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --per-set 3 --control --fixed chain:4 chain:6 chain:8 --tokens 48 \
  --temperatures 0 1 --out hf-48-after.json > hf-48-after.log 2>&1
echo "hf-48-after rc $?"
