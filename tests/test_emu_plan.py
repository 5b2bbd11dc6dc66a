"""Pure tests of the emulation mapping, static rules, tc scripts and forwarder helpers."""

from __future__ import annotations

import math
import os
import shutil
import signal
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testbed.emu.forwarder import (
    _VNET,
    VNET_HDR_LEN,
    default_queue_bytes,
    frame_vlan,
    retag,
    wire_bytes,
)
from testbed.emu.forwarding import StaticForwarding
from testbed.emu.links import NetemLink, netem_limit_packets
from testbed.emu.plan import build_plan
from testbed.emu.probes import interval_rates_mbps, parse_iperf3
from testbed.emu.reaper import clean_run
from testbed.emu.state import PREFIX_RE, RunState, proc_start_ticks, run_is_live
from testbed.errors import InputError
from testbed.names import IFNAME_RE
from testbed.optical.modulation import DEFAULT_MODULATIONS, choose_modulation
from testbed.spec import parse_scenario
from tests.waiting import wait_until


def scenario(**emulation: Any) -> Any:
    return parse_scenario({
        "name": "t", "topology": {"library": "nsfnet"},
        "dcs": [{"name": "dc-a", "node": "1", "gpus": 8},
                {"name": "dc-b", "node": "6", "gpus": 8, "hosts": 3},
                {"name": "dc-c", "node": "9", "gpus": 8}],
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, **emulation}})


def test_delays_rates_and_names() -> None:
    plan = build_plan(scenario(time_factor=2.0), prefix="lpab12")
    f = plan.fibre("1", "2")  # 1050 km: QPSK (reach 2000 km) -> 80 x 25 Gb/s
    assert f.delay_ms == pytest.approx(1050 * 5e-3 * 2.0)
    assert f.real_gbps == pytest.approx(2000.0)
    assert f.rate_mbps == pytest.approx(200.0)
    assert len(plan.fibres) == 22 and len(plan.lightpaths) == 3
    assert [h.name for h in plan.hosts if h.dc == "dc-b"] == ["dc-b-h0", "dc-b-h1", "dc-b-h2"]
    assert len([h for h in plan.hosts if h.dc == "dc-a"]) == 2  # hosts_per_dc default
    nodes = [s.node for s in plan.switches] + [h.node for h in plan.hosts] + \
        [x.middle for x in plan.fibres]
    assert len(set(nodes)) == len(nodes)
    for n in nodes:
        assert n.startswith("lpab12") and IFNAME_RE.fullmatch(n + "-eth10")
    lp = plan.lightpaths[0]
    assert (lp.dc_a, lp.dc_b, lp.vlan) == ("dc-a", "dc-b", 101)
    assert lp.delay_ms == pytest.approx(sum(plan.fibre(u, v).delay_ms
                                            for u, v in zip(lp.path, lp.path[1:], strict=False)))
    # The best format in reach of the path length, then ceil(100 Gb/s / per-slot rate).
    length = sum(plan.fibre(u, v).length_km for u, v in zip(lp.path, lp.path[1:], strict=False))
    per_slot = choose_modulation(length, DEFAULT_MODULATIONS)
    assert per_slot is not None
    assert lp.slots == math.ceil(100 / per_slot.gbps_per_slot)
    assert lp.real_gbps == pytest.approx(lp.slots * per_slot.gbps_per_slot)
    assert lp.rate_mbps == pytest.approx(lp.real_gbps * 1000 / 10000)


def test_too_fast_is_refused_with_the_divisor_needed() -> None:
    with pytest.raises(InputError) as err:
        build_plan(scenario(bandwidth_divisor=1000))
    assert "bandwidth_divisor" in str(err.value) and "Mbit/s" in str(err.value)


def test_fixed_grid_capacity() -> None:
    sc = parse_scenario({
        "name": "t", "topology": {"links": [{"u": "A", "v": "B", "length_km": 100}]},
        "dcs": [{"name": "dc-a", "node": "A", "gpus": 8},
                {"name": "dc-b", "node": "B", "gpus": 8}],
        "optical": {"grid": "fixed", "wavelengths": 40, "gbps_per_wavelength": 100},
        "workload": {"kind": "lightpath_requests"},
        "emulation": {"bandwidth_divisor": 10000, "lightpath_gbps": 150}})
    plan = build_plan(sc, prefix="lp0001")
    assert plan.fibres[0].rate_mbps == pytest.approx(400.0)
    assert plan.lightpaths[0].slots == 2 and plan.lightpaths[0].rate_mbps == pytest.approx(20.0)


def test_static_rules_follow_the_lightpath() -> None:
    plan = build_plan(scenario(), prefix="lpab12")
    # Port numbers: count links per switch in plan order, as Mininet does.
    ports: dict[tuple[str, str], int] = {}
    count: dict[str, int] = {}
    switches = {s.node for s in plan.switches}
    pairs = [(lk.a, lk.b) for lk in plan.links]
    pairs += [(f.roadm_u, f.middle) for f in plan.fibres] + \
        [(f.middle, f.roadm_v) for f in plan.fibres]
    for a, b in pairs:
        for x, y in ((a, b), (b, a)):
            if x in switches:
                count[x] = count.get(x, 0) + 1
                ports[(x, y)] = count[x]
    rules = StaticForwarding().flows(plan, ports)
    lp = plan.lightpaths[0]
    roadms = {s.label: s.node for s in plan.switches if s.kind == "roadm"}
    first, last = roadms[lp.path[0]], roadms[lp.path[-1]]
    assert any(f"set_field:{lp.vlan | 0x1000}->vlan_vid" in r and "10.2.0.0/16" in r
               for r in rules[first])
    assert any(f"dl_vlan={lp.vlan}" in r and "pop_vlan" in r for r in rules[last])
    for mid in lp.path[1:-1]:
        assert sum(f"dl_vlan={lp.vlan}" in r for r in rules[roadms[mid]]) == 2  # both ways
    # A ROADM off every lightpath gets no rules.
    used = {n for x in plan.lightpaths for n in x.path}
    idle = [roadms[n] for n in roadms if n not in used]
    assert idle and all(rules[r] == [] for r in idle)


def test_leaf_spine_plan_and_rules() -> None:
    plan = build_plan(scenario(dc_fabric="leaf_spine"), prefix="lpab12")
    kinds = [s.kind for s in plan.switches if s.label == "dc-b"]
    assert kinds.count("spine") == 2 and kinds.count("leaf") == 2


def test_netem_script() -> None:
    plan = build_plan(scenario(fibre_loss=0.01), prefix="lpab12")
    f = plan.fibres[0]
    link = NetemLink(f, 1, "lpab12f1-eth0", "lpab12f1-eth1", {101: 10.0}, Path("/tmp"))
    text = link.script()  # the netlink requests (pyroute2), one per line
    assert text.count("add netem ") == 4 and text.count("loss=1.0") == 4
    assert text.count("vlan_tag") == 2 and "value=101" in text  # per-lightpath cap, each way
    assert text.count("kind=mirred direction=egress action=redirect") == 2
    assert f"limit={netem_limit_packets(f.rate_mbps, f.delay_ms)}" in text
    # 1 Gbit/s x 50 ms needs more than netem's default 1000 packets.
    assert netem_limit_packets(1000, 50) > 8000


def _frame(gso: bool, vlan: int | None = None) -> bytes:
    eth = b"\x02" * 12 + (b"\x81\x00" + struct.pack("!H", vlan) if vlan else b"") + b"\x08\x00"
    ip = b"\x45" + b"\0" * 19
    tcp = b"\0" * 12 + bytes([0x80]) + b"\0" * 19  # data offset 8 words = 32 bytes
    payload = b"x" * (3 * 1448 if gso else 100)
    hdr = len(eth) + 20 + 32
    vnet = _VNET.pack(1, 1 if gso else 0, hdr, 1448 if gso else 0, len(eth) + 20, 16)
    return vnet + eth + ip + tcp + payload


def test_wire_bytes_counts_every_segment() -> None:
    assert wire_bytes(_frame(gso=True)) == (3 * 1514, 3)
    assert wire_bytes(_frame(gso=False)) == (14 + 20 + 32 + 100, 1)


def test_retag_restores_vlan_and_shifts_offsets() -> None:
    plain = _frame(gso=True)
    tagged = retag(plain, 101, 0x8100)
    assert frame_vlan(tagged) == 101 and frame_vlan(plain) is None
    assert len(tagged) == len(plain) + 4
    _f, _g, hdr_len, _s, csum_start, _o = _VNET.unpack_from(tagged, 0)
    assert (hdr_len, csum_start) == (14 + 4 + 52, 14 + 4 + 20)
    assert tagged[VNET_HDR_LEN + 18:] == plain[VNET_HDR_LEN + 14:]
    assert wire_bytes(tagged) == (3 * 1518, 3)


def test_queue_is_at_least_the_bdp() -> None:
    assert default_queue_bytes(1000, 50) == int(1e9 / 8 * 0.1)
    assert default_queue_bytes(10, 1) == 256 * 1024


def test_parse_iperf3_uses_receiver_intervals_after_warmup() -> None:
    iv = [{"sum": {"start": t, "seconds": 1.0, "bytes": b}}
          for t, b in ((0.0, 1e6), (1.0, 12.5e6), (2.0, 12.5e6))]
    data = {"end": {"sum_sent": {"retransmits": 3}, "sum_received": {
        "bits_per_second": 1.0, "seconds": 3.0}}, "server_output_json": {"intervals": iv}}
    import json

    res = parse_iperf3(json.dumps(data), warmup_s=1.0)
    assert res.goodput_mbps == pytest.approx(100.0) and res.retransmits == 3
    # every interval's own rate, the warm-up's too: where a short goodput comes from
    assert interval_rates_mbps(res.raw) == pytest.approx([8.0, 100.0, 100.0])
    assert interval_rates_mbps({"end": {}}) == []


def test_state_helpers(tmp_path: Path) -> None:
    import os

    # field 22 of /proc/PID/stat (after the parenthesised name), and None once gone
    mine = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    assert proc_start_ticks(os.getpid()) == mine
    child = subprocess.Popen(["true"])
    child.wait()
    assert proc_start_ticks(child.pid) is None
    # killed but not yet reaped (a zombie): gone too, so its run is not live
    child = subprocess.Popen(["sleep", "60"])
    try:
        born = proc_start_ticks(child.pid)
        assert born is not None
        st = RunState("lpzzz0", str(tmp_path / "lpzzz0"), child.pid, born)
        assert run_is_live(st)
        os.kill(child.pid, signal.SIGKILL)
        wait_until(lambda: Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1]
                   .split()[0] == "Z" or None, "the child a zombie", timeout_s=30,
                   interval_s=0.02)
        assert proc_start_ticks(child.pid) is None and not run_is_live(st)
    finally:
        child.kill()
        child.wait()
    assert PREFIX_RE.fullmatch("lp0a1f") and not PREFIX_RE.fullmatch("lpprobe1234")
    # A state dir whose state cannot be read: removed without touching anything else.
    d = tmp_path / "lpzzzz"
    d.mkdir()
    (d / "state.json").write_text("{broken")
    rep = clean_run(d)
    assert not d.exists() and "unreadable" in rep["state"]


def test_forwarder_metrics_collector() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from testbed.emu.fwdmetrics import ForwarderCollector

    class Fake:
        def stats(self) -> dict[str, Any]:
            d = {"rx_bytes": 10, "tx_bytes": 9, "rx_packets": 1, "queue_drops": 2,
                 "loss_drops": 0, "queue_depth_bytes": 5,
                 "vlans": {"101": {"rate_mbps": 10.0, "bytes": 7, "drops": 1}}}
            return {"directions": {"a_to_b": d}}

    reg = CollectorRegistry()
    reg.register(ForwarderCollector(Fake(), "1-2"))
    text = generate_latest(reg).decode()
    assert ('lightpipe_lightpath_rate_bits_per_second{direction="a_to_b",fibre="1-2",'
            'vlan="101"} 1e+07') in text
    assert "lightpipe_fibre_queue_drops_total" in text


def test_clean_and_exec_cli_input_errors(cli: Any, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTPIPE_STATE_DIR", str(tmp_path / "state"))
    r = cli("clean", "notarun")
    assert r.code == 2 and "lp + 4 hex" in r.err
    r = cli("clean", "--dry-run")
    assert r.code == 0 and "removed" not in r.out
    r = cli("exec", "dc-a-h0", "--", "true")
    assert r.code == 1 and "no live emulated network" in r.err
    r = cli("exec", "dc-a-h0", "--network", str(tmp_path), "--", "true")
    assert r.code == 2 and "no network.json" in r.err
    (tmp_path / "network.json").write_text('{"hosts": [{"name": "dc-a-h0", "node": "x", '
                                           '"pid": 999999999}]}')
    r = cli("exec", "dc-b-h0", "--network", str(tmp_path), "--", "true")
    assert r.code == 2 and "unknown host" in r.err and "dc-a-h0" in r.err
    r = cli("exec", "dc-a-h0", "--network", str(tmp_path))
    assert r.code == 2 and "give a command" in r.err
    r = cli("exec", "dc-a-h0", "--network", str(tmp_path), "--", "true")
    assert r.code == 1 and "gone" in r.err


def test_backend_supports_names_the_reason(quickstart: dict[str, Any]) -> None:
    from testbed.backends.emu import EmuBackend

    quickstart["emulation"]["bandwidth_divisor"] = 1000
    ok, why = EmuBackend().supports(parse_scenario(quickstart))
    assert not ok and "bandwidth_divisor" in why
    quickstart["emulation"]["bandwidth_divisor"] = 10000
    assert EmuBackend().supports(parse_scenario(quickstart)) == (True, "")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("iperf3") or not
                    shutil.which("unshare") or not shutil.which("nsenter"),
                    reason="needs root, iperf3, unshare and nsenter")
def test_iperf3_client_waits_for_a_server_that_listens_late() -> None:
    """The client is retried until the server listens (up to SERVER_WAIT_S). iperf3 3.12
    with -J exits 0 when it cannot connect, so the retry must read its JSON: a CI run
    failed on "unable to connect to server: Connection refused" at the first try. The
    pair runs in a private network namespace (its own loopback, port 5201 free)."""
    from testbed.emu.probes import run_iperf3

    holder = subprocess.Popen(["unshare", "-n", "sh", "-c", "ip link set lo up && exec sleep 120"])
    try:
        ns = ["nsenter", f"--net=/proc/{holder.pid}/ns/net"]
        wait_until(lambda: subprocess.run([*ns, "ip", "-o", "link", "show", "lo", "up"],
                                          capture_output=True, text=True).stdout.strip(),
                   "lo up in the private namespace")
        late = [*ns, "sh", "-c", 'sleep 1.5; exec "$@"', "sh"]  # listens 1.5 s late
        res = run_iperf3(late, ns, "127.0.0.1", seconds=1.0, warmup_s=0.2)
        assert res.goodput_mbps > 0
    finally:
        holder.kill()
        holder.wait()
