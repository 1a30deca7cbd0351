"""`pulsectl guard --detect` and `pulsectl guard TOOL`: find the agent tools on this host, and guard
one with its preset on the operator's word (a [[process]] table appended to config.toml, checked,
then a running pulsed reloaded)."""

import json
import os
import re
import sys

import click

from pulse.cli.group import Context, pass_ctx

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).

TOOLS = {"openclaw": "OpenClaw", "hermes": "Hermes", "litellm": "LiteLLM"}
BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_value(value: object) -> str:
    """One TOML value, inline (a JSON string is a TOML basic string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def toml_key(key: str) -> str:
    return key if BARE_KEY.fullmatch(key) else json.dumps(key)


def table_text(found, name: str) -> str:
    """The [[process]] table `pulsectl guard` appends: the preset, and what differs on this host."""
    head = (f"# {found.summary()}\n# guarded by `pulsectl guard {found.guard}`: the preset's tested settings "
            "(`pulsectl config --effective`\n# shows them all); each key below overrides the preset's.\n")
    lines = ["[[process]]", f"preset = {toml_value(found.preset)}", f"name = {toml_value(name)}"]
    lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in found.overrides.items()]
    return head + "\n".join(lines) + "\n"


def tested(preset: str) -> str:
    from pulse.core import presets
    return ", ".join(f"{tool} {version}" for tool, version in presets.read(preset)["tested"].items())


def guarded_by(config, found) -> str | None:
    """The [[process]] of `config` that already guards what was found, preset or not: the same
    config file kept, the same pidfile or match, or the same preset for the same HOME."""
    from pulse.core import presets
    if config is None:
        return None
    table = presets.applied({"preset": found.preset, **found.overrides})
    pidfile, match = (table.get("pidfile") or {}).get("path"), table.get("match")
    home = table.get("env", {}).get("HOME")
    for proc in config.process:
        path = proc.pidfile.path if hasattr(proc.pidfile, "path") else proc.pidfile
        if ((found.config and found.config in proc.config) or (pidfile and path == pidfile)
                or (match and proc.match == match)
                or (proc.preset == found.preset and home and proc.env.get("HOME") == home)):
            return proc.name
    return None


def caveats(found) -> list[str]:
    out = list(found.notes)
    for unit in found.units:
        out.append(f"its systemd user unit {unit} restarts it too: with Pulse guarding it, disable that one "
                   f"(systemctl --user disable --now {unit}, as {found.account.name}) so that one supervisor owns it")
    return out


def siblings(result, found) -> bool:
    """Whether the same account has another of this tool: then only --path says which."""
    return any(f is not found and f.guard == found.guard and f.account.name == found.account.name
               for f in result.found)


def say_detected(result, config) -> None:
    if not result.found:
        click.echo("found no OpenClaw, Hermes or LiteLLM: looked for ~/.openclaw and ~/.hermes in each account's "
                   "home (and OPENCLAW_STATE_DIR, OPENCLAW_CONFIG_PATH, HERMES_HOME), a LiteLLM proxy running with "
                   "--config, /etc/litellm/config.yaml and ~/litellm_config.yaml")
    for found in result.found:
        click.echo(f"{TOOLS[found.guard]}: {found.summary()}")
        if (name := guarded_by(config, found)) is not None:
            click.echo(f"  already guarded: [[process]] {name!r}")
        else:
            click.echo(f"  would guard it with: pulsectl guard {found.guard}"
                       + (f" --user {found.account.name}" if not found.account.own else "")
                       + (f" --path {found.where}" if siblings(result, found) else ""))
        keys = [f"{k} = {toml_value(v)}" for k, v in found.overrides.items() if k != "env"]
        click.echo(f"  preset {found.preset!r} (tested on {tested(found.preset)})"
                   + (f", with {', '.join(keys)}" if keys else ""))
        if env := found.overrides.get("env"):       # a key is said to be there, never shown
            click.echo("  and env " + ", ".join(f"{k} = {'(a key)' if k.endswith('_KEY') else v}" for k, v in env.items()))
        for line in caveats(found):
            click.echo(f"  note: {line}")
    on_path = [f"{n} ({p})" for n, p in result.clis.items() if p]
    missing = [n for n, p in result.clis.items() if not p]
    click.echo("agent CLIs on PATH: " + (", ".join(on_path) or "none")
               + (f"; not found: {', '.join(missing)}" if missing else ""))
    if result.found:
        click.echo("Nothing is guarded until you run one of those commands (--dry-run prints the table first).")


def current_config(ctx: Context):
    """config.toml as it stands, or None when there is none yet or it does not load."""
    from pulse.core import config as configmod
    try:
        return configmod.load(ctx.paths.config)
    except configmod.ConfigError:
        return None


def at(found, path: str) -> bool:
    """Whether `path` names this find: its state directory or its config file."""
    wanted = os.path.abspath(path).rstrip("/")
    return any(p and os.path.abspath(p).rstrip("/") == wanted for p in (found.where, found.config))


def chosen(result, tool: str, user: str | None, path: str | None = None):
    """The one find `pulsectl guard TOOL [--user U] [--path P]` means; exit 1 naming the choices otherwise."""
    finds = [f for f in result.found if f.guard == tool and (user is None or f.account.name == user)
             and (path is None or at(f, path))]
    if len(finds) == 1:
        return finds[0]
    if not finds:
        click.echo(f"pulsectl: found no {TOOLS[tool]}" + (f" of the account {user!r}" if user else "")
                   + (f" at {path}" if path else "")
                   + " on this host (`pulsectl guard --detect` says where it looked); a table written by hand "
                   f"takes its preset all the same: [[process]] preset = \"{tool_preset(tool)}\"", err=True)
    elif len({f.account.name for f in finds}) == len(finds):
        click.echo(f"pulsectl: found {len(finds)} of {TOOLS[tool]}; say which with --user ACCOUNT: "
                   + "; ".join(f.summary() for f in finds), err=True)
    else:
        click.echo(f"pulsectl: found {len(finds)} of {TOOLS[tool]} of one account: "
                   + "; ".join(f.summary() for f in finds) + "; say which with --path (its state directory or "
                   f"config file), or guard one by hand, a [[process]] with preset = \"{finds[0].preset}\" "
                   "and its paths (`guard --detect` says which keys)", err=True)
    sys.exit(1)


def tool_preset(tool: str) -> str:
    from pulse.core import presets
    return next(n for n in presets.names() if presets.read(n)["guard"] == tool)


def unique_name(config, found) -> str:
    taken = {p.name for p in config.process} if config is not None else set()
    return found.preset if found.preset not in taken else f"{found.preset}-{found.account.name}"


def checked(ctx: Context, text: str):
    """The config that `text` is, validated as pulsed would load it; exit 78 naming what is wrong."""
    from pulse.core import config as configmod
    origin = f"{ctx.paths.config} (with the table appended)"
    try:
        config = configmod.decode(text, origin)
        overrides = configmod.env_overrides(os.environ)
        if overrides:
            import msgspec
            config = msgspec.structs.replace(config, timings=msgspec.structs.replace(config.timings, **overrides))
        return configmod.validate(config, origin)
    except configmod.ConfigError as err:
        click.echo(f"pulsectl: refused, {ctx.paths.config} left as it was: {err}", err=True)
        sys.exit(78)


def reload_if_running(click_ctx: click.Context, ctx: Context) -> None:
    from pulse.cli.workercmd import reload
    from pulse.core import client
    from pulse.core.wire import controlmsgs
    try:
        client.request(ctx.paths, controlmsgs.GetStatus(), min(ctx.timeout, 3.0))
    except client.Unreachable:
        click.echo("pulsed is not running: it guards it from its next start (pulsectl daemon start)")
        return
    click_ctx.invoke(reload)


@click.command()
@click.argument("tool", required=False, type=click.Choice(sorted(TOOLS)))
@click.option("--detect", is_flag=True, help="Say what is on this host and how it would be guarded; change nothing.")
@click.option("--dry-run", is_flag=True, help="Print the table `guard TOOL` would append; change nothing.")
@click.option("--user", metavar="ACCOUNT", help="The account whose tool to guard, when several have one.")
@click.option("--path", metavar="PATH", help="Its state directory or config file, when one account has several.")
@pass_ctx
@click.pass_context
def guard(click_ctx: click.Context, ctx: Context, tool: str | None, detect: bool, dry_run: bool,
          user: str | None, path: str | None) -> None:
    """Guard OpenClaw, Hermes or LiteLLM with its tested preset (--detect: what is here).

    `--detect` finds the tools on this host (their state, configs, gateways running or not, user
    units, the agent CLIs on PATH) and says how each would be guarded. `guard TOOL` appends its
    [[process]] table to config.toml (the file's text and comments kept), checks the result
    (refused, and the file left untouched, if it is not valid) and reloads a running pulsed."""
    from pulse.core import toolscan
    if detect == (tool is not None):
        raise click.UsageError("say --detect (what is here) or the tool to guard: openclaw, hermes or litellm",
                               click_ctx)
    result = toolscan.scan()
    config = current_config(ctx)
    if detect:
        say_detected(result, config)
        return
    found = chosen(result, tool, user, path)
    if (name := guarded_by(config, found)) is not None:
        click.echo(f"{TOOLS[tool]} of {found.account.name} is already guarded: [[process]] {name!r} in {ctx.paths.config}")
        return
    table = table_text(found, unique_name(config, found))
    if dry_run:
        click.echo(table, nl=False)
        return
    if not ctx.paths.config.exists():
        from pulse.store.provision import ensure_home
        for item in ensure_home(ctx.home):
            click.echo(f"made {item}")
    existing = ctx.paths.config.read_text()
    addition = ("" if not existing or existing.endswith("\n") else "\n") + "\n" + table
    checked(ctx, existing + addition)
    with open(ctx.paths.config, "a") as f:      # appended: the operator's text and comments stay as they are
        f.write(addition)
    click.echo(f"appended to {ctx.paths.config}:\n{table}", nl=False)
    for line in caveats(found):
        click.echo(f"note: {line}")
    reload_if_running(click_ctx, ctx)


COMMANDS = [guard]
