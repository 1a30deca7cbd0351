"""pulsectl's click application: the group, its options, and where each command lives."""

from __future__ import annotations

import importlib
import sys

import click

from pulse import __version__
from pulse.cli.context import Context, unusable_store
from pulse.cli.launch import DEFAULT_TIMEOUT_S, home_of, import_msgspec

pass_ctx = click.make_pass_decorator(Context)


# Which module defines each command: only the one invoked is imported, so `pulsectl status`
# pays for click, zmq and msgspec, not for every other command's imports.
COMMAND_MODULES = {
    "status": "status", "restart": "workercmd", "start": "workercmd", "stop": "workercmd", "reload": "workercmd",
    "events": "pipeline", "vitals": "pipeline", "effects": "pipeline", "emit": "pipeline",
    "promote": "enginecmd", "deploy": "enginecmd", "rollback": "enginecmd", "engine": "enginecmd", "dev": "enginecmd",
    "pause": "maintenance", "resume": "maintenance", "notify": "maintenance",
    "task": "taskcmd", "mcp": "mcp", "gate-reset": "mcp", "gate": "mcp",
    "daemon": "daemon", "logs": "logcmd", "systemd": "systemdcmd", "init": "init",
    "check-config": "configcmd", "config": "configcmd", "report": "reportcmd", "instances": "roster",
    "store": "storecmd", "web": "webcmd", "process": "processcmd",
    "budget": "budgetcmd",
    "schedule": "schedulecmd",
    "fleet": "fleetcmd",
    "guard": "guardcmd",
}


# The one line `pulsectl --help` shows for each command, so that --help imports none of their modules
# (tests/test_cli_imports.py holds it to each command's docstring). Where a docstring's first sentence
# is longer than click's 45 characters, the line is chosen here (click would cut it with "..."); a
# command missing here is imported for its first sentence, shown whole (format_commands).
SHORT_HELP = {
    "budget": "Spend against limits per agent, today and this month; `budget reset AGENT`.",
    "check-config": "Validate config.toml (and PULSE_* overrides).",
    "config": "Print the configuration pulsed would run with (--effective).",
    "daemon": "Run pulsed without systemd.",
    "deploy": "Promote a staging tree that is already committed.",
    "dev": "Run the engine on staging, reloaded on every save.",
    "effects": "Effects and their state.",
    "emit": "Queue an effect by hand and ring the executor.",
    "engine": "The engine directory: alone, what main runs and what staging holds.",
    "events": "Print events (-n, --type, --since, -f).",
    "fleet": "The Pulses of the fleet, over NATS JetStream (enable with [fleet] enabled = true).",
    "gate": "The agent's safety gate: its sessions.",
    "gate-reset": "Reset a gate session, or an agent's.",
    "guard": "Guard OpenClaw, Hermes or LiteLLM (--detect).",
    "init": "Create the Pulse home with working defaults (idempotent).",
    "instances": "List this user's running Pulses.",
    "logs": "Print Pulse's log.",
    "mcp": "Serve the gated tools over MCP (stdio).",
    "notify": "Notifications.",
    "pause": "Leave PROCESS alone (no restarts) for a while.",
    "process": "A critical process ([[process]]): list, status, restart, stop, start, logs, config.",
    "promote": "Merge staging into main, checked.",
    "reload": "Re-read config.toml; restart what changed.",
    "report": "What happened on this host, judged.",
    "restart": "Restart WORKER (also revives a failed engine).",
    "resume": "Watch PROCESS again.",
    "rollback": "Return main to an earlier tree.",
    "schedule": "Recurring tasks and effects ([[schedule]] in config.toml), run by the tick.",
    "start": "Start WORKER (after a stop, or a failed engine).",
    "status": "Show every worker's and process's state.",
    "stop": "Stop WORKER, or pulsed itself.",
    "store": "Check, back up or compact the home's stores.",
    "systemd": "Run pulsed under systemd.",
    "task": "Tasks for agents: add, list, show, close.",
    "vitals": "The latest vitals (KEY: one, or a prefix).",
    "web": "The operator's page and /metrics.",
}


class LazyGroup(click.Group):
    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in SHORT_HELP:
                rows.append((name, SHORT_HELP[name]))
            elif (command := self.get_command(ctx, name)) is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMAND_MODULES:
            import difflib  # only a misspelt command
            close = difflib.get_close_matches(name, COMMAND_MODULES, n=1)
            ctx.fail(f"no command {name!r}" + (f"; did you mean {close[0]!r}?" if close else "") +
                     " (pulsectl --help lists them)")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context):
        """A store that cannot be used is one line naming the file and what to do, never a traceback."""
        try:
            return super().invoke(ctx)
        except Exception as err:
            code = unusable_store(err)
            if code is None:
                raise
            sys.exit(code)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = COMMAND_MODULES.get(name)
        if module is None:
            return None

        import_msgspec()   # before any command's module: nearly all need msgspec (--help needs none)
        commands = importlib.import_module(f"pulse.cli.{module}").COMMANDS
        return next(c for c in commands if c.name == name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
# readable=False: click would refuse a home it cannot list (exit 2) before any command runs, and an
# agent run's `pulsectl mcp`, under its own account, needs nothing from the home (the run hands it
# the gate's socket and its token); a command that does need the home says what it cannot reach (77).
@click.option("--home", envvar="PULSE_HOME", type=click.Path(file_okay=False, readable=False),
              help="Pulse home (default: $PULSE_HOME, else ~/.pulse).")
@click.option("-i", "--instance", metavar="NAME",
              help="The running Pulse called NAME (see `pulsectl instances`) instead of --home.")
@click.option("--timeout", default=DEFAULT_TIMEOUT_S, show_default=True, help="Seconds to wait for pulsed to answer.")
@click.version_option(__version__, prog_name="pulsectl")
@click.pass_context
def cli(ctx: click.Context, home: str | None, instance: str | None, timeout: float) -> None:
    """Inspect and steer Pulse, the supervisor of an AI agent's host."""
    if instance is not None:
        if ctx.get_parameter_source("home") == click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError("--home and --instance are exclusive")
        home = home_of(instance)
    ctx.obj = Context(home, timeout)
