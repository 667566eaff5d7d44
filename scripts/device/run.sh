#!/usr/bin/env bash
# GPU check (run on a lent CUDA machine from the repository root; see docs/gpu.md).
# Needs, in the carried folder .devcheck/whl, the transformers 5.24 wheel:
#   pip download --no-deps --only-binary=:all: -d .devcheck/whl transformers==5.24.0
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD
nvidia-smi -L
echo "== phase A: the machine's transformers, CPU adapter tests"
python3 -c "import transformers, torch; print(transformers.__version__, torch.__version__)"
timeout 150 python3 -m pytest tests/test_hf_adapter.py -q -m "not realmodel" -p no:cacheprovider -x 2>&1 | tail -25
echo "== phase B: transformers 5.24"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devcheck/whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
timeout 300 python3 scripts/device/gpu_check.py 2>&1 | grep -v "Loading weights" | tee "${OUT:-/tmp}/gpu_check.log"
