"""`pulsectl check-config` and `pulsectl config --effective`."""

import errno
import os
import sys
from urllib.parse import urlsplit

import click

from pulse.cli import configview
from pulse.cli.group import Context, pass_ctx

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


@click.command("check-config")
@pass_ctx
def check_config(ctx: Context) -> None:
    """Validate config.toml (and PULSE_* overrides). Exit 78 if it is bad."""
    config = ctx.config()
    problems = configview.unknown_kinds(ctx, config) + listen_taken(ctx, config)
    for problem in problems:
        click.echo(f"pulsectl: {problem}", err=True)
    if problems:
        sys.exit(78)
    for warning in missing_programs(config):
        click.echo(f"pulsectl: warning: {ctx.paths.config}: {warning}", err=True)
    click.echo(f"{ctx.paths.config}: ok")


def missing_programs(config) -> list[str]:
    """Each [[agent]] whose program is not to be found: a warning, not a refusal, since pulsed may run
    with another PATH than this shell (its runs give the task up at once, reason not-installed)."""
    import shutil

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
    import socket
    if not config.web.enabled:
        return []
    host, _, port = config.web.listen.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return []
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
    from pulse.core import client
    from pulse.core.wire import controlmsgs
    try:
        url = client.request(ctx.paths, controlmsgs.GetStatus(), min(ctx.timeout, 2.0)).status.web_url
    except client.Unreachable:
        return None
    return urlsplit(url).port if url else None


@click.command("config")
@click.option("--effective", is_flag=True, help="Print the configuration in force, defaults included.")
@pass_ctx
@click.pass_context
def config(click_ctx: click.Context, ctx: Context, effective: bool) -> None:
    """Print the configuration pulsed would run with (--effective)."""
    if not effective:
        # Printing the help and exiting 0 looked like success to a script: say what to run instead.
        raise click.UsageError("say what to print: --effective (the configuration in force, defaults "
                               "included); `pulsectl check-config` validates config.toml", click_ctx)
    configview.effective(ctx)


COMMANDS = [check_config, config]
