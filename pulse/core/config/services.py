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
    enabled: Annotated[bool, Meta(description="Run the web worker.")] = False
    listen: Annotated[str, Meta(description="host:port it listens on; port 0 takes a free one.")] = "127.0.0.1:8370"
    allow_remote: Annotated[bool, Meta(description="A listen address beyond loopback needs this, and TLS.")] = False
    tls_cert: Annotated[str | None, Meta(description="A PEM certificate file; both tls_cert and tls_key, or neither.",
                                         examples=["/etc/pulse/web.crt"])] = None
    tls_key: Annotated[str | None, Meta(description="Its PEM key file.", examples=["/etc/pulse/web.key"])] = None


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
    enabled: Annotated[bool, Meta(description="Run the telemetry receiver.")] = False
    # 4318 is OTLP/HTTP's own port, so a CLI pointed at "the local collector" finds it.
    listen: Annotated[str, Meta(
        description="host:port; beyond loopback every request needs the token in <home>/telemetry.token "
                    "(Authorization: Bearer TOKEN, or X-Pulse-Token: TOKEN).")] = "127.0.0.1:4318"
    max_body_kb: Annotated[int, Meta(ge=1, description="A larger request is refused (413) before its body is read, "
                                                       "in KiB.")] = 4096
    requests_per_s: Annotated[float, Meta(
        gt=0, description="Admitted requests a second, for callers with the token and for the others each, after "
                          "a burst.")] = 50
    burst: Annotated[int, Meta(ge=1, description="The burst before requests_per_s applies; past it: 429 with "
                                                 "Retry-After.")] = 100
    queue_kb: Annotated[int, Meta(
        ge=1, description="Bodies being read or not yet folded, in KiB; full: 503 (the CLI retries); callers without "
                          "the token get half; at least two bodies of max_body_kb.")] = 16384
    flush_s: Annotated[float, Meta(gt=0, description="What was folded goes to events.db this often, in s.")] = 5
    max_sources: Annotated[int, Meta(
        ge=1, description="Runs and sessions counted per flush; others' records are dropped, counted.")] = 32
    export: Annotated[str | None, Meta(
        description="A collector (http(s)://host:port, a path prefix allowed) to which each ended run goes as GenAI "
                    "trace spans over OTLP/HTTP; unset: nothing is sent.", examples=["http://127.0.0.1:4318"])] = None
    export_headers: Annotated[dict[str, str], Meta(description="Headers sent to the collector (e.g. Authorization); "
                                                               "never shown.")] = msgspec.field(default_factory=dict)
    export_queue: Annotated[int, Meta(ge=1, description="Runs waiting to be sent; full: the oldest dropped, counted.")] = 1000
    export_give_up_s: Annotated[float, Meta(
        gt=0, description="A run not sent this long (collector down) is dropped, counted, in s.")] = 60


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
    enabled: Annotated[bool, Meta(description="Run the fleet worker.")] = False
    url: Annotated[list[str], Meta(description="The NATS servers, nats:// or tls://.")] = msgspec.field(
        default_factory=lambda: ["nats://127.0.0.1:4222"])
    creds_file: Annotated[str | None, Meta(description="A NATS .creds file (JWT and NKey seed); never shown.",
                                           examples=["/etc/pulse/fleet.creds"])] = None
    token: Annotated[str | None, Meta(description="A plain token; never shown.", examples=["s3cret"])] = None
    nkey_seed_file: Annotated[str | None, Meta(description="A file holding an NKey seed (\"SU...\").",
                                               examples=["/etc/pulse/fleet.nk"])] = None
    host: Annotated[str | None, Meta(
        description="This host's name in the fleet; unset: <instance name>@<hostname>.", examples=["web-1"])] = None
    presence_interval_s: Annotated[float, Meta(
        gt=0, description="This host's summary goes to the pulse-hosts bucket this often, in s.")] = 5
    presence_ttl_s: Annotated[float, Meta(
        gt=0, description="... and is gone from it this long after the last one, in s; at least twice "
                          "presence_interval_s.")] = 30
    reconnect_max_s: Annotated[float, Meta(
        ge=0.5, description="A failed connect is retried after 0.5 s, doubling up to this, in s.")] = 30
    events_batch: Annotated[int, Meta(ge=1, description="Events published per cursor commit.")] = 500
    take_tasks: Annotated[bool, Meta(
        description="A host with [[agent]]s takes fleet tasks for them (`pulsectl task add --fleet`).")] = True
    # Renewed every third of it while the task runs: at least once across a host's death, at most once otherwise.
    task_lease_s: Annotated[float, Meta(
        ge=1, description="A host's claim on a fleet task lapses this long after its last renewal, and the task runs "
                          "again elsewhere, in s.")] = 30
    max_deliver: Annotated[int, Meta(
        ge=1, description="A fleet task is taken at most this many times; past it, it is dead-lettered (the "
                          "pulse-task-dead bucket, a fleet-task-dead event on its origin).")] = 3
    offer_ttl_s: Annotated[float, Meta(
        gt=0, description="A fleet task no host takes is dead-lettered this long after it was offered, with each "
                          "host's last reason for leaving it, in s.")] = 86_400
    # the fleet's "failed on" rule: another host that can take it gets it first
    failed_host_wait_s: Annotated[float, Meta(
        ge=0, description="A host that gave a fleet task up leaves it to the others this long before taking it "
                          "again, in s.")] = 60
    # A stream or bucket that already exists is used as it is.
    replicas: Annotated[int, Meta(
        ge=1, le=5, description="Copies the streams and KV buckets keep, one per NATS server: 1 for one server, 3 "
                                "on a three-server cluster (each survives the loss of any one).")] = 1


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
