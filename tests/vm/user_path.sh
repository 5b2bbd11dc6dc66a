#!/usr/bin/env bash
# The user's path, tested with the real `vagrant up` (vagrant-libvirt, a local Debian 12 box,
# software emulation) and the project's unmodified vagrant/Vagrantfile and provision.sh:
#
#   sudo bash tests/vm/user_path.sh               # the whole test (what CI runs), then destroy
#   sudo bash tests/vm/user_path.sh --cmd "CMD"   # up (or reuse), reload, CMD as root in
#                                                 # /lightpipe; returns CMD's status; VM kept
#   sudo bash tests/vm/user_path.sh --destroy     # destroy a kept VM and clean up
#
# The test: box (tests/vm/build_box.sh, cached; pip in it sees PyPI only, as in a user's VM)
# -> `LP_BOX=<box> vagrant up --provider libvirt` (provision.sh as a user runs it, make setup
# included; Grafana's repository is unreachable here, which provisioning must say in one
# line and go on) -> `vagrant reload` -> the services are active, the host's forwarded
# 127.0.0.1:9090 is LightPipe's monitor -> `vagrant ssh -c 'lightpipe run
# scenarios/monitor-demo.yaml'` -> `lightpipe grafana check --url http://127.0.0.1:9090`
# on the host finds that run on every panel the scenario can produce -> the Grafana files,
# statically -> `vagrant destroy -f`, and nothing of it left (domain, volumes, pool, network).
# Every step prints its time ("user-path: STEP took N s").
#
# Environment: LP_CPUS (2), LP_MEMORY_MB (6144), LIGHTPIPE_USERPATH_TIMEOUT_S (2400: the
# whole test), VAGRANT_HOME (default /var/tmp/lightpipe-vagrant.d: the box lives there).
set -euo pipefail
MODE=test CMD=""
case "${1:-}" in
  --cmd) [ "$#" -ge 2 ] || { echo "user-path: --cmd needs a command" >&2; exit 2; }
         MODE=cmd CMD="$2" ;;
  --destroy) MODE=destroy ;;
  "") ;;
  -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "user-path: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
REPO="$(pwd)"
HOST_CLI="${VENV:-$REPO/.venv}/bin/lightpipe"
POOL=lightpipe-userpath
POOL_DIR=/var/tmp/lightpipe-userpath-pool
NET=lightpipe-userpath
PREFIX=lightpipe-userpath-
NETS=("$NET")
TAG=user-path
# shellcheck source=tests/vm/libvirt_lib.sh
source "$REPO/tests/vm/libvirt_lib.sh"  # host_setup, libvirt_remove, libvirt_left, log, step, vagrant_env
hold_harness_lock "$@"  # (outside the time limit below: timeout(1) signals its child)
# The whole test under a time limit (its EXIT trap still destroys the VM).
if [ "$MODE" = test ] && [ -z "${LP_USERPATH_TIMED:-}" ]; then
  LP_USERPATH_TIMED=1 exec timeout --kill-after=120 "${LIGHTPIPE_USERPATH_TIMEOUT_S:-2400}" \
    bash "$REPO/tests/vm/user_path.sh" "$@"
fi
# Panels that monitor-demo cannot fill (as tests/test_monitor_emu.py's HONESTLY_EMPTY):
# per-flow routing of DC fabrics (no leaf-spine fabric, no routing policy in the scenario)
# and the training loss (shadow-mode workers train no model). `grafana check` names them
# "n/a" from the run's own facts; every other query must have data (its exit status).
EXPECTED_EMPTY=("routing: panel Per-job bottleneck rate" "routing: panel Flows moved per re-route"
                "routing: panel Path computation time" "workers: panel Training loss")
# With netem links (the VM's kernel has netem: `link_mode` netem in lightpipe_run_info) the
# fibres are kernel qdiscs, which keep no per-fibre or per-lightpath counters of LightPipe's
# (only the user-space forwarder exports lightpipe_fibre_* and lightpipe_lightpath_*).
EXPECTED_EMPTY_NETEM=("optical: variable fibre" "optical: panel Per-fibre throughput"
                      "optical: panel Per-lightpath throughput" "optical: panel Queue depth"
                      "optical: panel Drops" "optical: panel Link emulator timer slack")

vagrant_env 6144
# provision.sh with no options, as `vagrant up` runs it for a user (Grafana included: its
# repository is unreachable here, and provisioning must say so in one line and go on).
export LP_PROVISION_ARGS="${LP_USERPATH_PROVISION_ARGS:-}"
UP_LOG="$(mktemp)"

vagrant_() { (cd "$REPO/vagrant" && vagrant "$@"); }
in_vm() { vagrant_ ssh -c "$1" -- -q; }

# PIDs of this checkout's Vagrant port forwards (ssh -N -L with our machine's key).
forward_pids() {
  local key="$REPO/vagrant/.vagrant/machines/default/libvirt/private_key"
  pgrep -f -- "IdentityFile=\"?${key//./\\.}\"? .*-L 127\\.0\\.0\\.1:(3000|9090):" || true
}

# Everything this harness made in libvirt and Vagrant, gone (after a failure too).
cleanup() {
  local rc=$? d
  trap - EXIT
  rm -f "${UP_LOG:-}"
  if [ "$MODE" = test ] && [ "$rc" != 0 ]; then
    log "FAILED (status $rc) at: $step_name; the monitor's journal:"
    in_vm "sudo journalctl -u lightpipe-monitor --no-pager -n 30" 2>&1 | tail -n 30 >&2 || true
    if [ -n "${run_dir:-}" ]; then  # the run's own account, before the VM goes
      log "the run's log (the last 60 lines of $run_dir/lightpipe.log) and its events:"
      in_vm "sudo tail -n 60 $run_dir/lightpipe.log; sudo tail -n 3 $run_dir/workers/*/stage*.log
sudo /lightpipe/.venv/bin/python -c 'import json, sys
s = json.load(open(sys.argv[1]))
for k in (\"event_errors\", \"faults\", \"reroute_rtt_out\"):
    print(k, json.dumps(s.get(k))[:2000])' $run_dir/summary.json" 2>&1 | tail -n 120 >&2 || true
    fi
  fi
  local t
  t=$(now)
  vagrant_ destroy -f >/dev/null 2>&1 || true
  # vagrant-libvirt's port forwards (`ssh -N -L 127.0.0.1:PORT:...`, one per port, made by
  # `up` and `reload`) can outlive destroy: end ours, by PID (this checkout's machine key
  # is on their command line), and wait until they are gone.
  for d in $(forward_pids); do kill "$d" 2>/dev/null || true; done
  for d in $(forward_pids); do timeout 10 tail --pid="$d" -f /dev/null || kill -9 "$d" 2>/dev/null || true; done
  libvirt_remove
  rm -rf "$REPO/vagrant/.vagrant"
  # What is left must be nothing of ours.
  local left
  left="$(libvirt_left)"
  [ -n "$(forward_pids)" ] && left+=" port-forward"
  if [ -n "$left" ]; then
    log "left behind:$left"
    [ "$rc" = 0 ] && rc=1
  else
    log "destroy and clean-up took $(( $(now) - t )) s: no domain, volume, pool or network left"
  fi
  log "whole run took $(( $(now) - T_ALL )) s"
  exit "$rc"
}

vm_running() {
  local st
  st="$(vagrant_ status --machine-readable 2>/dev/null || true)"
  grep -q ',state,running$' <<<"$st"
}

up_and_reload() {
  step "host set-up (packages, libvirtd)"
  if [ "$MODE" = test ]; then  # a fresh VM: what a killed run left goes first
    host_setup --fresh
    rm -rf "$REPO/vagrant/.vagrant"
  else
    host_setup
  fi
  done_step
  step "box (tests/vm/build_box.sh; cached)"
  LP_BOX="$(bash "$REPO/tests/vm/build_box.sh")"
  export LP_BOX
  done_step
  if vm_running; then
    log "reusing the running VM"
  else
    local p
    for p in 3000 9090; do
      if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
        die "127.0.0.1:$p is taken on this machine: the Vagrantfile forwards it"
      fi
    done
    step "vagrant up --provider libvirt (provision.sh, make setup)"
    vagrant_ up --provider libvirt 2>&1 | tee "$UP_LOG" | stamp
    done_step
    # What provisioning said: torch's source, and Grafana's unreachable repository (once).
    grep -q "setup: torch 2.13.0.* from " "$UP_LOG" ||
      die "make setup in the VM did not say where its torch came from"
    log "the VM's torch: $(grep -o 'setup: torch 2.13.0.*' "$UP_LOG" | tail -n 1)"
    if [ -z "${LP_USERPATH_PROVISION_ARGS:-}" ]; then
      n_grafana="$(grep -c "provision: Grafana's apt repository" "$UP_LOG" || true)"
      [ "$n_grafana" = 1 ] ||
        die "provisioning said $n_grafana lines of Grafana's unreachable repository, not 1"
    fi
  fi
  step "vagrant reload"; vagrant_ reload 2>&1 | stamp; done_step
}

if [ "$MODE" = destroy ]; then
  MODE=destroy; cleanup
fi
if [ "$MODE" = cmd ]; then
  up_and_reload
  step "--cmd"
  rc=0
  in_vm "cd /lightpipe && sudo bash -c $(printf '%q' "$CMD")" || rc=$?
  done_step
  exit "$rc"
fi

trap cleanup EXIT
# timeout(1) ends the test with SIGTERM: without a trap bash dies of it and skips EXIT, and
# the VM outlived the test (CI of d340887, 2026-11-28). Exit instead, so cleanup runs.
trap 'exit 143' TERM
trap 'exit 130' INT
up_and_reload

step "services after the reload"
in_vm "systemctl is-active lightpipe-monitor openvswitch-switch; systemctl is-enabled lightpipe-monitor prometheus; systemctl show -p Restart --value lightpipe-monitor; ss -Hltn 'sport = :9090'" |
  tr -s ' \r' ' ' > /tmp/lp-userpath-svc.$$
cat /tmp/lp-userpath-svc.$$ >&2  # (not tee /dev/stderr: that reopens and truncates a log file)
mapfile -t svc < /tmp/lp-userpath-svc.$$
rm -f /tmp/lp-userpath-svc.$$
[ "${svc[0]}" = active ] || die "lightpipe-monitor is ${svc[0]}, not active"
[ "${svc[1]}" = active ] || die "openvswitch-switch is ${svc[1]}, not active"
[ "${svc[2]}" = enabled ] || die "lightpipe-monitor is ${svc[2]}, not enabled"
[ "${svc[3]}" = masked ] || die "the distribution's prometheus is ${svc[3]}, not masked"
[ "${svc[4]}" = on-failure ] || die "lightpipe-monitor Restart=${svc[4]}"
case "${svc[*]:5}" in
  *"127.0.0.1:9090"*) ;;
  *) die "in the VM, port 9090 is not bound to 127.0.0.1 only: ${svc[*]:5}" ;;
esac
done_step

step "host: the forwarded 127.0.0.1:9090 is LightPipe's monitor"
flags="$(curl -fsS --max-time 30 http://127.0.0.1:9090/api/v1/status/flags)" ||
  die "no answer on the host's 127.0.0.1:9090"
echo "$flags" | grep -q '"storage.tsdb.path":"/var/lib/lightpipe/prometheus/data"' ||
  die "127.0.0.1:9090 is not LightPipe's monitor: $flags"
ss -Hltn 'sport = :9090' | grep -v '127.0.0.1:9090' | grep -q . &&
  die "the host's port 9090 is open beyond 127.0.0.1: $(ss -Hltn 'sport = :9090')"
ss -Hltn 'sport = :3000' | grep -q '127.0.0.1:3000' || die "port 3000 is not forwarded"
ss -Hltn 'sport = :3000' | grep -v '127.0.0.1:3000' | grep -q . &&
  die "the host's port 3000 is open beyond 127.0.0.1"
done_step

step "vagrant ssh -c 'lightpipe run scenarios/monitor-demo.yaml'"
RUN_LOG="$(mktemp)"
run_rc=0
# (each line stamped with the test's clock: where the run's time goes, phase by phase)
vagrant_ ssh -c 'lightpipe run scenarios/monitor-demo.yaml' -- -q 2>&1 | tee "$RUN_LOG" |
  stamp >&2 || run_rc=$?
run_id="$(sed -n 's/.*prometheus: run \([^,]*\),.*/\1/p' "$RUN_LOG" | head -n 1)"
run_dir="$(sed -n 's/^lightpipe: no --out: writing to \(\/var\/lib\/lightpipe\/runs\/[A-Za-z0-9._-]*\)$/\1/p' "$RUN_LOG" | head -n 1)"
is_emu=0
grep -q "running the emulation backend" "$RUN_LOG" && is_emu=1
rm -f "$RUN_LOG"
# Each job's outcome from the run's summary (and a failed stage's log): why, when it failed.
if [ -n "$run_dir" ]; then
  in_vm "sudo /lightpipe/.venv/bin/python /lightpipe/tests/vm/run_outcome.py $run_dir" >&2 ||
    { [ "$run_rc" = 0 ] && run_rc=1; }
fi
[ "$run_rc" = 0 ] || die "the run failed (status $run_rc)"
[ "$is_emu" = 1 ] || die "the run was not an emulation"
[ -n "$run_id" ] || die "the run did not say which Prometheus run it was"
log "run id $run_id"
done_step

step "host: lightpipe grafana check --url http://127.0.0.1:9090 --run $run_id"
link_mode="$(curl -fsS --max-time 30 http://127.0.0.1:9090/api/v1/query \
  --data-urlencode "query=last_over_time(lightpipe_run_info{run=\"$run_id\"}[1h])" |
  "${VENV:-$REPO/.venv}/bin/python" -c 'import json, sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["metric"].get("link_mode", "") if r else "")')"
log "the run's link mode: ${link_mode:-unknown}"
[ "$link_mode" = netem ] && EXPECTED_EMPTY+=("${EXPECTED_EMPTY_NETEM[@]}")
check_rc=0
check="$("$HOST_CLI" grafana check --url http://127.0.0.1:9090 --run "$run_id")" || check_rc=$?
echo "$check" >&2
[ "$check_rc" = 0 ] ||
  die "queries without data from this run: $(echo "$check" | grep '^EMPTY' | paste -sd ';' -)"
n_ok="$(echo "$check" | grep -c '^ok ' || true)"
n_na="$(echo "$check" | grep -c '^n/a ' || true)"
na="$(echo "$check" | sed -n 's/^n\/a *[0-9]*  \(.*\)  (this run cannot.*/\1/p')"
unexpected="$(echo "$na" | grep -vF -f <(printf '%s\n' "${EXPECTED_EMPTY[@]}") || true)"
[ -z "$unexpected" ] || die "named as impossible for this run, but it should have data: $unexpected"
# Every dashboard query was run (ok or n/a), and the ones with data are all but those named.
n_queries="$("$REPO/.venv/bin/python" -c 'from testbed.monitor.dashboards import load_dashboards, queries
print(sum(len(queries(k, v)) for k, v in load_dashboards().items()))')"
[ "$((n_ok + n_na))" -ge "$n_queries" ] ||
  die "grafana check ran $((n_ok + n_na)) of the dashboards' $n_queries queries"
[ "$n_ok" -gt 0 ] || die "no query had data"
log "$(echo "$check" | tail -n 1)"
done_step

step "in the VM: pip sees PyPI only; lightpipe report and doctor without Grafana"
in_vm "sudo /lightpipe/.venv/bin/pip config list; ls /etc/pip.conf /etc/xdg/pip 2>/dev/null; sudo /lightpipe/.venv/bin/python -c 'import json, sys; print(json.load(open(sys.prefix + \"/lightpipe-torch-source.json\"))[\"source\"])'" \
  > "$UP_LOG" 2>&1 || true
cat "$UP_LOG" >&2
[ "$(grep -cv '^\(local-file\|cpu-index\|pypi\|pypi-cpu\)$' "$UP_LOG" || true)" = 0 ] ||
  die "the VM's pip has a configuration, or its torch no recorded source"
grep -qx 'local-file' "$UP_LOG" && die "the VM's torch came from a local file (a user's VM has none)"
in_vm "sudo lightpipe report $run_dir" >&2 || die "lightpipe report failed in the VM"
in_vm "sudo test -s $run_dir/report.html" || die "no $run_dir/report.html"
in_vm "sudo lightpipe doctor" >&2 || die "lightpipe doctor failed in the VM"
done_step

step "Grafana's files, statically (Grafana itself is not installable here)"
in_vm "cd /lightpipe && sudo .venv/bin/python tests/vm/grafana_static.py" >&2 ||
  die "Grafana's provisioning is not as Grafana would need it"
done_step

step "vagrant destroy -f"
exit 0  # (the EXIT trap destroys the VM and checks that nothing is left)
