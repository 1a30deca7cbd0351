"""`pulsectl config --effective` and `pulsectl check-config`, and the check of allow.kinds that
check-config and reload make, click-free: pulse.cli.configcmd declares them to click,
pulse.cli.fastpath runs them without it."""

from __future__ import annotations

import errno
import os
import sys

from pulse.cli.context import Context, echo

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def effective(ctx: Context) -> None:
    """The configuration in force: the running pulsed's (and where it differs from config.toml),
    else config.toml's with every default and PULSE_* override."""
    import msgspec

    from pulse.core import client
    from pulse.core.config import Config, ConfigError, load, to_toml, without_secrets
    from pulse.core.wire import controlmsgs
    try:
        reply = client.request(ctx.paths, controlmsgs.GetConfig(), ctx.timeout)
    except client.Unreachable:
        on_disk = without_secrets(ctx.config())
        echo(f"# pulsed is not running: {ctx.paths.config} with every default and PULSE_* override")
        echo(to_toml(on_disk), nl=False)
        return
    running = msgspec.convert(reply.config, Config)
    echo("# what the running pulsed uses")
    try:
        file_only = without_secrets(load(ctx.paths.config, {}))   # the file and defaults, no PULSE_* override
    except ConfigError as err:
        echo(f"# {ctx.paths.config} is not valid now ({err}); pulsed keeps this until it is")
        file_only = running
    for key in differing(msgspec.to_builtins(running), msgspec.to_builtins(file_only)):
        echo(f"# {key}: not what {ctx.paths.config} says (a PULSE_* override, or an edit not yet reloaded)")
    echo(to_toml(running), nl=False)


def differing(running: object, on_disk: object, path: str = "") -> list[str]:
    """The dotted keys whose values differ between two plain configs (arrays of tables whole)."""
    if isinstance(running, dict) and isinstance(on_disk, dict):
        return [key for name in sorted(set(running) | set(on_disk))
                for key in differing(running.get(name), on_disk.get(name), f"{path}.{name}" if path else name)]
    return [] if running == on_disk else [path]


def unknown_kinds(ctx: Context, config) -> list[str]:
    """allow.kinds may name built-in kinds and the kinds the engine's executors declare; anything
    else is a typo (exit 78, with the nearest name). The engine is asked only when needed: loading
    it runs agent code, in a throwaway process."""
    from pulse.core.wire.eventmsgs import EffectKind
    if set(EffectKind).issuperset(config.allow.kinds):
        return []          # as nearly always: said without importing every kind's module (registry)
    from pulse.effects import registry
    problems = registry.unknown_kinds(config.allow.kinds)
    if problems and ctx.paths.engine.is_dir():
        from pulse.engine import repo
        try:
            declared = repo.probe(ctx.paths.engine)["kinds"]
        except repo.EngineDirError as err:
            echo(f"pulsectl: could not ask the engine which kinds it declares: {err}", err=True)
            declared = []
        problems = registry.unknown_kinds(config.allow.kinds, declared)
    return [f"{ctx.paths.config}: $.allow.kinds: {problem}" for problem in problems]


def check(ctx: Context) -> None:
    """`check-config`: config.toml (and PULSE_* overrides) validated; exit 78 naming what is bad,
    warnings for what may fail later."""
    config = ctx.config()
    problems = unknown_kinds(ctx, config) + listen_taken(ctx, config)
    for problem in problems:
        echo(f"pulsectl: {problem}", err=True)
    if problems:
        sys.exit(78)
    for warning in missing_programs(config):
        echo(f"pulsectl: warning: {ctx.paths.config}: {warning}", err=True)
    echo(f"{ctx.paths.config}: ok")


def missing_programs(config) -> list[str]:
    """Each [[agent]] whose program is not to be found: a warning, not a refusal, since pulsed may run
    with another PATH than this shell (its runs give the task up at once, reason not-installed)."""
    if not config.agent:
        return []
    import shutil  # with bz2 and lzma, ~2.5 ms: only to look for an agent's program

    from pulse.core.config import ADAPTER_ARGV
    out = []
    for i, agent in enumerate(config.agent):
        argv = agent.argv or ADAPTER_ARGV.get(agent.adapter) or []
        if not argv or "{" in argv[0]:
            continue
        path = agent.env.get("PATH", os.environ.get("PATH", os.defpath))
        if shutil.which(argv[0], path=path) is None:
            where = "does not exist or is not executable" if "/" in argv[0] else "is not on PATH"
            out.append(f"$.agent[{i}] ({agent.name}): its program {argv[0]!r} {where}; its runs will fail "
                       "until it is installed")
    return out


def listen_taken(ctx: Context, config) -> list[str]:
    """[web] listen already taken by another process (another Pulse, a second instance of one): the
    web worker would fail at each start. Its own running web worker's port is not a problem."""
    if not config.web.enabled:
        return []
    host, _, port = config.web.listen.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return []
    import socket  # here: only a [web] that listens on a fixed port is looked at
    host = host.strip("[]") or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the server binds: TIME_WAIT is no clash
            probe.bind((host, int(port)))
        return []
    except OSError as err:
        if err.errno != errno.EADDRINUSE:
            return []
    if own_web_port(ctx) == int(port):
        return []
    return [f"{ctx.paths.config}: $.web.listen: {config.web.listen} is already in use by another process "
            "(another Pulse? `pulsectl instances`): the web worker could not start there; choose another port"]


def own_web_port(ctx: Context) -> int | None:
    """The port this home's running web worker listens on, if it runs."""
    from urllib.parse import urlsplit  # ~3 ms: only when the port is taken

    from pulse.core import client
    from pulse.core.wire import controlmsgs
    try:
        url = client.request(ctx.paths, controlmsgs.GetStatus(), min(ctx.timeout, 2.0)).status.web_url
    except client.Unreachable:
        return None
    return urlsplit(url).port if url else None
