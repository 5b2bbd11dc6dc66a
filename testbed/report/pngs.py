"""The PNG figures a run, reproduction or sweep wrote into its directory, inlined on the page."""

from __future__ import annotations

import base64
from collections.abc import Mapping

from testbed.io.bounded import DirReader
from testbed.report.page import Figure

PNG_MAX_BYTES = 8 << 20
"""Largest PNG inlined (a bigger one is named on the page, not shown)."""
PNG_MAX_FILES = 24
"""PNG files of one directory inlined."""
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# file name -> what the figure shows (the reproductions' and sweeps' own figures)
CAPTIONS: Mapping[str, str] = {
    "routing.png": "Mean all-reduce time (top, lower is better) and effective GPU "
                   "utilisation (bottom, higher is better) per case, one column per group of "
                   "policies, mean over seeds with 95 % CI. The ILP is solved only in the "
                   "small cases; the larger fabrics say so where its bar would be.",
    "crosspipe_latency.png": "Iteration time per schedule as the cross-DC latency grows "
                             "(left: traditional schedules, right: CrossPipe's). Dashed: "
                             "1F1B's time with no network delay, (m+p-1)(F+B); it bounds "
                             "the unsplit schedules only, so interleaved 1F1B and the "
                             "split-backward schedules (zb-h1, crosspipe-opt*) may go below "
                             "it. Dotted: the lower bound of any split-backward schedule at "
                             "that latency; crosspipe-opt-relaxed (no memory limit) reaches "
                             "it.",
    "crosspipe_bandwidth.png": "Iteration time per schedule as the cross-DC bandwidth "
                               "grows (log scale), same panels and reference lines as the "
                               "latency figure.",
    "geopipe_latency.png": "Bubble ratio of 1F1B and GeoPipe variants as the cross-DC "
                           "latency grows; lower is better.",
    "geopipe_bandwidth.png": "Iteration time of 1F1B and GeoPipe variants as the cross-DC "
                             "bandwidth grows (log scale); dotted verticals mark the "
                             "bandwidths where a schedule stops being network-bound.",
    "outage.png": "The job's stall (extra time of the iterations a fibre cut touched) "
                  "against the fault's length, cut until repair, one panel per collective "
                  "time-out and a line per protection scheme (simulated); black crosses: "
                  "the job failed (its collective timed out; drawn at the time lost until "
                  "then); hollow red squares: emulation points. Dotted: the field trials' "
                  "~100 ms; dashed: 5 % of a steady iteration (training notices above it); "
                  "grey: stall = fault length.",
    "outage_ablation.png": "Left: what protection buys, the stall per scheme at a few "
                           "fault lengths. Middle: what the detour costs afterwards, the "
                           "job's completion time beyond the stall (the detour's longer "
                           "delay on every later iteration), with the slowdown and the "
                           "spectrum held. Right: an ideal transport and retry "
                           "(restart the process group) against TCP and fail, no "
                           "protection.",
    "cba.png": "CBA against sp-ff over the load sweep (mean ± 95 % CI over seeds).",
    "bace.png": "BACE-Pipe against delay-first and cost-first over the load sweep (mean "
                "± 95 % CI over seeds).",
}


def png_names(d: DirReader) -> list[str]:
    """The PNG files at the top of the directory: those with a caption first, in the
    caption table's order (latency before bandwidth), then the rest by name."""
    order = {n: i for i, n in enumerate(CAPTIONS)}
    return sorted((n for n in d.names() if n.lower().endswith(".png") and d.is_file(n)),
                  key=lambda n: (order.get(n, len(order)), n))


def png_figures(d: DirReader, names: list[str] | None = None,
                captions: Mapping[str, str] = CAPTIONS) -> list[Figure]:
    """Each PNG (every one at the top of d when names is None) as an inlined Figure whose
    caption ends with its file name; one that is too large, not a PNG or unreadable is
    recorded as skipped."""
    figs: list[Figure] = []
    names = png_names(d) if names is None else names
    if len(names) > PNG_MAX_FILES:
        d.skip("*.png", f"{len(names)} PNG files: the first {PNG_MAX_FILES} shown")
        names = names[:PNG_MAX_FILES]
    for name in names:
        data = d.read_bytes(name, PNG_MAX_BYTES)
        if data is None:
            continue  # (the reader recorded why)
        if not data.startswith(PNG_MAGIC):
            d.skip(name, "not shown: not a PNG file")
            continue
        uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        cap = captions.get(name, "A figure this run wrote.")
        figs.append(Figure(uri, f"{cap} (file: {name})", alt=name))
    return figs
