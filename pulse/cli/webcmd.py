"""`pulsectl web url`, `pulsectl web rotate-token`: the operator's page ([web] in config.toml)."""

from __future__ import annotations

import sys

import click

from pulse.cli.group import Context, pass_ctx
from pulse.core.home import write_web_token

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


@click.group()
def web() -> None:
    """The operator's page and /metrics (enable with [web] enabled = true)."""


@web.command()
@pass_ctx
def url(ctx: Context) -> None:
    """The page's address with its token, for the running web worker (the real port when 0 was asked)."""
    from pulse.core.wire import controlmsgs
    status = ctx.request(controlmsgs.GetStatus()).status
    if status.web_url is None:
        enabled = ctx.config().web.enabled
        click.echo("pulsectl: the web worker is not running" + ("" if enabled else
                   " ([web] enabled = true in config.toml, then `pulsectl reload`)"), err=True)
        sys.exit(3)
    click.echo(f"{status.web_url}/?token={ctx.paths.web_token.read_text().strip()}")


@web.command(name="rotate-token")
@pass_ctx
def rotate_token(ctx: Context) -> None:
    """Replace the page's token: every open session ends; `pulsectl web url` prints the new address."""
    write_web_token(ctx.paths)
    click.echo(f"new token written to {ctx.paths.web_token}; open sessions must log in again")


COMMANDS = [web]
