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
# prometheus/promtool for metrics, chromium + chromium-driver for the report tests,
# kmod (modprobe: netem/openvswitch where the kernel has them), shellcheck (CI).
SYS_PKGS=(mininet openvswitch-switch iperf3 ethtool iptables nftables prometheus iproute2 tcpdump
          iputils-ping curl util-linux mount procps chromium chromium-driver
          kmod shellcheck)

log() { echo "setup: $*" >&2; }

# shellcheck source=scripts/aptlib.sh
source "$(dirname "$0")/aptlib.sh"  # apt_missing, apt_ensure
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  if [ -z "$(apt_missing "${SYS_PKGS[@]}")" ]; then
    log "system packages present"
  else
    apt_ensure setup "${SYS_PKGS[@]}"
  fi
else
  log "not root (or no apt-get): skipping system packages; emulation will be unavailable"
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
LOCK=requirements.lock
if [ "$DEPS_ONLY" = 1 ] && [ ! -f "$LOCK" ]; then
  log "--deps-only needs $LOCK"; exit 2
fi
if [ "$DEPS_ONLY" = 0 ] && { [ "${LIGHTPIPE_UNLOCKED:-0}" = 1 ] || [ ! -f "$LOCK" ]; }; then
  # Unlocked: the newest releases pyproject.toml allows (what `make lock` resolves).
  log "installing lightpipe[dev] unlocked (torch==2.13.0 pinned; ray for sweeps on Ray)"
  "$VENV/bin/pip" install -q -e '.[dev]'
else
  # Locked: exactly what was tested (requirements.lock: versions and sha256 hashes), so
  # that a fresh machine gets the same PyYAML, pydantic, ... as CI. torch on its own: the
  # CPU build where the machine has it (pip's find-links), PyPI's 2.13.0 elsewhere.
  # A venv that holds them already (a rerun; the Vagrant box's, built from this lock) is
  # left as it is (pip re-checking ~130 satisfied pins: ~20 s in a software-emulated guest).
  if "$VENV/bin/python" "$(dirname "$0")/locked_installed.py" "$LOCK" torch==2.13.0 2>/dev/null; then
    log "the locked dependencies (requirements.lock) and torch==2.13.0: installed already"
  else
    log "installing the locked dependencies (requirements.lock) and torch==2.13.0"
    "$VENV/bin/pip" install -q --no-deps torch==2.13.0
    "$VENV/bin/pip" install -q --no-deps --require-hashes -r "$LOCK"
  fi
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
log "done: $VENV/bin/lightpipe"
