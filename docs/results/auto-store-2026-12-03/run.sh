#!/bin/bash
# The commands behind docs/results/auto-store-2026-12-03 (run while holding
# /tmp/ersd-bench.lock). A first attempt with --threads 2 / OMP_NUM_THREADS=2, 96 tokens and 2
# prompts per category was aborted after one run (0.9 tokens/s: the machine was loaded by jobs
# running without the lock).
cd "$(dirname "$0")/../../.."
export PYTHONPATH=src
OUT=docs/results/auto-store-2026-12-03
# llama.cpp, exact policy: llamacpp.json / llamacpp.log
OMP_NUM_THREADS=1 timeout 780 python -m ersd.bench.auto_check --backend llamacpp --threads 1 \
  --tokens 48 --temperatures 0 1 --per-set 1 --out $OUT/llamacpp.json > $OUT/llamacpp.log 2>&1
# (then `ersd models calibrate --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --dtype
#  float32 --draft-dtype int8 --temperatures 1 --tokens 48 --prompts 1` under `timeout 150`:
#  it timed out while loading the weights on the loaded machine; nothing was stored)
# PyTorch without a stored profile: killed after 1.5 prompts, its rows are hf-noprofile.log
OMP_NUM_THREADS=1 timeout 1080 python -m ersd.bench.auto_check --backend hf --draft-dtype int8 \
  --tokens 48 --temperatures 1 --per-set 1 --fixed chain:4 chain:6 --out $OUT/hf.json > $OUT/hf-noprofile.log 2>&1
# PyTorch with the pair's profile stored first: hf.json / hf.log
OMP_NUM_THREADS=1 timeout 900 python -m ersd.bench.auto_check --backend hf --draft-dtype int8 \
  --tokens 48 --temperatures 1 --sets humaneval mtbench --per-set 1 --fixed chain:4 \
  --profile-tokens 32 --out $OUT/hf.json > $OUT/hf.log 2>&1
