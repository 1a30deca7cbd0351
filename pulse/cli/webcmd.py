"""`pulsectl web url`, `pulsectl web rotate-token`: the operator's page ([web] in config.toml)."""

from __future__ import annotations

import click

from pulse.cli import webview
from pulse.cli.group import Context, pass_ctx


@click.group()
def web() -> None:
    """The operator's page and /metrics (enable with [web] enabled = true)."""


@web.command()
@pass_ctx
def url(ctx: Context) -> None:
    """The page's address with its token, for the running web worker (the real port when 0 was asked)."""
    webview.url(ctx)


@web.command(name="rotate-token")
@pass_ctx
def rotate_token(ctx: Context) -> None:
    """Replace the page's token: every open session ends; `pulsectl web url` prints the new address."""
    webview.rotate_token(ctx)


COMMANDS = [web]
