#!/bin/bash
# issue 30 benchmarks, run alone under the shared lock (one process per backend); every step is
# cut at 15:57 UTC (the deadline of the session that ran them)
cd /work/wt30
export PYTHONPATH=/work/wt30/src
OUT=docs/results/auto-store-2026-12-03
left() { local l=$(( $(date -u -d "15:57" +%s) - $(date -u +%s) )); [ $l -lt $1 ] && echo $l || echo $1; }
date -u
OMP_NUM_THREADS=2 timeout $(left 600) /work/main/.venv/bin/python -m ersd.bench.auto_check --backend llamacpp --threads 2 \
  --tokens 96 --temperatures 0 1 --per-set 2 --out $OUT/llamacpp.json > $OUT/llamacpp.log 2>&1
date -u
OMP_NUM_THREADS=2 timeout $(left 300) /work/main/.venv/bin/python -c "from ersd.cli import main; main()" models calibrate \
  --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --dtype float32 --draft-dtype int8 \
  --temperatures 0,1 --tokens 48 --prompts 2 > $OUT/hf-calibrate.log 2>&1
date -u
OMP_NUM_THREADS=2 timeout $(left 720) /work/main/.venv/bin/python -m ersd.bench.auto_check --backend hf --draft-dtype int8 \
  --tokens 48 --temperatures 0 1 --per-set 1 --fixed chain:4 chain:6 --out $OUT/hf.json > $OUT/hf.log 2>&1
date -u
