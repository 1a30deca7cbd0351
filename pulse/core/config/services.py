"""[web], [telemetry], [fleet]: what Pulse serves or joins over the network, each off unless
enabled and each run by its own worker."""

import re
from typing import TYPE_CHECKING, Annotated

import msgspec
from msgspec import Meta

from pulse.core.config.keys import ConfigError, Table

if TYPE_CHECKING:
    from pulse.core.config import Config

FLEET_URL = re.compile(r"(nats|tls)://[^\s/]+")
EXPORT_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")     # an HTTP token (RFC 9110)
HIDDEN = "(hidden)"


class Web(Table):
    """The operator's page and /metrics (`pulsectl web url`). Nothing listens on TCP unless enabled."""
    enabled: bool = False
    """Run the web worker."""
    listen: str = "127.0.0.1:8370"
    """host:port it listens on; port 0 takes a free one."""
    allow_remote: bool = False
    """A listen address beyond loopback needs this, and TLS."""
    tls_cert: str | None = None
    """A PEM certificate file; both tls_cert and tls_key, or neither. Example: `"/etc/pulse/web.crt"`"""
    tls_key: str | None = None
    """Its PEM key file. Example: `"/etc/pulse/web.key"`"""


def validate_web(web: Web, origin: str) -> None:
    try:
        host, _ = listen_address(web.listen)
    except ValueError as err:
        raise ConfigError(f"{origin}: $.web.listen: {err}") from None
    if (web.tls_cert is None) != (web.tls_key is None):
        raise ConfigError(f"{origin}: $.web: set both tls_cert and tls_key, or neither")
    if not is_loopback(host):
        if not web.allow_remote:
            raise ConfigError(f"{origin}: $.web.listen: {host} is not a loopback address; set allow_remote = true "
                              "(and tls_cert, tls_key) to listen beyond this host")
        if web.tls_cert is None:
            raise ConfigError(f"{origin}: $.web: listening on {host} beyond this host needs tls_cert and tls_key")


class Telemetry(Table):
    """The local OTLP receiver (pulse.workers.telemetry), off unless enabled. OTLP/HTTP logs, metrics
    and traces in (protobuf or JSON), folded into one `telemetry` fact per run or session and flush_s;
    at most max_sources of them per flush, so the receiver adds at most max_sources * 60 / flush_s
    events a minute, whatever it is sent."""
    enabled: bool = False
    """Run the telemetry receiver."""
    # 4318 is OTLP/HTTP's own port, so a CLI pointed at "the local collector" finds it.
    listen: str = "127.0.0.1:4318"
    """host:port; beyond loopback every request needs the token in <home>/telemetry.token (Authorization: Bearer TOKEN,
    or X-Pulse-Token: TOKEN)."""
    max_body_kb: Annotated[int, Meta(ge=1)] = 4096
    """A larger request is refused (413) before its body is read, in KiB."""
    requests_per_s: Annotated[float, Meta(gt=0)] = 50
    """Admitted requests a second, for callers with the token and for the others each, after a burst."""
    burst: Annotated[int, Meta(ge=1)] = 100
    """The burst before requests_per_s applies; past it: 429 with Retry-After."""
    queue_kb: Annotated[int, Meta(ge=1)] = 16384
    """Bodies being read or not yet folded, in KiB; full: 503 (the CLI retries); callers without the token get half; at
    least two bodies of max_body_kb."""
    flush_s: Annotated[float, Meta(gt=0)] = 5
    """What was folded goes to events.db this often, in s."""
    max_sources: Annotated[int, Meta(ge=1)] = 32
    """Runs and sessions counted per flush; others' records are dropped, counted."""
    export: str | None = None
    """A collector (http(s)://host:port, a path prefix allowed) to which each ended run goes as GenAI trace spans over
    OTLP/HTTP; unset: nothing is sent. Example: `"http://127.0.0.1:4318"`"""
    export_headers: dict[str, str] = msgspec.field(default_factory=dict)
    """Headers sent to the collector (e.g. Authorization); never shown."""
    export_queue: Annotated[int, Meta(ge=1)] = 1000
    """Runs waiting to be sent; full: the oldest dropped, counted."""
    export_give_up_s: Annotated[float, Meta(gt=0)] = 60
    """A run not sent this long (collector down) is dropped, counted, in s."""
    export_metrics_s: Annotated[float, Meta(ge=0)] = 60
    """Pulse's own metrics (a core set of /metrics) go through the OpenTelemetry SDK's OTLP exporter to
    <export>/v1/metrics this often, in s; a collection not taken is dropped, counted; 0: not sent."""
    # never ended: a session Pulse did not start is the operator's
    session_loop_per_min: Annotated[int, Meta(ge=1)] | None = None
    """Sessions Pulse did not start (an operator's own CLI pointed here, with the token): more API requests, or
    tool calls, than this in a minute is said (a loop-noticed fact and [[notify]], at most hourly per session);
    unset: not looked for. Example: `120`"""


def validate_telemetry(telemetry: Telemetry, origin: str) -> None:
    try:
        listen_address(telemetry.listen)
    except ValueError as err:
        raise ConfigError(f"{origin}: $.telemetry.listen: {err}") from None
    if telemetry.export is not None and not telemetry.enabled:
        raise ConfigError(f"{origin}: $.telemetry.export: set enabled = true too (the telemetry worker sends "
                          "the runs), or remove export")
    if telemetry.export is not None and not EXPORT_URL.fullmatch(telemetry.export):
        raise ConfigError(f"{origin}: $.telemetry.export: {telemetry.export!r} is not an http:// or https:// "
                          "collector address (like http://127.0.0.1:4318)")
    for name, value in telemetry.export_headers.items():
        if not HEADER_NAME.fullmatch(name) or "\r" in value or "\n" in value:
            raise ConfigError(f"{origin}: $.telemetry.export_headers: {name!r} is not a header name, or its "
                              "value has a line break")
    if telemetry.queue_kb < 2 * telemetry.max_body_kb:
        raise ConfigError(f"{origin}: $.telemetry.queue_kb must hold at least two bodies of max_body_kb "
                          f"({telemetry.max_body_kb}; half of it is for callers without the token), got {telemetry.queue_kb}")


class Fleet(Table):
    """This host among others, over NATS JetStream (pulse.workers.fleet); off unless enabled, and the
    fleet worker is then the only process that talks to NATS. A single host never needs it, and
    survival never waits on it. At most one of creds_file, token, nkey_seed_file; none: the server's
    anonymous access."""
    enabled: bool = False
    """Run the fleet worker."""
    url: list[str] = msgspec.field(
        default_factory=lambda: ["nats://127.0.0.1:4222"])
    """The NATS servers, nats:// or tls://."""
    creds_file: str | None = None
    """A NATS .creds file (JWT and NKey seed); never shown. Example: `"/etc/pulse/fleet.creds"`"""
    token: str | None = None
    """A plain token; never shown. Example: `"s3cret"`"""
    nkey_seed_file: str | None = None
    """A file holding an NKey seed ("SU..."). Example: `"/etc/pulse/fleet.nk"`"""
    host: str | None = None
    """This host's name in the fleet; unset: <instance name>@<hostname>. Example: `"web-1"`"""
    presence_interval_s: Annotated[float, Meta(gt=0)] = 5
    """This host's summary goes to the pulse-hosts bucket this often, in s."""
    presence_ttl_s: Annotated[float, Meta(gt=0)] = 30
    """... and is gone from it this long after the last one, in s; at least twice presence_interval_s."""
    reconnect_max_s: Annotated[float, Meta(ge=0.5)] = 30
    """A failed connect is retried after 0.5 s, doubling up to this, in s."""
    events_batch: Annotated[int, Meta(ge=1)] = 500
    """Events published per cursor commit."""
    take_tasks: bool = True
    """A host with [[agent]]s takes fleet tasks for them (`pulsectl task add --fleet`)."""
    # Renewed every third of it while the task runs: at least once across a host's death, at most once otherwise.
    task_lease_s: Annotated[float, Meta(ge=1)] = 30
    """A host's claim on a fleet task lapses this long after its last renewal, and the task runs again elsewhere, in s."""
    max_deliver: Annotated[int, Meta(ge=1)] = 3
    """A fleet task is taken at most this many times; past it, it is dead-lettered (the pulse-task-dead bucket, a
    fleet-task-dead event on its origin)."""
    offer_ttl_s: Annotated[float, Meta(gt=0)] = 86_400
    """A fleet task no host takes is dead-lettered this long after it was offered, with each host's last reason for
    leaving it, in s."""
    # the fleet's "failed on" rule: another host that can take it gets it first
    failed_host_wait_s: Annotated[float, Meta(ge=0)] = 60
    """A host that gave a fleet task up leaves it to the others this long before taking it again, in s."""
    # A stream or bucket that already exists is used as it is.
    replicas: Annotated[int, Meta(ge=1, le=5)] = 1
    """Copies the streams and KV buckets keep, one per NATS server: 1 for one server, 3 on a three-server cluster (each
    survives the loss of any one)."""


def validate_fleet(fleet: Fleet, origin: str) -> None:
    if not fleet.url:
        raise ConfigError(f"{origin}: $.fleet.url: name at least one server")
    for i, url in enumerate(fleet.url):
        if not FLEET_URL.fullmatch(url):
            raise ConfigError(f"{origin}: $.fleet.url[{i}]: not a nats:// or tls:// server address")
    ways = [k for k in ("creds_file", "token", "nkey_seed_file") if getattr(fleet, k) is not None]
    if len(ways) > 1:
        raise ConfigError(f"{origin}: $.fleet: set at most one of creds_file, token, nkey_seed_file (got {', '.join(ways)})")
    if fleet.host is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}", fleet.host):
        raise ConfigError(f"{origin}: $.fleet.host: 1 to 128 letters, digits and _ . @ - (not starting with a symbol)")
    if fleet.presence_ttl_s < 2 * fleet.presence_interval_s:
        raise ConfigError(f"{origin}: $.fleet: presence_ttl_s must be at least twice presence_interval_s")


def without_secrets(config: "Config") -> "Config":
    """`config` fit to show (`pulsectl config --effective`, the control socket): the fleet's token
    and the export's header values replaced; the creds and seed are files, named by path, never read here."""
    if config.fleet.token is not None:
        config = msgspec.structs.replace(config, fleet=msgspec.structs.replace(config.fleet, token=HIDDEN))
    if config.telemetry.export_headers:
        config = msgspec.structs.replace(config, telemetry=msgspec.structs.replace(
            config.telemetry, export_headers={k: HIDDEN for k in config.telemetry.export_headers}))
    return config


def listen_address(listen: str) -> tuple[str, int]:
    """"host:port" (an IPv6 host in brackets) → (host, port); ValueError saying what is wrong."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{listen!r} is not host:port (like 127.0.0.1:8370; port 0 takes a free one)")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost (by text: pulsed validates config and stays small, so no ipaddress)."""
    parts = host.split(".")
    ipv4 = len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)
    return host in ("localhost", "::1", "0:0:0:0:0:0:0:1") or (ipv4 and parts[0] == "127")


def urlsplit_host(url: str) -> str | None:
    """The host of an http(s) URL (brackets of an IPv6 host dropped), None when it is not one."""
    found = re.match(r"https?://(\[[^\]/\s]+\]|[^/:\s?#]+)(:\d+)?([/?#]\S*)?$", url)
    return found.group(1).strip("[]") if found else None
