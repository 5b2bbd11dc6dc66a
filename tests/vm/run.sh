#!/usr/bin/env bash
# VM test harness: boot Debian's kernel (netem, openvswitch) under QEMU with virtme-ng and
# run the `vm` pytest tests inside it, on this machine's own root filesystem (read-only).
#
#   bash tests/vm/run.sh                # what CI runs (root: installs what it needs)
#   LIGHTPIPE_VM_KVM=0 bash tests/vm/run.sh -k netem   # extra args go to pytest
#   bash tests/vm/run.sh --cmd "python bench/bench_links.py --mode netem"   # not pytest
#
# Environment: VENV (default .venv of this checkout), LIGHTPIPE_VM_OUT (host directory
# the guest writes its log and junit.xml to; default runs/vm), LIGHTPIPE_VM_MEMORY (6G),
# LIGHTPIPE_VM_CPUS (2), LIGHTPIPE_VM_KVM (auto: try KVM, fall back to TCG; 1; 0),
# LIGHTPIPE_VM_KERNEL (a vmlinuz; default the newest /boot/vmlinuz-*),
# LIGHTPIPE_VM_TIMEOUT_S (1200: the guest is stopped after this long),
# LIGHTPIPE_VM_CALIBRATION=0 (leave out the sim-vs-emu calibration run: PyTorch workers),
# LIGHTPIPE_VM_RING=0 (leave out the two-DC ring with the controller).
set -euo pipefail
CMD=""
if [ "${1:-}" = "--cmd" ]; then
  [ "$#" -ge 2 ] || { echo "vm-harness: --cmd needs a command" >&2; exit 2; }
  CMD="$2"; shift 2
fi
cd "$(dirname "$0")/../.."
REPO="$(pwd)"
VENV="${VENV:-$REPO/.venv}"
case "$VENV" in /*) ;; *) VENV="$REPO/$VENV" ;; esac
OUT="${LIGHTPIPE_VM_OUT:-$REPO/runs/vm}"
MEMORY="${LIGHTPIPE_VM_MEMORY:-6G}"
CPUS="${LIGHTPIPE_VM_CPUS:-2}"
KVM="${LIGHTPIPE_VM_KVM:-auto}"
LIMIT_S="${LIGHTPIPE_VM_TIMEOUT_S:-1200}"  # the whole guest run, CI's budget
# apt: QEMU, Debian's kernel (files in /boot and /lib/modules only: this machine does not
# boot it), the static busybox virtme-ng builds its initramfs from, ping for the guest.
APT_PKGS=(qemu-system-x86 linux-image-amd64 busybox-static iputils-ping iperf3 kmod)

log() { echo "vm-harness: $*" >&2; }
now() { date +%s; }
T0=$(now)

# shellcheck source=scripts/aptlib.sh
source "$REPO/scripts/aptlib.sh"  # apt_ensure
apt_ensure vm-harness "${APT_PKGS[@]}" || exit 2
if [ ! -x "$VENV/bin/vng" ]; then
  # The pin lives in pyproject.toml (dev extras); `make setup` installs it.
  pin="$(grep -o '"virtme-ng[^"]*"' pyproject.toml | tr -d '"')"
  log "installing $pin into $VENV"
  "$VENV/bin/pip" install -q "$pin"
fi
log "set-up took $(( $(now) - T0 )) s"

KERNEL="${LIGHTPIPE_VM_KERNEL:-$(find /boot -maxdepth 1 -name 'vmlinuz-*' | sort -V | tail -n 1)}"
if [ -z "$KERNEL" ] || [ ! -f "$KERNEL" ]; then
  log "no kernel in /boot (apt-get install linux-image-amd64)"; exit 2
fi
export PATH="$VENV/bin:$PATH"
VNG=(vng --run "$KERNEL" --force-9p --memory "$MEMORY" --cpus "$CPUS")

ACCEL=(--disable-kvm)
if [ "$KVM" != 0 ] && [ -w /dev/kvm ]; then
  # KVM guests hang on some hosts (nested virtualisation): try a trivial boot first.
  t=$(now)
  if timeout 15 "${VNG[@]}" --exec true >/dev/null 2>&1; then
    ACCEL=()
    log "KVM works (probe $(( $(now) - t )) s)"
  else
    [ "$KVM" = 1 ] && { log "KVM asked for but a KVM guest did not boot"; exit 2; }
    log "KVM guest did not boot within 15 s: software emulation (TCG)"
  fi
else
  log "software emulation (TCG)"
fi

mkdir -p "$OUT"
rm -f "$OUT/rc" "$OUT/junit.xml"
# Quote each pytest argument for the guest's shell.
PYARGS=""
for a in "$@"; do PYARGS+=" $(printf '%q' "$a")"; done
GUEST="cd $(printf '%q' "$REPO") && LIGHTPIPE_VM_CMD=$(printf '%q' "$CMD") \
LIGHTPIPE_VM_CALIBRATION=$(printf '%q' "${LIGHTPIPE_VM_CALIBRATION:-1}") \
LIGHTPIPE_VM_RING=$(printf '%q' "${LIGHTPIPE_VM_RING:-1}") bash \
tests/vm/guest.sh $(printf '%q' "$OUT") $(printf '%q' "$VENV") \
$(printf '%q' "${PYTHONPATH:-$REPO}")$PYARGS"
t=$(now)
set +e
timeout --kill-after=10 "$LIMIT_S" "${VNG[@]}" "${ACCEL[@]}" --rwdir "$OUT" --exec "$GUEST" \
  2>&1 | tee "$OUT/vm.log"
set -e
log "guest ran $(( $(now) - t )) s; total $(( $(now) - T0 )) s"
if [ ! -f "$OUT/rc" ]; then
  log "the guest wrote no exit status (it did not boot, crashed, or ran past" \
    "LIGHTPIPE_VM_TIMEOUT_S=$LIMIT_S s): see $OUT/vm.log"
  exit 1
fi
rc="$(cat "$OUT/rc")"
log "pytest in the guest exited with $rc (junit: $OUT/junit.xml)"
exit "$rc"
