"""Exports of a timed schedule: Chrome trace JSON and a Gantt chart PNG."""

from __future__ import annotations

import io
import os
from pathlib import Path

from testbed.io.atomic import atomic_write_bytes, atomic_write_json
from testbed.schedule.timer import Timing

_COLOURS = {"F": "#4c72b0", "B": "#dd8452", "I": "#c44e52", "W": "#8172b3"}


def chrome_trace(timing: Timing) -> dict:
    """Trace Event Format: pid 0 = stages (tid = stage), pid 1 = links (one tid each)."""
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "stages"}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "links"}},
    ]
    stages = sorted({o.stage for o in timing.ops})
    for s in stages:
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": s,
                       "args": {"name": f"stage {s}"}})
    for o in timing.ops:
        events.append({"name": str(o.action), "cat": o.action.kind, "ph": "X", "pid": 0,
                       "tid": o.stage, "ts": o.start_ms * 1000.0,
                       "dur": (o.end_ms - o.start_ms) * 1000.0,
                       "args": {"microbatch": o.action.microbatch, "chunk": o.action.chunk}})
    links = sorted({x.link for x in timing.transfers})
    tid = {name: i for i, name in enumerate(links)}
    for name in links:
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[name],
                       "args": {"name": f"link {name}"}})
    for x in timing.transfers:
        events.append({"name": f"{'act' if x.kind == 'activation' else 'grad'}{x.microbatch}",
                       "cat": x.kind, "ph": "X", "pid": 1, "tid": tid[x.link],
                       "ts": x.start_ms * 1000.0, "dur": (x.leave_ms - x.start_ms) * 1000.0,
                       "args": {"src": x.src, "dst": x.dst, "ready_ms": x.ready_ms,
                                "arrive_ms": x.arrive_ms}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": timing.summary()}


def write_chrome_trace(timing: Timing, path: str | os.PathLike[str]) -> Path:
    return atomic_write_json(path, chrome_trace(timing))


def write_gantt(timing: Timing, path: str | os.PathLike[str], title: str | None = None) -> Path:
    """Draw one row per stage (ops coloured by kind, labelled with the micro-batch)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    stages = max((o.stage for o in timing.ops), default=-1) + 1
    fig, ax = plt.subplots(figsize=(12, 0.5 * stages + 1.5))
    for o in timing.ops:
        width = o.end_ms - o.start_ms
        ax.barh(o.stage, width, left=o.start_ms, height=0.8, color=_COLOURS[o.action.kind],
                edgecolor="white", linewidth=0.4)
        if width > timing.iteration_time_ms / 80:
            ax.text(o.start_ms + width / 2, o.stage, str(o.action.microbatch), ha="center",
                    va="center", fontsize=6, color="white")
    ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"{timing.schedule}: {timing.iteration_time_ms:.2f} ms, "
                 f"bubble {timing.bubble_ratio:.1%}")
    kinds = sorted({o.action.kind for o in timing.ops}, key="FBIW".index)
    ax.legend(handles=[Patch(color=_COLOURS[k], label=k) for k in kinds], loc="upper right",
              fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=120)
    finally:
        plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())
