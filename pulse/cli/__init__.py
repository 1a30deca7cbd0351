"""pulsectl: inspect and steer a running pulsed.

Each command lives in its own module; heavy imports stay inside the commands
that need them, so `pulsectl status` starts fast.
"""

from __future__ import annotations

import sys

import click

from pulse import __version__
from pulse.home import Paths, resolve_home


class Context:
    def __init__(self, home: str | None, timeout: float):
        self.home = resolve_home(home)
        self.timeout = timeout

    @property
    def paths(self) -> Paths:
        return Paths.for_client(self.home)

    def request(self, message):
        """Send a control request; exit 4 (LSB: unknown) when pulsed cannot be reached."""
        from pulse import client
        try:
            reply = client.request(self.paths, message, self.timeout)
        except client.Unreachable as err:
            click.echo(f"pulsectl: {err}", err=True)
            sys.exit(4)
        if not reply.ok:
            click.echo(f"pulsectl: {reply.error}", err=True)
            sys.exit(1)
        return reply


pass_ctx = click.make_pass_decorator(Context)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--home", envvar="PULSE_HOME", type=click.Path(file_okay=False),
              help="Pulse home (default: $PULSE_HOME, else ~/.pulse).")
@click.option("--timeout", default=3.0, show_default=True, help="Seconds to wait for pulsed to answer.")
@click.version_option(__version__, prog_name="pulsectl")
@click.pass_context
def cli(ctx: click.Context, home: str | None, timeout: float) -> None:
    """Inspect and steer Pulse, the supervisor of an AI agent's host."""
    ctx.obj = Context(home, timeout)


from pulse.cli import (configcmd, daemon, engine, init, logs, maintenance, mcp, pipeline, status,  # noqa: E402
                       systemd, tasks, workers)

for module in (status, workers, pipeline, engine, daemon, logs, systemd, init, configcmd, tasks, maintenance, mcp):
    for command in module.COMMANDS:
        cli.add_command(command)


def main() -> None:
    cli()
