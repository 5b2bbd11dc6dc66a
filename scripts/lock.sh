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
# pip-compile resolves for the Python it runs on (gnpy is 3.11/3.12's only, webob's
# legacy-cgi 3.13's only): so once per supported Python, 3.12 and 3.13 seeded with 3.11's pins
# (pip-compile keeps the pins of its output file where they hold), then one lock with a
# marker on each pin that not every Python needs (scripts/lock_markers.py).
PYS=(3.11 3.12 3.13)
compile_for() {  # compile_for 3.X: $tools/raw-3.X.lock
  local v="$1" py
  py="$(bash scripts/find_python.sh "$v")" ||
    { log "no Python $v here: the lock is for 3.11, 3.12 and 3.13 (e.g. pyenv install $v)"; return 2; }
  "$py" -m venv "$tools/venv-$v"
  "$tools/venv-$v/bin/pip" install -q "pip-tools==$PIP_TOOLS_VERSION"
  "$tools/venv-$v/bin/pip-compile" -q --generate-hashes --allow-unsafe --extra dev --strip-extras \
    --no-emit-index-url --no-emit-find-links --no-header \
    -o "$tools/raw-$v.lock" pyproject.toml 2>"$tools/compile-$v.log" ||
    { tail -n 20 "$tools/compile-$v.log" >&2; log "pip-compile on Python $v failed"; return 1; }
  log "resolved for Python $v"
}
if [ "$keep" = 1 ]; then cp requirements.lock "$tools/raw-3.11.lock"; fi
log "resolving (pip-compile --generate-hashes, once per Python; a few minutes)"
compile_for 3.11
cp "$tools/raw-3.11.lock" "$tools/raw-3.12.lock"
cp "$tools/raw-3.11.lock" "$tools/raw-3.13.lock"
pids=()
for v in 3.12 3.13; do compile_for "$v" & pids+=("$!"); done
for pid in "${pids[@]}"; do wait "$pid"; done
merge_args=()
for v in "${PYS[@]}"; do merge_args+=("$v=$tools/raw-$v.lock"); done
# torch and its CUDA libraries out, LightPipe itself out (installed editable).
"$tools/venv-3.11/bin/python" scripts/lock_markers.py requirements.lock.tmp "${merge_args[@]}"
# Each Python must install all of it, for real (a dry run builds nothing: it passed gnpy's
# oopt-gnpy-libyang on 3.13, which has no wheel there and does not build), and pip check
# must pass (webob needs legacy-cgi on 3.13 only: a 3.11 resolution left it out).
for minor in 11 12 13; do
  py="$(bash scripts/find_python.sh "3.$minor" 2>/dev/null)" || { log "no Python 3.$minor here: not checked"; continue; }
  "$py" -m venv "$tools/check-3.$minor"
  "$tools/check-3.$minor/bin/pip" install -q --upgrade pip
  if ! "$tools/check-3.$minor/bin/pip" install -q --no-deps --require-hashes \
      -r requirements.lock.tmp >"$tools/check.log" 2>&1; then
    tail -n 5 "$tools/check.log" >&2
    log "requirements.lock does not install on Python 3.$minor ($py): not kept"; rm -f requirements.lock.tmp; exit 1
  fi
  # (torch is not in the lock: what needs it is reported by pip check and left out here)
  unmet="$("$tools/check-3.$minor/bin/pip" check 2>&1 | grep -v ' requires torch, ' | grep -v '^No broken' || true)"
  if [ -n "$unmet" ]; then
    echo "$unmet" >&2
    log "requirements.lock leaves requirements unmet on Python 3.$minor: not kept"; rm -f requirements.lock.tmp; exit 1
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
