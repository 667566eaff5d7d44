# Sourced by scripts/setup.sh and scripts/setup-vllm.sh: `pip_install PYTHON ARGS...` runs
# `PYTHON -m pip install --quiet ARGS...`, tries again twice when pip fails (the package index is
# reached over a network that can drop a download), and on the third failure prints pip's output
# and returns pip's exit status, so that `set -e` stops the set-up there. A failed install is never
# passed over: a half-installed environment fails later, far from its cause (CI once ran vLLM's
# tests in a .venv-vllm whose dependencies had not installed: "No module named 'aiohttp'").
pip_install() {
  local py=$1 log try rc=0
  shift
  log=$(mktemp)
  for try in 1 2 3; do
    rc=0
    "$py" -m pip install --quiet --disable-pip-version-check "$@" \
      >"$log" 2>&1 || rc=$?
    if [[ $rc == 0 ]]; then
      grep -v "^WARNING: Location" "$log" || true
      rm -f "$log"
      return 0
    fi
    echo "pip install $* failed (exit $rc, try $try of 3)" >&2
    [[ $try == 3 ]] || sleep $((try * 15))
  done
  cat "$log" >&2
  rm -f "$log"
  return "$rc"
}
