#!/usr/bin/env bash
# issue 30: auto's loop cost on llama.cpp (zero draft forwards) after the candidates are kept
# between plain steps (commit.txt: after.txt) -- the control run again, one prompt a category,
# 3 repeats.  Run alone, under the benchmark lock.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > after.txt
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  ersd.bench.auto_check --backend llamacpp --threads 2 --tokens 96 --temperatures 0 1 \
  --per-set 1 --repeats 3 --control --out llamacpp-after.json > llamacpp-after.log 2>&1
echo "llamacpp-after rc $?"
