#!/usr/bin/env bash
# issue 30: is llama.cpp auto (zero draft forwards: the curve says drafting cannot pay) slower
# than target-only decoding, or is that the machine?  A second plain configuration (plain-b,
# --control) in the same rotation gives the noise on identical work; the per-token split gives
# auto's own loop cost apart from the forwards.  Run alone, under the benchmark lock.
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
run llamacpp-control --backend llamacpp --threads 2 --tokens 96 --temperatures 0 1 \
  --per-set 2 --repeats 3 --control
