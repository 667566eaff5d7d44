#!/usr/bin/env bash
# Issue 50's "same cells as the last measurement": auto-margin-2026-12-05's 256-token run (2
# prompts per category, T = 0 and 1, chain:4 and chain:8 fixed), now with the new auto against
# the code before issue 50 (`bd30beb^`, as auto-old) in one rotation.  Run alone, under the
# benchmark lock, with a fresh cost store.  About an hour on 2 cores for both temperatures;
# TEMPS=0 (or 1) runs one temperature (half the time) into hf-256-new-old-t$TEMPS.json.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
export PYTHONPATH=$(cd ../../.. && pwd)  # research.auto_check from the repository root
TEMPS=${TEMPS:-0 1}
SUFFIX=$([ "$TEMPS" = "0 1" ] && echo "" || echo "-t${TEMPS// /-}")
git rev-parse --short HEAD > run-256${SUFFIX}-commit.txt
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  research.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --per-set 2 --fixed chain:4 chain:8 --tokens 256 \
  --temperatures $TEMPS --old-auto 'bd30beb^' --out hf-256-new-old$SUFFIX.json \
  > hf-256-new-old$SUFFIX.log 2>&1
echo "hf-256-new-old$SUFFIX rc $?"
