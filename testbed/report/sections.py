"""The report's sections per kind of directory: each returns Sections of figures and tables."""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from testbed.emu.scale import Scale
from testbed.errors import RuntimeFailure
from testbed.io.bounded import DirReader
from testbed.report import figures as F
from testbed.report import readers
from testbed.report.page import Figure, Section, Table, markdown_html
from testbed.report.readers import (
    FIGURE_MAX_BARS,
    FIGURE_MAX_LINES,
    FIGURE_MAX_SPANS,
    MARKDOWN_MAX_FILES,
    read_json,
    table_rows,
)

log = logging.getLogger(__name__)

MAX_FIBRES = 400
"""Fibres (rows) of a spectrum heat map; the busiest are kept."""
MAX_SLOTS = 4096
"""Spectrum slots of a heat map (the spec allows no more)."""
SPECTRUM_MAX_WORK = 10_000_000
"""Cell updates spent on one spectrum figure (the lightpaths past it are left out)."""
ENGINE_GANTT_MAX_JOBS = 2_000
"""Jobs re-simulated to find a run's most frequent pipeline."""


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def scenario_name(d: DirReader) -> str:
    man = read_json(d, "manifest.json")
    return str(man.get("scenario", ""))[:200] if isinstance(man, dict) else ""


def _outside_files(spec: dict[str, Any]) -> list[str]:
    """The files outside the run directory that a recorded spec names."""
    out = []
    for section, key in (("topology", "file"), ("workload", "trace")):
        ref = _dict(spec.get(section)).get(key)
        if ref:
            out.append(f"{section}.{key} {str(ref)[:100]!r}")
    return out


def _scenario(d: DirReader) -> Any:
    """The run's validated scenario from its manifest, or None. A spec naming files
    outside the directory (a topology file, a trace) is used only when the directory is
    root's or the caller's: root reads no file on another user's say-so."""
    from testbed.spec import parse_scenario

    man = read_json(d, "manifest.json")
    if not isinstance(man, dict) or not isinstance(man.get("spec"), dict):
        return None
    outside = _outside_files(man["spec"])
    if outside and d.owner not in (0, os.geteuid()):
        d.skip("manifest.json", f"its spec names {', '.join(outside)} outside the run "
               f"directory: not read for a directory of uid {d.owner} (no topology map, "
               "no re-simulated timeline)")
        return None
    try:
        return parse_scenario(man["spec"])
    except Exception as exc:
        log.info("manifest spec not reusable: %s", exc)
        return None


def _safe(fn: Any, *args: Any) -> list[Section]:
    """A section builder that failed becomes a note, never a broken report."""
    try:
        return list(fn(*args))
    except Exception as exc:
        log.warning("report section %s skipped: %s", fn.__name__, exc)
        return [Section(fn.__name__.strip("_").replace("_", " "),
                        f"(not drawn: {type(exc).__name__}: {exc})")]


# ------------------------------------------------------------------ runs
def run(d: DirReader, backend: str) -> list[Section]:
    """A run's page: what it found, its figures, then every recorded field (folded)."""
    head, body, tail = run_parts(d, backend)
    return head + body + tail


def run_parts(d: DirReader, backend: str) -> tuple[list[Section], list[Section],
                                                   list[Section]]:
    """(what the run found, its figures and tables, its raw fields behind a fold)."""
    from testbed.report.findings import findings, raw_fields

    head = _safe(findings, d, backend)
    scen = _scenario(d)
    body: list[Section] = []
    if d.has("requests.csv"):
        body += _safe(_lightpath_sections, d, scen, backend)
    if d.has("jobs.csv"):
        body += _safe(_jobs_sections, d, scen, backend)
    from testbed.report.faultfig import fault_sections

    body += _safe(fault_sections, d, backend)
    if backend == "emu":
        from testbed.report.fidelity import fidelity_sections

        body += _safe(fidelity_sections, d)
        body += _safe(_emu_sections, d, scen)
    body += _safe(_other_pngs, d)
    return head, body, _safe(raw_fields, d, backend)


def _other_pngs(d: DirReader) -> list[Section]:
    """Every PNG the run directory holds (a figure the user or a tool put there)."""
    from testbed.report.pngs import png_figures

    figs = png_figures(d)
    return [Section("other figures in the run directory", "", figs)] if figs else []


def _topology(scen: Any) -> tuple[Any, dict[str, str]]:
    from testbed.spec.check import topology_of

    topo = topology_of(scen)
    return topo.graph(), {d.node: d.name for d in scen.dcs}


def _cuts(scen: Any) -> set[frozenset]:
    cuts = set()
    for ev in getattr(scen, "events", None) or []:
        if getattr(ev, "kind", "") == "fiber_cut" and getattr(ev, "link", None):
            cuts.add(frozenset(str(x) for x in ev.link))
    return cuts


def _path_links(path: str) -> list[frozenset]:
    nodes = [p for p in path.split("-") if p]
    return [frozenset((a, b)) for a, b in itertools.pairwise(nodes)]


def _lightpath_sections(d: DirReader, scen: Any, backend: str) -> list[Section]:
    io = readers
    rows = io.read_csv(d, "requests.csv")
    acc = [r for r in rows if r.get("accepted") == "1" and r.get("path")]
    secs: list[Section] = []
    end = max((io.num(r["arrival_s"]) + io.num(r["holding_s"]) for r in acc), default=1.0)
    figs: list[Figure] = []
    if scen is not None:
        g, dcs = _topology(scen)
        carried: dict[frozenset, float] = defaultdict(float)
        for r in acc:
            for link in _path_links(r["path"]):
                carried[link] += io.num(r["bitrate"]) * io.num(r["holding_s"]) / end
        figs.append(Figure(F.data_uri(F.topology_map(
            g, dcs, carried, "mean Gbit/s carried", _cuts(scen),
            f"{scen.name}: fibres by mean carried traffic ({backend})")),
            "Topology with the datacentres (orange) and every fibre drawn wider the more "
            "traffic its lightpaths carried on average over the run; red dashed fibres are "
            "cut by a scenario event. Look for the thick fibres: they are the bottlenecks "
            "that blocking comes from."))
    holds = [(r["path"], int(r["first_slot"]), int(r["slots"]), io.num(r["arrival_s"]),
              io.num(r["arrival_s"]) + io.num(r["holding_s"])) for r in acc]
    figs += _spectrum_figures(d, holds, scen, end, "lightpaths")
    # blocking over time
    xs, ys, blocked = [], [], 0
    for i, r in enumerate(rows, 1):
        blocked += r.get("accepted") != "1"
        if i % max(1, len(rows) // 200) == 0 or i == len(rows):
            xs.append(io.num(r["arrival_s"]))
            ys.append(blocked / i)
    by_rate: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        by_rate[r["bitrate"]][0] += 1
        by_rate[r["bitrate"]][1] += r.get("accepted") != "1"
    notes: list[str] = []
    if xs and not any(ys):
        notes.append(f"No request was blocked: the blocking ratio is 0 throughout, for every "
                     f"requested bit rate ({', '.join(sorted(by_rate, key=io.num))} Gbit/s), "
                     "so neither is drawn.")
    elif xs:
        figs.append(Figure(F.data_uri(F.series({"running blocking ratio": (xs, ys)},
                                               "arrival time (s)", "blocked / requested",
                                               "blocking ratio as requests arrive")),
                           "Fraction of the requests so far that were blocked. It should "
                           "settle: a curve still drifting at the end means the run was too "
                           "short for a steady-state figure."))
        labels = sorted(by_rate, key=lambda x: io.num(x))
        if len(labels) > FIGURE_MAX_BARS:
            d.skip("requests.csv", f"{len(labels)} distinct bit rates: no bar chart of "
                   f"them (the limit is {FIGURE_MAX_BARS})")
        elif len(labels) > 1:
            figs.append(Figure(F.data_uri(F.bars(
                [f"{b} Gbit/s" for b in labels],
                [by_rate[b][1] / by_rate[b][0] for b in labels], None,
                "blocking ratio (blocked / requested)",
                "blocking ratio per requested bit rate", "requested bit rate")),
                "Wider requests need more contiguous slots, so they are blocked more often; "
                "a large spread here is the bandwidth unfairness of the spectrum policy."))
        else:
            notes.append(f"Every request asked for {labels[0]} Gbit/s: no blocking per bit "
                         "rate to compare.")
    secs.append(Section(f"{backend}: lightpaths and spectrum",
                        " ".join([f"{len(rows)} requests, {len(acc)} accepted.", *notes]), figs))
    return secs


def _spectrum_figures(d: DirReader, holds: list[tuple[str, int, int, float, float]],
                      scen: Any, end: float, what: str) -> list[Figure]:
    """Slots x fibre at the busiest instant and slots x time on the busiest fibre, from
    (route 'a-b-c', first slot, slot count, set-up s, tear-down s) of every lightpath.
    Bounded whatever the records say: at most MAX_SLOTS slots, MAX_FIBRES fibres and
    SPECTRUM_MAX_WORK cell updates per figure (what is left out is recorded)."""
    figs: list[Figure] = []
    holds = [h for h in holds if all(math.isfinite(x) for x in (h[3], h[4]))]
    if not math.isfinite(end) or end <= 0:
        end = max((h[4] for h in holds), default=1.0)
    slots = int(getattr(getattr(scen, "optical", None), "slots", 0) or
                max((first + n for _p, first, n, _a, _b in holds), default=1))
    if slots > MAX_SLOTS:
        d.skip(what, f"slot indices up to {slots}: the spectrum drawn for the first "
               f"{MAX_SLOTS} slots only")
        slots = MAX_SLOTS
    events = sorted([(a, 1) for _p, _f, _n, a, _b in holds] +
                    [(b, -1) for _p, _f, _n, _a, b in holds])
    live, busiest_t, busiest_n = 0, 0.0, -1
    for t, d in events:
        live += d
        if live > busiest_n:
            busiest_n, busiest_t = live, t
    fibres = sorted({lk for h in holds for lk in _path_links(h[0])},
                    key=lambda k: tuple(sorted(k)))
    if not fibres:
        return figs
    use: dict[frozenset, float] = defaultdict(float)
    for path, _first, n, a, b in holds:
        for lk in _path_links(path):
            use[lk] += n * (b - a)
    if len(fibres) > MAX_FIBRES:
        d.skip(what, f"{len(fibres)} fibres: the spectrum drawn for the {MAX_FIBRES} "
               "busiest")
        keep = set(sorted(fibres, key=lambda k: -use[k])[:MAX_FIBRES])
        fibres = [k for k in fibres if k in keep]
    names = ["-".join(sorted(k, key=lambda x: (len(x), x))) for k in fibres]
    idx = {k: i for i, k in enumerate(fibres)}
    snap = [[0.0] * slots for _ in fibres]
    work = 0
    for path, first, n, a, b in holds:
        if a <= busiest_t < b:
            lo, hi = max(0, first), min(slots, first + n)
            for lk in _path_links(path):
                if lk in idx and work < SPECTRUM_MAX_WORK:
                    work += max(0, hi - lo)
                    for s in range(lo, hi):
                        snap[idx[lk]][s] = 1.0
    figs.append(Figure(F.data_uri(F.spectrum_heatmap(
        snap, names, "spectrum slot index", None,
        f"spectrum occupancy per fibre at t = {busiest_t:.1f} s ({busiest_n} {what} live)",
        "occupied (1) / free (0)", ylabel="fibre (node-node)"), "png"),
        "Which slots of each fibre are occupied at the busiest instant of the run (yellow "
        "occupied, purple free). First-fit packs the low slot indices; a fibre whose row "
        "is full blocks every new request routed over it."))
    if work >= SPECTRUM_MAX_WORK:
        d.skip(what, f"more than {SPECTRUM_MAX_WORK} slot updates: the busiest-instant "
               "spectrum leaves some lightpaths out")
    top = max(fibres, key=lambda k: use[k])
    bins = 400
    width = (end or 1.0) / bins
    grid = [[0.0] * bins for _ in range(slots)]
    work = 0
    for path, first, n, a, b in holds:
        if top not in _path_links(path):
            continue
        b0, b1 = max(0, int(max(a, 0.0) / width)), min(bins - 1, int(min(b, end) / width))
        lo, hi = max(0, first), min(slots, first + n)
        work += max(0, b1 - b0 + 1) * max(0, hi - lo)
        if work > SPECTRUM_MAX_WORK:
            d.skip(what, f"more than {SPECTRUM_MAX_WORK} slot-time updates: the slots x "
                   "time figure leaves some lightpaths out")
            break
        for k in range(b0, b1 + 1):
            frac = (min(b, (k + 1) * width) - max(a, k * width)) / width
            for s in range(lo, hi):
                grid[s][k] += max(frac, 0.0)
    step = max(1, slots // 10)
    labels = [str(s) if s % step == 0 else "" for s in range(slots)]
    figs.append(Figure(F.data_uri(F.spectrum_heatmap(
        grid, labels, "simulated time (s)", (0.0, end or 1.0),
        f"slots x time on the busiest fibre {names[idx[top]]}",
        "fraction of the time bin occupied", height_in=4.5,
        ylabel="spectrum slot index"), "png"),
        "Spectrum slot (rows, 0 at the top) against simulated time (columns) on fibre "
        f"{names[idx[top]]}, the "
        "fibre with the most slot-seconds in use. Gaps inside the occupied band are "
        "fragmentation: free slots too scattered for a wide request."))
    return figs


def _jobs_sections(d: DirReader, scen: Any, backend: str) -> list[Section]:
    io = readers
    rows = io.read_csv(d, "jobs.csv")
    figs: list[Figure] = []
    ran = [r for r in rows if r.get("blocked") in ("0", "", "False")]
    ran_ids = {id(r) for r in ran}
    by_model: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        by_model[r["model"]].append(r)
    models = list(by_model)
    if len(models) > FIGURE_MAX_LINES:
        d.skip("jobs.csv", f"{len(models)} models: the first {FIGURE_MAX_LINES} drawn and "
               "tabled")
        models = models[:FIGURE_MAX_LINES]
    ran_by_model: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in ran:
        ran_by_model[r["model"]].append(r)
    stats = []
    for m in models:
        mine = by_model[m]
        ok = [r for r in mine if id(r) in ran_ids]
        its = [io.num(r["iteration_time_s"]) for r in ok]
        jct = [io.num(r["jct_s"]) for r in ok]
        stats.append((m, len(mine), len(mine) - len(ok),
                      f"{(len(mine) - len(ok)) / len(mine):.1%}" if mine else "",
                      _mean(its), _mean([io.num(r["bubble_ratio"]) for r in ok]),
                      _mean(jct) / 3600.0, sum(io.num(r["cost_usd"]) for r in ok)))
    tables = [Table(["model", "jobs", "blocked", "blocked share", "mean iteration time (s, "
                     "accepted jobs)", "mean bubble ratio", "mean JCT (h)", "cost (USD)"],
                    stats, "Means are over the accepted jobs only; the blocked share is next "
                    "to them.")]
    figs.append(Figure(F.data_uri(F.histograms(
        {m: [io.num(r["iteration_time_s"]) for r in ran_by_model[m]] for m in models},
        "iteration time (s)", "iteration time per job, by model (accepted jobs)")),
        "Distribution of the per-job iteration time: one curve per model. A second hump "
        "within one model means some of its jobs got a slower placement (a longer or thinner "
        "lightpath between stages)."))
    figs.append(Figure(F.data_uri(F.histograms(
        {m: [io.num(r["jct_s"]) / 3600.0 for r in ran_by_model[m]] for m in models},
        "job completion time (h)", "job completion time, by model (accepted jobs)")),
        "Job completion time including queueing; blocked jobs are not in it (see the table "
        "for their share)."))
    if scen is not None:
        g, dcs = _topology(scen)
        count: dict[frozenset, float] = defaultdict(float)
        for r in ran:
            for lp in (r.get("lightpaths") or "").split("|"):
                if lp and lp != "fabric":
                    for link in _path_links(lp.split(":")[0]):
                        count[link] += 1
        figs.append(Figure(F.data_uri(F.topology_map(
            g, dcs, count, "jobs whose lightpaths cross it", _cuts(scen),
            f"{scen.name}: fibres used by the jobs' lightpaths")),
            "Datacentres (orange) and the fibres carrying the jobs' inter-DC lightpaths, "
            "wider for more jobs. With no blue fibre, every job fitted inside one DC."))
    lps = io.read_csv(d, "lightpaths.csv")
    if lps:
        holds = [(r["path"], int(r["first_slot"]), int(r["slots"]), io.num(r["setup_s"]),
                  io.num(r["teardown_s"])) for r in lps if r.get("teardown_s")]
        end = max((h[4] for h in holds if math.isfinite(h[4])), default=1.0)
        figs += _spectrum_figures(d, holds, scen, end, "job lightpaths")
    if scen is not None:
        gantt = _engine_gantt(scen)
        if gantt is not None:
            figs.append(gantt)
    return [Section(f"{backend}: pipeline jobs", f"{len(rows)} jobs, {len(ran)} ran.",
                    figs, tables)]


def _mean(vals: list[float]) -> float:
    vals = [v for v in vals if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def _engine_gantt(scen: Any) -> Figure | None:
    """The schedule engine's timeline of the run's most common pipeline (re-simulated)."""
    from testbed.jobs.sim import simulate
    from testbed.jobs.timing import Timer
    from testbed.schedule.model import Hop, PipelineProblem
    from testbed.schedule.registry import build_schedule
    from testbed.schedule.timer import time_schedule

    seen: dict[tuple, int] = defaultdict(int)
    wl = getattr(scen, "workload", None)
    if isinstance(getattr(wl, "jobs", None), int) and wl.jobs > ENGINE_GANTT_MAX_JOBS:
        scen = scen.model_copy(update={"workload": wl.model_copy(
            update={"jobs": ENGINE_GANTT_MAX_JOBS})})

    class Recording(Timer):
        def time(self, forward_ms, backward_ms, hops, activation_mb, microbatches,  # type: ignore[no-untyped-def,override]
                 schedule):
            key = (tuple(forward_ms), tuple(backward_ms), tuple(hops), activation_mb,
                   microbatches, schedule)
            if len(seen) < 5000:
                seen[key] += 1
            return super().time(forward_ms, backward_ms, hops, activation_mb, microbatches,
                                schedule)

    simulate(scen, quiet=True, timer=Recording())
    if not seen:
        return None
    f, b, hops, act, m, sched_name = max(seen, key=lambda k: (len(k[2]) > 0, seen[k]))
    if not readers.small_pipeline(len(f), m):
        return None
    prob = PipelineProblem(f, b, tuple(Hop(lat, bw) for lat, bw in hops), act, m)
    timing = time_schedule(prob, build_schedule(sched_name, prob), check_memory_cap=False)
    worst = max(hops, key=lambda h: h[0], default=(0.0, 0.0))
    return Figure(F.data_uri(F.gantt(timing, f"{sched_name}, {len(f)} stages, {m} micro-"
                                     f"batches: {timing.iteration_time_ms:.1f} ms, bubble "
                                     f"{timing.bubble_ratio:.0%}")),
                  "One iteration of the run's most frequent pipeline as the schedule engine "
                  f"times it (slowest boundary: {worst[0]:.2f} ms latency, {worst[1]:g} Gbit/s). "
                  "White gaps are idle time (the bubble); green/purple bars under and over a "
                  "stage are activations and gradients on the wire. Long purple bars mean the "
                  "pipeline waits on the inter-DC link.")


def _emu_sections(d: DirReader, scen: Any) -> list[Section]:
    io = readers
    d = readers.open_run(d)
    figs: list[Figure] = []
    tables: list[Table] = []
    probes = io.read_csv(d, "probes.csv")
    if probes:
        keys = [k for k in probes[0] if k is not None][:50]
        label_key = next((k for k in ("lightpath", "name", "pair") if k in keys), keys[0])
        ratio_key = next((k for k in keys if "ratio" in k), None)
        caption = ("TCP goodput measured with iperf3 over each emulated lightpath, as a "
                   "fraction of its configured rate. About 0.95 is the TCP/IP header limit; "
                   "much lower means the emulator could not keep up.")
        if ratio_key and len(probes) <= FIGURE_MAX_BARS:
            figs.append(Figure(F.data_uri(F.bars(
                [str(p.get(label_key)) for p in probes],
                [io.num(p.get(ratio_key)) for p in probes], None,
                "measured / configured goodput", "iperf3 goodput per emulated lightpath",
                "lightpath (id)")), caption))
        elif ratio_key:
            figs.append(Figure(F.data_uri(F.histograms(
                {"lightpaths": [io.num(p.get(ratio_key)) for p in probes]},
                "measured / configured goodput",
                f"iperf3 goodput of {len(probes)} emulated lightpaths", "lightpaths")),
                caption + f" {len(probes)} lightpaths: their distribution, not a bar each."))
        shown, note = table_rows(d, probes, "probes.csv")
        tables.append(Table(keys, [[p.get(k) for k in keys] for p in shown],
                            "probes.csv" + note))
    summ = _dict(io.read_json(d, "summary.json"))
    agr = summ.get("agreement")
    if isinstance(agr, dict):
        tables.append(Table(["requests replayed", "identical decisions", "compared"],
                            [(agr.get("requests"), agr.get("same"),
                              ", ".join(map(str, list(agr.get("compared") or [])[:20])))],
                            "Simulator vs controller: the same request stream, decision by "
                            "decision."))
    its = io.read_csv(d, "iterations.csv")
    if its:
        by_job: dict[str, list[float]] = defaultdict(list)
        for r in its:
            if r.get("warmup") != "1":
                by_job[r["job"]].append(io.num(r["iteration_time_s"]))
        by_job = _first_groups(d, by_job, "iterations.csv", "jobs")
        figs.append(Figure(F.data_uri(F.histograms(
            by_job, "measured iteration time (s, real-time units)",
            "measured iterations per job (emulated workers, warm-up excluded)",
            "iterations")),
            "Every measured iteration of the real PyTorch workers, one curve per job: the "
            "spread is what one averaged number hides."))
    trace = io.read_json(d, "trace.json")
    text = ""
    if isinstance(trace, dict):
        timelines, left_out = _job_timelines(d, trace, summ, its)
        figs += timelines
        if left_out:
            text = (f"Timelines drawn for the first {MAX_TIMELINE_JOBS} jobs; {left_out} more "
                    "job(s) left out (all are in trace.json, open it in Perfetto).")
    if isinstance(summ.get("agreement"), list):
        rows, more = table_rows(d, [r for r in summ["agreement"] if isinstance(r, dict)],
                                "summary.json agreement")
        cols = list(dict.fromkeys(k for r in rows for k in r))[:50]

        def cell(v: Any) -> Any:
            return "; ".join(map(str, v)) if isinstance(v, list) else v

        verdict = _dict(summ.get("agreement_verdict"))
        note = more + ("" if not verdict or verdict.get("reliable") else (
            " UNRELIABLE: " + "; ".join(map(str, list(verdict.get("reasons") or [])[:20]))))
        tables.append(Table(cols, [[cell(r.get(c)) for c in cols] for r in rows],
                            "Simulated vs emulated iteration time per job (p10/p90: signed "
                            "errors of the measured iterations' spread)." + note))
    from testbed.report.prom import prometheus_charts

    pfigs, pnote = prometheus_charts(d)
    secs = [Section("emulation: measurements", text, figs, tables)] if figs or tables else []
    if pfigs or pnote:
        secs.append(Section("emulation: the run's Prometheus series", pnote, pfigs))
    return secs


MAX_TIMELINE_JOBS = 6  # one side-by-side figure per emulated job, at most this many
MAX_TIMELINE_STAGES = 1024  # (the spec's limit on a pipeline's stages)


def _span_kind(e: dict[str, Any]) -> str:
    if e.get("cat") == "wait":
        return "wait (idle)"
    name = str(e["name"])
    return "forward" if name.startswith("F") else "backward" if name[:1] in "BIW" else name[:8]


def _first_groups(d: DirReader, groups: dict[str, list[float]], what: str,
                  kind: str) -> dict[str, list[float]]:
    """The first FIGURE_MAX_LINES groups of a figure (a cut recorded)."""
    if len(groups) <= FIGURE_MAX_LINES:
        return groups
    d.skip(what, f"{len(groups)} {kind}: the first {FIGURE_MAX_LINES} drawn")
    return dict(itertools.islice(groups.items(), FIGURE_MAX_LINES))


def _spans(d: DirReader, spans: Sequence[Any], name: str) -> list[Any]:
    if len(spans) <= FIGURE_MAX_SPANS:
        return list(spans)
    d.skip("trace.json", f"{name}: {len(spans)} spans in one iteration, the first "
           f"{FIGURE_MAX_SPANS} drawn")
    return list(spans[:FIGURE_MAX_SPANS])


def _job_timelines(d: DirReader, trace: dict[str, Any], summ: dict[str, Any],
                   its: list[dict[str, str]]) -> tuple[list[Figure], int]:
    """Per emulated job (at most MAX_TIMELINE_JOBS): the schedule engine's timeline of its
    pipeline beside the workers' measured first measured iteration on one time scale;
    (figures, jobs left out). Without the job's pipeline record (older runs) the measured
    timeline alone."""
    from testbed.schedule import Hop, PipelineProblem, build_schedule, time_schedule

    events = [e for e in trace.get("traceEvents") or [] if isinstance(e, dict)]
    pid_of = {e["args"]["name"]: e["pid"] for e in events
              if e.get("ph") == "M" and e.get("name") == "process_name"}
    spans_of: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            spans_of[e["pid"]].append(e)
    info = {str(w.get("job")): w for w in summ.get("worker_jobs") or [] if isinstance(w, dict)}
    measured: dict[str, int] = {}
    for r in its:
        if r.get("warmup") != "1" and r["job"] not in measured:
            measured[r["job"]] = int(r["iteration"])
    names = [n for n in pid_of if spans_of.get(pid_of[n])]
    figs: list[Figure] = []
    for name in names[:MAX_TIMELINE_JOBS]:
        job = name.removeprefix("job ")
        evs = spans_of[pid_of[name]]
        iters = sorted({e.get("args", {}).get("iteration") for e in evs},
                       key=lambda x: (x is None, x))
        it = measured.get(job, iters[0])
        mine = _spans(d, [e for e in evs if e.get("args", {}).get("iteration") == it] or evs,
                      name)
        mine = [e for e in mine if isinstance(e.get("tid"), int)
                and 0 <= e["tid"] < MAX_TIMELINE_STAGES]
        if not mine:
            d.skip("trace.json", f"{name}: no span on a stage 0..{MAX_TIMELINE_STAGES - 1}")
            continue
        w = info.get(job, {})
        try:
            factor = Scale.of_record(w, name).time_factor
        except RuntimeFailure as exc:
            d.skip("summary.json", str(exc))
            continue
        t0 = min(e["ts"] for e in mine)
        pipe = w.get("pipeline")
        if isinstance(pipe, dict) and not readers.small_pipeline(
                len(pipe.get("forward_ms") or []), pipe.get("microbatches")):
            d.skip("summary.json", f"{name}: its pipeline is too large to time (more than "
                   f"{readers.PIPELINE_MAX_OPS} stage x micro-batch steps)")
            pipe = None
        if isinstance(pipe, dict):
            problem = PipelineProblem(
                tuple(pipe["forward_ms"]), tuple(pipe["backward_ms"]),
                tuple(Hop(lat, math.inf if bw is None else bw) for lat, bw in pipe["hops"]),
                tuple(pipe["activation_mb"]) if isinstance(pipe["activation_mb"], list)
                else pipe["activation_mb"], pipe["microbatches"])
            sched = str(w.get("schedule") or "1f1b")
            timing = time_schedule(problem, build_schedule(sched, problem),
                                   check_memory_cap=False)
            spans = [(int(e["tid"]), _span_kind(e), (e["ts"] - t0) / 1e3 / factor,
                      (e["ts"] + e["dur"] - t0) / 1e3 / factor) for e in mine]
            measured_ms = max((sp[3] for sp in spans), default=0.0)
            figs.append(Figure(F.data_uri(F.gantt_side_by_side(
                timing, spans, f"{name}: {sched}, {problem.stages} stages, "
                f"{problem.microbatches} micro-batches",
                f"schedule engine: {timing.iteration_time_ms:.1f} ms",
                f"emulated workers, iteration {it}: {measured_ms:.1f} ms"
                + (f" (wall / {factor:g})" if factor != 1.0 else ""))),
                f"{name}: the schedule engine's timeline of this job's pipeline (left) beside "
                "what its emulated workers did in their first measured iteration (right), on "
                "one time scale (real-time ms; the workers' wall time divided by the "
                "emulation's time factor). Grey bars on the right are waits for an input; "
                "where they are longer than the engine's idle gaps, the network is slower "
                "than modelled."))
        else:
            spans_s = [(f"stage {e['tid']}", _span_kind(e), (e["ts"] - t0) / 1e6,
                        (e["ts"] + e["dur"] - t0) / 1e6) for e in mine]
            figs.append(Figure(F.data_uri(F.worker_gantt(
                spans_s, f"{name}: measured timeline, iteration {it}")),
                f"What the emulated workers of {name} actually did, per stage: compute and "
                "the time spent waiting for an input (idle). This run records no pipeline "
                "for the job, so the engine's timeline is not drawn beside it."))
    return figs, max(0, len(names) - MAX_TIMELINE_JOBS)


def agreement(root: DirReader) -> list[Section]:
    io = readers
    text = root.read_text("agreement.md") or ""
    sim = io.read_csv(root, "sim/jobs.csv")
    emu_its = io.read_csv(root, "emu/iterations.csv")
    figs = []
    if sim and emu_its:
        pred = {r["job_id"]: io.num(r["iteration_time_s"]) for r in sim}
        by_job: dict[str, list[float]] = defaultdict(list)
        for r in emu_its:
            if r.get("warmup") != "1":
                by_job[r["job"]].append(io.num(r["iteration_time_s"]))
        groups = {}
        for job, vals in by_job.items():
            p = pred.get(job) or pred.get(job.split("-")[-1])
            if p:
                groups[f"job {job}"] = [v / p - 1.0 for v in vals]
        groups = _first_groups(root, groups, "emu/iterations.csv", "jobs")
        if groups:
            figs.append(Figure(F.data_uri(F.histograms(
                groups, "measured / simulated iteration time - 1",
                "sim-vs-emu agreement: every measured iteration", "iterations")),
                "Relative error of each measured iteration against the simulator's "
                "prediction for its job: the whole distribution and its worst case, not one "
                "averaged number. 0 is perfect agreement."))
    if not text and not figs:
        return []
    return [Section("agreement: simulation vs emulation", "", figs, [],
                    markdown_html(text) if text else "")]


# ------------------------------------------------------------------ reproductions
HEADLINE_NOTES = {
    "cba": "The largest effect over the load sweep: the paired change against sp-ff, mean "
           "over seeds, at the load where it is largest.",
    "bace": "The largest effect over the load sweep: the paired change against each "
            "baseline, mean over seeds, at the load where it is largest.",
    "routing": "Per case, mean over seeds: greedy against ECMP (negative time and positive "
               "utilisation are better), and greedy's bottleneck against the best known one "
               "(the ILP's in the small cases).",
    "crosspipe": "The largest iteration-time reduction over the latency and bandwidth sweeps, "
                 "for each way of giving the schedules memory.",
    "geopipe": "The largest reduction over the latency and bandwidth sweeps against 1F1B, at "
               "equal bytes per GPU and with relaxed memory.",
}


REPRODUCES = {
    "cba": "CBA (Dec 2025): communication-bound-aware cross-domain resource assignment of "
           "pipeline jobs, against shortest-path first-fit (sp-ff)",
    "bace": "BACE-Pipe (May 2026): bandwidth-aware, cost-efficient pipeline scheduling "
            "across regions, against delay-first and cost-first placement",
}


def _experiment(summ: dict[str, Any]) -> str:
    exp = summ.get("experiment")
    if isinstance(exp, str):
        return exp
    return "crosspipe" if "max_reduction_vs_1f1b_same_memory_pct" in summ else (
        "geopipe" if "max_bubble_reduction_pct" in summ else "")


def reproduction(root: DirReader) -> list[Section]:
    from testbed.report.headline import headline_rows

    io = readers
    summ = _dict(io.read_json(root, "summary.json"))
    exp = _experiment(summ)
    what = str(summ.get("reproduces") or REPRODUCES.get(exp) or f"reproduction: {exp}")[:500]
    secs = [Section("what this reproduction found", what,
                    tables=[Table(["figure", "this run", "paper"],
                                  table_rows(root, headline_rows(summ), "summary.json")[0],
                                  HEADLINE_NOTES.get(exp, ""))])]
    secs += _safe(_reproduction_figures, root, summ)
    mds = [n for n in root.names() if n.endswith(".md") and n != "README.md"]
    if len(mds) > MARKDOWN_MAX_FILES:
        root.skip("*.md", f"{len(mds)} Markdown files: the first {MARKDOWN_MAX_FILES} shown")
    for name in mds[:MARKDOWN_MAX_FILES]:
        text = root.read_text(name)
        if text is not None:
            secs.append(Section(f"table: {name}", "", [], [], markdown_html(text),
                                fold=f"{name}: the full table"))
    setup = summ.get("setup")
    if isinstance(setup, dict):
        rows, note = table_rows(root, [(k, json.dumps(v)[:2000] if isinstance(
            v, dict | list) else v) for k, v in setup.items()], "summary.json setup")
        secs.append(Section("set-up", tables=[Table([], rows, note)],
                            fold="every set-up value (summary.json)"))
    return secs


CAPTIONS = {
    "cba": "Left: mean iteration time over the jobs EVERY policy accepted (s), one job set "
           "for all lines, so blocked jobs do not drop out of one mean only. Middle: "
           "iteration-time change against sp-ff on the jobs BOTH policies ran (paired, same "
           "seeds): below 0 is faster. Right: blocking ratio. Hollow diamonds are the small "
           "case solved exactly (cba-ilp), a separate experiment not joined to the sweep. "
           "Policies at the same load are nudged sideways so coinciding points stay visible.",
    "bace": "Mean job completion time (h) over the jobs every policy completed, and "
            "electricity cost (k$) per policy over the load sweep, 95 % CI over seeds; lower "
            "is better on both.",
}


REPRO_MAX_ROWS = 5_000
"""Rows of a reproduction's summary drawn as its policy comparison."""


def _reproduction_figures(root: DirReader, summ: dict[str, Any]) -> list[Section]:
    """The figures the reproduction wrote (its PNG files, every one), and for the schedule
    reproductions the engine's timelines; a directory without PNGs (older runs) gets its
    comparison redrawn from summary.json."""
    from testbed.report.pngs import CAPTIONS as PNG_CAPTIONS
    from testbed.report.pngs import png_figures, png_names

    exp = _experiment(summ)
    pngs = png_names(root)
    caps = dict(PNG_CAPTIONS)
    if exp in CAPTIONS:
        caps[f"{exp}.png"] = CAPTIONS[exp]
    figs = png_figures(root, pngs, caps)
    rows = summ.get("rows")
    if not pngs:
        if isinstance(rows, list):
            rows = [r for r in rows if isinstance(r, dict)]
            lines = len({(r.get("policy"), r.get("case")) for r in rows})
            if len(rows) > REPRO_MAX_ROWS or lines > FIGURE_MAX_LINES * 2:
                root.skip("summary.json", f"{len(rows)} rows, {lines} policy lines: the "
                          f"comparison is drawn for at most {REPRO_MAX_ROWS} rows and "
                          f"{FIGURE_MAX_LINES * 2} lines")
                return [Section("figures", "(not drawn: too many rows; see summary.json)")]
        if exp in CAPTIONS and isinstance(rows, list):
            from testbed.report.repro_plots import reproduction_figure

            figs.append(Figure(F.data_uri(reproduction_figure(exp, rows)), CAPTIONS[exp]))
    if exp in ("crosspipe", "geopipe"):
        from testbed.report.repro_plots import schedule_figures

        figs += schedule_figures(root, summ, series=not pngs)
    if not figs:
        return [Section("figures", "This reproduction wrote no figure and none could be "
                        "drawn from its summary.json.")]
    return [Section("figures", "", figs)]


# ------------------------------------------------------------------ sweeps
def sweep(root: DirReader) -> list[Section]:
    """A sweep's page: its best and worst point first, its figures (the PNGs it wrote;
    redrawn for an older directory without them), then the tables behind folds."""
    from testbed.report.pngs import png_figures, png_names
    from testbed.report.repro_plots import sweep_figures

    io = readers
    meta = _dict(io.read_json(root, "sweep.json"))
    metric = str(meta.get("metric", "blocking_ratio"))[:100]
    keys = [str(k) for k in _dict(meta.get("set"))]
    agg = io.read_csv(root, "sweep_mean.csv")
    secs = [Section("what this sweep found", f"{str(meta.get('points'))[:40]} runs, "
                    f"{str(meta.get('seeds'))[:40]} seed(s) per point; metric {metric}.",
                    tables=[Table(["figure", "this sweep", "at"], _sweep_extremes(
                        agg, keys, metric), "Means over seeds (95 % CI half-width in "
                        "brackets where there are several seeds).")])]
    pngs = png_names(root)
    if pngs:
        from testbed.report.repro_plots import _is_number

        caps = {f"{metric}_vs_{k.split('.')[-1]}.png":
                f"{metric} for each value of {k}"
                + (" (a line: the values are numbers)" if all(_is_number(r.get(k))
                                                              for r in agg) else
                   " (bars: the values are categories, not a scale)")
                + "; the other swept fields' values are separate lines or bar colours; "
                "whiskers are 95 % confidence intervals over seeds." for k in keys}
        secs.append(Section("figures", "", png_figures(root, pngs, caps)))
    else:
        secs += _safe(sweep_figures, root, meta)
    sets, note = table_rows(root, list(_dict(meta.get("set")).items()), "sweep.json set")
    secs.append(Section("swept values", tables=[Table([], sets, note)],
                        fold=f"{len(sets)} swept field(s) and their values"))
    if agg:
        cols = [k for k in agg[0] if k is not None][:50]
        rows, note = table_rows(root, agg, "sweep_mean.csv")
        secs.append(Section("mean per point", tables=[Table(cols, [[r.get(k) for k in cols]
                                                                   for r in rows], note)],
                            fold=f"{len(rows)} points (sweep_mean.csv)"))
    return secs


def _sweep_extremes(agg: list[dict[str, str]], keys: list[str], metric: str
                    ) -> list[tuple[str, str, str]]:
    """The lowest and highest mean of the metric over the grid, and where."""
    io = readers
    pts = [r for r in agg if math.isfinite(io.num(r.get(metric)))]
    if not pts:
        return []
    ci_key = next((k for k in (f"{metric}_ci95_half", f"{metric}_ci95") if k in pts[0]), "")

    def show(r: dict[str, str]) -> tuple[str, str]:
        ci = io.num(r.get(ci_key)) if ci_key else math.nan
        return (f"{io.num(r[metric]):.4g}" + (f" (± {ci:.2g})" if math.isfinite(ci) else ""),
                ", ".join(f"{k}={r.get(k)}" for k in keys))

    lo = min(pts, key=lambda r: io.num(r[metric]))
    hi = max(pts, key=lambda r: io.num(r[metric]))
    return [(f"lowest {metric}", *show(lo)), (f"highest {metric}", *show(hi))]
