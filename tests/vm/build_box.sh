#!/usr/bin/env bash
# Build (or reuse) a local Debian 12 Vagrant box for vagrant-libvirt, for the user-path test
# (tests/vm/user_path.sh) on machines without systemd or working nested KVM: a debootstrap
# minbase root file system with systemd, openssh-server, rsync, sudo, python3-venv, make and
# a `vagrant` user (Vagrant's insecure key; Vagrant replaces it on first `up`), booted with
# Debian's own kernel from this machine's /boot by the box's Vagrantfile (libvirt domain type
# "qemu": software emulation). pip in the box is a user's: it sees PyPI only (none of this
# machine's pip configuration, local wheel directories or constraints go in), so torch comes
# the way `make setup` gives it on a user's machine (scripts/install_torch.py: PyTorch's CPU
# index where reachable, else PyPI's torch with its CUDA libraries). Only this machine's
# extra certificate authorities (/usr/local/share/ca-certificates) are trusted too, for
# this network's TLS.
#
#   bash tests/vm/build_box.sh            # as root; prints the box's name on stdout
#
# Cached under $LIGHTPIPE_BOX_CACHE (default /var/tmp/lightpipe-box), keyed by a hash of
# its recipe (this script, the kernel, the setup files and the lock, Vagrant's key); a changed
# recipe builds a new box and removes the old ones. The box is added to $VAGRANT_HOME.
set -euo pipefail
CACHE="${LIGHTPIPE_BOX_CACHE:-/var/tmp/lightpipe-box}"
SUITE=bookworm
MIRROR="${LIGHTPIPE_BOX_MIRROR:-http://deb.debian.org/debian}"
INCLUDE=systemd,systemd-sysv,systemd-resolved,dbus,udev,iproute2,kmod,ca-certificates,curl,python3,python3-venv,make,sudo,openssh-server,rsync
# Warmed natively here (apt and pip in a chroot) rather than under software emulation in the
# guest, where dpkg and pip take ~25 min: gnupg (provision.sh's), and what `make setup`
# installs, by its own script (scripts/setup.sh --deps-only, from this checkout): its system
# packages (mininet, openvswitch-switch, prometheus, chromium, ...) and the locked Python
# dependencies in /lightpipe/.venv, where the guest's checkout will be (rsync leaves the
# excluded .venv alone). `make setup` in the guest still runs and finishes it (LightPipe
# itself, pip check). Debian's prometheus.service stays enabled, as a user's apt-get would
# leave it: it starts at boot on port 9090, and provision.sh must stop, disable and mask it.
# The apt lists are kept.
PREINSTALL=(gnupg)
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
SETUP_FILES=(scripts/setup.sh scripts/aptlib.sh scripts/locked_installed.py scripts/install_torch.py
             requirements.lock)
GUEST_VENV=/lightpipe/.venv
DISK_GB=20  # (PyPI's CUDA torch: ~5 GB of the venv)
APT_PKGS=(debootstrap qemu-utils e2fsprogs linux-image-amd64 vagrant)

log() { echo "build-box: $*" >&2; }
die() { echo "build-box: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "run as root (debootstrap, mkfs)"

# shellcheck source=scripts/aptlib.sh
source "$REPO/scripts/aptlib.sh"  # apt_ensure
apt_ensure build-box "${APT_PKGS[@]}" || exit 2

KERNEL="$(find /boot -maxdepth 1 -name 'vmlinuz-*' | sort -V | tail -n 1)"
[ -n "$KERNEL" ] || die "no kernel in /boot (apt-get install linux-image-amd64)"
KVER="${KERNEL#/boot/vmlinuz-}"
INITRD="/boot/initrd.img-$KVER"
if [ ! -f "$INITRD" ] || [ ! -d "/lib/modules/$KVER" ]; then
  die "no $INITRD or /lib/modules/$KVER"
fi
# Vagrant's insecure key, from its package's file list (a search of / beside `make test` failed
# when a file vanished under find, and set -e ended the build without a word).
KEY="$( { dpkg -L vagrant 2>/dev/null || true; } | grep -m 1 '/keys/vagrant\.pub$' || true)"
[ -n "$KEY" ] || die "Vagrant's insecure key (keys/vagrant.pub) not found: is vagrant installed?"

# The recipe: everything that goes into the box. The initrd is not in it: the box only
# names its path (the guest boots the host's kernel and initrd directly), and its bytes
# change whenever a package's trigger rebuilds it: the VM kernel path's apt install of
# busybox-static did, between the box built beside `make test` and the user path, which
# then built the box again (209 s; CI of 0312daf, 2026-11-29).
recipe() {
  cat "$0"
  echo "$KVER $MIRROR $INITRD"; sha256sum "$KERNEL" "$KEY"
  (cd "$REPO" && cat "${SETUP_FILES[@]}")
  for f in /usr/local/share/ca-certificates/*.crt; do
    [ -f "$f" ] && cat "$f"
  done
  true
}
HASH="$(recipe | sha256sum | cut -c1-12)"
NAME="lightpipe-debian12-$HASH"
DIR="$CACHE/$HASH"
BOX="$DIR/$NAME.box"
export VAGRANT_CHECKPOINT_DISABLE=1

if [ ! -s "$BOX" ]; then
  T0=$(date +%s)
  mkdir -p "$CACHE"
  WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
  MOUNTS=()
  # shellcheck disable=SC2317  # (called by the trap)
  unmount_all() {
    local i
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount "${MOUNTS[$i]}" 2>/dev/null || true; done
  }
  trap 'unmount_all; rm -rf --one-file-system "$WORK"' EXIT
  ROOT="$WORK/rootfs"
  log "debootstrap $SUITE (minbase + $INCLUDE) into $ROOT"
  debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    { tail -n 20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
  log "debootstrap took $(( $(date +%s) - T0 )) s"
  # This machine's own certificate authorities (a TLS-intercepting proxy's, for pip).
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$ROOT/usr/local/share/ca-certificates/"
    chroot "$ROOT" update-ca-certificates >/dev/null 2>&1
  fi
  rm -f "$ROOT/etc/resolv.conf"  # (systemd-resolved's link: this machine's, for apt)
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  mount -t proc proc "$ROOT/proc"
  MOUNTS=("$ROOT/proc")
  printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"
  chmod 0755 "$ROOT/usr/sbin/policy-rc.d"
  chroot "$ROOT" apt-get -qq update
  chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends "${PREINSTALL[@]}" >"$WORK/preinstall.log" 2>&1 ||
    { tail -n 20 "$WORK/preinstall.log" >&2; die "installing ${PREINSTALL[*]} failed"; }
  T1=$(date +%s)
  mkdir -p "$ROOT/tmp/lightpipe-setup/scripts"
  for f in "${SETUP_FILES[@]}"; do cp "$REPO/$f" "$ROOT/tmp/lightpipe-setup/$f"; done
  # A clean environment: none of this machine's PIP_* settings (find-links to its wheels).
  chroot "$ROOT" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive HOME=/root LANG=C.UTF-8 bash -c \
    "cd /tmp/lightpipe-setup && bash scripts/setup.sh --deps-only $GUEST_VENV" \
    >"$WORK/setup.log" 2>&1 ||
    { tail -n 20 "$WORK/setup.log" >&2; die "scripts/setup.sh --deps-only in the chroot failed"; }
  grep '^setup: torch ' "$WORK/setup.log" | sed 's/^/build-box: /' >&2 || true
  if [ -e "$ROOT/etc/pip.conf" ] || [ -d "$ROOT/etc/xdg/pip" ]; then
    die "the box has a pip configuration: a user's VM has none"
  fi
  rm -rf "$ROOT/tmp/lightpipe-setup" "$ROOT/root/.cache/pip"
  log "make setup's packages and $GUEST_VENV (scripts/setup.sh --deps-only, pip on PyPI only) took $(( $(date +%s) - T1 )) s ($(du -sh "$ROOT$GUEST_VENV" | cut -f1) venv)"
  rm -f "$ROOT/usr/sbin/policy-rc.d"
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount "${MOUNTS[$i]}"; done
  MOUNTS=()
  [ "$(chroot "$ROOT" systemctl is-enabled prometheus 2>/dev/null)" = enabled ] ||
    die "Debian's prometheus.service is not enabled in the box (the path provision.sh must mask)"
  log "${PREINSTALL[*]} and make setup's packages: done at $(( $(date +%s) - T0 )) s"

  mkdir -p "$ROOT/lib/modules"
  cp -a "/lib/modules/$KVER" "$ROOT/lib/modules/$KVER"
  echo lightpipe-box > "$ROOT/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 lightpipe-box\n' > "$ROOT/etc/hosts"
  printf '/dev/vda / ext4 defaults 0 1\n' > "$ROOT/etc/fstab"
  printf 'deb %s %s main\ndeb %s %s-updates main\ndeb http://deb.debian.org/debian-security %s-security main\n' \
    "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" "$SUITE" > "$ROOT/etc/apt/sources.list"
  mkdir -p "$ROOT/etc/systemd/network"
  # DHCP's client id from the interface's MAC, not networkd's default (a DUID from the
  # machine id, which every VM made from this box shares): with two VMs on one network,
  # libvirt's dnsmasq would otherwise give the second no lease of its own (found with
  # tests/vm/cluster.sh's two guests).
  printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n\n[DHCPv4]\nClientIdentifier=mac\n' \
    > "$ROOT/etc/systemd/network/50-dhcp.network"
  ln -sfn /run/systemd/resolve/resolv.conf "$ROOT/etc/resolv.conf"
  chroot "$ROOT" systemctl enable systemd-networkd systemd-resolved ssh >/dev/null 2>&1
  # Host keys are made on the box's first boot, not shared by every VM made from it.
  rm -f "$ROOT"/etc/ssh/ssh_host_*
  mkdir -p "$ROOT/etc/systemd/system/ssh.service.d"
  printf '[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n' \
    > "$ROOT/etc/systemd/system/ssh.service.d/hostkeys.conf"
  chroot "$ROOT" useradd -m -s /bin/bash vagrant
  echo 'vagrant ALL=(ALL) NOPASSWD:ALL' > "$ROOT/etc/sudoers.d/vagrant"
  chmod 0440 "$ROOT/etc/sudoers.d/vagrant"
  install -d -m 0700 -o 1000 -g 1000 "$ROOT/home/vagrant/.ssh"
  install -m 0600 -o 1000 -g 1000 "$KEY" "$ROOT/home/vagrant/.ssh/authorized_keys"
  [ "$(chroot "$ROOT" id -u vagrant)" = 1000 ] || die "vagrant's uid is not 1000"
  chroot "$ROOT" apt-get clean  # (the downloaded .debs; the lists stay)

  log "disk image (${DISK_GB}G, ext4 from the tree) and qcow2"
  mkfs.ext4 -q -F -L root -d "$ROOT" "$WORK/raw.img" "${DISK_GB}G" >&2
  qemu-img convert -O qcow2 "$WORK/raw.img" "$WORK/box.img" >&2
  rm -f "$WORK/raw.img"
  printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %d}\n' "$DISK_GB" \
    > "$WORK/metadata.json"
  cat > "$WORK/Vagrantfile" <<EOF
# Box Vagrantfile (made by LightPipe's tests/vm/build_box.sh for this machine): boot Debian's
# kernel directly under software emulation.
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |lv|
    lv.driver = "qemu"
    lv.kernel = "$KERNEL"
    lv.initrd = "$INITRD"
    lv.cmd_line = "root=/dev/vda rw console=ttyS0 quiet"
    lv.default_prefix = ENV.fetch("LP_LIBVIRT_PREFIX", "lightpipe-userpath-")
    lv.storage_pool_name = ENV.fetch("LP_LIBVIRT_POOL", "default")
    lv.management_network_name = ENV.fetch("LP_LIBVIRT_NETWORK", "vagrant-libvirt")
    lv.management_network_address = ENV.fetch("LP_LIBVIRT_SUBNET", "192.168.121.0/24")
  end
end
EOF
  tar -C "$WORK" -cf "$WORK/$NAME.box" metadata.json Vagrantfile box.img
  # Only the current recipe's box is kept.
  find "$CACHE" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended \
    -regex ".*/[0-9a-f]{12}" -exec rm -rf {} +
  mkdir -p "$DIR"
  mv "$WORK/$NAME.box" "$BOX"
  log "built $BOX ($(du -h "$BOX" | cut -f1)) in $(( $(date +%s) - T0 )) s"
fi

if ! vagrant box list 2>/dev/null | grep -q "^$NAME "; then
  # Boxes of older recipes go first.
  vagrant box list 2>/dev/null | awk '/^lightpipe-debian12-/ {print $1}' | sort -u |
    while read -r old; do vagrant box remove -f --all "$old" >/dev/null 2>&1 || true; done
  vagrant box add -f --name "$NAME" "$BOX" >&2
fi
echo "$NAME"
