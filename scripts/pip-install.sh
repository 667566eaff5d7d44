# Sourced by scripts/setup.sh and scripts/setup-vllm.sh: `pip_install PYTHON ARGS...` runs
# `PYTHON -m pip install --quiet ARGS...`, tries again twice when pip fails (the package index is
# reached over a network that can drop a download), and on the third failure prints pip's output
# and returns pip's exit status, so that `set -e` stops the set-up there. A failed install is never
# passed over: a half-installed environment fails later, far from its cause (CI once ran vLLM's
# tests in a .venv-vllm whose dependencies had not installed: "No module named 'aiohttp'").
# A full disk is not retried: pip's error is printed with the free space of the filesystems it
# writes to (the environment's and TMPDIR's).
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
    if grep -q "No space left on device" "$log"; then
      cat "$log" >&2
      rm -f "$log"
      echo "pip ran out of disk space; free space where it writes:" >&2
      df -h "$(dirname "$(dirname "$py")")" "${TMPDIR:-/tmp}" >&2 || true
      return "$rc"
    fi
    [[ $try == 3 ]] || sleep $((try * 15))
  done
  cat "$log" >&2
  rm -f "$log"
  return "$rc"
}

# `need_disk WHAT GB PATH [GB PATH ...]`: stop with a one-line error, before anything is
# installed, when a filesystem has less free space than the GB (gigabytes) of the PATHs on it
# (each PATH or its nearest existing parent; PATHs on one filesystem add up); WHAT names what
# needs the space.
need_disk() {
  local what=$1 gb p avail mount
  shift
  local -A want=() free=()
  while (($# >= 2)); do
    gb=$1 p=$2
    shift 2
    while [[ ! -e "$p" ]]; do p=$(dirname "$p"); done
    read -r avail mount < <(df -Pk "$p" | awk 'NR == 2 { print $4, $6 }')
    want[$mount]=$((${want[$mount]:-0} + gb))
    free[$mount]=$avail
  done
  for mount in "${!want[@]}"; do
    if ((free[$mount] < want[$mount] * 1024 * 1024)); then
      echo "error: $what needs at least ${want[$mount]} GB free on $mount, which has" \
        "$((free[$mount] / 1024 / 1024)) GB free. Free some space there (or set TMPDIR, where" \
        "pip unpacks, to a folder on a larger disk)." >&2
      return 1
    fi
  done
}
