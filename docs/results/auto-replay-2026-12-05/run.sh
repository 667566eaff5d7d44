#!/usr/bin/env bash
# The agreement data (the models, ~10 min), then the replay (no models, ~3 min).  Run alone.
set -euo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
git rev-parse --short HEAD > commit.txt
flock /tmp/ersd-bench.lock ../../../.venv/bin/python agreement.py 5 128 agree-128.json > agreement.log 2>&1
../../../.venv/bin/python replay.py agree-128.json > replay.md
../../../.venv/bin/python runlength.py agree-128.json > runlength.md
