"""pulse.cli.fastpath: the commands run in loops are served without click, and say exactly what
click says. Each invocation below runs twice, through pulsectl's entry point and through the click
group alone, on the same home (no pulsed: nothing changes between the two runs but what the
commands themselves write), and the two must agree byte for byte, exit code included."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest
from test_cli_imports import HEAVY, imported

from pulse.cli import fastpath
from pulse.cli.group import cli
from pulse.core.wire import eventmsgs
from pulse.store import eventsdb
from support import CTL_ZYGOTE, init_home

OFFERED = "gw_node-3-0123456789ab"
ENTRY, CLICK_ONLY = "main", "click"     # pulsectl's entry point; its click group alone
# the entry point in a fresh interpreter: for the one run that reads stdin, which the zygote's runs lack
ENTRY_PROGRAM = "import sys; sys.argv = ['pulsectl', *sys.argv[1:]]; from pulse.cli import main; main()"


def run(entry: str, home, *args: str, stdin: str = "", home_from_env: bool = False) -> tuple[int, str, str]:
    """`pulsectl --home HOME ARGS` (`home_from_env`: PULSE_HOME=HOME pulsectl ARGS) in a process of its
    own, forked from the test worker's zygote (a fresh interpreter when it reads stdin, which the
    zygote's runs do not have)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    env["PULSE_RUNTIME_DIR"] = str(home.parent / "run")
    if home_from_env:
        env["PULSE_HOME"] = str(home)
    argv = list(args) if home_from_env else ["--home", str(home), *args]
    if stdin:
        assert entry == ENTRY
        proc = subprocess.run([sys.executable, "-c", ENTRY_PROGRAM, *argv], env=env, input=stdin,
                              capture_output=True, text=True, timeout=60)
    else:
        proc = CTL_ZYGOTE.run(argv, env, 60, entry)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("fast") / "home"
    init_home(home)
    for title in ("first", "second \x1b[31mred\x1b[0m"):
        assert run(ENTRY, home, "task", "add", "--project", "p", "--title", title, "--prompt", "x")[0] == 0
    conn = eventsdb.open_events(home / "events.db")      # a task this host offered to the fleet
    eventsdb.append_events(conn, [eventmsgs.now_event(eventmsgs.FLEET_TASK_OFFERED, "pulsectl", OFFERED,
                                                      {"title": "far", "project": "p", "prompt": "x"})])
    conn.close()
    return home


# Served without click (fastpath.resolve finds them) ...
SERVED = [
    ["--version"],
    ["task", "list"], ["task", "list", "--json"], ["task", "list", "--status", "pending", "--status=acked"],
    ["events"], ["events", "-n", "3"], ["events", "--lines=2", "--json"], ["events", "--type", "task-created"],
    ["events", "--since", "10m", "--type", "task-created", "--type", "wake"],
    ["effects"], ["effects", "--pending", "-n", "5", "--json"],
    ["config", "--effective"],
    ["budget"], ["budget", "--json"],
    ["process", "list"], ["process", "list", "--json"],
    ["reload"], ["reload", "--wait", "0"], ["reload", "--wait=2.5"],
    ["task", "show", "1"], ["task", "show", "task-2", "--json"], ["task", "show", "--json", "2"], ["task", "show", "99"],
    ["task", "show", "gw_node-3-0123456789ab"], ["task", "show", "gw_node-3-0123456789ab", "--json"],
    ["task", "show", "gw_node-3-00000000000f"],
    ["--timeout", "2", "task", "list"], ["--timeout=2", "effects"],
    ["restart", "engine"], ["restart", "--no-wait", "tick"], ["start", "watcher", "--wait", "2"],
    ["stop", "executor", "--wait=1"], ["stop"], ["stop", "--no-wait"],
    ["--help"], ["-h"], ["task", "add", "--help"], ["task", "-h"], ["events", "--help"], ["fleet", "add", "--help"],
    ["--timeout", "2", "stop", "--help"],
    ["check-config"], ["vitals"], ["vitals", "nope"], ["vitals", "health", "--json"], ["instances"],
    ["instances", "--json"], ["logs"], ["logs", "-n", "3", "--worker", "tick"],
    ["schedule", "list"], ["schedule", "list", "--json"], ["schedule", "run", "nightly"],
    ["fleet", "status"], ["fleet", "tasks"], ["fleet", "tasks", "--json"], ["fleet", "events", "-n", "5"],
    ["fleet", "add", "--project", "p", "--title", "t", "--prompt", "x"],
    ["task", "add", "--project", "p", "--title", "t", "--prompt", "x", "--fleet"],
    ["gate", "sessions"], ["gate", "sessions", "--json"], ["gate-reset", "--agent", "nobody"],
    ["gate-reset", "operator-shell/none/1", "--keep-progress"],
    ["task", "output", "1"], ["task", "output", "1", "--attempt", "2"], ["task", "close", "99"],
    ["task", "close", "gw_node-3-00000000000f"], ["task", "give-up", "99", "--reason", "r"], ["task", "retry", "1"],
    ["budget", "reset", "nobody"], ["pause", "nope"], ["pause", "nope", "--for", "2h"], ["resume", "nope"],
    ["emit", "noop", "--param", "novalue"], ["web", "url"], ["web", "rotate-token"],
    ["process", "status", "nope"], ["process", "status", "nope", "--json"], ["process", "config", "nope", "--pin"],
    ["process", "restart", "nope", "--wait", "0"], ["process", "stop", "nope"], ["process", "start", "nope"],
    ["process", "logs", "nope", "-n", "5"],
    ["store", "check"], ["store", "compact", "--dry-run"], ["store", "restore-archived", "/nowhere/x"],
    ["engine"], ["engine", "log"], ["rollback", "--to", "nothing"],
    ["deploy"], ["promote", "-m", "msg"],
]
# ... and left to click, for its help and its errors.
LEFT = [
    ["--version", "task"], ["task", "add", "--title", "--help"], ["nope", "--help"], ["-i", "x", "--help"],
    ["events", "--type", "nope"], ["events", "--since", "yesterday-ish"], ["events", "-n", "x"],
    ["events", "-n"], ["events", "-n", "-1"], ["events", "-n3"], ["events", "--json=1"], ["events", "extra"],
    ["task", "list", "--status", "bogus"], ["task", "list", "--json", "--json"],
    ["task", "add", "--project", "p", "--title", "t"], ["task", "add", "--project", "p", "--title", "t", "--prompt"],
    ["task", "add", "--project", "p", "--title", "t", "--prompt", "x", "--priority", "high"],
    ["config"], ["budget", "reset"], ["budget", "--jsn"], ["--timeout", "soon", "effects"], ["effects", "--pending=yes"],
    ["process", "list", "--jsn"], ["process", "lst"],
    ["reload", "--wait", "soon"], ["reload", "--wait"], ["reload", "--wait", "-1"], ["reload", "now"],
    ["task", "show"], ["task", "show", "x"], ["task", "show", "1", "2"], ["task", "show", "-1"],
    ["task", "show", "gw_node-3-0123456789a"], ["task", "show", "1", "--help"],
    ["restart"], ["restart", "nope"], ["start", "engine", "--help"], ["stop", "engine", "tick"],
    ["restart", "engine", "--wait", "x"], ["stop", "--wait"], ["start", "engine", "--no-wait=1"],
    ["check-config", "extra"], ["vitals", "a", "b"], ["logs", "--worker", "nope"], ["logs", "-n", "many"],
    ["instances", "--jsn"], ["schedule", "run"], ["schedule", "lst"], ["fleet", "add", "--project", "p"],
    ["gate-reset"], ["gate-reset", "s", "--agent", "a"], ["task", "output", "x"], ["task", "close", "x"],
    ["task", "retry"], ["pause", "nope", "--for", "soon"], ["emit"], ["emit", "noop", "--deadline", "soon"],
    ["process", "config", "x", "--pin", "--restore"], ["process", "status"], ["process", "logs", "x", "-n", "-2"],
    ["web", "url", "extra"], ["notify", "test", "--wait", "x"],
    ["store", "backup"], ["store", "backup", "/etc/hostname"], ["store", "compact", "--dry-run", "x"], ["engine", "lg"],
    ["promote", "-m"],
]


@pytest.mark.parametrize("args", SERVED + LEFT, ids=" ".join)
def test_fast_path_says_what_click_says(home, args):
    assert (fastpath.resolve(["--home", str(home), *args]) is not None) == (args in SERVED)
    assert run(ENTRY, home, *args) == run(CLICK_ONLY, home, *args)


# -i NAME: the home of the running instance of that name (none runs here: both paths say so alike)
INSTANCE_SERVED = [["-i", "nosuch", "task", "list"], ["--instance=nosuch", "--timeout", "2", "events"],
                   ["-i", "nosuch", "gate", "sessions", "--json"]]
INSTANCE_LEFT = [["-i", "x", "--home", "h", "task", "list"], ["-i=x", "task", "list"], ["-i", "x", "nope"],
                 ["-i", "x", "--version"], ["-i", "x", "-i", "y", "effects"], ["-i", "x", "task", "list", "--help"],
                 ["-i", "x", "task", "list", "--jsn"], ["-i", "--home", "task", "list"]]


@pytest.mark.parametrize("args", INSTANCE_SERVED + INSTANCE_LEFT, ids=" ".join)
def test_an_instance_by_name_is_said_as_click_says_it(home, args, monkeypatch):
    monkeypatch.setenv("PULSE_HOME", str(home))
    monkeypatch.setenv("PULSE_RUNTIME_DIR", str(home.parent / "run"))
    served = args in INSTANCE_SERVED
    if served:     # resolve looks the instance up, and says there is none
        with pytest.raises(SystemExit):
            fastpath.resolve(args)
    else:
        assert fastpath.resolve(args) is None
    code, out, err = run(ENTRY, home, *args, home_from_env=True)
    assert (code, out, err) == run(CLICK_ONLY, home, *args, home_from_env=True)
    assert not served or (code == 1 and "nosuch" in err), err


@pytest.mark.parametrize("args", [
    ["task", "add", "--project", "p", "--title", "t", "--prompt", "x", "--priority", "3", "--tag", "a", "--tag=b"],
    ["task", "add", "--project", "p", "--title", "t", "--prompt", "   "],
    ["task", "add", "--project", "p", "--title", "t", "--prompt", "x", "--agent", "nobody"],
    ["task", "add", "--project", "p", "--title", "t", "--prompt", "x", "--tag", "!bad"],
])
def test_task_add_writes_and_says_what_click_does(home, args):
    """Each run adds a task (or refuses the same way): the ids follow on, the rest is the same."""
    assert fastpath.resolve(["--home", str(home), *args]) is not None
    code, out, err = run(ENTRY, home, *args)
    code2, out2, err2 = run(CLICK_ONLY, home, *args)
    if code == 0:
        number = int(out.strip().removeprefix("task-"))
        assert out2.strip() == f"task-{number + 1}"
        out2, err2 = out, err2.replace(f"task-{number + 1}", f"task-{number}")
    assert (code, out, err) == (code2, out2, err2)


def test_help_on_a_terminal_narrower_than_clicks_width_is_left_to_click(monkeypatch):
    """click wraps its help to the terminal's width: one narrower than the text generated ahead gets
    click's own; a wider one (or none) the same text as click prints."""
    monkeypatch.setenv("COLUMNS", "79")
    assert fastpath.resolve(["--help"]) is None
    monkeypatch.setenv("COLUMNS", "200")
    assert fastpath.resolve(["--help"]) is not None


def test_an_option_given_twice_is_left_to_click(home):
    """click takes the last of a repeated option: its rule, not one this parser repeats."""
    args = ["task", "add", "--project", "p", "--project", "q", "--title", "t", "--prompt", "x"]
    assert fastpath.resolve(["--home", str(home), *args]) is None


def test_prompt_from_stdin(home):
    code, out, _ = run(ENTRY, home, "task", "add", "--project", "p", "--title", "t", "--prompt", "-", stdin="from stdin")
    assert code == 0
    code, shown, _ = run(ENTRY, home, "events", "-n", "1", "--json")
    assert '"prompt":"from stdin"' in shown and out.strip() in shown


def test_missing_store_is_said_as_click_says_it(tmp_path):
    home = tmp_path / "nothing-here"
    for args in (["task", "list"], ["events"], ["effects"], ["budget"]):
        assert run(ENTRY, home, *args) == run(CLICK_ONLY, home, *args)


def test_each_option_table_is_its_click_commands():
    """A new option on a served command must be taught to fastpath too (else it would be refused
    there and sent to click: right, but slow), and no option may mean something else there."""
    kinds = {click.INT: fastpath.INT, click.FLOAT: fastpath.FLOAT}
    for words, served in fastpath.COMMANDS.items():
        ctx = click.Context(cli)
        command = cli.get_command(ctx, words[0])
        for word in words[1:]:
            command = command.get_command(ctx, word)
        declared = {}
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            kind = (fastpath.FLAG if param.is_flag else fastpath.MULTI if param.multiple
                    else kinds.get(param.type, fastpath.VALUE))
            default = None if param.multiple else param.default
            if type(default).__name__ == "Sentinel":     # click 8.3's UNSET: a flag is then False
                default = False if param.is_flag else None
            for name in param.opts:
                declared[name] = (param.name, kind, default)
        ours = {name: (o.dest, o.kind, None if o.kind == fastpath.MULTI else o.default)
                for name, o in served.options.items()}
        unserved = set(declared) - set(ours)
        assert unserved <= {"--help"}, (words, unserved)
        assert {name: declared[name] for name in ours} == ours, words
        required = set() if served.argument_optional else {served.argument} - {None}
        assert set(served.required) | required == {p.name for p in command.params if getattr(p, "required", False)}, words
        assert {p.name for p in command.params if isinstance(p, click.Argument)} == {served.argument} - {None}, words


@pytest.mark.parametrize("args", [["task", "list"], ["events", "-n", "5"], ["effects"], ["budget"],
                                  ["config", "--effective"], ["task", "show", "1"], ["--version"],
                                  ["check-config"], ["schedule", "list"], ["vitals"], ["logs"], ["gate", "sessions"],
                                  ["fleet", "tasks"]])
def test_served_commands_load_neither_click_nor_libzmq_nor_heavy_modules(tmp_path, home, args):
    modules, proc = imported(tmp_path, *args, home=home)
    assert proc.returncode == 0, proc.stderr
    assert not modules & (HEAVY | {"click"}), modules & (HEAVY | {"click"})


def test_worker_verbs_load_neither_click_nor_heavy_modules_on_their_way_to_pulsed(tmp_path, home):
    """No pulsed runs here: each says so, having loaded only what its request needs."""
    for args in (["restart", "engine"], ["stop"]):
        modules, proc = imported(tmp_path, *args, home=home)
        assert proc.returncode != 0 and "pulsed is not running" in proc.stderr, proc.stderr
        assert not modules & (HEAVY | {"click"}), (args, modules & (HEAVY | {"click"}))


def test_version_and_help_load_no_msgspec(tmp_path):
    for args in (["--version"], ["--help"]):
        modules, proc = imported(tmp_path, *args)
        assert proc.returncode == 0 and "msgspec" not in modules, args
