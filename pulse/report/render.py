"""The report as text and as one self-contained HTML page: pure functions of an analysis and the
events it cites (no I/O, no clock), so `pulsectl report` and the `report` effect make the same
page.

The page needs no script and makes no request: inline CSS and SVG only, and a Content-Security-
Policy that forbids everything else, so even a string that slipped through could fetch nothing.
Every string that came from a task, an agent, a log or a model is escaped (`esc`): a task titled
`<img src=x onerror=…>` shows as text. Dark theme on screen, light on paper.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from html import escape
from typing import Mapping

from pulse.core import clock
from pulse.report.analysis import Analysis, TimelineEntry, cited

COLOURS = {"acked": "#3fb950", "pass": "#3fb950", "failed": "#f85149", "given_up": "#a40e26", "fail": "#f85149",
           "running": "#58a6ff", "pending": "#58a6ff", "expired": "#8b949e", "warn": "#d29922",
           "promote": "#a371f7", "rollback": "#d29922", "info": "#58a6ff", "error": "#f85149"}
GANTT_WIDTH, LANE_HEIGHT, LABEL_WIDTH = 960, 26, 150
EVENT_DATA_CHARS = 600


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def _iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")     # ISO 8601, as every time pulsectl prints


def _citations(ids: list[int]) -> str:
    return " ".join(f'<a class="cite" href="#ev-{i}">#{i}</a>' for i in ids)


# -- text ------------------------------------------------------------------------------------------------

def text(analysis: Analysis, path: str | None = None) -> str:
    """The short summary: what `pulsectl report` prints, what the daily notification carries."""
    w = analysis.window
    scope = "".join(f" {k} {v}" for k, v in (("project", w.project), ("task", w.task)) if v)
    lines = [f"Pulse report {_iso(w.start)} → {_iso(w.end)}{scope}: score {analysis.score}/100, "
             f"{analysis.verdict.upper()} ({w.events} events; analyst: {analysis.analyst})"]
    if analysis.fallback:
        lines.append(f"  (the agent's analysis was not used: {analysis.fallback})")
    for card in analysis.role_analysis:
        who = card.role if card.name == card.role else f"{card.role} {card.name}"
        lines.append(f"  [{card.verdict}] {who}: {card.summary}")
    for title, findings in (("Issues", analysis.issues), ("Highlights", analysis.highlights)):
        if findings:
            lines.append(f"{title}:")
            for f in findings:
                refs = " " + " ".join(f"#{i}" for i in f.event_ids[:8]) if f.event_ids else ""
                lines.append(f"  - ({f.severity}) {f.text}{refs}")
    if path:
        lines.append(f"Page: {path}")
    return "\n".join(lines) + "\n"


# -- HTML ------------------------------------------------------------------------------------------------

CSS = """
:root{color-scheme:dark}
body{margin:0;padding:24px;background:#0d1117;color:#e6edf3;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #30363d;padding-bottom:4px}
.muted{color:#8b949e}.head{display:flex;align-items:center;gap:16px;flex-wrap:wrap}
.score{font-size:36px;font-weight:700}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-weight:600;font-size:12px;text-transform:uppercase;color:#0d1117}
.b-pass{background:#3fb950}.b-warn{background:#d29922}.b-fail{background:#f85149}
.note{background:#3b2300;border:1px solid #d29922;padding:6px 10px;border-radius:6px;margin-top:8px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:12px}
.card{background:#161b22;border:1px solid #30363d;border-radius:8px;padding:12px}
.card h3{margin:0 0 6px;font-size:14px;display:flex;justify-content:space-between;gap:8px}
.card table{border-collapse:collapse;font-size:12px;margin-top:6px}.card td{padding:1px 8px 1px 0}
ul.find{list-style:none;padding:0;margin:0}ul.find li{padding:4px 0 4px 10px;border-left:3px solid #30363d;margin:4px 0}
.s-error{border-color:#f85149!important}.s-warn{border-color:#d29922!important}.s-info{border-color:#58a6ff!important}
a.cite{color:#58a6ff;font-size:12px;text-decoration:none;margin-left:2px}
svg text{fill:#c9d1d9;font-size:11px}.lane{fill:#161b22}.axis{stroke:#30363d}
.gantt{overflow-x:auto}.gantt svg{min-width:640px}
.events{font:12px/1.4 ui-monospace,monospace;list-style:none;padding:0}
.events li{padding:3px 0;border-bottom:1px solid #21262d;word-break:break-all}
.events li:target{background:#1f2a37}
.legend span{margin-right:12px;font-size:12px}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
@media print{:root{color-scheme:light}body{background:#fff;color:#000;padding:0}.card{background:#fff;border-color:#999}
.lane{fill:#f2f2f2}svg text{fill:#000}a.cite{color:#000}.note{background:#fff}.events li:target{background:none}
.card,.events li{break-inside:avoid}}
"""


def _badge(verdict: str) -> str:
    return f'<span class="badge b-{esc(verdict)}">{esc(verdict)}</span>'


def _lanes(timeline: list[TimelineEntry]) -> list[str]:
    agents = sorted({e.lane for e in timeline if e.lane.startswith("agent:")})
    others = [lane for lane in ("survival", "engine") if any(e.lane == lane for e in timeline)]
    rest = sorted({e.lane for e in timeline} - set(agents) - set(others))
    return agents + others + rest


def gantt(analysis: Analysis) -> str:
    """One lane per agent (and survival, engine); one bar per run with data-run=RUN_ID, markers for the rest."""
    timeline = analysis.timeline
    w0, w1 = analysis.window.start.timestamp(), analysis.window.end.timestamp()
    if timeline:   # zoomed to what happened: a quiet day with one busy minute still shows its bars
        lo = min(e.start.timestamp() for e in timeline)
        hi = max(e.end.timestamp() for e in timeline)
        pad = max((hi - lo) * 0.05, 1.0)
        w0, w1 = max(w0, lo - pad), min(w1, hi + pad)
    span = max(w1 - w0, 1e-6)
    lanes = _lanes(timeline)
    plot = GANTT_WIDTH - LABEL_WIDTH
    height = LANE_HEIGHT * max(len(lanes), 1) + 24

    def x(ts: float) -> float:
        return LABEL_WIDTH + max(0.0, min(1.0, (ts - w0) / span)) * plot

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="timeline" width="100%" '
           f'viewBox="0 0 {GANTT_WIDTH} {height}" preserveAspectRatio="xMinYMin meet">']
    row = {lane: i for i, lane in enumerate(lanes)}
    for lane, i in row.items():
        y = i * LANE_HEIGHT
        out.append(f'<rect class="lane" x="{LABEL_WIDTH}" y="{y + 2}" width="{plot}" height="{LANE_HEIGHT - 4}"/>'
                   f'<text x="4" y="{y + LANE_HEIGHT / 2 + 4}">{esc(lane.removeprefix("agent:"))[:24]}</text>')
    for e in timeline:
        y = row[e.lane] * LANE_HEIGHT
        colour = COLOURS.get(e.outcome, "#8b949e")
        tip = f"<title>{esc(e.label)} · {esc(e.outcome)} · {_iso(e.start)} → {_iso(e.end)}</title>"
        x0, x1 = x(e.start.timestamp()), x(e.end.timestamp())
        if e.run is not None:
            out.append(f'<rect data-run="{esc(e.run)}" x="{x0:.1f}" y="{y + 5}" width="{max(x1 - x0, 2):.1f}" '
                       f'height="{LANE_HEIGHT - 10}" rx="2" fill="{colour}">{tip}</rect>')
        elif e.lane == "engine":
            out.append(f'<path d="M{x0:.1f} {y + 3}v{LANE_HEIGHT - 6}" stroke="{colour}" stroke-width="3">{tip}</path>')
        else:
            out.append(f'<path d="M{x0:.1f} {y + 6}l5 {LANE_HEIGHT / 2 - 6}l-5 {LANE_HEIGHT / 2 - 6}l-5 '
                       f'{-(LANE_HEIGHT / 2 - 6)}z" fill="{colour}">{tip}</path>')
    axis_y = len(lanes) * LANE_HEIGHT + 4
    out.append(f'<path class="axis" d="M{LABEL_WIDTH} {axis_y}H{GANTT_WIDTH}"/>')
    fmt = "%H:%M:%S" if span < 3600 else "%m-%d %H:%M"
    for k in range(5):
        ts = w0 + span * k / 4
        anchor = "start" if k == 0 else "end" if k == 4 else "middle"
        out.append(f'<text x="{x(ts):.1f}" y="{axis_y + 14}" text-anchor="{anchor}">'
                   f'{time.strftime(fmt, time.gmtime(ts))}</text>')
    out.append("</svg>")
    return "".join(out)


# Each figure of a role card as a person reads it: a label and its unit (the JSON keeps the keys).
FIGURE_LABELS = {
    "runs": ("runs", ""), "acked": ("runs that succeeded", ""), "failed": ("runs that failed", ""),
    "given_up": ("tasks given up", ""), "running": ("runs still going", ""),
    "success_rate_pct": ("runs that succeeded", "%"), "tasks": ("tasks", ""), "tasks_done": ("tasks done", ""),
    "tasks_done_weighted_pct": ("tasks done, recent ones weighing more", "%"),
    "retries": ("attempts after a first", ""), "median_s": ("typical run (median)", "s"),
    "max_s": ("longest run", "s"), "slow_runs": ("slow runs (over twice the median)", ""),
    "cost_usd": ("cost", "USD"), "actions": ("actions", ""), "repairs": ("repairs", ""),
    "repairs_acked": ("repairs that worked", ""), "repairs_failed": ("repairs that failed", ""),
    "notifications": ("notifications", ""), "rollbacks": ("engine rollbacks", ""),
}


def figure(key: str, value: object) -> tuple[str, str]:
    """(label, value with its unit) of one figure; a key no label names is shown in words."""
    label, unit = FIGURE_LABELS.get(key, (key.replace("_", " "), ""))
    if value is None:
        return label, "–"
    if unit == "USD":
        return label, f"${value:.2f}" if isinstance(value, (int, float)) else str(value)
    if isinstance(value, float):
        value = f"{value:g}"
    return label, f"{value} {unit}".strip() if unit else str(value)


def _card(card) -> str:
    figures = "".join(f"<tr><td class=muted>{esc(label)}</td><td>{esc(shown)}</td></tr>"
                      for label, shown in (figure(k, v) for k, v in card.figures.items()))
    title = esc(card.role) if card.name == card.role else f"{esc(card.role)} · {esc(card.name)}"
    return (f'<div class="card"><h3><span>{title}</span>{_badge(card.verdict)}</h3>'
            f"<div>{esc(card.summary)}</div><table>{figures}</table>"
            f"<div>{_citations(card.event_ids)}</div></div>")


def _findings(findings) -> str:
    if not findings:
        return '<p class="muted">none</p>'
    return '<ul class="find">' + "".join(
        f'<li class="s-{esc(f.severity)}">{esc(f.text)} {_citations(f.event_ids)}</li>' for f in findings) + "</ul>"


def _event_line(ev) -> str:
    # the data's wall times as ISO 8601, as pulsectl events prints them (never epoch floats)
    data = json.dumps(clock.readable_times(ev.data), separators=(",", ":"), default=str, ensure_ascii=False)
    if len(data) > EVENT_DATA_CHARS:
        data = data[:EVENT_DATA_CHARS] + "…"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ev.ts))
    return (f'<li id="ev-{int(ev.id)}"><b>#{int(ev.id)}</b> {when} {esc(ev.type)} '
            f'<span class="muted">{esc(ev.source)} → {esc(ev.target or "-")}</span> {esc(data)}</li>')


def html(analysis: Analysis, events: Mapping[int, object]) -> str:
    """The page. `events`: at least every event the analysis cites, by id."""
    w = analysis.window
    scope = "".join(f" · {k} {esc(v)}" for k, v in (("project", w.project), ("task", w.task)) if v)
    note = (f'<div class="note">The agent\'s analysis was not used: {esc(analysis.fallback)}. '
            "This is the deterministic analysis.</div>" if analysis.fallback else "")
    legend = "".join(f'<span><i style="background:{COLOURS[k]}"></i>{k}</span>'
                     for k in ("acked", "failed", "given_up", "running", "expired", "promote", "rollback"))
    appendix = "".join(_event_line(events[i]) for i in sorted(cited(analysis)) if i in events)
    return "".join([
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        "<meta name=viewport content=\"width=device-width,initial-scale=1\">",
        f"<title>Pulse report {_iso(w.start)} → {_iso(w.end)}</title><style>{CSS}</style></head><body>",
        f'<div class="head"><div><h1>Pulse report</h1><div class="muted">{_iso(w.start)} → {_iso(w.end)}{scope} · '
        f"{w.events} events · analyst: {esc(analysis.analyst)}</div></div>",
        f'<div class="score">{analysis.score}</div>{_badge(analysis.verdict)}</div>{note}',
        f'<h2>Timeline</h2><div class="legend">{legend}</div><div class="gantt">{gantt(analysis)}</div>',
        f'<h2>Roles</h2><div class="cards">{"".join(_card(c) for c in analysis.role_analysis)}</div>',
        f"<h2>Issues</h2>{_findings(analysis.issues)}",
        f"<h2>Highlights</h2>{_findings(analysis.highlights)}",
        f'<h2>Cited events</h2><ul class="events">{appendix}</ul>',
        "</body></html>\n",
    ])
