#!/usr/bin/env bash
# Move the lock: resolve pyproject.toml's dependencies (the dev extras included) again,
# write requirements.lock (exact versions and sha256 hashes), reinstall from it and run
# the suite. `make lock` runs this; commit requirements.lock only when the suite passes.
#   bash scripts/lock.sh [--keep] [--no-test]
# --keep: keep every pin of the current lock and only resolve what pyproject.toml added
# (pip-compile prefers the pins already in its output file).
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0 test=1
for arg in "$@"; do
  case "$arg" in
    --keep) keep=1 ;;
    --no-test) test=0 ;;
    *) echo "lock: unknown option $arg (use --keep, --no-test)" >&2; exit 2 ;;
  esac
done
PIP_TOOLS_VERSION=7.6.2
log() { echo "lock: $*" >&2; }
# The lock is resolved as a user's machine would: pip sees PyPI only (no local wheel
# directories, constraints or config files of this machine), so that every hash in it is
# PyPI's own and holds on any machine.
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_CONSTRAINT PIP_EXTRA_INDEX_URL PIP_INDEX_URL
tools=$(mktemp -d /tmp/lightpipe-lock.XXXXXX)
trap 'rm -rf "$tools"' EXIT
"${PYTHON:-python3}" -m venv "$tools/venv"
"$tools/venv/bin/pip" install -q "pip-tools==$PIP_TOOLS_VERSION"
if [ "$keep" = 1 ]; then cp requirements.lock "$tools/raw.lock"; fi
log "resolving (pip-compile --generate-hashes; a few minutes)"
"$tools/venv/bin/pip-compile" -q --generate-hashes --allow-unsafe --extra dev --strip-extras \
  --no-emit-index-url --no-emit-find-links --no-header \
  -o "$tools/raw.lock" pyproject.toml
# Markers back onto their pins (and onto what only marked pins need), torch and its CUDA
# libraries out, LightPipe itself out (installed editable): scripts/lock_markers.py.
"$tools/venv/bin/python" scripts/lock_markers.py "$tools/raw.lock" requirements.lock.tmp pyproject.toml
# One lock for every supported Python (3.11, 3.12, 3.13): each one found here must install
# all of it, for real (a dry run builds nothing: it passed gnpy's oopt-gnpy-libyang on 3.13,
# which has no wheel there and does not build); markers such as gnpy's decide per Python.
for minor in 11 12 13; do
  py="$(bash scripts/find_python.sh "3.$minor" 2>/dev/null)" || { log "no Python 3.$minor here: not checked"; continue; }
  "$py" -m venv "$tools/check-3.$minor"
  "$tools/check-3.$minor/bin/pip" install -q --upgrade pip
  if ! "$tools/check-3.$minor/bin/pip" install -q --no-deps --require-hashes \
      -r requirements.lock.tmp >"$tools/check.log" 2>&1; then
    tail -n 5 "$tools/check.log" >&2
    log "requirements.lock does not install on Python 3.$minor ($py): not kept"; rm -f requirements.lock.tmp; exit 1
  fi
  log "Python 3.$minor ($py): the lock installs"
  rm -rf "$tools/check-3.$minor"
done
mv requirements.lock.tmp requirements.lock
log "wrote requirements.lock ($(grep -c '==' requirements.lock) packages)"
rm -f .venv/.lightpipe-setup*
if [ "$test" = 1 ]; then
  make test
fi
