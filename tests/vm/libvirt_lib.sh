# shellcheck shell=bash
# Shared by the VM tests on vagrant-libvirt (user_path.sh, cluster.sh); sourced, not run.
# The host's packages and libvirt's daemons (no systemd here), a storage pool of the test's
# own, and the removal of everything the test made in libvirt, by the test's own names.
# The caller sets POOL, POOL_DIR, PREFIX (its domains' name prefix) and NETS (an array of
# its libvirt networks), REPO (the checkout) and TAG (its log prefix). Also the harnesses'
# shared steps: log, die, step/done_step (each step's time), stamp, vagrant_env.
# shellcheck source=scripts/aptlib.sh
source "$REPO/scripts/aptlib.sh"  # apt_ensure
VM_APT_PKGS=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-daemon-driver-qemu
             libvirt-clients qemu-utils qemu-system-x86 dnsmasq-base ebtables rsync
             openssh-client curl debootstrap linux-image-amd64)
VIRSH=(virsh -q -c qemu:///system)

log() { echo "$TAG: $*" >&2; }
die() { echo "$TAG: $*" >&2; exit 1; }
now() { date +%s; }
T_ALL=$(now)
step_t=0 step_name=""
step() { step_name="$1"; step_t=$(now); log "== $1"; }
done_step() { log "$step_name took $(( $(now) - step_t )) s"; }
# Seconds since the start in front of each line (where provisioning spends its time).
stamp() { while IFS= read -r line; do printf '[%4d s] %s\n' "$(( $(now) - T_ALL ))" "$line"; done; }

# hold_harness_lock "$@": the rest of the harness runs again under a lock of its TAG
# (flock -o: the VMs' port forwards and vagrant's children do not keep it), so that one
# run of each harness uses its libvirt names at a time on this machine; a second says so
# and exits 1. Held, what of ours is in libvirt is a killed run's (remove_leftovers).
LOCK_DIR=/run/lightpipe-vm
hold_harness_lock() {
  [ -n "${LP_VM_LOCKED:-}" ] && return 0
  [ "$(id -u)" = 0 ] || { echo "$TAG: run as root (libvirt, debootstrap)" >&2; exit 2; }
  mkdir -m 0700 "$LOCK_DIR" 2>/dev/null || true
  if [ -L "$LOCK_DIR" ] || [ ! -d "$LOCK_DIR" ] || [ "$(stat -c %u "$LOCK_DIR")" != 0 ]; then
    die "$LOCK_DIR is not a directory of root's: not locking there"
  fi
  local rc=0
  LP_VM_LOCKED=1 flock -n -o -E 75 "$LOCK_DIR/$TAG.lock" bash "$REPO/tests/vm/${0##*/}" "$@" ||
    rc=$?
  [ "$rc" = 75 ] && die "another $TAG run is under way on this machine (it holds $LOCK_DIR/$TAG.lock)"
  exit "$rc"
}

# remove_leftovers: under the lock, domains, a pool or networks of ours are what a killed
# run left (its EXIT trap never ran): vagrant up would stop at "name ... already taken".
# Removed first, by our names, and said.
remove_leftovers() {
  local left
  left="$(libvirt_left)"
  [ -z "$left" ] && return 0
  log "removing what an earlier run that was killed left in libvirt:$left"
  libvirt_remove
  left="$(libvirt_left)"
  [ -z "$left" ] || die "could not remove the leftovers:$left"
}

# vagrant_env MEMORY_MB: root or exit 2; Vagrant on libvirt with the test's own box home,
# pool, network and domain prefix; guests of LP_CPUS (2) CPUs and LP_MEMORY_MB (MEMORY_MB).
vagrant_env() {
  [ "$(id -u)" = 0 ] || { echo "$TAG: run as root (libvirt, debootstrap)" >&2; exit 2; }
  export VAGRANT_HOME="${VAGRANT_HOME:-/var/tmp/lightpipe-vagrant.d}"
  export VAGRANT_CHECKPOINT_DISABLE=1 VAGRANT_DEFAULT_PROVIDER=libvirt
  export LP_CPUS="${LP_CPUS:-2}" LP_MEMORY_MB="${LP_MEMORY_MB:-$1}"
  export LP_PROVISION_ARGS="--no-grafana"
  export LP_LIBVIRT_PREFIX="$PREFIX" LP_LIBVIRT_POOL="$POOL" LP_LIBVIRT_NETWORK="$NET"
}

host_setup() {  # host_setup [--fresh]: --fresh removes a killed run's leftovers first
  APT_QUIET=1 apt_ensure vm-host "${VM_APT_PKGS[@]}" || die "cannot install the host's packages"
  if ! "${VIRSH[@]}" version >/dev/null 2>&1; then
    [ -d /run/systemd/system ] && die "libvirtd is not running (systemctl start libvirtd)"
    pgrep -x virtlogd >/dev/null || virtlogd -d
    pgrep -x libvirtd >/dev/null || libvirtd -d
    for _ in $(seq 100); do "${VIRSH[@]}" version >/dev/null 2>&1 && break; sleep 0.2; done
    "${VIRSH[@]}" version >/dev/null || die "libvirtd did not come up"
    log "started virtlogd and libvirtd"
  fi
  [ "${1:-}" = --fresh ] && remove_leftovers
  if ! "${VIRSH[@]}" pool-info "$POOL" >/dev/null 2>&1; then
    mkdir -p "$POOL_DIR"
    "${VIRSH[@]}" pool-define-as "$POOL" dir --target "$POOL_DIR" >/dev/null
  fi
  local active
  active="$("${VIRSH[@]}" pool-list --name)"
  grep -qE "^$POOL *$" <<<"$active" || "${VIRSH[@]}" pool-start "$POOL" >/dev/null
}

# Our domains (by PREFIX), our pool's volumes and the pool, our networks: gone.
libvirt_remove() {
  local d v n
  for d in $("${VIRSH[@]}" list --all --name 2>/dev/null | grep "^$PREFIX" || true); do
    "${VIRSH[@]}" destroy "$d" >/dev/null 2>&1 || true
    "${VIRSH[@]}" undefine "$d" --nvram >/dev/null 2>&1 ||
      "${VIRSH[@]}" undefine "$d" >/dev/null 2>&1 || true
  done
  if "${VIRSH[@]}" pool-info "$POOL" >/dev/null 2>&1; then
    for v in $("${VIRSH[@]}" vol-list "$POOL" 2>/dev/null | awk '{print $1}'); do
      "${VIRSH[@]}" vol-delete --pool "$POOL" "$v" >/dev/null 2>&1 || true
    done
    "${VIRSH[@]}" pool-destroy "$POOL" >/dev/null 2>&1 || true
    "${VIRSH[@]}" pool-undefine "$POOL" >/dev/null 2>&1 || true
  fi
  rmdir "$POOL_DIR" 2>/dev/null || true
  for n in "${NETS[@]}"; do
    if "${VIRSH[@]}" net-info "$n" >/dev/null 2>&1; then
      "${VIRSH[@]}" net-destroy "$n" >/dev/null 2>&1 || true
      "${VIRSH[@]}" net-undefine "$n" >/dev/null 2>&1 || true
    fi
  done
}

# What of ours is still in libvirt (" domain pool network ..."), empty when nothing.
libvirt_left() {
  local left="" n
  "${VIRSH[@]}" list --all --name 2>/dev/null | grep -q "^$PREFIX" && left+=" domain"
  "${VIRSH[@]}" pool-info "$POOL" >/dev/null 2>&1 && left+=" pool"
  for n in "${NETS[@]}"; do
    "${VIRSH[@]}" net-info "$n" >/dev/null 2>&1 && left+=" network:$n"
  done
  echo "$left"
}
