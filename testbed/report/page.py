"""The report page: sections of figures (data URIs), tables and text into one HTML file."""

from __future__ import annotations

import datetime as _dt
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed import __version__

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0 auto;
max-width:1100px;padding:1em 2em;color:#222;line-height:1.45}
h1{font-size:1.5em;border-bottom:2px solid #4c78a8;padding-bottom:.2em}
h2{font-size:1.2em;margin-top:2em;color:#2b4c6f}
figure{margin:1em 0;padding:.5em;border:1px solid #e4e4e4;border-radius:4px}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{font-size:.9em;color:#444;margin-top:.4em}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0;display:block;overflow-x:auto;
max-width:100%}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f2f5f9}
.note{font-size:.9em;color:#555}
.kv td:first-child{font-weight:600;white-space:nowrap}
.headline td:nth-child(2){font-weight:600}
details{margin:.6em 0}summary{cursor:pointer;color:#2b4c6f}
nav a{margin-right:1em}
"""


@dataclass
class Figure:
    uri: str
    caption: str
    alt: str = ""


@dataclass
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[Any]]
    caption: str = ""


@dataclass
class Section:
    title: str
    text: str = ""
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    html: str = ""  # trusted HTML (rendered Markdown)
    fold: str = ""  # when set: the section's body behind a <details> with this summary


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return html.escape(f"{v:.4g}")
    if isinstance(v, list | tuple):
        return html.escape(", ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in v))
    return html.escape("" if v is None else str(v))


def _table(t: Table, cls: str = "") -> str:
    out = [f"<table class='{cls}'>" if cls else "<table>"]
    if t.caption:
        out.append(f"<caption class='note'>{html.escape(t.caption)}</caption>")
    if t.headers:
        out.append("<tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in t.headers)
                   + "</tr>")
    for r in t.rows:
        out.append("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in r) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _anchor(i: int) -> str:
    return f"s{i}"


def render(title: str, kind: str, run_dir: str, secs: Sequence[Section]) -> str:
    """The whole page; every figure is an <img> with a data: URI (no network fetches)."""
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p class='note'>LightPipe {html.escape(__version__)} report of "
            f"<code>{html.escape(run_dir)}</code> ({html.escape(kind)}), written {now}. "
            "Self-contained: open it from the file system, no server needed.</p>",
            "<nav>" + "".join(f"<a href='#{_anchor(i)}'>{html.escape(s.title)}</a>"
                              for i, s in enumerate(secs)) + "</nav>"]
    n_fig = 0
    for i, s in enumerate(secs):
        body.append(f"<h2 id='{_anchor(i)}'>{html.escape(s.title)}</h2>")
        if s.fold:
            body.append(f"<details><summary>{html.escape(s.fold)}</summary>")
        if s.text:
            body.append(f"<p>{html.escape(s.text)}</p>")
        for t in s.tables:
            body.append(_table(t, "kv" if len(t.headers) == 0 else
                               "headline" if list(t.headers[:1]) == ["figure"] else ""))
        if s.html:
            body.append(s.html)
        for f in s.figures:
            n_fig += 1
            alt = html.escape(f.alt or f.caption.split(".")[0])
            body.append(f"<figure><img class='fig' src='{f.uri}' alt='{alt}'>"
                        f"<figcaption><b>Figure {n_fig}.</b> {html.escape(f.caption)}"
                        "</figcaption></figure>")
        if s.fold:
            body.append("</details>")
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
            "img-src data:; style-src 'unsafe-inline'\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def markdown_html(text: str) -> str:
    """Markdown (tables included) to HTML, raw HTML in the input escaped."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
