#!/usr/bin/env bash
# Issue 50's live measurement: the new auto against the code before issue 50's package
# (bd30beb^, run by research.auto_check --old-auto in a worker subprocess from that commit's
# src, on a copy of the same curves and profile) in one rotation, with plain decoding and fixed
# chains.  Run ALONE, under the benchmark lock; smallest first.  Estimated on the 2-core AMD
# host from the earlier runs' per-run times: smoke ~1 min, llama.cpp ~8 min, PyTorch ~15 min.
# Peak memory: two copies of the pair (parent + worker), ~2x one process's.
set -uo pipefail
cd "$(dirname "$0")"
export OMP_NUM_THREADS=2
root=$(cd ../../.. && pwd)
py=$root/.venv/bin/python
git rev-parse --short HEAD > measure-commit.txt
run() {  # name, args...
  local name=$1
  shift
  (cd "$root" && ERSD_COST_STORE=$(mktemp -d) flock /tmp/ersd-bench.lock $py -m research.auto_check \
    "$@" --old-auto 'bd30beb^' --out "docs/results/auto-rules-2026-12-06/$name.json") \
    > "$name.log" 2>&1
  echo "$name rc $?"
}
# 0. smoke: the harness and the old checkout on the weight-free pair (seconds of work)
run smoke --target tiny-qwen2 --draft tiny-qwen2-draft --sets humaneval --per-set 1 --tokens 6 \
  --temperatures 0 --fixed chain:2
# 1. llama.cpp (issue: auto ÷ plain >= 0.98 with zero draft forwards; new not below old)
run llamacpp-new-old --backend llamacpp --threads 2 --tokens 96 --temperatures 0 1 \
  --per-set 1 --repeats 2
# 2. PyTorch, packed float32 <- int8 (issue: auto ÷ best fixed >= 0.95 per category mean)
run hf-new-old --backend hf --dtype float32 --draft-dtype int8 --profile-tokens 48 \
  --profile-prompts 2 --tokens 96 --temperatures 0 1 --per-set 1 --fixed chain:4 chain:8
