"""The analysis: one versioned msgspec schema, what `pulsectl report --json` prints exactly.

Every claim cites the events it rests on by id, under the key `event_ids`. An analysis that
cites an event outside its window is invalid (`check`) and is never printed or rendered:
whoever wrote it (the deterministic analyst, or an agent), the page only ever links to events
that exist.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Iterable, Literal

import msgspec

VERSION = 1
MAX_CITATIONS = 20          # per claim: enough to find the story, bounded so the page stays one page

Verdict = Literal["pass", "warn", "fail"]
Severity = Literal["info", "warn", "error"]
Stamp = Annotated[datetime, msgspec.Meta(tz=True)]        # RFC 3339 with its offset, UTC when we write it
EventIds = list[Annotated[int, msgspec.Meta(ge=1)]]


class Window(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    start: Stamp
    end: Stamp
    project: str | None = None      # --project: only that project's tasks and runs
    task: str | None = None         # --task: only that task
    events: int = 0                 # events in the window (after the filters)


class Finding(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A highlight or an issue."""
    text: str
    severity: Severity
    event_ids: EventIds


class RoleCard(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One per role and name: each agent that ran, the survival layer, the operator."""
    role: Literal["agent", "survival", "operator"]
    name: str
    verdict: Verdict
    summary: str
    figures: dict[str, int | float | str | None] = {}
    event_ids: EventIds = []


class TimelineEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One agent run (run = its agent-run effect id), survival incident, promote or rollback."""
    lane: str                       # "agent:NAME", "survival" or "engine"
    label: str
    start: Stamp
    end: Stamp
    outcome: str                    # acked | failed | given_up | running | expired | promote | rollback ...
    event_ids: EventIds
    run: str | None = None


class Analysis(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    version: Literal[1] = VERSION
    window: Window
    score: Annotated[int, msgspec.Meta(ge=0, le=100)]
    verdict: Verdict
    analyst: str = "deterministic"  # who wrote it
    fallback: str | None = None     # why an agent's answer was not used, when it was not
    highlights: list[Finding] = []
    issues: list[Finding] = []
    role_analysis: list[RoleCard] = []
    timeline: list[TimelineEntry] = []


class InvalidAnalysis(Exception):
    """An answer that does not fit the schema, or cites events that are not in the window."""


def stamp(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc)


def cited(analysis: Analysis) -> list[int]:
    """Every event id the analysis cites, each once, in order of first citation."""
    seen: dict[int, None] = {}
    for claim in (*analysis.highlights, *analysis.issues, *analysis.role_analysis, *analysis.timeline):
        for event_id in claim.event_ids:
            seen.setdefault(event_id, None)
    return list(seen)


def dangling(analysis: Analysis, known: Iterable[int] | set[int]) -> list[int]:
    known = known if isinstance(known, (set, frozenset)) else set(known)
    return [i for i in cited(analysis) if i not in known]


def check(analysis: Analysis, known: set[int]) -> Analysis:
    """The analysis, if every citation names an event of the window; else InvalidAnalysis."""
    missing = dangling(analysis, known)
    if missing:
        shown = ", ".join(f"#{i}" for i in missing[:10]) + (" …" if len(missing) > 10 else "")
        raise InvalidAnalysis(f"cites {len(missing)} event(s) not in the window: {shown}")
    return analysis


def decode(raw: bytes | str | dict) -> Analysis:
    """An analysis from JSON text or a decoded object; InvalidAnalysis naming the field otherwise."""
    try:
        if isinstance(raw, dict):
            return msgspec.convert(raw, Analysis)
        return msgspec.json.decode(raw, type=Analysis)
    except (msgspec.ValidationError, msgspec.DecodeError) as err:
        raise InvalidAnalysis(f"does not fit the analysis schema: {err}") from None


def encode(analysis: Analysis) -> bytes:
    return msgspec.json.encode(analysis)


def schema() -> dict:
    """The JSON Schema an agent is asked to answer in."""
    return msgspec.json.schema(Analysis)
