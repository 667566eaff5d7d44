#!/usr/bin/env bash
# issue 30: in llamacpp-control, auto ran at 0.96-0.98 of plain on all 4 grounded (editing)
# runs while the control (plain-b) ran at 0.995-1.025 there.  The grounded prompts again, with
# 5 repeats, to see whether that is auto or the machine.  Run alone, under the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  ersd.bench.auto_check --backend llamacpp --threads 2 --tokens 96 --temperatures 0 1 \
  --sets grounded --per-set 2 --repeats 5 --control --out llamacpp-grounded.json \
  > llamacpp-grounded.log 2>&1
echo "llamacpp-grounded rc $?"
