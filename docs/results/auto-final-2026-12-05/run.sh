#!/usr/bin/env bash
# issue 30, the closing measurement on main (see README.md), on a 2-core AMD EPYC (AVX2 only):
# the pair demo.sh runs here (float32 target with prepacked linears, int8 draft). Run alone,
# one job at a time under the benchmark lock.
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
hf=(--backend hf --dtype float32 --draft-dtype int8 --profile-tokens 32)
run hf-96 "${hf[@]}" --tokens 96 --temperatures 0 1 --per-set 2 --fixed chain:4 chain:6
run llamacpp-96 --backend llamacpp --threads 2 --tokens 96 --temperatures 0 1 --per-set 2 \
  --fixed chain:4
run hf-b8 "${hf[@]}" --tokens 96 --batch 8 --repeats 3 --temperatures 1 0 --per-set 2 \
  --fixed chain:4
run hf-48 "${hf[@]}" --tokens 48 --temperatures 0 1 --per-set 2 --fixed chain:4 chain:6
