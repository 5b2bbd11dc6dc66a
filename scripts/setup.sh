#!/usr/bin/env bash
# Install what LightPipe needs: system packages (when root, Debian/Ubuntu) and the
# project with its dev extras in a virtual environment. Idempotent; quick when done.
#
#   bash scripts/setup.sh [--deps-only] [VENV]
#
# --deps-only: system packages and the locked dependencies (torch, requirements.lock) only,
# not LightPipe itself: what tests/vm/build_box.sh warms in a Vagrant box without a checkout.
set -euo pipefail
DEPS_ONLY=0
if [ "${1:-}" = "--deps-only" ]; then DEPS_ONLY=1; shift; fi
VENV="${1:-.venv}"
# Every tool a documented command uses: ping/iperf3/ip/tc/curl in `lightpipe exec`
# examples, unshare+mount (util-linux, mount) for host names inside emulated hosts,
# prometheus/promtool for metrics, kmod (modprobe: netem/openvswitch where the kernel has
# them).
SYS_PKGS=(mininet openvswitch-switch iperf3 ethtool iptables nftables prometheus iproute2 tcpdump
          iputils-ping curl util-linux mount procps kmod)
# For the tests only: chromium + chromium-driver (the report opened in a browser), shellcheck.
# Installed where the archive has them under these names (Debian); elsewhere (Ubuntu ships
# Chromium as a snap) one line says so and the tests that need them skip.
TEST_PKGS=(chromium chromium-driver shellcheck)

log() { echo "setup: $*" >&2; }

# The Python: 3.11, 3.12 or 3.13 (Debian 12's, Ubuntu 24.04's and Debian 13's python3);
# anything else is refused in one line, before anything is installed for it.
PYTHON_SET="${PYTHON:+1}"
PYTHON="${PYTHON:-python3}"
SUPPORTED="3.11, 3.12 or 3.13"
HOWTO="e.g. Ubuntu 22.04: apt-get install python3.11 python3.11-venv, then make setup PYTHON=python3.11"
py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
if [ -x "$VENV/bin/python" ] && [ -z "$PYTHON_SET" ]; then
  PY_VER="$(py_version "$VENV/bin/python" || true)"  # (the venv made earlier decides)
else
  command -v "$PYTHON" >/dev/null 2>&1 ||
    { log "PYTHON=$PYTHON: not found; LightPipe needs Python $SUPPORTED ($HOWTO)"; exit 2; }
  PY_VER="$(py_version "$PYTHON" || true)"
fi
case "$PY_VER" in
  3.11|3.12|3.13) ;;
  *) log "Python ${PY_VER:-?} ($PYTHON) is not supported: LightPipe needs Python $SUPPORTED ($HOWTO)"
     exit 2 ;;
esac
if [ -x "$VENV/bin/python" ] && [ -n "$PYTHON_SET" ] &&
   [ "$(py_version "$VENV/bin/python" || true)" != "$PY_VER" ]; then
  log "$VENV has Python $(py_version "$VENV/bin/python" || echo '?'), not $PYTHON's $PY_VER: remove it, or give another VENV=..."
  exit 2
fi
# shellcheck source=scripts/aptlib.sh
source "$(dirname "$0")/aptlib.sh"  # apt_missing, apt_ensure
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  if [ -z "$(apt_missing "${SYS_PKGS[@]}" "${TEST_PKGS[@]}")" ]; then
    log "system packages present"
  else
    apt_ensure setup "${SYS_PKGS[@]}"
    mapfile -t want < <(apt_missing "${TEST_PKGS[@]}")
    [ "${#want[@]}" -eq 0 ] || apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null 2>&1 || true
    have=() lack=()
    for p in "${want[@]}"; do
      if apt-cache show "$p" >/dev/null 2>&1; then have+=("$p"); else lack+=("$p"); fi
    done
    [ "${#have[@]}" -eq 0 ] || apt_ensure setup "${have[@]}"
    [ "${#lack[@]}" -eq 0 ] ||
      log "not in this distribution's archive: ${lack[*]} (for the tests only: those that need them skip)"
  fi
else
  log "not root (or no apt-get): skipping system packages; emulation will be unavailable"
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV (Python $PY_VER)"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
LOCK=requirements.lock
if [ "$DEPS_ONLY" = 1 ] && [ ! -f "$LOCK" ]; then
  log "--deps-only needs $LOCK"; exit 2
fi
# torch on its own (scripts/install_torch.py): the CPU build from this machine's own files
# where it has them, else PyTorch's CPU index, else PyPI's (with its CUDA libraries).
# It says which it took and writes it to $VENV/lightpipe-torch-source.json.
install_torch() { "$VENV/bin/python" "$(dirname "$0")/install_torch.py" --version "$TORCH_VERSION"; }
TORCH_VERSION=2.13.0
if [ "$DEPS_ONLY" = 0 ] && { [ "${LIGHTPIPE_UNLOCKED:-0}" = 1 ] || [ ! -f "$LOCK" ]; }; then
  # Unlocked: the newest releases pyproject.toml allows (what `make lock` resolves).
  log "installing lightpipe[dev] unlocked (torch==$TORCH_VERSION pinned; ray for sweeps on Ray)"
  install_torch
  "$VENV/bin/pip" install -q -e '.[dev]'
else
  # Locked: exactly what was tested (requirements.lock: versions and sha256 hashes, one lock
  # for Python 3.11-3.13, its markers decide per Python), so that a fresh machine gets the
  # same PyYAML, pydantic, ... as CI. A venv that holds them already (a rerun; the Vagrant
  # box's, built from this lock) is left as it is (pip re-checking ~130 satisfied pins:
  # ~20 s in a software-emulated guest).
  if "$VENV/bin/python" "$(dirname "$0")/locked_installed.py" "$LOCK" 2>/dev/null; then
    log "the locked dependencies (requirements.lock): installed already"
  else
    log "installing the locked dependencies (requirements.lock)"
    "$VENV/bin/pip" install -q --no-deps --require-hashes -r "$LOCK"
  fi
  install_torch
  if [ "$DEPS_ONLY" = 1 ]; then log "done (--deps-only): $VENV"; exit 0; fi
  # The build backend is the lock's own setuptools (no isolated build environment: that
  # fetched the newest setuptools and wheel on every run, ~100 s in a software-emulated guest).
  "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e .
  "$VENV/bin/pip" check >/dev/null || { "$VENV/bin/pip" check >&2; exit 1; }
fi
bash "$(dirname "$0")/link_cli.sh" "$VENV"
# LightPipe's own bytecode, once (pip compiles only what it installs, not an editable
# checkout): each `lightpipe` command, forwarder, controller and worker then reads it even
# where PYTHONDONTWRITEBYTECODE is set, instead of compiling the package again.
"$VENV/bin/python" -m compileall -q -j 0 testbed controllers workloads >/dev/null || true
# The dynamic-RMSA loop compiled ahead of time (testbed/sim/rmsa_kernel.py, ~5 s of CPU once),
# so that the first `lightpipe sim` does not pay for it; without a C compiler numba
# compiles it on first use instead.
"$VENV/bin/python" -m testbed.sim.rmsa_kernel --build >/dev/null 2>&1 ||
  log "the compiled RMSA loop is not built ahead of time here (no C compiler?): numba compiles it on first use"
log "done: $VENV/bin/lightpipe"
# What this machine can run (`lightpipe doctor`: each missing piece with its fix); it fails
# only when the simulator itself does not work.
"$VENV/bin/lightpipe" doctor --summary >&2
