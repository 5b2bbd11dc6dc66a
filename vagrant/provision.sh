#!/usr/bin/env bash
# Provision a Debian/Ubuntu machine (the Vagrant VM) as a LightPipe testbed, as root:
# LightPipe (make setup) with `lightpipe` on PATH, the kernel's extra modules (netem), Open
# vSwitch with the kernel datapath, the LightPipe monitor (Prometheus) as a systemd service on
# port 9090, and Grafana from Grafana's apt repository with LightPipe's datasource and
# dashboards. Idempotent: running it again changes nothing.
#
#   sudo vagrant/provision.sh [--repo DIR] [--listen ADDR] [--no-setup] [--no-grafana]
#                             [--no-prometheus] [--no-ovs] [--no-modules] [--no-services]
#   vagrant/provision.sh --print-python   # the Python it would use here (stdout) and why
#
# Python (make setup PYTHON=...), by the release in /etc/os-release: python3 on Debian 12
# (3.11), Debian 13 (3.13) and Ubuntu 24.04 (3.12); python3.11 from Ubuntu's archive
# (universe) on Ubuntu 22.04, whose python3 is 3.10; elsewhere python3 if it is 3.11-3.13.
# Otherwise it refuses in one line (exit 2) before installing anything.
# --listen: the address the monitor (9090) and Grafana (3000) listen on, 127.0.0.1 by default
# (VirtualBox's port forwarding needs 0.0.0.0). --no-services: no systemd units, nothing started.
# Grafana's repository unreachable: one line says so, its apt source is left out (so apt keeps
# working) and everything else goes on; run this again later to add Grafana.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
ARGS=("$@")
LISTEN=127.0.0.1
MONITOR_PORT=9090
DO_SETUP=1 DO_GRAFANA=1 DO_PROMETHEUS=1 DO_OVS=1 DO_MODULES=1 DO_SERVICES=1 PRINT_PYTHON=0
# (The LIGHTPIPE_* variables below name other places only for tests.)
OS_RELEASE="${LIGHTPIPE_OS_RELEASE:-/etc/os-release}"
GRAFANA_APT="${LIGHTPIPE_GRAFANA_APT:-https://apt.grafana.com}"
APT_ETC="${LIGHTPIPE_APT_ETC:-/etc/apt}"
GRAFANA_KEY="$APT_ETC/keyrings/grafana.gpg"
GRAFANA_LIST="$APT_ETC/sources.list.d/grafana.list"
GRAFANA_REPO=""  # "" (not looked at yet), ok, or why not (one line)
GRAFANA_ETC="${LIGHTPIPE_GRAFANA_ETC:-/etc/grafana}"
GRAFANA_PROV="$GRAFANA_ETC/provisioning"
GRAFANA_DASH="$GRAFANA_ETC/dashboards/lightpipe"
SECRETS=/etc/lightpipe
GRAFANA_PASSWORD_FILE="$SECRETS/grafana-admin-password"
STATE=/var/lib/lightpipe
# The boxes a refusal names (docs/vm.md: which were booted where).
BOXES="the default box (LP_BOX unset: debian/bookworm64) or LP_BOX=debian/trixie64, bento/ubuntu-24.04 or bento/ubuntu-22.04 (vagrant destroy, then vagrant up)"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
log() { echo "provision: $*" >&2; }
die() { echo "provision: $*" >&2; exit 2; }

APT=(apt-get -o DPkg::Lock::Timeout=300 -y -q --no-install-recommends)
UPDATED=0
GRAFANA_CHANGED=0

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
apt_update() {
  [ "$UPDATED" = 1 ] && return 0
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  UPDATED=1
}
# apt_has PKG: the apt sources offer PKG (a candidate version).
apt_has() { LC_ALL=C apt-cache policy "$1" 2>/dev/null | grep -q '^ *Candidate: [^(]'; }
apt_install() {
  local want=() p
  for p in "$@"; do installed "$p" || want+=("$p"); done
  [ "${#want[@]}" -eq 0 ] && return 0
  apt_update
  log "installing ${want[*]}"
  "${APT[@]}" install "${want[@]}"
}
# Packages whose postinst starts a service that must not run (Debian's prometheus on 9090):
# installed with services held back by policy-rc.d, which deb-systemd-invoke obeys.
apt_install_held() {
  local p need=0
  for p in "$@"; do installed "$p" || need=1; done
  [ "$need" = 1 ] || return 0
  [ -e /usr/sbin/policy-rc.d ] && die "/usr/sbin/policy-rc.d exists: not overwriting it"
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 0755 /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt_install "$@"
  rm -f /usr/sbin/policy-rc.d
  trap - EXIT
}
have_systemd() { [ -d /run/systemd/system ]; }
services() { [ "$DO_SERVICES" = 1 ] && have_systemd; }
enable_service() {
  if services; then
    systemctl enable --now "$1" >/dev/null 2>&1 || log "could not start $1 (systemctl status $1)"
  else
    log "not starting $1 (no systemd or --no-services)"
  fi
}
# install_file SRC DEST MODE: copy when the content or mode differs; says whether it did.
install_file() {
  if cmp -s "$1" "$2" && [ "$(stat -c %a "$2")" = "$3" ] && [ ! -L "$2" ] &&
     [ "$(stat -c %u "$2")" = 0 ]; then
    return 1
  fi
  install -D -o root -g root -m "$3" "$1" "$2"
  return 0
}


# The distribution's Prometheus: LightPipe's monitor runs the binary itself on port 9090
# (the Grafana datasource's), so the packaged service must never start and take that port.
mask_distro_prometheus() {
  if services; then
    local was=""
    systemctl is-active --quiet prometheus 2>/dev/null && was="stopped, "
    if [ "$(systemctl is-enabled prometheus 2>/dev/null)" != masked ]; then
      systemctl disable --now prometheus >/dev/null 2>&1 || true
      systemctl mask prometheus >/dev/null 2>&1
      log "the distribution's prometheus.service: ${was}disabled and masked (port $MONITOR_PORT is lightpipe-monitor.service's)"
    elif [ -n "$was" ]; then
      systemctl stop prometheus >/dev/null 2>&1 || true
      log "the distribution's prometheus.service: stopped (masked already)"
    fi
  elif have_systemd; then
    log "--no-services: the distribution's prometheus.service left as it is"
  fi
}

# --- Grafana -----------------------------------------------------------------------------
# The provisioning goes where Grafana reads it, owned by root (copies, not links into the
# synced checkout), with the dashboards' path written in: nothing for a user to set.
install_grafana_provisioning() {
  local src="$REPO/grafana" f tmp changed=0
  [ -d "$src/provisioning" ] || { log "no $src/provisioning: Grafana not provisioned"; return 0; }
  if [ -L "$GRAFANA_PROV" ]; then  # an older provision.sh linked the checkout in
    rm -f "$GRAFANA_PROV"
    [ -d "$GRAFANA_PROV.dist" ] && mv "$GRAFANA_PROV.dist" "$GRAFANA_PROV"
  fi
  for f in "$GRAFANA_ETC" "$GRAFANA_PROV" "$GRAFANA_PROV/datasources" \
      "$GRAFANA_PROV/dashboards" "$GRAFANA_ETC/dashboards" "$GRAFANA_DASH"; do
    if [ -L "$f" ] || { [ -e "$f" ] && [ "$(stat -c %u "$f")" != 0 ]; }; then
      die "$f is a link or not root's: not writing Grafana's provisioning through it"
    fi
    [ -d "$f" ] || install -d -o root -g root -m 0755 "$f"
    chmod go-w "$f"
  done
  install_file "$src/provisioning/datasources/lightpipe.yaml" \
    "$GRAFANA_PROV/datasources/lightpipe.yaml" 644 && changed=1
  tmp="$(mktemp)"
  sed "s|\${LIGHTPIPE_GRAFANA_DASHBOARDS}|$GRAFANA_DASH|g" \
    "$src/provisioning/dashboards/lightpipe.yaml" > "$tmp"
  # shellcheck disable=SC2016  # (a literal ${)
  if grep -qF '${' "$tmp"; then rm -f "$tmp"; die "unresolved variable in $src/provisioning/dashboards/lightpipe.yaml"; fi
  install_file "$tmp" "$GRAFANA_PROV/dashboards/lightpipe.yaml" 644 && changed=1
  rm -f "$tmp"
  for f in "$src"/dashboards/*.json; do
    install_file "$f" "$GRAFANA_DASH/$(basename "$f")" 644 && changed=1
  done
  for f in "$GRAFANA_DASH"/*.json; do  # dashboards no longer in the checkout
    [ -e "$f" ] || continue
    [ -e "$src/dashboards/$(basename "$f")" ] || { rm -f "$f"; changed=1; }
  done
  if [ "$changed" = 1 ]; then
    GRAFANA_CHANGED=1
    log "Grafana provisioning in $GRAFANA_PROV, dashboards in $GRAFANA_DASH"
  fi
  if services; then
    tmp="$(mktemp)"
    printf '[Service]\nEnvironment=GF_SERVER_HTTP_ADDR=%s\n' "$LISTEN" > "$tmp"
    if install_file "$tmp" /etc/systemd/system/grafana-server.service.d/lightpipe.conf 644; then
      systemctl daemon-reload
      GRAFANA_CHANGED=1
    fi
    rm -f "$tmp"
  fi
  return 0
}
# grafana_repo: Grafana's apt source, there only while the repository answers: its key fetched
# (bounded: 5 s to connect, 30 s in all) and checked, the source written, then apt-get update
# of that source alone, where any error counts. Any failure removes the source (an
# unreachable or badly signed source slows or fails every later apt-get update, make
# setup's too) and returns 1 with GRAFANA_REPO saying why, in one line. Idempotent.
grafana_repo() {
  local line="deb [signed-by=$GRAFANA_KEY] $GRAFANA_APT stable main" tmp err
  GRAFANA_REPO=""
  if ! command -v curl >/dev/null 2>&1 || ! command -v gpg >/dev/null 2>&1; then
    grafana_no_repo "curl or gpg (gnupg) missing"; return 1
  fi
  tmp="$(mktemp -d)"
  if ! err="$(curl -fsS --connect-timeout 5 --max-time 30 -o "$tmp/key" "$GRAFANA_APT/gpg.key" 2>&1)"; then
    rm -rf "$tmp"; grafana_no_repo "${err%%$'\n'*}"; return 1
  fi
  if ! err="$(gpg --batch --no-tty --dearmor < "$tmp/key" 2>&1 > "$tmp/key.gpg")" ||
     [ ! -s "$tmp/key.gpg" ]; then
    rm -rf "$tmp"; grafana_no_repo "its gpg.key is not a key: ${err%%$'\n'*}"; return 1
  fi
  if ! cmp -s "$tmp/key.gpg" "$GRAFANA_KEY"; then
    if ! install -D -m 0644 "$tmp/key.gpg" "$GRAFANA_KEY"; then
      rm -rf "$tmp"; grafana_no_repo "could not write $GRAFANA_KEY"; return 1
    fi
  fi
  rm -rf "$tmp"
  if [ "$(cat "$GRAFANA_LIST" 2>/dev/null)" != "$line" ]; then
    if ! { mkdir -p "$(dirname "$GRAFANA_LIST")" && echo "$line" > "$GRAFANA_LIST"; }; then
      grafana_no_repo "could not write $GRAFANA_LIST"; return 1
    fi
  fi
  # Only this source (the others' lists kept), transient errors included (APT::Update::Error-Mode).
  if ! err="$(apt-get -o DPkg::Lock::Timeout=300 -qq update -o Dir::Etc::SourceList="$GRAFANA_LIST" \
        -o Dir::Etc::SourceParts=- -o APT::Get::List-Cleanup=0 -o APT::Update::Error-Mode=any \
        -o Acquire::Retries=0 -o Acquire::http::Timeout=30 -o Acquire::https::Timeout=30 2>&1)"; then
    err="$(printf '%s\n' "$err" | grep -m1 '^E: ' || printf '%s\n' "$err" | head -n 1)"
    grafana_no_repo "apt-get update of it failed: ${err:-?}"; return 1
  fi
  GRAFANA_REPO=ok
}
# grafana_no_repo WHY: remove Grafana's apt source (its key stays: harmless) and note why.
grafana_no_repo() {
  rm -f "$GRAFANA_LIST"
  GRAFANA_REPO="$1"
}
# The one line when Grafana's repository does not answer: what still works, what to do
# (tests/vm/user_path.sh counts the lines that begin "provision: Grafana's apt repository").
grafana_unreachable_line() {
  local again="sudo $REPO/vagrant/provision.sh"
  [ "${#ARGS[@]}" -gt 0 ] && again="$again$(printf ' %q' "${ARGS[@]}")"
  log "Grafana's apt repository $GRAFANA_APT is unreachable or unusable ($GRAFANA_REPO): Grafana not installed, its apt source left out; everything else continues (the monitor on :$MONITOR_PORT, runs, lightpipe grafana check, lightpipe report); to add Grafana later: vagrant provision (or in the VM: $again), or pass --no-grafana to stop trying"
}
grafana_admin_password() {
  install -d -o root -g root -m 0700 "$SECRETS"
  if [ ! -s "$GRAFANA_PASSWORD_FILE" ]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr '+/' '-_' > "$GRAFANA_PASSWORD_FILE")
    rm -f "$SECRETS/.grafana-admin-set"
  fi
  chmod 0600 "$GRAFANA_PASSWORD_FILE"
  if [ ! -e "$SECRETS/.grafana-admin-set" ]; then
    # Before Grafana's first start, so admin/admin is never live; read from stdin, not argv.
    if runuser -u grafana -- grafana-cli --homepath /usr/share/grafana \
         --config /etc/grafana/grafana.ini admin reset-admin-password --password-from-stdin \
         < "$GRAFANA_PASSWORD_FILE" >/dev/null 2>&1; then
      touch "$SECRETS/.grafana-admin-set"
    else
      log "could not set Grafana's admin password (grafana-cli admin reset-admin-password)"
    fi
  fi
  log "Grafana: user admin, password in $GRAFANA_PASSWORD_FILE (root only: sudo cat it)"
}

# --- The Python ------------------------------------------------------------------------
# os_release: OS_ID, OS_LIKE, OS_VERSION (VERSION_ID), OS_CODENAME and OS_PRETTY from
# $OS_RELEASE, read as data (never sourced), its first 200 lines and 16 KiB, each value cut
# to 80 characters of a plain set.
os_release() {
  OS_ID="" OS_LIKE="" OS_VERSION="" OS_CODENAME="" OS_PRETTY=""
  local f="$OS_RELEASE" line k v
  [ -z "${LIGHTPIPE_OS_RELEASE:-}" ] && [ ! -r "$f" ] && f=/usr/lib/os-release
  [ -r "$f" ] || return 0
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in [A-Z]*=*) ;; *) continue ;; esac
    k="${line%%=*}" v="${line#*=}"
    v="${v#[\"\']}" v="${v%[\"\']}"
    v="${v//[^A-Za-z0-9 ._,:()\/+-]/}"
    v="${v:0:80}"
    case "$k" in
      ID) OS_ID="${v,,}" ;;
      ID_LIKE) OS_LIKE="${v,,}" ;;
      VERSION_ID) OS_VERSION="$v" ;;
      VERSION_CODENAME) OS_CODENAME="${v,,}" ;;
      PRETTY_NAME) OS_PRETTY="$v" ;;
    esac
  done < <(head -c 16384 "$f" | head -n 200)
}
is_ubuntu() { [ "$OS_ID" = ubuntu ] || [[ " $OS_LIKE " == *" ubuntu "* ]]; }
# choose_python: the Python for make setup, by the release: PY (the interpreter), PY_PKGS
# (the apt packages that give it and its venv module) and PY_WHY (one line). Returns 0; 2
# where the release has no Python 3.11-3.13 (PY_WHY: the refusal, naming LP_BOX's boxes); 3
# where that depends on a python3 not installed yet.
choose_python() {
  os_release
  local name ver old=""
  case "$OS_ID" in
    debian|ubuntu)
      name="${OS_ID^} ${OS_VERSION:-$OS_CODENAME}"
      [ -n "$OS_VERSION" ] && [ -n "$OS_CODENAME" ] && name="$name ($OS_CODENAME)" ;;
    *) name="${OS_PRETTY:-${OS_ID:-this system (no $OS_RELEASE)}}" ;;
  esac
  PY=python3 PY_PKGS="python3 python3-venv" PY_WHY=""
  # By VERSION_ID where the file has one, else by the code name (Debian testing has none).
  case "$OS_ID:${OS_VERSION:-:$OS_CODENAME}" in
    debian:12|debian::bookworm) PY_WHY="$name: python3 (3.11)"; return 0 ;;
    debian:13|debian::trixie) PY_WHY="$name: python3 (3.13)"; return 0 ;;
    ubuntu:24.04|ubuntu::noble) PY_WHY="$name: python3 (3.12)"; return 0 ;;
    ubuntu:22.04|ubuntu::jammy)
      PY=python3.11 PY_PKGS="python3.11 python3.11-venv"
      PY_WHY="$name: python3 is 3.10, so python3.11 and python3.11-venv from Ubuntu's archive (universe)"
      return 0 ;;
    ubuntu:20.04|ubuntu::focal) old=3.8 ;;
    ubuntu:18.04|ubuntu::bionic) old=3.6 ;;
    debian:11|debian::bullseye) old=3.9 ;;
    debian:10|debian::buster) old=3.7 ;;
  esac
  if [ -n "$old" ]; then
    PY="" PY_PKGS=""
    PY_WHY="$name has Python $old and no Python 3.11-3.13 in its archive; use $BOXES"
    return 2
  fi
  if ! command -v python3 >/dev/null 2>&1; then
    PY_WHY="$name: python3 is not installed, so its version is unknown (LightPipe needs 3.11-3.13)"
    return 3
  fi
  ver="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null | head -c 16 || true)"
  case "$ver" in
    3.11|3.12|3.13) PY_WHY="$name: python3 ($ver)"; return 0 ;;
  esac
  PY="" PY_PKGS=""
  PY_WHY="$name: python3 is Python ${ver:-?}, not 3.11-3.13 (a release this script does not know); use $BOXES"
  return 2
}

# Sourced (tests): the functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

while [ "$#" -gt 0 ]; do
  case "$1" in
    --repo) [ "$#" -ge 2 ] || die "--repo needs a directory"; REPO="$2"; shift ;;
    --listen) [ "$#" -ge 2 ] || die "--listen needs an address"; LISTEN="$2"; shift ;;
    --no-setup) DO_SETUP=0 ;;
    --no-grafana) DO_GRAFANA=0 ;;
    --no-prometheus) DO_PROMETHEUS=0 ;;
    --no-ovs) DO_OVS=0 ;;
    --no-modules) DO_MODULES=0 ;;
    --no-services) DO_SERVICES=0 ;;
    --print-python) PRINT_PYTHON=1 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
case "$LISTEN" in
  127.0.0.1|0.0.0.0) ;;
  *) die "--listen $LISTEN: 127.0.0.1 or 0.0.0.0" ;;
esac

# The Python first, before anything is installed: a release without 3.11-3.13 stops here.
py_rc=0
choose_python || py_rc=$?
if [ "$PRINT_PYTHON" = 1 ]; then
  case "$py_rc" in
    0) echo "$PY"; log "$PY_WHY; make setup PYTHON=$PY (apt: $PY_PKGS)"; exit 0 ;;
    *) die "$PY_WHY" ;;
  esac
fi
[ "$py_rc" = 2 ] && die "$PY_WHY"

[ "$(id -u)" = 0 ] || die "run as root (sudo $0)"
command -v apt-get >/dev/null 2>&1 || die "needs apt-get (Debian or Ubuntu)"
[ -f "$REPO/Makefile" ] || die "--repo $REPO is not a LightPipe checkout"
REPO="$(cd "$REPO" && pwd -P)"
HERE="$REPO/vagrant"  # (the templates; Vagrant runs this script from a copy in /tmp)
export DEBIAN_FRONTEND=noninteractive

# Grafana's source from an earlier run, before any apt-get update: kept only if the
# repository still answers (else every apt-get update below, make setup's too, would wait on
# it or fail on it).
if [ -e "$GRAFANA_LIST" ] && ! grafana_repo && [ "$DO_GRAFANA" = 0 ]; then
  log "Grafana's apt repository $GRAFANA_APT is unreachable or unusable ($GRAFANA_REPO): its apt source removed (so apt keeps working)"
fi

if [ "$py_rc" = 3 ]; then  # (a release this script does not know, without python3 yet)
  apt_install python3
  py_rc=0
  choose_python || py_rc=$?
  [ "$py_rc" = 0 ] || die "$PY_WHY"
fi
if [ "$PY" != python3 ] && ! installed "$PY"; then  # (Ubuntu 22.04's python3.11: universe)
  apt_update
  apt_has "$PY" || die "$PY_WHY, but $PY is not in this machine's apt sources: enable Ubuntu's universe component (sudo add-apt-repository universe) and run this again"
fi
log "Python: $PY_WHY"
# shellcheck disable=SC2086  # (PY_PKGS: package names, split on purpose)
apt_install ca-certificates curl gnupg make iproute2 kmod $PY_PKGS

if [ "$DO_MODULES" = 1 ]; then
  # Ubuntu keeps sch_netem (and more qdiscs) in linux-modules-extra; Debian ships them.
  if is_ubuntu; then
    extra="linux-modules-extra-$(uname -r)"
    if ! installed "$extra"; then
      apt_update
      if apt_has "$extra"; then apt_install "$extra"
      else log "no $extra for this kernel: netem may be missing"; fi
    fi
  fi
  mkdir -p /etc/modules-load.d
  want_modules="$(printf '%s\n' sch_netem openvswitch)"
  [ "$(cat /etc/modules-load.d/lightpipe.conf 2>/dev/null)" = "$want_modules" ] ||
    echo "$want_modules" > /etc/modules-load.d/lightpipe.conf
  for m in sch_netem openvswitch; do
    modprobe "$m" 2>/dev/null || log "modprobe $m failed (module not in this kernel?)"
  done
fi

if [ "$DO_OVS" = 1 ]; then
  apt_install openvswitch-switch
  enable_service openvswitch-switch
fi

if [ "$DO_PROMETHEUS" = 1 ] || [ "$DO_SETUP" = 1 ]; then
  # (make setup's system packages include prometheus too: installed here first, held.)
  apt_install_held prometheus
  mask_distro_prometheus
fi

if [ "$DO_SETUP" = 1 ]; then
  log "make setup PYTHON=$PY in $REPO"
  make -C "$REPO" setup PYTHON="$PY"
  mask_distro_prometheus
  # `lightpipe` on PATH: the checkout's CLI, as root, run scenarios by their repository path.
  tmp="$(mktemp)"
  sed -e "s|@REPO@|$REPO|g" -e "s|@STATE@|$STATE|g" "$HERE/lightpipe-wrapper.sh" > "$tmp"
  if install_file "$tmp" /usr/local/bin/lightpipe 755; then
    log "installed /usr/local/bin/lightpipe (runs $REPO/.venv/bin/lightpipe as root)"
  fi
  rm -f "$tmp"
fi

# --- the LightPipe monitor: a systemd service on $LISTEN:$MONITOR_PORT -------------------
if [ "$DO_PROMETHEUS" = 1 ]; then
  if services; then
    install -d -o root -g root -m 0755 "$STATE"
    tmp="$(mktemp)"
    sed -e "s|@REPO@|$REPO|g" -e "s|@LISTEN@|$LISTEN|g" -e "s|@PORT@|$MONITOR_PORT|g" \
      "$HERE/lightpipe-monitor.service" > "$tmp"
    changed=0
    install_file "$tmp" /etc/systemd/system/lightpipe-monitor.service 644 && changed=1
    rm -f "$tmp"
    [ "$changed" = 1 ] && systemctl daemon-reload
    systemctl enable lightpipe-monitor >/dev/null 2>&1
    if [ ! -x "$REPO/.venv/bin/lightpipe" ]; then
      log "lightpipe-monitor.service enabled, not started: no $REPO/.venv (make setup)"
    elif [ "$changed" = 1 ] || ! systemctl is-active --quiet lightpipe-monitor; then
      systemctl restart lightpipe-monitor ||
        log "lightpipe-monitor did not start (journalctl -u lightpipe-monitor)"
      log "lightpipe-monitor.service: http://$LISTEN:$MONITOR_PORT, data in $STATE/prometheus"
    fi
  else
    log "no systemd or --no-services: start the monitor with 'sudo lightpipe monitor up'"
  fi
fi

# --- Grafana -----------------------------------------------------------------------------
install_grafana_provisioning
if [ "$DO_GRAFANA" = 1 ]; then
  [ -n "$GRAFANA_REPO" ] || grafana_repo || true
  if [ "$GRAFANA_REPO" != ok ]; then
    grafana_unreachable_line
  elif apt_install grafana; then
    grafana_admin_password
    enable_service grafana-server
    if [ "$GRAFANA_CHANGED" = 1 ] && services && systemctl is-active --quiet grafana-server; then
      systemctl restart grafana-server ||  # (new provisioning or listen address)
        log "grafana-server did not restart (journalctl -u grafana-server); everything else is done"
    fi
  else
    grafana_no_repo "apt-get install grafana failed"
    log "Grafana's apt repository $GRAFANA_APT answered, but apt-get install grafana failed (its output above): Grafana not installed, its apt source left out; everything else continues; to try again: vagrant provision, or pass --no-grafana"
  fi
else
  log "--no-grafana: Grafana not installed (its provisioning is in $GRAFANA_PROV for when it is)"
fi
log "done"
