"""network.json: what a live emulated network consists of (for exec, controllers, metrics)."""

from __future__ import annotations

from typing import Any

from testbed.emu.live import LiveNetwork

NETWORK_SCHEMA = 1


def network_info(net: LiveNetwork) -> dict[str, Any]:
    """Hosts (DC, IP, namespace PID), switches, fibres (rate, delay, mode), lightpaths."""
    p = net.plan
    hosts = []
    for h in p.hosts:
        pid = net.host_pid(h.name)
        hosts.append({"name": h.name, "dc": h.dc, "ip": h.ip.split("/")[0], "prefix_len": 8,
                      "mac": h.mac, "node": h.node, "intf": net.host_iface(h.name),
                      "pid": pid, "netns": f"/proc/{pid}/ns/net", "switch": h.switch})
    fibres = []
    for f in p.fibres:
        emu = net.emulators[f.middle]
        fibres.append({"u": f.u, "v": f.v, "length_km": f.length_km, "mode": emu.mode,
                       "rate_mbps": f.rate_mbps, "real_gbps": f.real_gbps,
                       "modulation": f.modulation, "delay_ms": f.delay_ms,
                       "emulated_delay_ms": round(emu.emulated_delay_ms(), 4), "loss": f.loss,
                       "middle": f.middle, "middle_pid": emu.ns_pid,
                       "intf_u": emu.intf_u, "intf_v": emu.intf_v,
                       "forwarder_pid": emu.pid,
                       "control": emu.control,
                       "roadm_u": f.roadm_u, "roadm_v": f.roadm_v,
                       "port_u": net.ports.get((f.roadm_u, f.middle)),
                       "port_v": net.ports.get((f.roadm_v, f.middle)),
                       "lightpath_caps_mbps": {str(k): v for k, v in emu.caps_mbps.items()}})
    switches = [{"name": s.node, "kind": s.kind, "label": s.label, "dpid": s.dpid,
                 "ports": {other: port for (sw, other), port in net.ports.items()
                           if sw == s.node}}
                for s in p.switches]
    lightpaths = [{"vlan": lp.vlan, "dc_a": lp.dc_a, "dc_b": lp.dc_b, "path": list(lp.path),
                   "slots": lp.slots, "real_gbps": lp.real_gbps, "rate_mbps": lp.rate_mbps,
                   "delay_ms": lp.delay_ms} for lp in p.lightpaths]
    return {
        "schema": NETWORK_SCHEMA,
        "scenario": p.scenario,
        "prefix": p.prefix,
        "state_dir": str(net.state_dir),
        "switch_netns": p.prefix,
        "ovs_rundir": str(net.ovs.dir) if net.ovs else None,
        "link_mode": net.link_mode,
        "datapath": net.datapath,
        **p.scale.as_record(),
        "dc_subnets": dict(p.dc_subnets),
        "controller": None,
        "hosts": hosts,
        "switches": switches,
        "fibres": fibres,
        "lightpaths": lightpaths,
    }
