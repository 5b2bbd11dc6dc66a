"""The kernel path inside the VM harness: netem links and the Open vSwitch kernel datapath.

Runs where the kernel has (or can load) sch_netem and openvswitch: the virtme-ng guest
of tests/vm/run.sh (Debian's kernel), a Vagrant VM. Elsewhere every test skips.
Figures are printed (pytest -s or the harness's -v -rs log) for docs/vm.md.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.vm, pytest.mark.root, pytest.mark.slow]

# A ring A-B-C-D with DCs on A and C: the two-DC case, and a second route for restoration.
SCENARIO = """
version: 1
name: vm-ring
topology:
  links:
    - {u: A, v: B, length_km: 1000}
    - {u: B, v: C, length_km: 1000}
    - {u: C, v: D, length_km: 1500}
    - {u: D, v: A, length_km: 1500}
dcs:
  - {name: dc-a, node: A, gpus: 8}
  - {name: dc-c, node: C, gpus: 8}
optical: {slots: 16, k_paths: 2}
workload: {kind: lightpath_requests}
emulation: {hosts_per_dc: 1, bandwidth_divisor: 10000, link_mode: netem, datapath: kernel}
"""
RATE_MBPS = 10.0  # low: under software emulation (TCG) the guest's CPU is the ceiling
# The delay calibration (testbed.emu.calibrate) aims every path's median RTT at 2 x its
# configured delay; noise can put it on either side: a symmetric 1 ms band.
RTT_TOL_MS = 1.0
# TCP goodput over an HTB cap: headers take ~3.5 % of a 1500-byte frame (0.952-0.956
# measured in CI); below 0.90 the cap or the path is wrong, above 0.97 the cap is not applied.
GOODPUT_BAND = (0.90, 0.97)
# A goodput out of the band is measured again up to this many times: a TCG guest can stall
# for a few hundred ms while iperf3 measures (CI, stop 57: 0.888 once where 0.952-0.956
# was the rule). A wrong cap is out of the band every time and still fails.
GOODPUT_RECHECKS = 2


def _why_skip() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("mnexec", "iperf3", "ovs-vswitchd", "ovsdb-server", "ping"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} not installed"
    from testbed.envprobe import module_state, netem_available

    if not netem_available():
        return "this kernel has no netem qdisc (run tests/vm/run.sh)"
    if module_state("openvswitch") == "absent":
        return "this kernel has no openvswitch module (run tests/vm/run.sh)"
    return None


WHY = _why_skip()
need_kernel = pytest.mark.skipif(WHY is not None, reason=WHY or "")


def _report(line: str) -> None:
    """Figures go to the harness log (stdout is captured per test; -rs shows skips)."""
    print(f"VM-REPORT {line}", flush=True)
    out = os.environ.get("LIGHTPIPE_VM_REPORT")
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def _calibration_line(rec: dict[str, Any]) -> str:
    """Before/after median error per path and the corrections, for the log."""
    def errs(rows: list[dict[str, Any]]) -> str:
        return ", ".join(f"{r['pair']} ({r['hops']} hops) {r['error_ms']:+.2f} (max "
                         f"{r['max_ms'] - r['expected_rtt_ms']:+.2f})" for r in rows)

    corr = ", ".join(f"{f['fibre']} {f['correction_ms']:.3f}" for f in rec["fibres"])
    return (f"{rec['corrections_applied']} round(s) in {rec['wall_s']:.1f} s, settled "
            f"{rec['settled']}; RTT - 2 x delay before: {errs(rec['before'])}; after: "
            f"{errs(rec['after'])}; corrections (ms/pass): {corr}")


@need_kernel
def test_guest_kernel_features() -> None:
    from testbed.emu.network import choose_datapath, choose_link_mode
    from testbed.envprobe import module_state

    mode, dp = choose_link_mode("auto"), choose_datapath("auto")
    _report(f"kernel {platform.release()} link_mode(auto)={mode} datapath(auto)={dp} "
            f"openvswitch={module_state('openvswitch')} sch_netem={module_state('sch_netem')}")
    assert (mode, dp) == ("netem", "kernel")
    assert module_state("openvswitch") == "loaded"  # choose_datapath loaded it


@need_kernel
def test_netem_link_rate_delay_loss() -> None:
    """One fibre, netem + HTB in its middle namespace: RTT, TCP goodput, loss."""
    from testbed.emu.linkbench import LinkTestbed

    delay_ms = 10.0
    with LinkTestbed(RATE_MBPS, delay_ms, link_mode="netem", calibrate=True) as lt:
        assert lt.mode == "netem" and lt.calibration is not None
        st = _in_band_or_recalibrated(lt.ping(count=30), 2 * delay_ms,
                                      lambda: lt.ping(count=30), lt.calibrate, "netem link")
        ratio = _goodput_ratio(lambda: lt.iperf(seconds=4.0, warmup_s=1.5), RATE_MBPS,
                               "netem link")
    _report(f"netem link calibration: {_calibration_line(lt.calibration)}")
    _report(f"netem link {RATE_MBPS} Mbit/s {delay_ms} ms: RTT median {st.median_ms:.2f} ms "
            f"min {st.min_ms:.2f} p99 {st.p99_ms:.2f} (expected {2 * delay_ms}), goodput "
            f"{ratio:.3f} of rate")
    assert st.median_ms is not None and abs(st.median_ms - 2 * delay_ms) <= RTT_TOL_MS
    assert GOODPUT_BAND[0] <= ratio <= GOODPUT_BAND[1]
    with LinkTestbed(RATE_MBPS, 1.0, loss=0.05, link_mode="netem") as lt:
        st = lt.ping(count=400, interval_s=0.005)
    lost = st.sent - st.received
    # Each ping crosses the fibre twice: P(lost) = 1 - 0.95^2 = 9.75 %.
    _report(f"netem loss 5 %/direction: {lost}/{st.sent} pings lost (expected 9.75 %)")
    assert 0.05 * st.sent <= lost <= 0.15 * st.sent


def test_controller_store_on_9p() -> None:
    """The controller's SQLite store on the harness's 9p directory (WAL fails there)."""
    out = os.environ.get("LIGHTPIPE_VM_OUT_DIR")
    if not out:
        pytest.skip("only in the VM harness (LIGHTPIPE_VM_OUT_DIR: its 9p directory)")
    from controllers.store import Store

    path = Path(out) / "store-9p.db"
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        p.unlink(missing_ok=True)
    st = Store(path)
    st.set_meta("k", "v")
    st.close()
    st = Store(path)
    assert st.get_meta("k") == "v"
    st.close()
    _report(f"controller store on 9p ({out}): ok")


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if WHY:
        pytest.skip(WHY)
    if os.environ.get("LIGHTPIPE_VM_RING") == "0":
        pytest.skip("LIGHTPIPE_VM_RING=0: the two-DC ring is left out")
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.orchestrate.glue import attach_controller, controller_address
    from testbed.spec import load_scenario

    tmp = tmp_path_factory.mktemp("vmring")
    spec = tmp / "ring.yaml"
    spec.write_text(SCENARIO)
    sc = load_scenario(spec)
    t0 = time.monotonic()
    net = EmuNetwork(build_plan(sc), link_mode="netem", datapath="kernel",
                     controller=controller_address())
    state: dict[str, Any] = {"net": net, "spec": spec}
    try:
        net.start()
        t_net = time.monotonic() - t0
        state["ctl"] = attach_controller(net, spec, tmp / "run", token="t0ken",
                                         timeout_s=net.startup_timeout_s)
        _report(f"ring up: network {t_net:.1f} s, controller {time.monotonic() - t0 - t_net:.1f}"
                f" s (start-up timeout {net.startup_timeout_s:.0f} s); link_mode "
                f"{net.link_mode}, datapath {net.datapath}")
        import threading

        done = threading.Event()

        def _watch() -> None:
            if done.wait(60):
                return
            pid = state["ctl"].proc.pid
            ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,wchan:32,args", "--forest"],
                                capture_output=True, text=True).stdout
            _report(f"POST /lightpaths: no answer after 60 s; processes:\n{ps[-4000:]}")
            spy = Path(sys.executable).parent / "py-spy"  # dev extras
            if spy.exists():
                r = subprocess.run([str(spy), "dump", "--pid", str(pid), "--subprocesses"],
                                   capture_output=True, text=True)
                _report(f"py-spy dump of the controller:\n{r.stdout[-12000:]}"
                        f"{r.stderr[-2000:]}")

        threading.Thread(target=_watch, daemon=True).start()
        status, lp = state["ctl"].request("POST", "/lightpaths", {
            "src_dc": "dc-a", "dst_dc": "dc-c", "slots": 2})
        done.set()
        assert status == 201, lp
        state["lp"] = lp
        from testbed.emu.calibrate import calibrate_network

        state["calibration"] = calibrate_network(net)
        _report(f"ring calibration: {_calibration_line(state['calibration'])}")
        yield state
    except Exception:
        log = tmp / "run" / "controller.log"  # on the guest's tmpfs: gone after the VM
        if log.exists():
            _report("controller.log tail:\n" + log.read_text()[-6000:])
        if net.ovs is not None:  # each switch's view of its controller connection
            try:
                _report("ovs controllers:\n" + net.ovs.vsctl(
                    "--columns=target,is_connected,role,status", "list", "Controller"))
            except Exception as e:  # diagnosis only
                _report(f"ovs-vsctl list Controller failed: {e}")
        raise
    finally:
        if "ctl" in state:
            state["ctl"].stop()
        net.stop()


def _host(net: Any, dc: str) -> Any:
    return next(h for h in net.plan.hosts if h.dc == dc)


def _in_band_or_recalibrated(st: Any, expected_ms: float, ping: Callable[[], Any],
                             recalibrate: Callable[[], dict[str, Any]], what: str) -> Any:
    """A median RTT outside expected_ms +- RTT_TOL_MS is calibrated again and pinged again,
    up to RTT_RECHECKS times, as a run's verification does (testbed.orchestrate.run
    .verify_network): under software emulation the processing time drifts between the
    calibration and the check. The last measurement."""
    from testbed.orchestrate.run import RTT_RECHECKS

    for _ in range(RTT_RECHECKS):
        if st.median_ms is not None and abs(st.median_ms - expected_ms) <= RTT_TOL_MS:
            break
        _report(f"{what}: RTT median {st.median_ms} ms outside {expected_ms} +- "
                f"{RTT_TOL_MS} ms: calibrating again, as a run's verification does")
        _report(f"{what} calibration again: {_calibration_line(recalibrate())}")
        st = ping()
    return st


def _goodput_ratio(measure: Callable[[], Any], rate_mbps: float, what: str) -> float:
    """TCP goodput over rate_mbps; out of GOODPUT_BAND it is measured again, up to
    GOODPUT_RECHECKS times, each attempt reported with its retransmits and its 0.5 s
    intervals (a stall shows as one slow interval, a wrong cap as all). The last ratio."""
    from testbed.emu.probes import interval_rates_mbps

    for attempt in range(GOODPUT_RECHECKS + 1):
        res = measure()
        ratio = float(res.goodput_mbps) / rate_mbps
        if GOODPUT_BAND[0] <= ratio <= GOODPUT_BAND[1]:
            break
        rates = ", ".join(f"{r:.2f}" for r in interval_rates_mbps(res.raw))
        _report(f"{what}: goodput {ratio:.3f} of {rate_mbps:.2f} Mbit/s outside {GOODPUT_BAND} "
                f"(attempt {attempt + 1}; {res.retransmits} retransmits; intervals {rates} "
                f"Mbit/s)" + ("; measuring again" if attempt < GOODPUT_RECHECKS else ""))
    return ratio


def _ping(net: Any, a: Any, b: Any, count: int, interval_s: float = 0.02) -> Any:
    from testbed.emu.probes import PingStats, icmp_ping

    return PingStats.of(icmp_ping(f"/proc/{net.host_pid(a.name)}/ns/net",
                                  b.ip.split("/")[0], count=count, interval_s=interval_s))


def test_two_dc_rtt_and_goodput(ring: dict[str, Any]) -> None:
    """The lightpath's RTT within the band, as a run's verification holds it: a pair out
    of the band after the calibration is calibrated again and pinged again, up to
    RTT_RECHECKS times (testbed.orchestrate.run.verify_network). Under software emulation
    the path's processing time drifts between the calibration and the check (CI, 8 runs:
    medians 18.69-20.97 ms for a planned 20; the 18.69 one, -1.31 ms, after the
    calibration measured it at +0.63 with the same settings seconds before)."""
    from testbed.emu.calibrate import calibrate_network
    from testbed.emu.probes import run_iperf3

    net, lp = ring["net"], ring["lp"]
    assert (net.link_mode, net.datapath) == ("netem", "kernel")
    a, c = _host(net, "dc-a"), _host(net, "dc-c")
    _ping(net, a, c, count=3)  # warm: ARP is static, flows are in; first packets are slow
    st = _ping(net, a, c, count=30)
    one_way_ms = float(lp["latency_ms"])
    st = _in_band_or_recalibrated(st, 2 * one_way_ms, lambda: _ping(net, a, c, count=30),
                                  lambda: calibrate_network(net), "two-DC lightpath")
    rate = net.plan.scale.rate_mbps(float(lp["capacity_gbps"]))
    ratio = _goodput_ratio(lambda: run_iperf3(
        ["mnexec", "-a", str(net.host_pid(c.name))], ["mnexec", "-a", str(net.host_pid(a.name))],
        c.ip.split("/")[0], seconds=4.0, warmup_s=1.5), rate, "two-DC lightpath")
    _report(f"two-DC lightpath {lp['nodes']} vid {lp['vid']}: RTT median {st.median_ms:.2f} "
            f"ms min {st.min_ms:.2f} p99 {st.p99_ms:.2f} (2 x one-way = {2 * one_way_ms:.2f}); "
            f"goodput {ratio * rate:.2f} of {rate:.2f} Mbit/s = {ratio:.3f}")
    assert st.received == st.sent
    assert st.median_ms is not None and abs(st.median_ms - 2 * one_way_ms) <= RTT_TOL_MS
    assert GOODPUT_BAND[0] <= ratio <= GOODPUT_BAND[1]


def test_kernel_datapath_forwards(ring: dict[str, Any]) -> None:
    """The bridges are kernel (system) datapaths, and their flows carry the traffic."""
    net = ring["net"]
    env = {**os.environ, **net.ovs.env}
    show = subprocess.run(["ovs-appctl", "-t", f"{net.ovs.dir}/ovs-vswitchd.ctl",
                           "dpctl/show"], capture_output=True, text=True, env=env, check=True)
    assert "system@ovs-system" in show.stdout, show.stdout
    types = subprocess.run(["ovs-vsctl", f"--db=unix:{net.ovs.db_sock}", "--columns=name,"
                            "datapath_type", "list", "Bridge"], capture_output=True, text=True,
                           env=env, check=True).stdout
    assert "netdev" not in types
    flows = subprocess.run(["ovs-appctl", "-t", f"{net.ovs.dir}/ovs-vswitchd.ctl",
                            "dpctl/dump-flows", "system@ovs-system"], capture_output=True,
                           text=True, env=env, check=True).stdout
    a, c = _host(net, "dc-a"), _host(net, "dc-c")
    st = _ping(net, a, c, count=5)
    flows = subprocess.run(["ovs-appctl", "-t", f"{net.ovs.dir}/ovs-vswitchd.ctl",
                            "dpctl/dump-flows", "system@ovs-system"], capture_output=True,
                           text=True, env=env, check=True).stdout
    n = len([x for x in flows.splitlines() if "packets:" in x])
    _report(f"kernel datapath: {n} datapath flows after ping, {st.received}/{st.sent} replies")
    assert st.received == st.sent and n > 0


def test_lightpath_caps_follow_the_controller(ring: dict[str, Any]) -> None:
    """A new lightpath gets its netem-mode cap (an HTB class behind a VLAN filter on the
    fibre's emulator) and loses it when deleted (tests/test_controller_netem.py's root
    test, on the ring the guest already has)."""
    net, ctl = ring["net"], ring["ctl"]
    status, lp = ctl.request("POST", "/lightpaths", {"src_dc": "dc-a", "dst_dc": "dc-c",
                                                     "slots": 1})
    assert status == 201, lp
    f = net.plan.fibre(lp["nodes"][0], lp["nodes"][1])
    emu = net.emulators[f.middle]

    def filters() -> str:
        return subprocess.run(["mnexec", "-a", str(emu.ns_pid), "tc", "filter", "show", "dev",
                               emu.intf_v], capture_output=True, text=True, check=True).stdout

    # tc prints the basic filter's ematch as "meta(vlan eq V)" (iproute2 6.1) or
    # "vlan_tag eq V" (older)
    def has(out: str, vid: int) -> bool:
        return re.search(rf"\bvlan(?:_tag)? eq {vid}\b", out) is not None

    assert has(filters(), lp["vid"])
    status, _ = ctl.request("DELETE", f"/lightpaths/{lp['id']}")
    assert status in (200, 204)
    out = filters()
    _report(f"netem caps: lightpath vid {lp['vid']} on {f.middle} added and removed")
    assert not has(out, lp["vid"])


def test_fibre_cut_restored_by_controller(ring: dict[str, Any]) -> None:
    net, ctl, lp1 = ring["net"], ring["ctl"], ring["lp"]
    u, v = lp1["nodes"][0], lp1["nodes"][1]
    f = net.plan.fibre(u, v)
    emu = net.emulators[f.middle]
    t_cut = time.monotonic()
    subprocess.run(["mnexec", "-a", str(emu.ns_pid), "ip", "link", "set", emu.intf_u, "down"],
                   check=True)
    deadline = time.monotonic() + net.startup_timeout_s
    lp = lp1
    while time.monotonic() < deadline:
        status, lp = ctl.request("GET", f"/lightpaths/{lp1['id']}")
        if status == 200 and lp["restored"] >= 1:
            break
        time.sleep(0.05)
    seen_s = time.monotonic() - t_cut
    a, c = _host(net, "dc-a"), _host(net, "dc-c")
    st = _ping(net, a, c, count=5)
    status, metrics = ctl.request("GET", "/metrics")
    line = next(x for x in metrics.splitlines()
                if x.startswith("lightpipe_restoration_seconds_sum"))
    _report(f"fibre {u}-{v} cut: lightpath {lp1['nodes']} -> {lp['nodes']}, controller "
            f"restoration {float(line.split()[-1]) * 1e3:.0f} ms, seen after "
            f"{seen_s * 1e3:.0f} ms; {st.received}/{st.sent} pings after")
    assert lp["restored"] >= 1 and lp["nodes"] != lp1["nodes"]
    assert st.received >= st.sent - 1
    subprocess.run(["mnexec", "-a", str(emu.ns_pid), "ip", "link", "set", emu.intf_u, "up"],
                   check=True)


CALIB = Path(__file__).resolve().parents[2] / "scenarios" / "calib-latency-gpipe.yaml"


@need_kernel
@pytest.mark.skipif(os.environ.get("LIGHTPIPE_VM_CALIBRATION", "1") == "0",
                    reason="LIGHTPIPE_VM_CALIBRATION=0 leaves it out")
def test_calibration_agreement_reported(tmp_path: Path) -> None:
    """A short calibration scenario on both backends (one 2-stage job across two DCs:
    PyTorch workers under software emulation are slow to start); the agreement and its
    verdict are reported."""
    import json

    import yaml

    data = yaml.safe_load(CALIB.read_text())
    data["workload"].update({"jobs": 1, "max_stages_per_dc": 1})
    data["workload"]["mix"][0]["stages"] = 2
    data["emulation"].update({"max_jobs": 1, "worker_iterations": 3,
                              "worker_warmup_iterations": 1, "link_mode": "netem",
                              "datapath": "kernel", "forwarding": "static"})
    spec = tmp_path / "calib.yaml"
    spec.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    t0 = time.monotonic()
    lightpipe = str(Path(sys.executable).parent / "lightpipe")
    r = subprocess.run([lightpipe, "run", str(spec), "--backend", "both", "--out", str(out)],
                       capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    table = out / "agreement.md"
    assert table.exists(), sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    summary = json.loads((out / "emu" / "summary.json").read_text())
    _report(f"calibration {data['name']} (1 job of 2 stages, netem + kernel datapath) in "
            f"{wall:.0f} s:\n{table.read_text().strip()}")
    (row,) = summary["agreement"]
    assert row["emulated_iteration_time_s"] is not None and row["relative_error"] is not None
    verdict = summary["agreement_verdict"]
    # 3 iterations are too few for a figure: the run must say so rather than report one
    assert not verdict["reliable"] and any("measured iterations" in r for r in verdict["reasons"])
    assert "UNRELIABLE" in table.read_text()
