"""Where a run sends its telemetry, and how it is tagged as the run (pulse.workers.telemetry).

When the telemetry receiver runs, it says where in the runtime directory (`telemetry.json`: its
URL, its pid, whether it needs its token). Every run gets a token of its own, derived from the
receiver's (run_token), and its run id (headers, by the environment): needed beyond loopback; on
loopback it puts the run's telemetry in a rate bucket apart from anonymous local senders, and only
with it are records tagged with that run counted as the run's (what a run reports can end it).
The executor reads that as a run starts and hands the adapter a `Receiver`; an adapter whose CLI
exports OpenTelemetry points the run at it (`Adapter.report_to`). Every run is tagged with OTEL_RESOURCE_ATTRIBUTES `pulse.run.id` (the
agent-run effect id), `pulse.task.id` and `pulse.agent`, so the receiver counts its records as
that run's, whatever session ids the CLI makes up.

The operator's `[[agent]] env` wins: an agent whose env sets any of OPERATOR_KEYS (its own
exporter, endpoint, protocol or headers, or telemetry off) is left to it; only the run's tags are
added to its OTEL_RESOURCE_ATTRIBUTES, so the operator's own collector can tell runs apart too.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from pulse.core import procs

# Imports inside functions: hashlib and hmac (~3-4 ms, OpenSSL) only for a run's trace ids: every
# adapter imports this module.

# Set by the operator, any of these says: this agent's telemetry is mine.
OPERATOR_KEYS = ("OTEL_SDK_DISABLED", "CLAUDE_CODE_ENABLE_TELEMETRY", "OTEL_EXPORTER_OTLP_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_HEADERS",
                 "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER", "OTEL_TRACES_EXPORTER")
RESOURCE_ENV = "OTEL_RESOURCE_ATTRIBUTES"
HEADERS_ENV = "OTEL_EXPORTER_OTLP_HEADERS"


@dataclass(frozen=True)
class Receiver:
    """The receiver a run reports to, and what tags it."""
    url: str                           # http://host:port, no path
    token: str | None                  # the run's own (run_token): needed beyond loopback, a bucket of its own on it
    tags: dict[str, str]               # pulse.run.id, pulse.task.id, pulse.agent

    def headers_env(self) -> str | None:
        """OTEL_EXPORTER_OTLP_HEADERS for the token: X-Pulse-Token and the run it is for, X-Pulse-Run;
        values (hex, the run id) that need no percent-encoding, which not every SDK undoes."""
        if self.token is None:
            return None
        run = self.tags.get(RUN_TAG)
        return f"x-pulse-token={self.token}" + (f",x-pulse-run={run}" if run else "")


RUN_TAG = "pulse.run.id"


def run_token(secret: str, run: str) -> str:
    """A run's own token, derived from the receiver's: it lets the run report as itself and as no
    other run (the receiver derives it again to check), and tells nothing of the receiver's token."""
    import hashlib
    import hmac
    return hmac.new(secret.encode(), b"pulse-run:" + run.encode(), hashlib.sha256).hexdigest()


def receiver(telemetry_file: Path, token_file: Path, run: str, task: str, agent: str) -> Receiver | None:
    """The running receiver, from what it wrote in the runtime directory; None when there is none
    (not enabled, stopped, or a file its dead predecessor left: the pid and start time it names are
    no live process's)."""
    try:
        info = json.loads(telemetry_file.read_text())
        if procs.proc_start(int(info["pid"])) != info["proc_start"]:
            return None
        url = str(info["url"])
        secret = token_file.read_text().strip() or None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Receiver(url, run_token(secret, run) if secret else None,
                    {RUN_TAG: run, "pulse.task.id": task, "pulse.agent": agent})


def operator_decides(operator_env: dict[str, str]) -> bool:
    return any(key in operator_env for key in OPERATOR_KEYS)


def tag(env: dict[str, str], tags: dict[str, str]) -> None:
    """Add the run's tags to OTEL_RESOURCE_ATTRIBUTES (key=value, comma-separated, values
    percent-encoded); a key the operator set already is left as it is."""
    present = env.get(RESOURCE_ENV, "")
    have = {pair.split("=", 1)[0].strip() for pair in present.split(",") if "=" in pair}
    added = [f"{k}={urllib.parse.quote(v, safe='')}" for k, v in tags.items() if k not in have]
    if added:
        env[RESOURCE_ENV] = ",".join([p for p in [present.strip(",")] if p] + added)
