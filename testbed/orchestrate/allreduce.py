"""Run ring all-reduce jobs (workload allreduce_jobs) in a live leaf-spine emulation.

With the run's controller up: give it the layout with the fabric's link rates, register
every job (`POST /routing/jobs`), start one `workloads.allreduce` rank per member host
(torch.distributed gloo; its ring sends from rank r to rank r-1, so ranks are given in
reverse member order and member i sends to member i+1, as registered), then for
each routing policy in turn
`PUT /routing` and run the job's rounds, every job starting each round at the same
moment. Spine flow counters tell the path each flow took (under ECMP the switches
choose); the max-min fluid model (testbed.sim.allreduce) on those very paths gives the
simulated round times that the measured ones are compared with.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from testbed.errors import RuntimeFailure
from testbed.io.atomic import atomic_write_json
from testbed.io.records import read_json_lines
from testbed.spec.models import Scenario

log = logging.getLogger(__name__)

MASTER_PORT0 = 29611
# A ring waits between rounds; without this, Linux restarts every connection from
# slow start after the idle gap (per network namespace, so only the job's hosts).
HOST_SYSCTLS = ("net.ipv4.tcp_slow_start_after_idle=0",)
START_TIMEOUT_S = 120.0
STATS_SETTLE_S = 1.2  # OVS pushes datapath flow stats to OpenFlow rules every ~0.5 s
FLOW_RE = re.compile(r"n_bytes=(\d+).*nw_src=([\d.]+),nw_dst=([\d.]+)")


def layout_with_rates(net: Any) -> Any:
    """The controller layout of the network with the plan's fabric/host link rates."""
    from testbed.orchestrate.glue import layout_from_emu

    layout = layout_from_emu(net)
    rate = {frozenset((lk.a, lk.b)): lk.rate_mbps for lk in net.plan.links}
    links = [lk.model_copy(update={"rate_mbps": rate.get(frozenset((lk.a, lk.b)))})
             if lk.kind == "fabric" else lk for lk in layout.links]
    node_of = {h.name: h.node for h in net.plan.hosts}
    hosts = [h.model_copy(update={"rate_mbps": rate.get(frozenset((node_of[h.name], h.switch)))})
             for h in layout.hosts]
    return layout.model_copy(update={"links": links, "hosts": hosts})


def spine_bytes(net: Any) -> dict[tuple[str, str, str], int]:
    """(spine node, src ip, dst ip) -> bytes of the per-flow rules on every spine."""
    out: dict[tuple[str, str, str], int] = {}
    for s in net.plan.switches:
        if s.kind != "spine":
            continue
        r = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", s.node,
                            "cookie=0x4c52000000000000/0xffff000000000000"],
                           capture_output=True, text=True, check=False, timeout=10)
        if r.returncode != 0:
            raise RuntimeFailure(f"ovs-ofctl dump-flows {s.node}: {r.stderr.strip()[:200]}")
        for line in r.stdout.splitlines():
            m = FLOW_RE.search(line)
            if m:
                out[(s.node, m.group(2), m.group(3))] = int(m.group(1))
    return out


def observed_paths(net: Any, before: dict[tuple[str, str, str], int],
                   after: dict[tuple[str, str, str], int],
                   pairs: list[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
    """The path of each host pair: through the spine whose counter grew the most."""
    plan = net.plan
    out: dict[tuple[str, str], list[str]] = {}
    for src, dst in pairs:
        a, b = plan.host(src), plan.host(dst)
        if a.switch == b.switch:
            out[(src, dst)] = [src, a.switch, dst]
            continue
        ip_a, ip_b = a.ip.split("/")[0], b.ip.split("/")[0]
        grew = {sp: n - before.get((sp, x, y), 0) for (sp, x, y), n in after.items()
                if (x, y) == (ip_a, ip_b)}
        if not grew or max(grew.values()) <= 0:
            raise RuntimeFailure(f"no spine counted the flow {src} -> {dst}")
        spine = max(grew, key=lambda sp: grew[sp])
        out[(src, dst)] = [src, a.switch, spine, b.switch, dst]
    return out


class Ranks:
    """The worker processes of every job, their record files and the round signals."""

    def __init__(self, net: Any, scenario: Scenario, work: Path, rounds: int,
                 port0: int = MASTER_PORT0) -> None:
        self.net, self.work, self.rounds = net, work, rounds
        self.sync = work / "sync"
        self.sync.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[str]] = []
        self.records: list[tuple[int, int, Path]] = []  # (job, rank, file)
        wl = scenario.workload
        for j, job in enumerate(wl.jobs):  # type: ignore[attr-defined]
            # gloo's ring sends from rank r to rank r-1 (measured with spine counters):
            # ranks in reverse member order make member i send to member i+1.
            order = list(reversed(job.members))
            master = net.plan.host(order[0]).ip.split("/")[0]
            for rank, member in enumerate(order):
                net.host_cmd(member, ["sysctl", "-q", "-w", *HOST_SYSCTLS])
                rec = work / f"job{j}-rank{rank}.jsonl"
                node = net.nodes[net.plan.host(member).node]
                argv = net.python_argv(
                    "workloads.allreduce", "--rank", str(rank), "--world",
                    str(len(job.members)), "--master", f"{master}:{port0 + j}",
                    "--buffer-bytes", str(job.buffer_bytes), "--rounds", str(rounds),
                    "--sync", str(self.sync), "--out", str(rec),
                    "--iface", str(node.defaultIntf()))
                err = open(work / f"job{j}-rank{rank}.stderr", "w")
                self.procs.append(net.host_popen(member, argv, stdout=subprocess.DEVNULL,
                                                 stderr=err))
                err.close()
                self.records.append((j, rank, rec))

    def events(self) -> list[dict[str, Any]]:
        out = []
        for j, rank, path in self.records:
            out.extend({**r, "job": j, "rank": rank}
                       for r in read_json_lines(path, "all-reduce records"))
        return out

    def wait(self, done: Any, timeout_s: float, what: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            ev = self.events()
            errors = [e for e in ev if e["event"] == "error"]
            if errors:
                raise RuntimeFailure(f"all-reduce job {errors[0]['job']} rank "
                                     f"{errors[0]['rank']}: {errors[0]['error']}")
            if done(ev):
                return ev
            dead = [p for p in self.procs if p.poll() not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeFailure(f"all-reduce workers: no {what} within {timeout_s:.0f} s"
                                     f" (see {self.work})")
            time.sleep(0.01)

    def go(self, k: int) -> float:
        t = time.time()
        (self.sync / f"go-{k}").touch()
        return t

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def run_allreduce_jobs(scenario: Scenario, net: Any, ctl: Any, stage: Path,
                       quiet: bool = False) -> dict[str, Any]:
    """Every policy in turn, each with the jobs' ranks started afresh; per round and job the
    emulated time and the simulated one on the observed paths. Returns the summary keys."""
    from controllers.flowroute import routing_graph
    from controllers.rules import LayoutIndex
    from testbed.routing.maxmin import max_min_rates
    from testbed.sim.allreduce import flow_id, ring_flow_bytes, ring_keys, round_times

    if ctl is None:
        raise RuntimeFailure("allreduce_jobs needs emulation.forwarding: controller")
    wl = scenario.workload
    layout = layout_with_rates(net)
    status, body = ctl.request("PUT", "/layout", layout.model_dump(), timeout_s=30)
    if status != 200:
        raise RuntimeFailure(f"controller refused the rated layout: {status} {body}")
    ix = LayoutIndex.build(layout)
    graph = routing_graph(ix)
    keys, job_of, flow_bytes = [], {}, {}
    for j, job in enumerate(wl.jobs):  # type: ignore[attr-defined]
        for k in ring_keys(job.members, j):
            keys.append(k)
            job_of[k] = j
        flow_bytes[j] = ring_flow_bytes(job.members, job.buffer_bytes)
        status, body = ctl.request("POST", "/routing/jobs", {
            "members": job.members, "buffer_bytes": job.buffer_bytes})
        if status != 201:
            raise RuntimeFailure(f"controller refused all-reduce job {j}: {status} {body}")
    iters = [job.iterations for job in wl.jobs]  # type: ignore[attr-defined]
    per_policy = max(iters)
    work = stage / "allreduce"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    routing: dict[str, Any] = {}
    bottleneck: dict[str, dict[int, float]] = {}  # policy -> job -> Gb/s on the paths taken
    divisor = net.plan.scale.bandwidth_divisor  # emulated/real rate (the run's Scale)
    k = 0
    for p_index, policy in enumerate(wl.policies):  # type: ignore[attr-defined]
        status, body = ctl.request("PUT", "/routing", {"policy": policy}, timeout_s=60)
        if status != 200:
            raise RuntimeFailure(f"controller: PUT /routing {policy}: {status} {body}")
        routing[policy] = body
        # Each policy's jobs start afresh, as a job launched under that routing would:
        # TCP connections that lived through the previous policy's shared links keep
        # its congestion state (a halved window grows back slowly) into the next.
        ranks = Ranks(net, scenario, work / policy, per_policy,
                      port0=MASTER_PORT0 + p_index * len(wl.jobs))  # type: ignore[attr-defined]
        n_ranks = len(ranks.records)
        try:
            ranks.wait(lambda ev, n=n_ranks: sum(e["event"] == "ready" for e in ev) == n,
                       START_TIMEOUT_S, "start-up")
            before = spine_bytes(net)  # rules are in: the ranks' start-up took longer
            gos = {}
            for i in range(per_policy):
                gos[k] = ranks.go(i)
                ev = ranks.wait(lambda ev, i=i, n=n_ranks: sum(
                    e["event"] == "round" and e["round"] == i for e in ev) == n,
                                600.0, f"round {i} of {policy}")
                k += 1
        finally:
            ranks.stop()
        shutil.rmtree(ranks.sync, ignore_errors=True)
        time.sleep(STATS_SETTLE_S)
        after = spine_bytes(net)
        pairs = [(s, d) for _, s, d in keys]
        seen = observed_paths(net, before, after, pairs)
        paths = {key: seen[(key[1], key[2])] for key in keys}
        if policy != "ecmp":  # the controller's paths must be the ones packets took
            chosen = {(f["src"], f["dst"]): f["path"] for jv in body["jobs"]
                      for f in jv["flows"]}
            wrong = [p for p in pairs if chosen.get(p) != seen[p]]
            if wrong:
                raise RuntimeFailure(f"{policy}: flow {wrong[0]} took {seen[wrong[0]]}, "
                                     f"the controller chose {chosen.get(wrong[0])}")
        sim = round_times(graph, paths, job_of, flow_bytes, scale=divisor)
        rates = max_min_rates(graph, {flow_id(key): paths[key] for key in keys})
        bottleneck[policy] = {j: min(r for i, r in rates.items()
                                     if i.startswith(f"{j}/")) for j in flow_bytes}
        for i, (kk, t_go) in enumerate(gos.items()):
            for j in range(len(wl.jobs)):  # type: ignore[attr-defined]
                ends = [e["end"] for e in ev if e["event"] == "round"
                        and e["round"] == i and e["job"] == j]
                emu_s = max(ends) - t_go
                rows.append({"policy": policy, "round": kk, "job": j,
                             "emu_s": round(emu_s, 4), "sim_s": round(sim[j], 4),
                             "rel_error": round(emu_s / sim[j] - 1.0, 4),
                             "paths": {f"{s}->{d}": paths[(jj, s, d)]
                                       for jj, s, d in keys if jj == j}})
        log.info("%s: %d rounds done", policy, per_policy)
    atomic_write_json(stage / "allreduce.json", {"rounds": rows, "routing": routing})
    out = summarize(rows)
    for policy, per_job in bottleneck.items():
        best = max(max(b.values()) for b in bottleneck.values())
        out[policy]["bottleneck_gbps"] = [round(per_job[j], 6) for j in sorted(per_job)]
        out[policy]["collision"] = min(per_job.values()) < best - 1e-6
    return {"workload": "allreduce_jobs", "allreduce": out}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per policy: mean/max emulated and simulated round time; the agreement distribution."""
    out: dict[str, Any] = {}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        rs = [r for r in rows if r["policy"] == policy]
        errs = sorted(abs(r["rel_error"]) for r in rs)
        out[policy] = {
            "samples": len(rs),
            "mean_emu_s": round(sum(r["emu_s"] for r in rs) / len(rs), 4),
            "max_emu_s": max(r["emu_s"] for r in rs),
            "mean_sim_s": round(sum(r["sim_s"] for r in rs) / len(rs), 4),
            "max_sim_s": max(r["sim_s"] for r in rs),
            "abs_rel_error_median": errs[len(errs) // 2],
            "abs_rel_error_p90": errs[min(len(errs) - 1, int(0.9 * len(errs)))],
            "abs_rel_error_max": errs[-1],
        }
    return out
