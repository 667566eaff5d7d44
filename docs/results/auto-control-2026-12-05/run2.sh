#!/usr/bin/env bash
# issue 30: the three PyTorch cells below 0.95 of the best fixed tree (or 0.98 of plain) in
# ../auto-final-2026-12-05 (n = 2 prompts each) rerun with 6 prompts (those 2 and the next 4 of
# the set), the same pair and settings, with the control (a second plain) in the rotation.
# Chosen because they missed: read them as a re-test of those cells, not as a fresh sample of
# the matrix.  Run alone, under the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
py=../../../.venv/bin/python
run() {  # name, args...
  local name=$1; shift
  ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock \
    $py -m ersd.bench.auto_check "$@" --out "$name.json" > "$name.log" 2>&1
  echo "$name rc $?"
}
hf=(--backend hf --dtype float32 --draft-dtype int8 --profile-tokens 32 --per-set 6 --control
    --fixed chain:4 chain:6)
run hf-math-96-t1 "${hf[@]}" --sets math --tokens 96 --temperatures 1
run hf-humaneval-48-t0 "${hf[@]}" --sets humaneval --tokens 48 --temperatures 0
run hf-mtbench-48-t1 "${hf[@]}" --sets mtbench --tokens 48 --temperatures 1
