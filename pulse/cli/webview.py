"""`pulsectl web url` and `web rotate-token` themselves, click-free: pulse.cli.webcmd declares them to
click, pulse.cli.fastpath runs them without it."""

from __future__ import annotations

import sys

from pulse.cli.context import Context, echo
from pulse.core.home import write_web_token

# Imports inside functions: the control messages (msgspec's structs) only for `url`, which asks pulsed.


def url(ctx: Context) -> None:
    """The page's address with its token, for the running web worker (the real port when 0 was asked);
    exit 3 when it does not run."""
    from pulse.core.wire import controlmsgs
    status = ctx.request(controlmsgs.GetStatus()).status
    if status.web_url is None:
        enabled = ctx.config().web.enabled
        echo("pulsectl: the web worker is not running" + ("" if enabled else
             " ([web] enabled = true in config.toml, then `pulsectl reload`)"), err=True)
        sys.exit(3)
    echo(f"{status.web_url}/?token={ctx.paths.web_token.read_text().strip()}")


def rotate_token(ctx: Context) -> None:
    """A new page token: every open session ends."""
    write_web_token(ctx.paths)
    echo(f"new token written to {ctx.paths.web_token}; open sessions must log in again")
