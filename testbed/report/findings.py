"""A run's page opens with what it found (headline figures, the simulator's on the same
input where the run has them); every recorded field follows behind a fold."""

from __future__ import annotations

import math
from typing import Any

from testbed.io.bounded import DirReader
from testbed.report.page import Section, Table
from testbed.report.readers import read_json, table_rows

LIGHTPATH_POLICIES = ("spectrum",)
JOB_POLICIES = ("placement", "admission", "schedule", "spectrum", "fixed_slots", "max_slots",
                "mfu")


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) \
        and math.isfinite(v) else None


def _ratio(v: Any) -> str:
    x = _num(v)
    return "n/a" if x is None else f"{x:.4f} ({100 * x:.1f} %)"


def relevant_policies(spec: dict[str, Any]) -> list[tuple[str, Any]]:
    """The policy fields that decide something in this run (a lightpath-only run has no
    placement or MFU; the queue discipline only matters with queue admission)."""
    pol = _dict(spec.get("policy"))
    kind = _dict(spec.get("workload")).get("kind")
    keys = list(JOB_POLICIES if kind == "pp_jobs" else LIGHTPATH_POLICIES)
    if kind == "pp_jobs" and pol.get("admission") == "queue":
        keys.append("queue")
    if kind == "pp_jobs" and pol.get("placement") == "cba-ilp":
        keys.append("ilp_time_limit_s")
    if _dict(spec.get("emulation")).get("dc_fabric") == "leaf_spine":
        keys.append("routing")
    return [(k, pol[k]) for k in keys if k in pol]


def findings(d: DirReader, backend: str) -> list[Section]:
    """'what this run found': the headline rows (figure, this run, compared with)."""
    man = _dict(read_json(d, "manifest.json"))
    summ = _dict(read_json(d, "summary.json"))
    spec = _dict(man.get("spec"))
    wl = _dict(spec.get("workload"))
    kind = summ.get("workload") or wl.get("kind")
    rows: list[tuple[str, str, str]] = []
    if kind == "pp_jobs" or "jobs" in summ or "worker_jobs" in summ:
        text = _jobs_rows(summ, rows) if backend == "sim" or "jobs" in summ else (
            f"{len(summ.get('worker_jobs') or [])} pipeline job(s) run by real PyTorch workers "
            "over the emulated network.")
    elif "requests" not in summ:
        text = ""  # (a run that records neither requests nor jobs: its own rows only)
    else:
        topo = _dict(spec.get("topology"))
        text = _lightpath_rows(summ, wl, rows, backend,
                               str(topo.get("library") or topo.get("file") or "its topology"))
    if backend == "emu":
        _emu_rows(summ, rows)
    pol = ", ".join(f"{k} {v}" for k, v in relevant_policies(spec))
    if pol:
        text += f" Policies: {pol}."
    if not rows:
        return [Section(f"{backend}: what this run found", text.strip())] if text.strip() \
            else []
    headers = ["figure", "this run", "compared with"]
    if not any(r[2] for r in rows):  # (nothing to compare with: no empty column)
        headers, rows = headers[:2], [r[:2] for r in rows]  # type: ignore[misc]
    return [Section(f"{backend}: what this run found", text.strip(),
                    tables=[Table(headers, rows,
                                  "The run's headline figures; every recorded field is at the "
                                  "end of the page.")])]


def _lightpath_rows(summ: dict[str, Any], wl: dict[str, Any],
                    rows: list[tuple[str, str, str]], backend: str, topology: str = "") -> str:
    n, acc = summ.get("requests"), summ.get("accepted")
    ci = summ.get("blocking_ci95")
    ci_s = (f" (95 % CI {ci[0]:.4f} to {ci[1]:.4f})" if isinstance(ci, list) and len(ci) == 2
            and all(_num(c) is not None for c in ci) else "")
    sim_ref = summ.get("sim_blocking_ratio")
    cmp = f"the simulator on the same requests: {_ratio(sim_ref)}" if sim_ref is not None else ""
    rows.append(("blocking ratio (blocked / requested)", _ratio(summ.get("blocking_ratio"))
                 + ci_s, cmp))
    if summ.get("bitrate_blocking_ratio") is not None:
        rows.append(("bit-rate blocking ratio (blocked / requested Gbit/s)",
                     _ratio(summ.get("bitrate_blocking_ratio")), ""))
    reasons = {k: v for k, v in _dict(summ.get("blocked_by_reason")).items() if v}
    if reasons:
        rows.append(("blocked requests by reason",
                     ", ".join(f"{k}: {v}" for k, v in reasons.items()), ""))
    if _num(summ.get("mean_spectrum_utilization")) is not None:
        rows.append(("mean spectrum utilisation (occupied / all slots)",
                     f"{summ['mean_spectrum_utilization']:.3f}", ""))
    asked = wl.get("requests")
    rows.append(("requests", f"{n} requested, {acc} accepted",
                 f"the spec asks for {asked}: the emulation replays the first {n}"
                 if backend == "emu" and isinstance(asked, int) and isinstance(n, int)
                 and asked > n else ""))
    lost, restored = summ.get("lightpaths_lost"), summ.get("lightpaths_restored")
    if lost or restored:
        rows.append(("lightpaths lost / restored after network events",
                     f"{lost} lost, {restored} restored", ""))
    b = _num(summ.get("blocking_ratio"))
    where = f"{summ.get('policy', '')} on {summ.get('topology') or topology or 'the topology'}"
    load = summ.get("load_erlang") or wl.get("load_erlang")
    return (f"{n} lightpath requests ({where}, {load} Erlang): "
            f"{'none' if b == 0 else f'{100 * b:.1f} %' if b is not None else 'n/a'} blocked.")


def _jobs_rows(summ: dict[str, Any], rows: list[tuple[str, str, str]]) -> str:
    jobs, blocked = summ.get("jobs"), summ.get("blocked")
    for key, label, fmt in (
            ("blocking_ratio", "blocked jobs (blocked / arrived)", "ratio"),
            ("mean_iteration_time_s", "mean iteration time (s, jobs that ran)", "{:.4g}"),
            ("mean_bubble_ratio", "mean bubble ratio (idle / iteration time)", "{:.3f}"),
            ("mean_jct_s", "mean job completion time (s)", "{:.4g}"),
            ("mean_wait_s", "mean wait before start (s)", "{:.4g}"),
            ("gpu_utilization", "GPU utilisation (busy / available GPU time)", "{:.3f}"),
            ("total_cost_usd", "electricity cost (USD)", "{:,.2f}")):
        v = summ.get(key)
        if _num(v) is not None:
            rows.append((label, _ratio(v) if fmt == "ratio" else fmt.format(v), ""))
    return f"{jobs} pipeline jobs, {blocked if blocked is not None else 'n/a'} blocked."


def _emu_rows(summ: dict[str, Any], rows: list[tuple[str, str, str]]) -> None:
    agr = summ.get("agreement")
    if isinstance(agr, dict) and agr.get("requests"):
        rows.append(("simulator vs controller: identical decisions",
                     f"{agr.get('same')} of {agr.get('requests')}",
                     "compared: " + ", ".join(map(str, list(agr.get("compared") or [])[:10]))))
    if isinstance(agr, list) and agr:
        for r in [r for r in agr if isinstance(r, dict)][:6]:
            sim_s, emu_s = (_num(r.get("simulated_iteration_time_s")),
                            _num(r.get("emulated_iteration_time_s")))
            err = _num(r.get("relative_error"))
            if sim_s is not None and emu_s is not None:
                rows.append((f"{r.get('job')}: emulated iteration time (median, s)",
                             f"{emu_s:.4f}" + (f" ({100 * err:+.1f} %)" if err is not None
                                               else ""),
                             f"the simulator: {sim_s:.4f} s"))
    fid = _dict(summ.get("fidelity"))
    if fid:
        rows.append(("fidelity verdict", "faithful" if fid.get("faithful") is True else
                     "NOT FAITHFUL",
                     "; ".join(map(str, list(fid.get("reasons") or [])[:5]))[:600]))
    verdict = _dict(summ.get("agreement_verdict"))
    if verdict and not verdict.get("reliable", True):
        rows.append(("agreement verdict", "UNRELIABLE",
                     "; ".join(map(str, list(verdict.get("reasons") or [])[:5]))))
    g, gmin = _num(summ.get("mean_goodput_ratio")), _num(summ.get("min_goodput_ratio"))
    if g is not None:
        rows.append(("iperf3 goodput / configured rate, per lightpath",
                     f"mean {g:.3f}, worst {gmin if gmin is not None else float('nan'):.3f}",
                     "about 0.95 is the TCP/IP header limit"))
    cuts = [c for c in summ.get("cut_to_restored_s") or [] if _num(c) is not None]
    if cuts:
        rows.append(("fibre cut to lightpaths restored (s)",
                     ", ".join(f"{c:.3f}" for c in cuts[:10]), ""))
    if "rtt_ok" in summ:
        rows.append(("emulated round-trip times within their band",
                     "yes" if summ.get("rtt_ok") else "NO", ""))


def raw_fields(d: DirReader, backend: str) -> list[Section]:
    """The scenario and every scalar the run recorded, each once, behind a fold."""
    man = _dict(read_json(d, "manifest.json"))
    summ = _dict(read_json(d, "summary.json"))
    spec = _dict(man.get("spec"))
    topo = _dict(spec.get("topology"))
    dcs = ", ".join(f"{x['name']} (node {x['node']}, {x.get('gpus', '?')} GPUs)"
                    for x in list(spec.get("dcs") or [])[:50] if isinstance(x, dict))
    pol = ", ".join(f"{k}={v}" for k, v in relevant_policies(spec))
    kv: list[tuple[str, Any]] = [
        ("backend", backend), ("scenario", man.get("scenario")),
        ("description", spec.get("description")),
        ("topology", topo.get("library") or topo.get("file") or
         f"{len(topo.get('links', []))} links given inline"),
        ("datacentres", dcs), ("policies", pol),
        ("workload", _dict(spec.get("workload")).get("kind")),
        ("seed", man.get("seed")), ("spec sha256", (man.get("spec_sha256") or "")[:16]),
        ("LightPipe version", man.get("lightpipe_version"))]
    seen = {k for k, _ in kv} | {"policy"}
    kv += [(k, v) for k, v in summ.items()
           if isinstance(v, int | float | str | bool) and k not in seen]
    shown, note = table_rows(d, [(k, v) for k, v in kv if v not in (None, "")],
                             "summary.json")
    return [Section(f"{backend}: scenario and every recorded field",
                    tables=[Table([], shown, note)],
                    fold=f"{len(shown)} fields from manifest.json and summary.json")]
