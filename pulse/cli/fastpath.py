"""pulsectl's commands, served without click.

Importing click takes longer (~20 ms at this host's usual speed, ~45 at its slowest) than most
commands take to run. So every command that ends in a moment, and those that follow (`events -f`,
`logs -f`), is read here when it is plainly well formed, by a parser that knows each one's options,
and runs the very same code click would run (their click commands call it too). Left to click: the
commands whose own work dwarfs it (`report`, `guard`, `init`, `daemon start`, `dev`, `systemd
install`, `mcp` with more than --agent) and every group named alone (`pulsectl web`: its help).

Every command's `--help` is printed from pulse.cli.helptext, click's own words generated ahead (on a
terminal narrower than click's widest help, click says it). Only what is certainly well formed is
served here: anything this parser is not sure of (an unknown option, a value that looks like an
option, a bad number, a missing required option, `-i` with --home or --help, a subcommand it does
not serve) returns None, and click parses the command line as always, with its own errors.
tests/test_cli_fastpath.py holds each option table to its click command, and what each command says
here to what it says through click.
"""

# No `from __future__ import annotations`: typing.NamedTuple compiles each string annotation into a
# ForwardRef, ~2 ms for the two tables' ten fields at every run.
import gc
import importlib
import os
import sys
from pathlib import Path
from typing import Callable, NamedTuple

from pulse import __version__
from pulse.cli.launch import chosen_home, global_options
from pulse.core.leanimport import import_msgspec

FLAG, VALUE, INT, FLOAT, MULTI = "flag", "value", "int", "float", "multi"


class Option(NamedTuple):
    dest: str            # the click parameter's name
    kind: str            # FLAG, VALUE, INT or FLOAT (a value int() or float() reads), MULTI (a value, repeatable)
    default: object = None


class Command(NamedTuple):
    options: dict[str, Option]            # every spelling → its option
    required: tuple[str, ...] = ()        # dests that must be given
    check: Callable[[dict], bool] | None = None   # False: let click say what is wrong
    run: str = ""                         # "module:function" of pulse.cli, called (ctx, **params)
    argument: str | None = None           # the dest of its one positional argument (required unless ...)
    argument_optional: bool = False       # ... this: then None when not given
    lasting: bool = False                 # it may run for minutes: the collector stays on (as with -f)


def _opts(*rows: tuple[tuple[str, ...], Option]) -> dict[str, Option]:
    return {name: option for names, option in rows for name in names}


JSON = (("--json",), Option("as_json", FLAG, False))
WAIT = ((("--wait",), Option("wait", FLOAT, 15.0)), (("--no-wait",), Option("no_wait", FLAG, False)))
PROCESS_WAIT = (("--wait",), Option("wait", FLOAT, 30.0))


def _task_statuses(params: dict) -> bool:
    from pulse.core.states import TaskStatus  # enum and its module, ~1 ms: only `task list` checks them
    return set(params["statuses"]) <= {s.value for s in TaskStatus}


def _events_sound(params: dict) -> bool:
    """Types it knows and a --since it can read: click says what is wrong with any other."""
    from pulse.core import clock  # re: ~1 ms
    from pulse.core.wire.eventmsgs import EVENT_TYPES  # with msgspec, ~14 ms: only the commands that read events pay it
    if not set(params["types"]) <= EVENT_TYPES:
        return False
    if params["since"]:
        try:
            clock.parse_since(params["since"])
        except ValueError:
            return False
    return True


def _task_or_fleet_id(params: dict) -> bool:
    """`task show`'s TASK as its click callback reads it (a task of this host, or a fleet id); anything
    else is click's to say."""
    from pulse.cli.taskverbs import task_or_fleet_id  # the task verbs' module: only `task show` checks it
    try:
        params["task"] = task_or_fleet_id(params["task"])
    except ValueError:
        return False
    return True


def _task_id(params: dict) -> bool:
    """TASK as its click callback reads it (a task of this host); anything else is click's to say."""
    from pulse.agents.tasks import parse_task_id  # tasks' module: only the verbs on one task check it
    try:
        params["task"] = parse_task_id(params["task"])
    except ValueError:
        return False
    return True


def _steerable(params: dict) -> bool:
    """A worker's name; anything else (a [[process]]'s name too) is click's to say."""
    from pulse.core.childspecs import STEERABLE  # with typing, ~5 ms: only the worker verbs check it
    return params["worker"] is None or params["worker"] in STEERABLE


def _log_source(params: dict) -> bool:
    """A process pulse.log has lines of (click's Choice); anything else is click's to say."""
    from pulse.core.childspecs import LOG_SOURCES  # as _steerable's: only `logs --worker` checks it
    return params["worker"] is None or params["worker"] in LOG_SOURCES


def _one_session_or_agent(params: dict) -> bool:
    """`gate-reset` of a SESSION or an --agent's, one of them: anything else is click's usage error."""
    return (params["session"] is None) != (params["agent"] is None)


def _duration(params: dict) -> bool:
    """`pause --for`: a duration clock.parse_duration reads (30m), else click's to say."""
    from pulse.core import clock  # re: ~1 ms
    return clock.parse_duration(params["duration"]) is not None


def _pin_or_restore(params: dict) -> bool:
    """`process config`: --pin and --restore together are click's usage error."""
    return not (params["pin"] and params["restore"])


def _directory(params: dict) -> bool:
    """`store backup DEST`, as click.Path(file_okay=False) reads it: not a file, made a Path."""
    if params["dest"] == "" or os.path.isfile(params["dest"]):
        return False
    params["dest"] = Path(params["dest"])
    return True


def _effective(params: dict) -> bool:
    """`config` alone is a usage error, click's to say."""
    return params.pop("effective")


COMMANDS: dict[tuple[str, ...], Command] = {
    ("task", "add"): Command(
        _opts((("--project",), Option("project", VALUE)), (("--title",), Option("title", VALUE)),
              (("--prompt",), Option("prompt", VALUE)), (("--priority",), Option("priority", INT, 0)),
              (("--agent",), Option("pin", VALUE)), (("--tag",), Option("tags", MULTI)),
              (("--fleet",), Option("fleet", FLAG, False))),
        required=("project", "title", "prompt"), run="taskverbs:add"),
    ("task", "list"): Command(
        _opts((("--status",), Option("statuses", MULTI)), JSON), check=_task_statuses, run="taskverbs:list_all"),
    ("task", "show"): Command(_opts(JSON), argument="task", check=_task_or_fleet_id, run="taskverbs:show"),
    ("task", "output"): Command(_opts((("--attempt",), Option("attempt", INT))), argument="task", check=_task_id,
                                run="taskverbs:output"),
    ("task", "close"): Command({}, argument="task", check=_task_or_fleet_id, run="taskverbs:close"),
    ("task", "give-up"): Command(_opts((("--reason",), Option("reason", VALUE, "given up by the operator"))),
                                 argument="task", check=_task_id, run="taskverbs:give_up"),
    ("task", "retry"): Command({}, argument="task", check=_task_id, run="taskverbs:retry"),
    ("events",): Command(
        _opts((("--type",), Option("types", MULTI)), (("--since",), Option("since", VALUE)),
              (("-n", "--lines"), Option("lines", INT, 50)), (("-f", "--follow"), Option("follow", FLAG, False)),
              JSON),
        check=_events_sound, run="eventsview:print_events"),
    ("effects",): Command(
        _opts((("--pending",), Option("pending", FLAG, False)), (("-n", "--lines"), Option("lines", INT, 50)), JSON),
        run="eventsview:print_effects"),
    ("config",): Command(
        _opts((("--effective",), Option("effective", FLAG, False))),
        check=_effective, run="configview:effective"),
    ("check-config",): Command({}, run="configview:check"),
    ("budget",): Command(_opts(JSON), run="budgetview:show"),
    ("budget", "reset"): Command({}, argument="agent", run="budgetview:reset"),
    ("emit",): Command(
        _opts((("--target",), Option("target", VALUE)), (("--param",), Option("params", MULTI)),
              (("--idempotent",), Option("idempotent", FLAG, False)), (("--deadline",), Option("deadline_s", FLOAT)),
              (("--wait",), Option("wait_s", FLOAT, 0))),
        argument="kind", run="emitview:emit"),
    ("pause",): Command(_opts((("--for",), Option("duration", VALUE, "30m"))), argument="process", check=_duration,
                        run="maintview:pause"),
    ("resume",): Command({}, argument="process", run="maintview:resume"),
    ("notify", "test"): Command(_opts((("--wait",), Option("wait", FLOAT, 30.0))), run="maintview:notify_test",
                                lasting=True),
    ("web", "url"): Command({}, run="webview:url"),
    ("store", "check"): Command({}, run="storeview:check", lasting=True),
    ("store", "compact"): Command(_opts((("--dry-run",), Option("dry_run", FLAG, False))), run="storeview:compact", lasting=True),
    ("store", "backup"): Command({}, argument="dest", check=_directory, run="storeview:backup", lasting=True),
    ("store", "restore-archived"): Command(_opts((("--to",), Option("dest", VALUE))), argument="path",
                                           run="storeview:restore_archived"),
    ("engine",): Command({}, run="engineview:overview"),
    ("engine", "log"): Command({}, run="engineview:engine_log"),
    ("promote",): Command(_opts((("-m", "--message"), Option("message", VALUE)), (("--again",), Option("again", FLAG, False))),
                          run="engineview:promote", lasting=True),
    ("deploy",): Command(_opts((("--again",), Option("again", FLAG, False))), run="engineview:deploy", lasting=True),
    ("rollback",): Command(_opts((("--to",), Option("ref", VALUE))), run="engineview:rollback", lasting=True),
    ("web", "rotate-token"): Command({}, run="webview:rotate_token"),
    ("vitals",): Command(_opts(JSON), argument="key", argument_optional=True, run="eventsview:print_vitals"),
    ("logs",): Command(
        _opts((("-f", "--follow"), Option("follow", FLAG, False)), (("--worker",), Option("worker", VALUE)),
              (("-n", "--lines"), Option("lines", INT, 50))),
        check=_log_source, run="logview:print_log"),
    ("instances",): Command(_opts(JSON), run="rosterview:list_all"),
    ("schedule", "list"): Command(_opts(JSON), run="scheduleview:list_all"),
    ("schedule", "run"): Command({}, argument="name", run="scheduleview:run"),
    ("fleet", "status"): Command(_opts(JSON), run="fleetview:status"),
    ("fleet", "events"): Command(
        _opts((("-f", "--follow"), Option("follow", FLAG, False)), (("--host",), Option("host", VALUE)),
              (("--type",), Option("type_", VALUE)), (("-n", "--last"), Option("last", INT, 50)), JSON),
        run="fleetview:events"),
    ("fleet", "add"): Command(
        _opts((("--agent",), Option("agent", VALUE)), (("--tag",), Option("tags", MULTI)),
              (("--project",), Option("project", VALUE)), (("--title",), Option("title", VALUE)),
              (("--prompt",), Option("prompt", VALUE)), (("--priority",), Option("priority", INT, 0))),
        required=("project", "title", "prompt"), run="fleetview:add"),
    ("fleet", "tasks"): Command(_opts(JSON), run="fleetview:tasks"),
    ("gate", "sessions"): Command(_opts(JSON), run="gateview:sessions"),
    ("gate-reset",): Command(
        _opts((("--agent",), Option("agent", VALUE)), (("--keep-progress",), Option("keep_progress", FLAG, False))),
        argument="session", argument_optional=True, check=_one_session_or_agent, run="gateview:reset"),
    ("process", "list"): Command(_opts(JSON), run="processview:list_all"),
    ("process", "status"): Command(_opts(JSON), argument="name", run="processview:status"),
    ("process", "config"): Command(
        _opts((("--pin",), Option("pin", FLAG, False)), (("--restore",), Option("restore", FLAG, False)), JSON,
              (("--wait",), Option("wait", FLOAT, 15.0))),
        argument="name", check=_pin_or_restore, run="processview:config"),
    ("process", "restart"): Command(_opts(PROCESS_WAIT), argument="name", run="processview:restart"),
    ("process", "stop"): Command(_opts(PROCESS_WAIT), argument="name", run="processview:stop"),
    ("process", "start"): Command(_opts(PROCESS_WAIT), argument="name", run="processview:start"),
    ("process", "logs"): Command(
        _opts((("-f", "--follow"), Option("follow", FLAG, False)), (("-n", "--lines"), Option("lines", INT, 50))),
        argument="name", run="processview:logs"),
    ("reload",): Command(_opts((("--wait",), Option("wait", FLOAT, 20.0))), run="reloadview:reload"),
    ("restart",): Command(_opts(*WAIT), argument="worker", check=_steerable, run="workerverbs:restart"),
    ("start",): Command(_opts(*WAIT), argument="worker", check=_steerable, run="workerverbs:start"),
    ("stop",): Command(_opts(*WAIT), argument="worker", argument_optional=True, check=_steerable,
                       run="workerverbs:stop"),
}


def parse_options(args: list[str], command: Command) -> dict | None:
    """The command's parameters from `args`, as click would pass them; None when unsure."""
    params: dict = {o.dest: ([] if o.kind == MULTI else o.default) for o in command.options.values()}
    given: set[str] = set()
    i = 0
    while i < len(args):
        if command.argument is not None and command.argument not in given and not args[i].startswith("-"):
            params[command.argument] = args[i]
            given.add(command.argument)
            i += 1
            continue
        name, eq, value = args[i].partition("=")
        option = command.options.get(name)
        if option is None or (eq and (option.kind == FLAG or not name.startswith("--"))):
            return None
        if option.kind == FLAG:
            if option.dest in given:
                return None
            params[option.dest] = True
        else:
            if not eq:
                i += 1
                if i == len(args):
                    return None
                value = args[i]
            if value.startswith("-") and value != "-":
                return None                  # an option's name, or a negative number: click's to judge
            if option.kind in (INT, FLOAT):
                try:
                    value = int(value) if option.kind == INT else float(value)
                except ValueError:
                    return None
            if option.kind == MULTI:
                params[option.dest].append(value)
            elif option.dest in given:
                return None                  # given twice: click's rules
            else:
                params[option.dest] = value
        given.add(option.dest)
        i += 1
    if command.argument is not None and command.argument not in given:
        if not command.argument_optional:
            return None
        params[command.argument] = None
    if not given.issuperset(command.required):
        return None
    for option in command.options.values():
        if option.kind == MULTI:
            params[option.dest] = tuple(params[option.dest])
    return params


def resolve(argv: list[str]) -> Callable[[], None] | None:
    """What to run for `argv` without click, or None to let click handle it."""
    found = global_options(argv)
    if found is None:
        return None
    home, instance, timeout, args = found
    if args == ["--version"]:
        return _version
    if args and args[-1] in ("--help", "-h"):
        return _help(tuple(args[:-1]))
    words = tuple(args[:2]) if tuple(args[:2]) in COMMANDS else tuple(args[:1])   # `budget reset` before `budget`
    command = COMMANDS.get(words)
    if command is None:
        return None
    import_msgspec()             # before its checks and its body: both read pulse.core.wire
    params = parse_options(args[len(words):], command)
    if params is None or (command.check is not None and not command.check(params)):
        return None
    module, _, function = command.run.partition(":")
    home = chosen_home(home, instance)
    collect = command.lasting or params.get("follow", False)
    return lambda: _run(module, function, home, timeout, params, collect)


def _version() -> None:
    print(f"pulsectl, version {__version__}")


def _help(words: tuple[str, ...]) -> Callable[[], None] | None:
    """A command's --help as click would print it here: its text at click's width, when the terminal
    has the columns for it (or there is none)."""
    import shutil  # with bz2 and lzma, ~3 ms: only for --help

    from pulse.cli.commandtable import COMMAND_TABLE
    from pulse.cli.helptext import COLUMNS, HELP, MADE_FROM
    text = HELP.get(words)
    if text is None or MADE_FROM != COMMAND_TABLE or shutil.get_terminal_size().columns < COLUMNS:
        return None
    return lambda: print(text, end="")


def _run(module: str, function: str, home: str | None, timeout: float, params: dict, collect: bool) -> None:
    from pulse.cli.context import Context  # pathlib and typing, ~10 ms where site has not loaded them: not for --version
    if collect:
        gc.enable()              # it runs until stopped, or long (pulse.cli.main turned the collector off)
    body = getattr(importlib.import_module(f"pulse.cli.{module}"), function)
    body(Context(home, timeout), **params)


def serve(run: Callable[[], None]) -> int:
    """Run a command resolved here as click's standalone mode would: its exit code, the same one
    line for a store that cannot be used (pulse.cli.group), Ctrl-C as `Aborted!` (1), and a reader
    that went away (`| head`) as exit 1."""
    from pulse.cli.context import unusable_store  # as in _run
    try:
        run()
        return 0
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            return exit.code or 0
        print(exit.code, file=sys.stderr)     # as the interpreter says sys.exit("text")
        return 1
    except KeyboardInterrupt:
        print("\nAborted!", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 1
    except Exception as err:
        code = unusable_store(err)
        if code is None:
            raise
        return code
