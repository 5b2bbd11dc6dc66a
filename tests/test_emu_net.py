"""Root tests of whole emulated networks: lightpath caps, 4-DC lifecycle, clean after kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.spec import parse_scenario
from tests.emu_skip import need_root
from tests.waiting import wait_until

pytestmark = [pytest.mark.root]

REPO = Path(__file__).resolve().parent.parent
LIGHTPIPE = [str(Path(sys.executable).parent / "lightpipe")]


def four_dc() -> dict[str, Any]:
    return {"name": "emu-4dc", "topology": {"library": "nsfnet"},
            "dcs": [{"name": "dc-a", "node": "1", "gpus": 8},
                    {"name": "dc-b", "node": "6", "gpus": 8},
                    {"name": "dc-c", "node": "9", "gpus": 8},
                    {"name": "dc-d", "node": "13", "gpus": 8}],
            "workload": {"kind": "lightpath_requests"},
            "emulation": {"bandwidth_divisor": 10000, "time_factor": 0.5, "hosts_per_dc": 2}}


def leftovers(prefix: str) -> dict[str, list[str]]:
    """Anything on the machine still carrying the run's prefix."""
    ns = [n.split()[0] for n in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                               text=True).stdout.splitlines()]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    procs = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if prefix in cmd:
                procs.append(f"{d.name}: {cmd[:80]}")
    from testbed.emu.state import state_root

    return {"netns": [n for n in ns if prefix in n],
            "links": [ln for ln in links.splitlines() if prefix in ln],
            "procs": procs,
            "state": [str(state_root() / prefix)] if (state_root() / prefix).exists() else []}


@need_root
@pytest.mark.slow
def test_two_lightpaths_on_one_fibre_each_get_their_capacity() -> None:
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.emu.probes import run_iperf3

    sc = parse_scenario({
        "name": "caps", "topology": {"links": [{"u": "A", "v": "B", "length_km": 200},
                                               {"u": "B", "v": "C", "length_km": 200}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 8, "hosts": 2},
                {"name": "dc-b", "node": "B", "gpus": 8}, {"name": "dc-c", "node": "C", "gpus": 8}],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 1}})
    plan = build_plan(sc)
    lps = {(lp.dc_a, lp.dc_b): lp for lp in plan.lightpaths}
    ab, ac = lps[("dc-a", "dc-b")], lps[("dc-a", "dc-c")]
    fibre = plan.fibre("A", "B")  # carries both lightpaths
    assert fibre.rate_mbps == pytest.approx(400.0)
    caps = {ab.vlan: 20.0, ac.vlan: 40.0}
    with EmuNetwork(plan, link_mode="userspace") as net:
        for lp in (ab, ac):  # what the controller does at run time
            for u, v in zip(lp.path, lp.path[1:], strict=False):
                net.emulators[plan.fibre(u, v).middle].set_cap(lp.vlan, caps[lp.vlan])
        emu = net.emulators[fibre.middle]

        def iperf(src: str, dst: str, dst_ip: str, port: int, out: dict[str, float]) -> None:
            r = run_iperf3(["mnexec", "-a", str(net.host_pid(dst))],
                           ["mnexec", "-a", str(net.host_pid(src))],
                           dst_ip, seconds=5.0, warmup_s=1.5, port=port)
            out[dst] = r.goodput_mbps

        for _attempt in range(3):
            # One lightpath alone on an idle 400 Mbit/s fibre still gets only its cap.
            alone: dict[str, float] = {}
            iperf("dc-a-h0", "dc-b-h0", "10.2.0.1", 5301, alone)
            both: dict[str, float] = {}
            threads = [threading.Thread(target=iperf, args=args) for args in (
                ("dc-a-h0", "dc-b-h0", "10.2.0.1", 5302, both),
                ("dc-a-h1", "dc-c-h0", "10.3.0.1", 5303, both))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            ratios = [alone["dc-b-h0"] / 20.0, both["dc-b-h0"] / 20.0, both["dc-c-h0"] / 40.0]
            if all(0.90 <= r <= 0.97 for r in ratios):
                break
        st = emu.stats()["directions"]["a_to_b" if fibre.u == "A" else "b_to_a"]
        assert st["vlans"][str(ab.vlan)]["packets"] > 0
        assert st["vlans"][str(ac.vlan)]["packets"] > 0
    assert all(0.90 <= r <= 0.97 for r in ratios), ratios
    assert not any(leftovers(plan.prefix).values())


@need_root
@pytest.mark.slow
def test_four_dc_up_verify_down_leaves_nothing(tmp_path: Path) -> None:
    from testbed.backends.emu import EmuBackend

    sc = parse_scenario(four_dc())
    out = tmp_path / "run"
    summary = EmuBackend().run(sc, out, quiet=True, probe_seconds=1.0)
    assert summary["verified"] is True and summary["lightpaths"] == 6
    assert summary["hosts"] == 8 and summary["fibres"] == 22
    for name in ("manifest.json", "summary.json", "probes.csv", "network.json"):
        assert (out / name).is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "emu" and manifest["link_mode"] == "userspace"
    assert manifest["bandwidth_divisor"] == 10000 and manifest["time_factor"] == 0.5
    net = json.loads((out / "network.json").read_text())
    # The os-ken controller programmed the switches (emulation.forwarding default) and
    # was stopped before the network went down.
    ctl = net["controller"]
    assert ctl["rest_url"].startswith("http://127.0.0.1:") and ctl["token"]
    assert summary["forwarding"] == "controller" and manifest["controller"]["pid"] == ctl["pid"]
    assert not Path(f"/proc/{ctl['pid']}").exists()
    assert len(net["hosts"]) == 8
    assert {f["mode"] for f in net["fibres"]} == {"userspace"}
    rows = (out / "probes.csv").read_text().splitlines()
    assert len(rows) == 7
    assert not any(leftovers(net["prefix"]).values()), leftovers(net["prefix"])


@need_root
@pytest.mark.slow
@pytest.mark.untimed  # what clean removes, not how fast packets go: the rootlane
@pytest.mark.parametrize("by", ["clean", "guardian"])
def test_clean_after_kill_9_removes_exactly_the_run(tmp_path: Path, by: str) -> None:
    """kill -9 of `lightpipe emu --hold`, then the run's leftovers go and nothing else does:
    removed by `lightpipe clean` (no guardian), or by the run's guardian with no command."""
    from testbed.emu.state import state_root

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(four_dc()))
    out = tmp_path / "held"
    tag = uuid.uuid4().hex[:6]
    # Unrelated machine state that must survive: a namespace and a veth pair.
    other_ns, other_veth = f"xns{tag}", f"xv{tag}"
    subprocess.run(["ip", "netns", "add", other_ns], check=True)
    subprocess.run(["ip", "link", "add", other_veth, "type", "veth", "peer", "name",
                    f"{other_veth}p"], check=True)
    env = {**os.environ, "LIGHTPIPE_GUARDIAN": "1" if by == "guardian" else "0"}
    proc = subprocess.Popen([*LIGHTPIPE, "emu", str(spec), "--out", str(out), "--hold", "-q"],
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        wait_until((out / "network.json").exists, "the held network to come up",
                   timeout_s=240, interval_s=0.2,
                   alive=lambda: None if proc.poll() is None else "lightpipe emu --hold exited")
        held = json.loads((out / "network.json").read_text())
        prefix, ctl_pid = held["prefix"], held["controller"]["pid"]
        assert Path(f"/proc/{ctl_pid}").exists()  # the run's os-ken controller
        # exec runs inside a host of the live network.
        r = subprocess.run([*LIGHTPIPE, "exec", "dc-b-h1", "--network", str(out), "--", "ip",
                            "-o", "-4", "addr"], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0 and "10.2.0.2" in r.stdout
        assert any(leftovers(prefix).values())
        guardian_log = state_root() / f"{prefix}.guardian.log"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if by == "clean":
            r = subprocess.run([*LIGHTPIPE, "clean", prefix], cwd=REPO, capture_output=True,
                               text=True)
            assert r.returncode == 0, r.stderr
        # the kernel finishes some of it after clean returns (a killed process is reaped by
        # init): wait for that instead of sleeping 0.5 s and assuming
        wait_until(lambda: not any(leftovers(prefix).values()),
                   f"nothing of {prefix} left after the {by}", timeout_s=30)
        wait_until(lambda: not Path(f"/proc/{ctl_pid}").exists(),
                   f"the run's controller gone after the {by}", timeout_s=30)
        if by == "guardian":
            wait_until(guardian_log.exists, "the guardian's log line", timeout_s=30)
            line = guardian_log.read_text()
            guardian_log.unlink()
            assert f"the owner of run {prefix} died without taking it down" in line, line
            assert f"'netns': '{prefix}'" in line and "'skipped'" not in line, line
        else:
            assert not guardian_log.exists()
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert other_ns in ns
        assert subprocess.run(["ip", "link", "show", other_veth],
                              capture_output=True).returncode == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        subprocess.run(["ip", "netns", "del", other_ns], check=False)
        subprocess.run(["ip", "link", "del", other_veth], check=False)


@need_root
def test_hold_tears_down_on_sigterm(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "hold", "topology": {"links": [{"u": "A", "v": "B", "length_km": 1000}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 8}, {"name": "dc-b", "node": "B", "gpus": 8}],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 3,
                      "dc_fabric": "leaf_spine", "forwarding": "static"}}))
    out = tmp_path / "held"
    proc = subprocess.Popen([*LIGHTPIPE, "emu", str(spec), "--out", str(out), "--hold", "-q"],
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_until((out / "network.json").exists, "the held network to come up", timeout_s=240,
               interval_s=0.2, alive=lambda: None if proc.poll() is None else
               f"lightpipe emu --hold exited: {proc.communicate()[1][-2000:]}")
    net = json.loads((out / "network.json").read_text())
    prefix = net["prefix"]
    assert sorted(s["kind"] for s in net["switches"]).count("spine") == 4  # 2 per DC
    proc.send_signal(signal.SIGTERM)
    _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verified"] is True and summary["forwarding"] == "static"
    assert net["controller"] is None
    pings = json.loads((out / "verification.json").read_text())["pings"]
    assert len(pings) == 5 and all(p["received"] == p["sent"] for p in pings)  # across leaves
    assert not any(leftovers(prefix).values())


@need_root
def test_sigint_right_after_network_json_ends_the_hold_cleanly(tmp_path: Path) -> None:
    """A caller that stops a held run as soon as network.json appears gets a clean end
    (summary written, nothing left), not "interrupted": the SIGINT here comes at the
    latest moment before the wait loop, from the on_hold hook itself."""
    from testbed.backends.emu import EmuBackend

    sc = parse_scenario({
        "name": "hold-sigint", "topology": {"links": [{"u": "A", "v": "B", "length_km": 1000}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 8}, {"name": "dc-b", "node": "B", "gpus": 8}],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "forwarding": "static"}})
    out = tmp_path / "held"
    seen: list[bool] = []

    def stop_at_once(_info: dict[str, Any]) -> None:
        seen.append((out / "network.json").exists())
        os.kill(os.getpid(), signal.SIGINT)

    # Python's Ctrl-C handler, whatever this process inherited: a pytest started in the
    # background by a shell without job control (`cmd &`) inherits SIGINT ignored, and
    # the held run then waited for ever (CI runs of 2026-11-27, 900 s each).
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        summary = EmuBackend().run(sc, out, quiet=True, hold=True, on_hold=stop_at_once)
    except KeyboardInterrupt:
        pytest.fail("SIGINT after network.json was published ended the run as interrupted")
    finally:
        signal.signal(signal.SIGINT, old)
    assert seen == [True]
    assert summary["held"] is True
    prefix = json.loads((out / "network.json").read_text())["prefix"]
    assert not any(leftovers(prefix).values())


def test_emu_cli_rejects_too_fast_links(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    data = four_dc()
    data["emulation"]["bandwidth_divisor"] = 100
    spec.write_text(yaml.safe_dump(data))
    r = subprocess.run([*LIGHTPIPE, "emu", str(spec), "--out", str(tmp_path / "o")], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "bandwidth_divisor" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@need_root
@pytest.mark.slow
def test_verification_catches_wrong_delay_and_cut_fibre() -> None:
    from testbed.emu.calibrate import calibrate_network
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.emu.verify import verify
    from testbed.orchestrate.run import verify_network

    sc = parse_scenario({
        "name": "neg", "topology": {"links": [{"u": "A", "v": "B", "length_km": 400},
                                              {"u": "B", "v": "C", "length_km": 400}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 8}, {"name": "dc-c", "node": "C", "gpus": 8}],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 1}})
    plan = build_plan(sc)
    with EmuNetwork(plan, link_mode="userspace") as net:
        # The baseline as the run path verifies it: calibrated again where the pair
        # drifted out of the band (a loaded 2-core CI machine, 2026-12-02: one verify
        # right after the calibration missed the band once).
        good = verify_network(net, calibrate_network(net), "enforce")
        assert good["ok"], (good["rtts"], good["rtt_rechecks"])
        assert [r["pair"] for r in good["rtts"]] == ["dc-a~dc-c"] and good["rtt_ok"]
        probe = good["probes"][0]
        assert probe["hops_seen"] == [plan.fibre("A", "B").middle, plan.fibre("B", "C").middle]
        for name, ms in probe["fibre_delay_ms"].items():
            assert abs(ms - net.emulators[name].emulated_delay_ms()) < 1.0, (name, ms)
        emu = net.emulators[plan.fibre("B", "C").middle]
        emu.request({"cmd": "set", "delay_ms": 2.0 + 5.0})  # fibre slower than configured
        slow = verify(net)
        assert not slow["ok"] and not any(p["delay_ok"] for p in slow["probes"])
        assert not slow["rtt_ok"] and slow["rtts"][0]["median_ms"] > 2 * 4.0 + 1.0
        assert not verify(net, rtt_enforced=False)["ok"]  # the probes still fail it
        # off their delays but on their routes: not enforced, the checks pass (the run
        # path's emulation.rtt_check warn)
        assert slow["routes_ok"] and slow["reach_ok"] and not slow["delays_ok"]
        from testbed.emu.verify import checks_pass
        assert checks_pass(slow, False, False) and not checks_pass(slow, False, True)
        emu.request({"cmd": "set", "delay_ms": 2.0, "down": True})  # fibre cut
        cut = verify(net, ping_count=2)
        assert not cut["ok"] and not any(p["delivered"] for p in cut["probes"])
        bc = plan.fibre("B", "C").middle
        assert all(bc not in p["fibre_delay_ms"] for p in cut["probes"])  # never left B-C


@need_root
@pytest.mark.slow
def test_run_path_calibrates_again_when_a_pair_drifts_out_of_the_band() -> None:
    """The run's verification (testbed.orchestrate.run.verify_network): a DC pair whose
    RTT has drifted out of 2 x delay +- 1 ms after the calibration (here: its lightpath's
    frames held 0.6 ms longer on each of its two fibres, behind the calibration's back)
    is calibrated again and back in the band; without a calibration to redo, `warn`
    records it and `enforce` fails naming the pair."""
    from testbed.emu.calibrate import calibrate_network
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.errors import RuntimeFailure
    from testbed.orchestrate.run import verify_network

    sc = parse_scenario({
        "name": "drift", "topology": {"links": [{"u": "A", "v": "B", "length_km": 400},
                                                {"u": "B", "v": "C", "length_km": 400}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 8}, {"name": "dc-c", "node": "C", "gpus": 8}],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 1}})
    plan = build_plan(sc)
    vlan = plan.lightpaths[0].vlan
    with EmuNetwork(plan, link_mode="userspace") as net:
        cal = calibrate_network(net)
        for u, v in (("A", "B"), ("B", "C")):  # +0.6 ms per fibre: within each fibre's
            emu = net.emulators[plan.fibre(u, v).middle]  # probe tolerance, +2.4 ms RTT
            was = emu.vlan_corrections_ms.get(vlan, 0.0)
            assert emu.request({"cmd": "vlan_delay", "vlan": vlan,
                                "correction_ms": was - 0.6}).get("ok")
        warned = verify_network(net, {"enabled": False}, "warn")
        assert warned["ok"] and not warned["rtt_ok"] and warned["rtt_rechecks"] == []
        assert warned["rtts"][0]["median_ms"] > warned["rtts"][0]["expected_rtt_ms"] + 1.0
        with pytest.raises(RuntimeFailure, match="DC pair dc-a~dc-c"):
            verify_network(net, {"enabled": False}, "enforce")
        fixed = verify_network(net, cal, "enforce")
        assert fixed["ok"] and fixed["rtt_ok"] and fixed["rtt_enforced"], fixed["rtts"]
        assert fixed["rtt_rechecks"][0]["out_of_band"] == ["dc-a~dc-c"]
        assert fixed["rtt_rechecks"][0]["calibration"]["corrections_applied"] >= 1
        # a fibre 4 ms late, past its probe's tolerance: `warn` records the probes' delays
        # as it does the RTT (CI of 402c12f: a run failed on one probe held late at load)
        emu = net.emulators[plan.fibre("A", "B").middle]
        was = emu.vlan_corrections_ms.get(vlan, 0.0)
        assert emu.request({"cmd": "vlan_delay", "vlan": vlan,
                            "correction_ms": was - 4.0}).get("ok")
        late = verify_network(net, {"enabled": False}, "warn")
        assert late["ok"] and late["routes_ok"] and not late["delays_ok"], late["probes"]
        assert not late["delays_enforced"]
        with pytest.raises(RuntimeFailure, match="DC pair dc-a~dc-c"):
            verify_network(net, {"enabled": False}, "enforce")


# A line A-B-C-D with a DC on every node: DC pairs 1, 2 and 3 fibre hops apart.
LINE = {"name": "hops", "topology": {"links": [{"u": "A", "v": "B", "length_km": 600},
                                               {"u": "B", "v": "C", "length_km": 400},
                                               {"u": "C", "v": "D", "length_km": 200}]},
        "dcs": [{"name": f"dc-{n.lower()}", "node": n, "gpus": 8} for n in "ABCD"],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": 1, "forwarding": "static"}}


@need_root
@pytest.mark.slow
def test_calibrated_rtt_holds_at_every_hop_count() -> None:
    """After the delay calibration and the run path's closed-loop check (a pair out of
    the band is calibrated again, at most twice), every DC pair's median RTT (30 echoes,
    measured apart from the calibration) is within 2 x its configured one-way delay
    +- 1 ms, on paths of 1, 2 and 3 fibres (userspace links, userspace datapath).

    Right after the first calibration a pair may sit just outside the band on a busy
    2-core machine (the bridges' processing drifts; a CI run measured +1.22 ms on the
    3-hop pair, and another +2.11 ms on it with every lane of the suite busy): that is
    what the re-check exists for, so the band is asserted on what the run path reports,
    and the first pings only have to be within 1.5 ms plus 0.5 ms per fibre crossed
    (each fibre's forwarders drift on their own)."""
    from testbed.emu.calibrate import calibrate_network
    from testbed.emu.network import EmuNetwork
    from testbed.emu.plan import build_plan
    from testbed.emu.probes import PingStats, icmp_ping
    from testbed.orchestrate.run import verify_network

    plan = build_plan(parse_scenario(LINE))
    assert sorted(len(lp.path) - 1 for lp in plan.lightpaths) == [1, 1, 1, 2, 2, 3]
    with EmuNetwork(plan, link_mode="userspace", datapath="user") as net:
        record = calibrate_network(net)
        assert record["enabled"] and record["error"] is None, record
        hosts = {h.dc: h for h in plan.hosts}
        errors = {}
        for lp in plan.lightpaths:
            a, b = hosts[lp.dc_a], hosts[lp.dc_b]
            st = PingStats.of(icmp_ping(f"/proc/{net.host_pid(a.name)}/ns/net",
                                        b.ip.split("/")[0], count=30, interval_s=0.02))
            assert st.received == st.sent and st.median_ms is not None
            errors[(lp.dc_a, lp.dc_b, len(lp.path) - 1)] = st.median_ms - 2 * lp.delay_ms
        assert all(abs(e) <= 1.5 + 0.5 * hops for (_, _, hops), e in errors.items()), \
            (errors, record["fibres"])
        check = verify_network(net, record, "enforce")
        assert check["ok"] and check["rtt_ok"] and len(check["rtts"]) == 6
        assert sorted(x["hops"] for x in check["rtts"]) == [1, 1, 1, 2, 2, 3]
        for x in check["rtts"]:
            assert abs(x["median_ms"] - x["expected_rtt_ms"]) <= 1.0, check["rtts"]
        latest = check["rtt_rechecks"][-1]["calibration"] if check["rtt_rechecks"] else record
        # The corrections stay within each fibre's delay and are recorded.
        for f in latest["fibres"]:
            assert 0.0 <= f["correction_ms"] <= f["delay_ms"]
            assert f["emulated_delay_ms"] == pytest.approx(
                f["delay_ms"] - f["correction_ms"], abs=1e-3)
            assert net.emulators[f["middle"]].stats()["delay_ms"] == pytest.approx(
                f["emulated_delay_ms"], abs=1e-3)
