"""Emulation across machines, the parts that need no root: the cluster file, placement of
DCs on machines, the VXLAN tunnel plan, the SSH command line, the machine check, `clean
--cluster` (arguments, the tunnel proof, the per-machine report) and a share's rules."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from testbed.cluster.place import parse_overrides, place
from testbed.cluster.remote import (
    CHECK_SCRIPT,
    MachineCheck,
    Ssh,
    check_machine,
    parse_check_output,
    ssh_error,
)
from testbed.cluster.spec import ClusterSpec, load_cluster, parse_cluster
from testbed.cluster.tunnel import (
    create_commands,
    delete_command,
    device_name,
    outer_packet_bytes,
    owned_devices,
    plan_tunnels,
    vni,
)
from testbed.emu.plan import build_plan
from testbed.errors import InputError, SpecError
from testbed.spec import Scenario, parse_scenario
from tests.conftest import load_yaml

TWO = {"machines": [{"name": "m1", "address": "192.0.2.1"},
                    {"name": "m2", "address": "192.0.2.2"}]}


def cluster(n: int = 2, **extra: Any) -> ClusterSpec:
    data = {"machines": [{"name": f"m{i + 1}", "address": f"192.0.2.{i + 1}"}
                         for i in range(n)], **extra}
    return parse_cluster(data)


def roadms(plan: Any) -> dict[str, str]:
    return {s.label: s.node for s in plan.switches if s.kind == "roadm"}


def ring(n_nodes: int, dcs: list[tuple[str, str, int]]) -> Scenario:
    """A ring of optical nodes n1..nN with the given (dc, node, hosts) DCs."""
    nodes = [f"n{i + 1}" for i in range(n_nodes)]
    links = [{"u": nodes[i], "v": nodes[(i + 1) % n_nodes], "length_km": 100.0}
             for i in range(n_nodes)]
    data = load_yaml("quickstart.yaml")
    data["topology"] = {"links": links}
    data["dcs"] = [{"name": d, "node": node, "gpus": 8, "hosts": h} for d, node, h in dcs]
    return parse_scenario(data)


# -- the cluster file ---------------------------------------------------------------------

def test_cluster_file_defaults_and_paths(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("name: lab\nssh: {user: vagrant, key: keys/id}\nmachines:\n"
                 "  - {name: m1, address: host-a.example, tunnel_address: 10.9.0.1}\n"
                 "  - {name: m2, address: 10.0.0.2, key: /abs/k2, venv: /opt/lp/.venv}\n")
    c = load_cluster(f)
    m1, m2 = c.machines
    assert c.key_of(m1) == tmp_path.resolve() / "keys/id"
    assert c.key_of(m2) == Path("/abs/k2")
    assert (c.user_of(m1), c.port_of(m1), c.venv_of(m1)) == ("vagrant", 22, "/lightpipe/.venv")
    assert c.venv_of(m2) == "/opt/lp/.venv"
    assert (m1.underlay_ip, m2.underlay_ip) == ("10.9.0.1", "10.0.0.2")
    assert c.tunnel.udp_port == 4789 and c.ssh.host_key_checking == "strict"


@pytest.mark.parametrize("change, field", [
    ({"machines": [{"name": "M1;x", "address": "192.0.2.1"}]}, "machines[0].name"),
    ({"machines": [{"name": "m1", "address": "-oProxyCommand=x"}]}, "machines[0].address"),
    ({"machines": [{"name": "m1", "address": "a b"}]}, "machines[0].address"),
    ({"machines": [{"name": "m1", "address": "h.example"}]}, "machines[0].tunnel_address"),
    ({"machines": [{"name": "m1", "address": "192.0.2.1", "tunnel_address": "h"}]},
     "machines[0].tunnel_address"),
    ({"machines": [{"name": "m1", "address": "192.0.2.1"},
                   {"name": "m1", "address": "192.0.2.2"}]}, "machines[1].name"),
    ({"machines": [{"name": "m1", "address": "192.0.2.1"},
                   {"name": "m2", "address": "192.0.2.1"}]}, "machines[1].address"),
    ({"machines": [{"name": "m1", "address": "192.0.2.1"},
                   {"name": "m2", "address": "2001:db8::2"}]}, "machines"),
    ({"machines": []}, "machines"),
    ({"venv": "lightpipe/.venv"}, "venv"),
    ({"ssh": {"user": "root; rm"}}, "ssh.user"),
    ({"ssh": {"key": "../../etc/shadow"}}, "ssh.key"),
    ({"ssh": {"host_key_checking": "no"}}, "ssh.host_key_checking"),
    ({"ssh": {"connect_timeout_s": 0}}, "ssh.connect_timeout_s"),
    ({"tunnel": {"kind": "gre"}}, "tunnel.kind"),
    ({"tunnel": {"underlay_mtu": 576}}, "tunnel.underlay_mtu"),
    ({"machinez": []}, "machinez"),
])
def test_bad_cluster_file_names_the_field(change: dict[str, Any], field: str) -> None:
    data = {**TWO, **change}
    with pytest.raises(SpecError) as err:
        parse_cluster(data)
    line = err.value.line()
    assert line.startswith(f"{field}: "), line
    assert "\n" not in line


def test_cli_bad_cluster_file_exit_2(cli: Any, tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("machines:\n  - {name: m1, address: '-oProxyCommand=touch /tmp/x'}\n")
    res = cli("cluster", "check", "--cluster", str(f), "--offline")
    assert res.code == 2
    assert res.err.count("\n") == 1 and "machines[0].address" in res.err
    res = cli("cluster", "check", "--cluster", str(tmp_path / "none.yaml"), "--offline")
    assert res.code == 2 and "--cluster" in res.err


# -- placement ----------------------------------------------------------------------------

def test_quickstart_on_two_machines_keeps_dcs_whole() -> None:
    sc = parse_scenario(load_yaml("quickstart.yaml"))
    plan = build_plan(sc, "lp0001")
    p = place(sc, plan, ("m1", "m2"))
    # Every DC on one machine with its hosts and switches, balanced: 2 DCs, 4 hosts each.
    assert {m: (x.dcs, x.hosts) for m, x in p.load.items()} == {"m1": (2, 4), "m2": (2, 4)}
    for h in plan.hosts:
        assert p.node_machine[h.node] == p.dc_machine[h.dc]
    # Only fibres cross: every other link has both ends on one machine.
    for link in plan.links:
        assert p.node_machine[link.a] == p.node_machine[link.b]
    crossing = {(c.u, c.v) for c in p.crossing}
    assert crossing == {(f.u, f.v) for f in plan.fibres
                        if p.optical_machine[f.u] != p.optical_machine[f.v]}
    assert 0 < len(crossing) < len(plan.fibres)
    for c in p.crossing:
        assert p.node_machine[c.middle] == c.machine_u != c.machine_v
    assert p.services == "m1"
    # Deterministic, whatever the run prefix.
    again = place(sc, build_plan(sc, "lpbeef"), ("m1", "m2"))
    assert again.dc_machine == p.dc_machine and again.optical_machine == p.optical_machine


def test_one_machine_has_no_crossing() -> None:
    sc = parse_scenario(load_yaml("quickstart.yaml"))
    p = place(sc, build_plan(sc, "lp0001"), ("solo",))
    assert p.crossing == () and set(p.node_machine.values()) == {"solo"}


def test_swap_pass_removes_crossings_greedy_leaves() -> None:
    # Largest-first greedy alternates n1, n2, n3, n4 between two machines: 4 of 4 ring
    # fibres cross. The swap pass puts neighbours together: 2 cross, loads unchanged.
    sc = ring(4, [("a", "n1", 2), ("b", "n2", 2), ("c", "n3", 2), ("d", "n4", 2)])
    p = place(sc, build_plan(sc, "lp0001"), ("m1", "m2"))
    assert len(p.crossing) == 2
    assert p.load["m1"].hosts == p.load["m2"].hosts == 4


def test_transit_nodes_follow_their_neighbours() -> None:
    # Ring of 6, DCs on n1 and n4 only: each machine gets one DC and one arc of transit
    # ROADMs, so exactly 2 fibres cross.
    sc = ring(6, [("a", "n1", 2), ("b", "n4", 2)])
    p = place(sc, build_plan(sc, "lp0001"), ("m1", "m2"))
    assert p.dc_machine["a"] != p.dc_machine["b"]
    assert len(p.crossing) == 2


def test_overrides() -> None:
    # (A scenario has one DC per optical node, so a DC and its ROADM are one unit.)
    sc = ring(4, [("a", "n1", 2), ("b", "n2", 1), ("c", "n3", 2)])
    plan = build_plan(sc, "lp0001")
    free = place(sc, plan, ("m1", "m2"))
    assert free.dc_machine["a"] != free.dc_machine["c"]  # the two largest apart
    p = place(sc, plan, ("m1", "m2"), {"c": "m2", "a": "m2"})
    assert p.dc_machine == {"a": "m2", "b": "m1", "c": "m2"}
    assert parse_overrides(["a=m2"], ["a", "b"], ["m1", "m2"]) == {"a": "m2"}
    for bad, what in (("a", "DC=MACHINE"), ("z=m1", "unknown DC"), ("a=m9", "unknown machine")):
        with pytest.raises(InputError, match=what):
            parse_overrides([bad], ["a", "b"], ["m1", "m2"])
    with pytest.raises(InputError, match="placed twice"):
        parse_overrides(["a=m1", "a=m2"], ["a", "b"], ["m1", "m2"])


def test_fourteen_dcs_on_three_machines_balanced() -> None:
    data = load_yaml("quickstart.yaml")
    data["dcs"] = [{"name": f"dc-{i}", "node": str(i), "gpus": 8 * i} for i in range(1, 15)]
    sc = parse_scenario(data)
    plan = build_plan(sc, "lp0001")
    p = place(sc, plan, ("m1", "m2", "m3"))
    hosts = sorted(x.hosts for x in p.load.values())
    assert sum(hosts) == 28 and hosts[-1] - hosts[0] <= 2
    assert len(p.crossing) < len(plan.fibres)


# -- tunnels ------------------------------------------------------------------------------

def test_tunnel_plan_names_ids_and_mtu() -> None:
    sc = parse_scenario(load_yaml("quickstart.yaml"))
    plan = build_plan(sc, "lp0a1f")
    c = cluster(2)
    p = place(sc, plan, c.machine_names)
    tunnels = plan_tunnels(plan.prefix, p, c, roadms(plan))
    assert len(tunnels) == len(p.crossing)
    devices = [t.a.device for t in tunnels]
    assert len(set(devices)) == len(devices)
    assert all(d.startswith("lp0a1fx") and len(d) <= 15 for d in devices)
    vnis = [t.vni for t in tunnels]
    assert len(set(vnis)) == len(vnis) and all(v >> 8 == 0x0A1F for v in vnis)
    for t in tunnels:
        assert (t.a.local_ip, t.a.remote_ip) == (t.b.remote_ip, t.b.local_ip)
        assert t.a.attach == "middle" and t.b.attach == "roadm"
        assert t.b.attach_to == roadms(plan)[t.v]
        # 1500 + 14 + 4 (802.1Q) + 8 VXLAN + 8 UDP + 20 IPv4 = 1554 > 1500: fragmented.
        assert (t.device_mtu, t.outer_bytes, t.fragments) == (1500, 1554, True)
    jumbo = plan_tunnels(plan.prefix, p, cluster(2, tunnel={"underlay_mtu": 9000}),
                         roadms(plan))
    assert not any(t.fragments for t in jumbo)
    assert outer_packet_bytes(6) == 1574
    # Another run's VNIs never meet these.
    other = plan_tunnels("lp0a20", p, c, roadms(plan))
    assert not {t.vni for t in other} & set(vnis)


def test_tunnel_ids_bounds() -> None:
    assert vni("lp0000", 1) == 1 and vni("lpffff", 255) == 0xFFFFFF
    with pytest.raises(InputError, match="at most 255"):
        vni("lp0001", 256)
    with pytest.raises(InputError):
        device_name("lp01", 1)
    assert device_name("lpffff", 99999) == "lpffffx99999"
    with pytest.raises(ValueError):
        device_name("lpffff", 999999999)  # 16 bytes: no interface name


def test_tunnel_commands_and_ownership() -> None:
    sc = ring(4, [("a", "n1", 1), ("b", "n3", 1)])
    plan = build_plan(sc, "lp00c0")
    c = cluster(2)
    t = plan_tunnels(plan.prefix, place(sc, plan, c.machine_names), c, roadms(plan))[0]
    # Born in the target namespace (never in the root one), then set up there.
    add, up = create_commands(t, t.b, "lp00c0")
    assert add[:8] == ["ip", "link", "add", t.b.device, "mtu", "1500", "netns", "lp00c0"]
    assert add[8:12] == ["type", "vxlan", "id", str(t.vni)]
    assert ["local", t.b.local_ip, "remote", t.b.remote_ip] == add[12:16]
    assert add[-3:] == ["df", "unset", "nolearning"]
    assert up == ["ip", "-n", "lp00c0", "link", "set", "dev", t.b.device, "up"]
    # A middle node's namespace, by its shell's PID.
    add, up = create_commands(t, t.a, 4242)
    assert add[6:8] == ["netns", "4242"]
    assert up == ["mnexec", "-a", "4242", "ip", "link", "set", "dev", t.a.device, "up"]
    assert delete_command(t.a.device) == ["ip", "link", "del", t.a.device]
    for bad in ("ns; reboot", 1, 0, -5, 1 << 22, True):
        with pytest.raises(ValueError):
            create_commands(t, t.a, bad)  # type: ignore[arg-type]
    # What `ip -j -d link show` reports: only the planned name + kind + VNI is the run's.
    links = [
        {"ifname": t.a.device, "linkinfo": {"info_kind": "vxlan", "info_data": {"id": t.vni}}},
        {"ifname": t.a.device, "linkinfo": {"info_kind": "veth"}},
        {"ifname": t.a.device, "linkinfo": {"info_kind": "vxlan",
                                            "info_data": {"id": t.vni + 1}}},
        {"ifname": "eth0"},
    ]
    assert owned_devices(links, [t], t.a.machine) == [t.a.device]
    assert owned_devices(links, [t], "elsewhere") == []


# -- SSH and the machine check ------------------------------------------------------------

def test_ssh_command_line(tmp_path: Path) -> None:
    key = tmp_path / "id"
    c = parse_cluster({**TWO, "ssh": {"user": "vagrant", "key": "id", "port": 2222,
                                      "host_key_checking": "accept-new",
                                      "known_hosts": "kh"}}, base_dir=tmp_path)
    argv = Ssh(c, c.machines[1]).argv(["sh", "-s", "--", "/a b", "x;y"])
    assert argv[0] == "ssh"
    for opt in ("BatchMode=yes", "StrictHostKeyChecking=accept-new", "IdentitiesOnly=yes",
                f'UserKnownHostsFile="{tmp_path / "kh"}"', "ConnectTimeout=10"):
        assert opt in argv
    assert argv[argv.index("-i") + 1] == str(key)
    assert argv[argv.index("-p") + 1] == "2222"
    # The destination follows '--' (never read as an option); remote words are quoted.
    assert argv[-3:] == ["--", "vagrant@192.0.2.2", "sh -s -- '/a b' 'x;y'"]
    strict = Ssh(cluster(1), cluster(1).machines[0]).argv(["true"])
    assert "StrictHostKeyChecking=yes" in strict and "-i" not in strict


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_unreachable_machine_is_one_line(cli: Any, tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there: a real "connection refused"
    f = tmp_path / "c.yaml"
    f.write_text(f"ssh: {{port: {port}, connect_timeout_s: 3}}\nmachines:\n"
                 "  - {name: near, address: 127.0.0.1}\n")
    check = check_machine(load_cluster(f), load_cluster(f).machines[0])
    assert not check.reachable and not check.ok
    assert check.line().startswith("near (127.0.0.1): unreachable (")
    assert "refused" in check.line()
    res = cli("cluster", "check", "--cluster", str(f))
    assert res.code == 1
    assert res.err.startswith("lightpipe: error: machine near (127.0.0.1): unreachable")
    assert res.err.count("\n") == 1


def test_key_file_checked_before_ssh(tmp_path: Path) -> None:
    c = parse_cluster({**TWO, "ssh": {"key": "id"}}, base_dir=tmp_path)
    with pytest.raises(InputError, match=r"^ssh.key: .*no such file"):
        check_machine(c, c.machines[0])
    key = tmp_path / "id"
    key.write_text("not a key\n")
    key.chmod(0o644)
    with pytest.raises(InputError, match="others can read it"):
        check_machine(c, c.machines[0])


def _run_check_script(venv: str, address: str, path: str | None = None) -> MachineCheck:
    """CHECK_SCRIPT run here by sh, as ssh runs it on a machine."""
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    res = subprocess.run(["/bin/sh", "-s", "--", venv, address], input=CHECK_SCRIPT,
                         capture_output=True, text=True, timeout=60, check=True, env=env)
    out = MachineCheck("here", address, reachable=True)
    parse_check_output(res.stdout, out)
    return out


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("ip", "tc", "mnexec",
                                                          "ovs-vswitchd", "ovs-vsctl")),
                    reason="needs LightPipe's tools installed here")
def test_check_script_on_this_machine(tmp_path: Path) -> None:
    import sys

    venv = str(Path(sys.executable).parent.parent)
    ok = _run_check_script(venv, "127.0.0.1")
    assert ok.missing == [] and set(ok.tools) == {"ip", "tc", "ovs-vswitchd", "ovs-vsctl",
                                                  "mnexec"}
    assert ok.venv == "ok" and ok.underlay_dev == "lo" and ok.kernel
    # A machine without mnexec and ovs-vsctl (PATH without /usr/bin) and no venv there.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("id", "awk", "cat", "uname", "sudo", "modinfo"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    bare = _run_check_script(str(tmp_path / "novenv"), "127.0.0.1", str(bin_dir))
    assert bare.missing == ["ovs-vsctl", "mnexec"]
    assert bare.venv == "missing"
    assert "missing mnexec" in bare.problems and not bare.ok
    assert "missing ovs-vsctl; missing mnexec; no venv" in bare.line()


def test_ssh_error_words() -> None:
    assert "host key not known" in ssh_error(255, "Host key verification failed.\n")
    assert ssh_error(255, "x\nuser@h: Permission denied (publickey).\n").startswith(
        "authentication refused")
    assert ssh_error(255, "") == "unreachable (ssh exited with 255)"


def test_cli_offline_prints_placement(cli: Any, tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("machines:\n  - {name: m1, address: 192.0.2.1}\n"
                 "  - {name: m2, address: 192.0.2.2}\n")
    spec = str(Path(__file__).parent.parent / "scenarios" / "quickstart.yaml")
    res = cli("cluster", "check", "--cluster", str(f), spec, "--offline", "--prefix", "lp0042",
              "--place", "dc-a=m2")
    assert res.code == 0, res.err
    assert "controller and monitor on m1" in res.out
    assert "m2: 2 DC(s) dc-a" in res.out
    assert "vxlan lp0042x" in res.out and "outer 1554 bytes" in res.out
    res = cli("cluster", "check", "--cluster", str(f), spec, "--offline", "--place", "dc-z=m1")
    assert res.code == 2 and "--place: unknown DC 'dc-z'" in res.err
    res = cli("cluster", "check", "--cluster", str(f), spec, "--offline", "--json")
    import json

    doc = json.loads(res.out)
    assert set(doc["dcs"]) == {"dc-a", "dc-b", "dc-c", "dc-d"}
    assert len(doc["tunnels"]) == len(doc["crossing"]) > 0


def test_cli_usage_errors_exit_2(cli: Any, tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("machines:\n  - {name: m1, address: 192.0.2.1}\n")
    spec = str(Path(__file__).parent.parent / "scenarios" / "quickstart.yaml")
    for argv, words in ((["cluster"], "required: ACTION"),
                        (["cluster", "check"], "required: --cluster"),
                        (["cluster", "check", "--cluster", str(f), "--offline", "--prefix",
                          "lpzz", spec], "--prefix: not a run prefix"),
                        (["cluster", "check", "--cluster", str(f), "--offline", "--place",
                          "dc-a=m1"], "--place: needs a SPEC")):
        res = cli(*argv)
        assert res.code == 2 and words in res.err and res.err.count("\n") == 1, res.err


def test_place_refuses_unknown_machine() -> None:
    sc = ring(4, [("a", "n1", 1), ("b", "n3", 1)])
    with pytest.raises(InputError, match="unknown machine 'm9'"):
        place(sc, build_plan(sc, "lp0001"), ("m1", "m2"), {"a": "m9"})


def test_shares_cover_the_plan_once() -> None:
    from testbed.cluster.share import split

    data = load_yaml("quickstart.yaml")
    data["dcs"] = [{"name": f"dc-{i}", "node": str(i), "gpus": 8} for i in range(1, 15)]
    sc = parse_scenario(data)
    plan = build_plan(sc, "lp0b0b")
    c = cluster(3)
    p = place(sc, plan, c.machine_names)
    tunnels = plan_tunnels(plan.prefix, p, c, roadms(plan))
    shares = split(plan, p, tunnels)
    assert [s.machine for s in shares.values()] == ["m1", "m2", "m3"]
    assert [s.services for s in shares.values()] == [True, False, False]
    assert sorted(h.node for s in shares.values() for h in s.hosts) == \
        sorted(h.node for h in plan.hosts)
    assert sum(len(s.links) for s in shares.values()) == len(plan.links)
    assert sum(len(s.fibres) for s in shares.values()) == len(plan.fibres)
    # A crossing fibre: two tunnel ends, one with its middle node, one with its far ROADM.
    for t in tunnels:
        a, b = shares[t.a.machine], shares[t.b.machine]
        assert t.a.attach_to in {f.middle for f in a.fibres}
        assert t.b.attach_to in {s.node for s in b.switches}
        assert (t, t.a) in a.tunnel_ends and (t, t.b) in b.tunnel_ends
    assert sum(len(s.tunnel_ends) for s in shares.values()) == 2 * len(p.crossing)


def test_docs_cluster_file_example_is_valid() -> None:
    import re

    import yaml

    text = (Path(__file__).parent.parent / "docs" / "cluster.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block is not None
    c = parse_cluster(yaml.safe_load(block.group(1)))
    assert c.machine_names == ("m1", "m2") and c.machines[1].underlay_ip == "10.9.0.2"


# -- lightpipe clean --cluster -------------------------------------------------------------

def _vxlan(name: str, vni_id: int, local: str = "192.0.2.1", port: int = 4789,
           kind: str = "vxlan") -> dict[str, Any]:
    """One device as `ip -j -d link show` reports it."""
    return {"ifname": name, "linkinfo": {"info_kind": kind, "info_data": {
        "id": vni_id, "local": local, "port": port}}}


def test_run_devices_need_name_kind_vni_address_and_port() -> None:
    from testbed.cluster.tunnel import run_devices

    ours = vni("lp00c0", 3)
    links = [
        _vxlan("lp00c0x7", ours),                      # the run's: everything matches
        _vxlan("lp00c0x8", vni("lp00c0", 1)),          # the run's too (another fibre)
        _vxlan("lp00c0x9", vni("lp00c1", 3)),          # another run's VNI
        _vxlan("lp00c0x10", ours, kind="veth"),        # not a vxlan
        _vxlan("lp00c0x11", ours, local="192.0.2.2"),  # another machine's address
        _vxlan("lp00c0x12", ours, port=4790),          # another UDP port
        _vxlan("lp00c0x13", vni("lp00c0", 3) & ~0xFF),  # ordinal 0: never planned
        _vxlan("lp00c0f1", ours),                      # a middle node's name, not a tunnel
        _vxlan("lp00c0x07", ours),                     # not how device_name writes it
        _vxlan("xlp00c0x1", ours),
        _vxlan("lp00c1x1", vni("lp00c1", 1)),          # another run, not asked for
        {"ifname": "lp00c0x14", "linkinfo": {"info_kind": "vxlan",
                                             "info_data": {"id": str(ours)}}},
        {"ifname": "eth0"},
    ]
    found = run_devices(links, ["lp00c0"], "192.0.2.1", 4789)
    assert [(d.name, d.prefix, d.vni) for d in found] == [
        ("lp00c0x7", "lp00c0", ours), ("lp00c0x8", "lp00c0", vni("lp00c0", 1))]
    assert [d.name for d in run_devices(links, ["lp00c0", "lp00c1"], "192.0.2.1", 4789)] \
        == ["lp00c0x7", "lp00c0x8", "lp00c1x1"]
    assert run_devices(links, [], "192.0.2.1", 4789) == []
    v6 = [{"ifname": "lp00c0x1", "linkinfo": {"info_kind": "vxlan", "info_data": {
        "id": ours, "local6": "2001:db8::1", "port": 4789}}}]
    assert [d.name for d in run_devices(v6, ["lp00c0"], "2001:db8:0::1", 4789)] == \
        ["lp00c0x1"]


def test_clean_args_validated() -> None:
    from testbed.cluster.cleanup import clean_args

    c = cluster(2, venv="/opt/lp/.venv")
    assert clean_args(c, c.machines[1], ["lp00c0"], True, False) == \
        ["/opt/lp/.venv", "1", "0", "192.0.2.2", "4789", "lp00c0"]
    for bad in ("lp00c0; reboot", "-rf", "LP00C0", "lp00c"):
        with pytest.raises(InputError, match=r"^RUN: not a LightPipe run prefix"):
            clean_args(c, c.machines[0], [bad], False, False)


def test_roottunnels_arguments_and_chosen_runs() -> None:
    from testbed.cluster.roottunnels import Usage, chosen_runs, main, parse_args

    args = parse_args(["--local-ip", "192.0.2.1", "--udp-port", "4789", "lp00c0"])
    assert (args.local_ip, args.udp_port, args.prefix) == ("192.0.2.1", 4789, ["lp00c0"])
    for argv, what in ((["--local-ip", "x;y", "--udp-port", "1"], "--local-ip"),
                       (["--local-ip", "192.0.2.1", "--udp-port", "0"], "--udp-port"),
                       (["--local-ip", "192.0.2.1", "--udp-port", "1", "lpzz"], "RUN"),
                       (["--local-ip", "192.0.2.1", "--udp-port", "1", "--all"], "unknown")):
        with pytest.raises(Usage, match=what):
            parse_args(argv)
    assert main(["--local-ip", "nope", "--udp-port", "1"]) == 2
    live = {"lp0001": True, "lp0002": False}
    # Named runs: all of them, except one live here (without --force).
    assert chosen_runs(["lp0001", "lp0003", "lp0003"], live, False)[0] == ["lp0003"]
    assert "lp0001" in chosen_runs(["lp0001"], live, False)[1][0]
    assert chosen_runs(["lp0001"], live, True) == (["lp0001"], [])
    # No names: the dead runs of this machine (all of them with --force).
    assert chosen_runs([], live, False) == (["lp0002"], [])
    assert chosen_runs([], live, True)[0] == ["lp0001", "lp0002"]


def _clean_result(text: str) -> Any:
    from testbed.cluster.cleanup import MachineClean, parse_clean_output

    out = MachineClean("m1", "192.0.2.1", reachable=True)
    parse_clean_output(text, out)
    return out


def test_clean_output_parsed_into_one_line_per_machine() -> None:
    ok = _clean_result(
        "tunnel: removed lp00c0x7 (vxlan vni 49155, run lp00c0)\n"
        "@lightpipe-clean tunnels 0\n"
        "clean: killed pid 10 (forwarder)\nclean: removed run lp00c0 (3 processes)\n"
        "@lightpipe-clean clean 0\n")
    assert ok.ok and ok.status == {"tunnels": 0, "clean": 0}
    assert ok.lines[0].startswith("tunnel: removed") and len(ok.lines) == 3
    assert ok.line() == "m1 (192.0.2.1): ok, removed 1 tunnel device(s) and 1 run(s)"
    assert ok.line(dry_run=True) == "m1 (192.0.2.1): ok (dry run: nothing removed)"
    assert _clean_result("@lightpipe-clean venv-missing\n").problem.startswith(
        "no LightPipe venv")
    assert _clean_result("@lightpipe-clean no-root\n").problem == \
        "neither root nor password-less sudo"
    failed = _clean_result("@lightpipe-clean tunnels 0\nlightpipe: error: state dir: "
                           "/run/lightpipe: others can write it\n@lightpipe-clean clean 2\n")
    assert failed.problem == ("lightpipe clean failed with exit code 2 (lightpipe: error: "
                              "state dir: /run/lightpipe: others can write it)")
    old = _clean_result("/lp/.venv/bin/python: No module named testbed.cluster.roottunnels\n"
                        "@lightpipe-clean tunnels 1\nclean: nothing to clean\n"
                        "@lightpipe-clean clean 0\n")
    assert old.problem == ("the tunnel sweep failed with exit code 1 (/lp/.venv/bin/python: "
                           "No module named testbed.cluster.roottunnels)")
    cut = _clean_result("@lightpipe-clean tunnels 0\nclean: removed run lp00c0 (0 processes)\n")
    assert cut.problem == "lightpipe clean did not finish (the session ended early)"
    # A tool's line that looks like a status line is kept as a line, not obeyed.
    odd = _clean_result("@lightpipe-clean tunnels x\n@lightpipe-clean tunnels 0\n"
                        "@lightpipe-clean clean 0\n")
    assert odd.ok and odd.lines == ["@lightpipe-clean tunnels x"]


def _run_clean_script(args: list[str], cwd: Path, env: dict[str, str]) -> Any:
    """CLEAN_SCRIPT run here by sh, as ssh runs it on a machine."""
    from testbed.cluster.cleanup import CLEAN_SCRIPT

    res = subprocess.run(["/bin/sh", "-s", "--", *args], input=CLEAN_SCRIPT, cwd=cwd,
                         capture_output=True, text=True, timeout=120, check=True, env=env)
    return _clean_result(res.stdout)


def test_clean_script_without_venv(tmp_path: Path) -> None:
    res = _run_clean_script([str(tmp_path / "novenv"), "0", "0", "192.0.2.1", "4789"],
                            tmp_path, dict(os.environ))
    assert res.flags == ["venv-missing"] and res.status == {} and not res.ok


@pytest.mark.skipif(os.geteuid() != 0, reason="the script runs its tools as root")
def test_clean_script_dry_run_here(tmp_path: Path) -> None:
    import secrets
    import sys

    venv = str(Path(sys.executable).parent.parent)
    if not Path(venv, "bin", "lightpipe").exists():
        pytest.skip("needs the venv's lightpipe entry point")
    prefix = f"lp{secrets.token_hex(2)}"
    env = {**os.environ, "LIGHTPIPE_STATE_DIR": str(tmp_path / "state")}
    res = _run_clean_script([venv, "1", "0", "192.0.2.1", "4789", prefix], tmp_path, env)
    assert res.ok, (res.problem, res.lines)
    assert res.status == {"tunnels": 0, "clean": 0}
    assert f"tunnel: no tunnel device left in the root namespace ({prefix})" in res.lines
    assert "clean: nothing to clean" in res.lines


def test_cli_clean_cluster_usage_errors(cli: Any, tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("machines:\n  - {name: m1, address: 192.0.2.1}\n")
    res = cli("clean", "--cluster", str(f), "lp0001;x")
    assert res.code == 2 and res.err.count("\n") == 1 and "RUN: not a LightPipe" in res.err
    res = cli("clean", "--cluster", str(f), "--dir", str(tmp_path))
    assert res.code == 2 and "--dir: not with --cluster" in res.err
    res = cli("clean", "--cluster", str(tmp_path / "none.yaml"))
    assert res.code == 2 and "--cluster: " in res.err and "no such file" in res.err


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_clean_cluster_unreachable_is_one_line(cli: Any, tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there: a real "connection refused"
    f = tmp_path / "c.yaml"
    f.write_text(f"ssh: {{port: {port}, connect_timeout_s: 3}}\nmachines:\n"
                 "  - {name: near, address: 127.0.0.1}\n"
                 "  - {name: nearer, address: 127.0.0.2}\n")
    res = cli("clean", "--cluster", str(f), "lp0001")
    assert res.code == 1
    assert res.err.startswith("lightpipe: error: machine near (127.0.0.1): unreachable (")
    assert "(and 1 more machine(s), listed above)" in res.err and res.err.count("\n") == 1
    assert "clean near (127.0.0.1): unreachable (" in res.out
    assert "clean nearer (127.0.0.2): unreachable (" in res.out


# -- one machine's share of the network ---------------------------------------------------

def _port_map(plan: Any) -> dict[tuple[str, str], int]:
    """Ports as the builder numbers them: per switch, in link order (fabric, then fibres)."""
    ports: dict[tuple[str, str], int] = {}
    switches = {s.node for s in plan.switches}

    def add(a: str, b: str) -> None:
        for x, y in ((a, b), (b, a)):
            if x in switches:
                ports[(x, y)] = 1 + sum(1 for k in ports if k[0] == x)

    for lk in plan.links:
        add(lk.a, lk.b)
    for f in plan.fibres:
        add(f.roadm_u, f.middle)
        add(f.middle, f.roadm_v)
    return ports


def test_share_rules_are_the_one_machine_rules_of_its_switches() -> None:
    from testbed.cluster.share import split
    from testbed.cluster.sharenet import LocalPorts, ShareForwarding
    from testbed.emu.forwarding import StaticForwarding

    sc = parse_scenario(load_yaml("quickstart.yaml"))
    plan = build_plan(sc, "lp0c0c")
    c = cluster(2)
    p = place(sc, plan, c.machine_names)
    shares = split(plan, p, plan_tunnels(plan.prefix, p, c, roadms(plan)))
    ports = _port_map(plan)
    whole = StaticForwarding().flows(plan, ports)
    seen = set()
    for share in shares.values():
        local = {s.node for s in share.switches}
        # Only this machine's ports are known there (a far ROADM's tunnel port keeps the
        # key (ROADM, middle node) it has on one machine).
        mine = {k: v for k, v in ports.items() if k[0] in local}
        rules = ShareForwarding(StaticForwarding(), local).flows(plan, mine)
        assert set(rules) == local
        assert rules == {sw: whole[sw] for sw in local}
        seen |= local
    assert seen == {s.node for s in plan.switches}
    lp = LocalPorts({("s1", "h1"): 3}, {"s1"})
    assert lp[("s2", "x")] == 0 and ("s2", "x") in lp and ("s1", "x") not in lp
    with pytest.raises(KeyError):
        lp[("s1", "x")]


# -- cluster up / down: the share document, the probes, the remote steps -----------------

def _quickstart_on_two(prefix: str = "lp0a0b") -> tuple[Any, ClusterSpec, Any, Any, Any]:
    from testbed.cluster.sharedoc import plan_cluster

    sc = parse_scenario(load_yaml("quickstart.yaml"))
    c = cluster(2)
    plan, placement, shares = plan_cluster(sc, c, prefix)
    return sc, c, plan, placement, shares


def test_share_doc_round_trip_rebuilds_each_share() -> None:
    import json

    from testbed.cluster.sharedoc import plan_digest, read_share_doc, share_doc

    sc, c, plan, placement, shares = _quickstart_on_two()
    for m in ("m1", "m2"):
        raw = share_doc(sc, c, plan, placement, m, "userspace", "user")
        order = read_share_doc(raw)
        assert order.plan == plan and order.share == shares[m]
        assert (order.link_mode, order.datapath) == ("userspace", "user")
        assert json.loads(raw)["plan_digest"] == plan_digest(plan)
    # Any change to what the plan is made from changes the digest.
    other = build_plan(sc, "lp0a0c")
    assert plan_digest(other) != plan_digest(plan)


@pytest.mark.parametrize("change, field", [
    ({"version": 2}, "share.version"),
    ({"prefix": "lp0a0b; rm -rf /"}, "share.prefix"),
    ({"machine": "m9"}, "share.machine"),
    ({"link_mode": "tc"}, "share.link_mode"),
    ({"datapath": 1}, "share.datapath"),
    ({"dcs": {"dc-a": "m1"}}, "share.dcs"),
    ({"dcs": {"dc-a": "m9", "dc-b": "m1", "dc-c": "m2", "dc-d": "m2"}}, "share.dcs"),
    ({"plan_digest": "0" * 16}, "share.plan_digest"),
    ({"scenario": []}, "share.scenario"),
])
def test_share_doc_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    import json

    from testbed.cluster.sharedoc import read_share_doc, share_doc

    sc, c, plan, placement, _ = _quickstart_on_two()
    doc = json.loads(share_doc(sc, c, plan, placement, "m1"))
    with pytest.raises(InputError) as exc:
        read_share_doc(json.dumps({**doc, **change}).encode())
    assert exc.value.path == field, str(exc.value)


def test_share_doc_bounded_and_json_only() -> None:
    from testbed.cluster.sharedoc import DOC_MAX_BYTES, read_share_doc

    for raw, words in ((b"x" * (DOC_MAX_BYTES + 1), "over"), (b"{not json", "not JSON"),
                       (b"[1]", "JSON object")):
        with pytest.raises(InputError) as exc:
            read_share_doc(raw)
        assert exc.value.path == "share" and words in str(exc.value)


def test_pair_probes_one_per_dc_pair_with_the_plans_delay() -> None:
    from testbed.cluster.sharedoc import pair_probes, probes_doc, read_probes

    _, _, plan, placement, _ = _quickstart_on_two()
    probes = pair_probes(plan, placement)
    assert len(probes) == 6 == len(plan.lightpaths)
    for p, lp in zip(probes, plan.lightpaths, strict=True):
        assert p.pair == f"{lp.dc_a}~{lp.dc_b}" and p.configured_ms == lp.delay_ms
        assert p.src_machine == placement.dc_machine[lp.dc_a]
        assert p.dst_machine == placement.dc_machine[lp.dc_b]
        assert len(p.fibres) == len(lp.path) - 1
        src = next(h for h in plan.hosts if h.node == p.src_node)
        assert src.dc == lp.dc_a
        assert p.dst_ip in {h.ip.split("/")[0] for h in plan.hosts if h.dc == lp.dc_b}
    assert sum(p.src_machine != p.dst_machine for p in probes) == 4  # 2 DCs on each
    assert read_probes(probes_doc(probes)) == probes


@pytest.mark.parametrize("bad", [
    b"{}", b"[1]", b'[{"pair": "x"}]',
    b'[{"pair": "a~b", "src_machine": "m1", "dst_machine": "m2", "src_node": "h",'
    b' "dst_ip": "10.0.0.1; reboot", "fibres": [], "configured_ms": 1}]',
    b'[{"pair": "a~b", "src_machine": "m1", "dst_machine": "m2", "src_node": "h",'
    b' "dst_ip": "10.0.0.1", "fibres": "1-2", "configured_ms": 1}]',
    b'[{"pair": "a~b", "src_machine": "m1", "dst_machine": "m2", "src_node": "h",'
    b' "dst_ip": "10.0.0.1", "fibres": [], "configured_ms": -1}]',
])
def test_probes_validated(bad: bytes) -> None:
    from testbed.cluster.sharedoc import read_probes

    with pytest.raises(InputError) as exc:
        read_probes(bad)
    assert exc.value.path.startswith("probes")


def test_share_args_validated_and_quoted() -> None:
    from testbed.cluster.drive import SHARE_SCRIPT, share_args
    from testbed.cluster.remote import Ssh

    c = cluster(2)
    m1 = c.machines[0]
    assert share_args(c, m1, "start") == ["sh", "-c", SHARE_SCRIPT, "sh", c.venv_of(m1),
                                          "start"]
    assert share_args(c, m1, "down", "lp0a0b")[-2:] == ["down", "lp0a0b"]
    assert share_args(c, m1, "status")[-1] == "status"  # names no run
    for action, prefix, field in (("start; id", None, "ACTION"), ("down", None, "RUN"),
                                  ("ping", "lp0a0b;id", "RUN")):
        with pytest.raises(InputError) as exc:
            share_args(c, m1, action, prefix)
        assert exc.value.path == field
    # The script travels as one quoted word: the remote login shell gives it to sh whole.
    import shlex

    remote = Ssh(c, m1).argv(share_args(c, m1, "ping", "lp0a0b"))[-1]
    assert shlex.split(remote) == share_args(c, m1, "ping", "lp0a0b")


def test_parse_share_output_and_problems() -> None:
    from testbed.cluster.drive import ShareResult, parse_share_output

    def parsed(text: str) -> ShareResult:
        r = ShareResult("m1", "192.0.2.1", reachable=True)
        parse_share_output(text, r)
        return r

    ok = parsed('INFO built\n@lightpipe-share ready {"hosts": {}, "up_s": 1.5}\n'
                "@lightpipe-share step start 0\n")
    assert ok.ok and ok.ready == {"hosts": {}, "up_s": 1.5} and ok.lines == ["INFO built"]
    rows = parsed('@lightpipe-share rtt {"pair": "a~b", "pings": 10}\n'
                  "@lightpipe-share step ping 0\n")
    assert rows.ok and rows.rows == [{"pair": "a~b", "pings": 10}]
    assert parsed("@lightpipe-share venv-missing\n").problem.startswith("no LightPipe venv")
    assert parsed("@lightpipe-share no-root\n").problem == \
        "neither root nor password-less sudo"
    assert parsed("@lightpipe-share bad share.prefix: not a run prefix\n"
                  "@lightpipe-share step start 2\n").problem == \
        "bad input there: share.prefix: not a run prefix"
    assert parsed("@lightpipe-share failed share builder exited with 1: boom\n"
                  "@lightpipe-share step start 1\n").problem == \
        "share builder exited with 1: boom"
    assert parsed("@lightpipe-share ready {broken\n").problem == "unreadable ready line"
    assert parsed("Traceback\n").problem.startswith("the step did not finish")
    down = parsed("clean: nothing to clean\n@lightpipe-share stopped lp0a0b none\n"
                  "@lightpipe-share step stop 0\n@lightpipe-share step clean 3\n")
    assert down.problem == "clean failed with exit code 3 (clean: nothing to clean)"
    assert parsed("@lightpipe-share step start 0\n").ready is None  # up_shares: failed
    gone = ShareResult("m2", "192.0.2.2", error="unreachable (ssh: refused)")
    assert gone.problem == "unreachable (ssh: refused)"


def test_hold_refuses_bad_input_without_root() -> None:
    import sys

    for argv, stdin, words in ((["start"], b"{not json", "@lightpipe-share bad share: "),
                               (["stop", "lp;id"], b"", "@lightpipe-share bad RUN: "),
                               (["ping", "lp0a0b"], b"[1]", "@lightpipe-share bad probes"),
                               (["serve", "x"], b"", "@lightpipe-share bad usage")):
        res = subprocess.run([sys.executable, "-m", "testbed.cluster.hold", *argv],
                             input=stdin, capture_output=True, timeout=60, check=False)
        assert res.returncode == 2 and res.stdout.decode().startswith(words), res


def test_cli_up_down_usage_errors_exit_2(cli: Any, tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("machines:\n  - {name: m1, address: 192.0.2.1}\n")
    spec = str(Path(__file__).parent.parent / "scenarios" / "quickstart.yaml")
    out = str(tmp_path / "out")
    for argv, words in ((["cluster", "up", spec, "--cluster", str(f)], "required: --out"),
                        (["cluster", "up", spec, "--cluster", str(f), "--out", out,
                          "--prefix", "lpzz"], "--prefix: not a run prefix"),
                        (["cluster", "up", spec, "--cluster", str(f), "--out", out,
                          "--place", "dc-a=m9"], "--place"),
                        (["cluster", "up", spec, "--cluster", str(f), "--out", out,
                          "--ready-timeout", "0"], "--ready-timeout"),
                        (["cluster", "down", "--cluster", str(f), "lp;id"], "RUN: not a run"),
                        (["cluster", "down", "lp0a0b"], "required: --cluster")):
        res = cli(*argv)
        assert res.code == 2 and words in res.err and res.err.count("\n") == 1, res.err
    assert not Path(out).exists()


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_cli_up_unreachable_machine_is_one_line(cli: Any, tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there: a real "connection refused"
    f = tmp_path / "c.yaml"
    f.write_text(f"ssh: {{port: {port}, connect_timeout_s: 3}}\nmachines:\n"
                 "  - {name: near, address: 127.0.0.1}\n")
    spec = str(Path(__file__).parent.parent / "scenarios" / "quickstart.yaml")
    res = cli("cluster", "up", spec, "--cluster", str(f), "--out", str(tmp_path / "o"))
    assert res.code == 1, (res.out, res.err)
    assert "up near (127.0.0.1): unreachable (" in res.out
    assert res.err.startswith("lightpipe: error: machine near (127.0.0.1): unreachable (")
    assert res.err.count("\n") == 1
    assert not (tmp_path / "o" / "cluster_run.json").exists()


def test_hold_status_lists_the_shares_this_machine_holds(tmp_path: Path,
                                                        monkeypatch: Any) -> None:
    """`hold status`: one `held` line per run directory with a share (ready.json), its
    holder told alive by PID and start time; a one-machine run (no ready.json) is not a
    share; a link planted as ready.json is not followed; the driver reads the lines."""
    import json

    from testbed.cluster.drive import ShareResult, parse_share_output
    from testbed.cluster.hold import cmd_status, held_shares
    from testbed.emu.state import RunState, proc_start_ticks

    root = tmp_path / "state"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("LIGHTPIPE_STATE_DIR", str(root))
    for prefix, owner in (("lp0a01", os.getpid()), ("lp0a02", 2 ** 22 - 7),
                          ("lp0a03", os.getpid())):
        d = root / prefix
        d.mkdir(mode=0o700)
        RunState(prefix, str(d), owner, proc_start_ticks(os.getpid()) or 0).save()
    (root / "lp0a01" / "ready.json").write_text(json.dumps(
        {"machine": "m1", "hosts": {"h1": {}, "h2": {}}, "tunnels": ["lp0a01x0"],
         "link_mode": "userspace", "datapath": "user", "up_s": 2.5}))
    (root / "lp0a02" / "ready.json").write_text(json.dumps({"machine": "m1"}))
    (tmp_path / "secret").write_text("{}")
    (root / "lp0a03" / "ready.json").symlink_to(tmp_path / "secret")
    rows = {r["prefix"]: r for r in held_shares()}
    assert rows["lp0a01"]["holder_alive"] is True and rows["lp0a01"]["hosts"] == ["h1", "h2"]
    assert rows["lp0a01"]["tunnels"] == ["lp0a01x0"] and rows["lp0a01"]["up_s"] == 2.5
    assert rows["lp0a02"]["holder_alive"] is False and rows["lp0a02"]["hosts"] == []
    assert "error" in rows["lp0a03"] and "machine" not in rows["lp0a03"]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cmd_status() == 0
    r = ShareResult("m1", "192.0.2.1", reachable=True)
    parse_share_output(buf.getvalue() + "@lightpipe-share step status 0\n", r)
    assert r.ok and [x["prefix"] for x in r.rows] == ["lp0a01", "lp0a02", "lp0a03"]
    root.chmod(0o777)  # a state root others could plant runs in: refused, one line
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cmd_status() == 1
    r = ShareResult("m1", "192.0.2.1", reachable=True)
    parse_share_output(buf.getvalue() + "@lightpipe-share step status 1\n", r)
    assert r.rows == [] and "LIGHTPIPE_STATE_DIR" in r.problem, r.problem


def test_pair_rows_judge_the_band_in_scenario_time() -> None:
    """A machine's `rtt` rows say within_band at +-1 ms emulated; the driver judges at the
    run's scale (here time_factor 10: +-10 ms emulated, 1 ms in scenario time), as a
    one-machine verification does, and keeps the rows in the probes' order."""
    import json

    from testbed.cluster.checks import pair_rows
    from testbed.cluster.drive import ShareResult, parse_share_output
    from testbed.cluster.sharedoc import PairProbe
    from testbed.emu.delaycal import RTT_TOL_MS
    from testbed.emu.scale import Scale

    probes = [PairProbe("a~b", "m1", "m1", "h1", "10.0.0.2", ("f1",), 30.0),
              PairProbe("a~c", "m1", "m2", "h1", "10.0.0.3", ("f2",), 50.0)]
    r = ShareResult("m1", "192.0.2.1", reachable=True)
    lines = [{"pair": "a~c", "src_machine": "m1", "dst_machine": "m2", "expected_rtt_ms": 100.0,
              "median_ms": 108.0, "within_band": False, "rtts_ms": [108.0], "pings": 1},
             {"pair": "a~b", "src_machine": "m1", "dst_machine": "m1", "expected_rtt_ms": 60.0,
              "median_ms": 71.0, "within_band": False, "rtts_ms": [71.0], "pings": 1}]
    parse_share_output("".join(f"@lightpipe-share rtt {json.dumps(x)}\n" for x in lines)
                       + "@lightpipe-share step ping 0\n", r)
    tol = Scale(1.0, 10.0).delay_ms(RTT_TOL_MS)  # bandwidth_divisor 1, time factor 10
    assert tol == 10.0
    rows = pair_rows([r], probes, tol)
    assert [x["pair"] for x in rows] == ["a~b", "a~c"]
    assert [x["within_band"] for x in rows] == [False, True]  # +11 ms out, +8 ms in
    assert [x["crosses"] for x in rows] == [False, True] and rows[1]["samples_ms"] == [108.0]
    assert [x["within_band"] for x in pair_rows([r], probes, RTT_TOL_MS)] == [False, False]
