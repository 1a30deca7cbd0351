"""The fleet's names and shapes, shared by the fleet worker and `pulsectl fleet`: stdlib only.

A host's name (`[fleet] host`, e.g. `gw@node-3.example`) is free text; NATS subjects split on dots
and KV keys allow no `@`, so each host also has a token: its name with every character outside
[A-Za-z0-9_-] written as `_`. Two hosts whose names differ only there would share a token; the
name is checked unique nowhere else, so choose names that differ in letters or digits.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pulse.core.home import FLEET_VIEW_FILE

EVENTS_STREAM = "PULSE_EVENTS"            # every host's events.db, in order per host
EVENTS_SUBJECTS = "pulse.events.>"        # pulse.events.<host token>.<event type>
HOSTS_BUCKET = "pulse-hosts"              # each host's summary, gone presence_ttl_s after its last put
SEEN_BUCKET = "pulse-hosts-seen"          # each host's name and last put, kept: what a gone host was
VIEW_FILE = FLEET_VIEW_FILE               # in the runtime dir: the fleet as the worker last saw it
CURSOR_FILE = "fleet-cursor.db"           # in the home: the last event id the stream acknowledged
DUPLICATE_WINDOW_S = 120                  # the stream drops a Nats-Msg-Id it has seen this recently

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def default_host(instance: str) -> str:
    return f"{instance}@{socket.gethostname()}"


def host_token(host: str) -> str:
    """`host` as one subject token and a valid KV key."""
    return _UNSAFE.sub("_", host) or "_"


def event_subject(host: str, event_type: str) -> str:
    return f"pulse.events.{host_token(host)}.{host_token(event_type)}"


def event_msg_id(host: str, event_id: int) -> str:
    """The de-duplication id: a republish after a crash between publish and cursor commit is dropped."""
    return f"{host}:{event_id}"


def shown_url(url: str) -> str:
    """A server address fit for a log or status line: any user:password in it is dropped."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def backoff_s(failures: int, most: float, first: float = 0.5) -> float:
    """How long to wait before the next connect after `failures` failed ones in a row."""
    return min(most, first * 2 ** max(0, failures - 1))


def connect_options(fleet, on_event, on_error) -> dict:
    """nats.connect's keyword arguments: the servers, one way to authenticate, and callbacks that
    keep the worker's account (and keep nats-py from logging, since a URL may carry a password)."""
    # nats-py's own reconnect is off: a lost connection closes, and the worker connects again with its
    # backoff, resuming from the cursor; what nats-py buffered for the dead connection is dropped
    options = dict(servers=list(fleet.url), connect_timeout=2, allow_reconnect=False,
                   max_reconnect_attempts=1, reconnect_time_wait=0.1)   # an initial connect tries each server twice
    if fleet.creds_file:
        options["user_credentials"] = fleet.creds_file
    elif fleet.token:
        options["token"] = fleet.token
    elif fleet.nkey_seed_file:
        options["nkeys_seed"] = fleet.nkey_seed_file

    async def disconnected() -> None:
        on_event("down", "the connection to NATS was lost; connecting again")

    async def error(err: Exception) -> None:
        on_error(describe(err))

    options.update(disconnected_cb=disconnected, error_cb=error)
    return options


def describe(err: BaseException) -> str:
    while isinstance(err, BaseExceptionGroup) and err.exceptions:   # a TaskGroup's: say what failed in it
        err = err.exceptions[0]
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


# -- the fleet view: what `pulsectl fleet status` and the page show --------------------------------

def agent_row(agent: dict) -> dict:
    """One agent of a host's summary, as the view shows it (a summary of an older version lacks some)."""
    slots, busy = agent.get("slots", 0), agent.get("busy", 0)
    return {"name": agent.get("name"), "slots": slots, "busy": busy, "free": max(0, slots - busy),
            "tags": agent.get("tags", []), "projects": agent.get("projects"), "budget": agent.get("budget"),
            "budget_known": agent.get("budget_known", "budget" in agent)}


def agent_words(agent: dict) -> str:
    """An agent in a line: `builder 1/2 [gpu] (p, q) held: <why>`."""
    words = f"{agent['name']} {agent['busy']}/{agent['slots']}"
    if agent.get("tags"):
        words += " [" + ",".join(agent["tags"]) + "]"
    if agent.get("projects") is not None:
        words += " (" + ",".join(agent["projects"]) + ")"
    if agent.get("budget"):
        words += f" held: {agent['budget']}"
    elif not agent.get("budget_known"):
        words += " budget unknown"
    return words


def process_healthy(process: dict) -> bool:
    """A process of a host's status: healthy when its state is running (alive when the host's Pulse
    is older than process states); a frozen process is alive but not healthy."""
    state = process.get("state")
    return state in ("running", "starting") if state not in (None, "unknown") else bool(process.get("alive"))


def host_row(summary: dict, now: float, up: bool) -> dict:
    """One host's line of the view, from its last summary. Whether it is up is not judged here: see
    fleet_rows."""
    workers = summary.get("workers", [])
    processes = summary.get("processes", [])
    agents = summary.get("agents", [])
    seen = summary.get("at", 0.0)
    return {
        "host": summary.get("host"),
        "state": "up" if up else "gone",
        "workers_running": sum(1 for w in workers if w.get("state") == "running"),
        "workers_total": len(workers),
        "processes_healthy": sum(1 for p in processes if process_healthy(p)),
        "processes_total": len(processes),
        "open_effects": summary.get("open_effects"),
        "agents_busy": sum(a.get("busy", 0) for a in agents),
        "agents_free": sum(max(0, a.get("slots", 0) - a.get("busy", 0)) for a in agents),
        # each agent: slots, busy, tags, projects, budget (why a run is held now; None: within limits)
        "agents": [agent_row(a) for a in agents],
        "agents_held": sum(1 for a in agents if a.get("budget")),
        "engine_commit": summary.get("engine_commit"),
        "version": summary.get("version"),
        "web_url": summary.get("web_url"),
        "last_seen": seen,
        "last_seen_age_s": round(max(0.0, now - seen), 3),
    }


def fleet_rows(present: dict[str, dict], seen: dict[str, dict], now: float) -> list[dict]:
    """Every host the fleet knows, by name. A host is up exactly while its entry is in the hosts bucket:
    the bucket's TTL, kept by the NATS server, is the one judgement of presence. Comparing a summary's
    own time with this host's clock instead made a host that put its summary late under load look gone
    in one view and up in the next. The others are gone, from the last summary the seen bucket kept."""
    rows = {}
    for key, summary in seen.items():
        rows[key] = host_row(summary, now, up=False)
    for key, summary in present.items():
        rows[key] = host_row(summary, now, up=True)
    return sorted(rows.values(), key=lambda r: str(r["host"]))


def write_view(runtime: Path, view: dict) -> None:
    """Atomically: a reader sees the old view or the new one, never half of one."""
    path = runtime / VIEW_FILE
    tmp = path.with_name(f".{VIEW_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(view, sort_keys=True))
    os.replace(tmp, path)


def read_view(runtime: Path) -> dict | None:
    try:
        return json.loads((runtime / VIEW_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def view_age_s(view: dict, now: float | None = None) -> float:
    return max(0.0, (time.time() if now is None else now) - view.get("at", 0.0))


def read_judged_view(runtime: Path, now: float | None = None) -> dict | None:
    """The fleet view as the CLI and the page show it. A view older than the presence TTL was not
    refreshed (NATS unreachable, the fleet worker down): what it says of the others can no longer be
    told, so every host but this one is `unknown`, and the view says `stale`."""
    view = read_view(runtime)
    if view is None:
        return None
    age = view_age_s(view, now)
    stale = age > view.get("ttl_s", 0.0)
    hosts = [{**row, "state": "unknown"} if stale and row.get("host") != view.get("host") else row
             for row in view.get("hosts", [])]
    return {**view, "hosts": hosts, "age_s": round(age, 3), "stale": stale}
