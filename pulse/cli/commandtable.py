"""Where each pulsectl command is defined, and its line in `pulsectl --help`: click-free, for the click
group (pulse.cli.group) and for the fast path, which prints the help generated ahead (pulse.cli.helptext)
only while it is of these commands."""

# One row per command: the module that defines it, and the one line `pulsectl --help` shows for it.
# Only the module of the command invoked is imported, so `pulsectl status` pays for click, zmq and
# msgspec, not for every other command's imports; and click's --help imports none of them, so the line is
# said here (tests/test_cli_imports.py holds it to the command's docstring: where the docstring's
# first sentence is longer than click's 45 characters, the line here is chosen shorter, since click
# would cut it with "..."). A new command is its module and its row here.
COMMAND_TABLE: dict[str, tuple[str, str]] = {
    "budget": ("budgetcmd", "Spend against limits per agent, today and this month; `budget reset AGENT`."),
    "check-config": ("configcmd", "Validate config.toml (and PULSE_* overrides)."),
    "config": ("configcmd", "Print the configuration pulsed would run with (--effective)."),
    "daemon": ("daemon", "Run pulsed without systemd."),
    "deploy": ("enginecmd", "Promote a staging tree that is already committed."),
    "dev": ("enginecmd", "Run the engine on staging, reloaded on every save."),
    "effects": ("pipeline", "Effects and their state."),
    "emit": ("pipeline", "Queue an effect by hand and ring the executor."),
    "engine": ("enginecmd", "The engine directory: alone, what main runs and what staging holds."),
    "events": ("pipeline", "Print events (-n, --type, --since, -f)."),
    "fleet": ("fleetcmd", "The Pulses of the fleet, over NATS JetStream (enable with [fleet] enabled = true)."),
    "gate": ("mcp", "The agent's safety gate: its sessions."),
    "gate-reset": ("mcp", "Reset a gate session, or an agent's."),
    "guard": ("guardcmd", "Guard OpenClaw, Hermes or LiteLLM (--detect)."),
    "init": ("init", "Create the Pulse home with working defaults (idempotent)."),
    "instances": ("roster", "List this user's running Pulses."),
    "logs": ("logcmd", "Print Pulse's log."),
    "mcp": ("mcp", "Serve the gated tools over MCP (stdio)."),
    "notify": ("maintenance", "Notifications."),
    "pause": ("maintenance", "Leave PROCESS alone (no restarts) for a while."),
    "process": ("processcmd", "A critical process ([[process]]): list, status, restart, stop, start, logs, config."),
    "promote": ("enginecmd", "Merge staging into main, checked."),
    "reload": ("workercmd", "Re-read config.toml; restart what changed."),
    "report": ("reportcmd", "What happened on this host, judged."),
    "restart": ("workercmd", "Restart WORKER (also revives a failed engine)."),
    "resume": ("maintenance", "Watch PROCESS again."),
    "rollback": ("enginecmd", "Return main to an earlier tree."),
    "schedule": ("schedulecmd", "Recurring tasks and effects ([[schedule]] in config.toml), run by the tick."),
    "start": ("workercmd", "Start WORKER (after a stop, or a failed engine)."),
    "status": ("status", "Show every worker's and process's state."),
    "stop": ("workercmd", "Stop WORKER, or pulsed itself."),
    "store": ("storecmd", "Check, back up or compact the home's stores."),
    "systemd": ("systemdcmd", "Run pulsed under systemd."),
    "task": ("taskcmd", "Tasks for agents: add, list, show, close."),
    "vitals": ("pipeline", "The latest vitals (KEY: one, or a prefix)."),
    "web": ("webcmd", "The operator's page and /metrics."),
}
COMMAND_MODULES = {name: module for name, (module, _) in COMMAND_TABLE.items()}
SHORT_HELP = {name: line for name, (_, line) in COMMAND_TABLE.items()}
