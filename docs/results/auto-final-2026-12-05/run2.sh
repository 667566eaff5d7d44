#!/usr/bin/env bash
# llama.cpp again with 3 repeats per configuration (medians): the single runs of run.sh vary as
# much between two plain runs of the same work as between auto and plain
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock ../../../.venv/bin/python -m \
  ersd.bench.auto_check --backend llamacpp --threads 2 --tokens 96 --temperatures 0 1 \
  --per-set 2 --repeats 3 --fixed chain:4 --out llamacpp-96-r3.json > llamacpp-96-r3.log 2>&1
echo "llamacpp-96-r3 rc $?"
