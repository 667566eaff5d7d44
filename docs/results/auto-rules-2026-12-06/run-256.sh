#!/usr/bin/env bash
# Issue 50's "same cells as the last measurement": auto-margin-2026-12-05's 256-token run (2
# prompts per category, T = 0 and 1, chain:4 and chain:8 fixed), now with the new auto against
# the code before issue 50 (`bd30beb^`, as auto-old) in one rotation.  Run alone, under the
# benchmark lock, with a fresh cost store.  About an hour on 2 cores for both temperatures;
# TEMPS=0 (or 1) runs one temperature (half the time) into hf-256-new-old-t$TEMPS.json.
#
# More prompts for some categories, without auto-old (the question there is auto against the
# best fixed chain), into hf-256-<sets>-t<TEMPS>.json:
#   SETS=grounded PER_SET=8 TEMPS=0 OLD= bash run-256.sh           # ~30 minutes
#   SETS="humaneval math" PER_SET=5 TEMPS=1 OLD= bash run-256.sh   # ~45 minutes
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
export PYTHONPATH=$(cd ../../.. && pwd)  # research.auto_check from the repository root
TEMPS=${TEMPS:-0 1}
SETS=${SETS:-humaneval mtbench math grounded}
PER_SET=${PER_SET:-2}
OLD=${OLD-bd30beb^}
if [ -n "$OLD" ]; then
  OUT=hf-256-new-old$([ "$TEMPS" = "0 1" ] && echo "" || echo "-t${TEMPS// /-}")
  COMMIT=run-256${OUT#hf-256-new-old}-commit.txt
  EXTRA=(--old-auto "$OLD")
else
  OUT=hf-256-${SETS// /-}-t${TEMPS// /-}
  COMMIT=$OUT-commit.txt
  EXTRA=()
fi
git rev-parse --short HEAD > "$COMMIT"
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  research.auto_check --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --sets $SETS --per-set "$PER_SET" --fixed chain:4 chain:8 --tokens 256 \
  --temperatures $TEMPS "${EXTRA[@]}" --out "$OUT.json" > "$OUT.log" 2>&1
echo "$OUT rc $?"
