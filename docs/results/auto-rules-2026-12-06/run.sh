#!/usr/bin/env bash
# The rules replay (no models, ~8 min on 2 cores) against the library before the removals
# (commit.txt: the Rules fields it switches off were removed after it), and the decision-cost
# microbenchmark of the kept "cannot pay" verdict.  Run alone.
set -euo pipefail
cd "$(dirname "$0")"
old=$(mktemp -d)
git -C ../../.. archive "$(cat commit.txt)" src | tar -x -C "$old"
export OMP_NUM_THREADS=1 PYTHONPATH="$old/src"
../../../.venv/bin/python replay_rules.py > replay_rules.md
../../../.venv/bin/python recheck_cost.py > recheck_cost.txt
rm -rf "$old"
