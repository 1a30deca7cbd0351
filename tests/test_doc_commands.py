"""Every shell command block in README.md and docs/, as docs/rules.md's Python blocks
already are (tests/test_docs.py): each `pulsectl` command is checked against pulsectl's own parser
(click: its subcommands, options and arguments as written, a synopsis's options too), and those
that need no running pulsed are run against a temporary home and must exit 0. A block that is not
commands, and a command that is not pulsectl's, is exempted below by name, with the reason.
"""

from __future__ import annotations

import re
import shlex
import subprocess

import click
import pytest
from test_doc_snippets import DOCS, fenced_blocks

from support import PULSECTL

# Blocks that show something else than commands to type, by their first line.
NOT_COMMANDS = {
    "<home>/config.toml": "a map of the home's files",
    "systemd (Type=notify": "the process tree (docs/architecture.md)",
}

# Programs other than pulsectl that the docs show, and why their lines are not run here.
OTHER_PROGRAMS = {
    "python3": "makes a venv and installs: what CI's fresh-clone run does",
    ".venv/bin/pip": "installs: CI's fresh-clone run",
    ".venv/bin/pytest": "the test suite itself",
    ".venv/bin/pulsed": "runs pulsed in the foreground until stopped: checked against its own parser below",
    "kill": "signals a worker of a running pulsed (tests/test_kill_matrix.py does it)",
    "useradd": "creates a system user: root, and the host's",
    "systemctl": "drives the host's systemd (tests/test_systemd.py runs a unit on a user manager)",
    "nats": "the NATS CLI on an operator's cluster (docs/fleet.md); the tests make the streams through nats-py",
    "nats-server": "docs/fleet.md's one-machine start: tests/test_fleet.py runs that block as written",
    "printf": "docs/fleet.md's one-machine start: tests/test_fleet.py runs that block as written",
    "export": "an operator's own CLI's environment (docs/telemetry.md); tests/test_telemetry.py sends as it does",
}

# pulsectl commands that need no running pulsed, run for real against a fresh home.
RUN_OFFLINE = {("report",), ("instances",), ("check-config",), ("engine",), ("engine", "log"), ("store", "check"),
               ("guard",), ("store", "compact")}
# ... except these, each for its reason.
NOT_RUN = {
    "pulsectl report --analyst claude": "needs an [[agent]] named claude, and its CLI",
    "pulsectl systemd install": "writes /etc/systemd/system (root)",
    "pulsectl guard openclaw": "needs an OpenClaw on the host: tests/test_guard.py runs docs/guard.md's lines on a fake home",
}

SYNOPSIS = re.compile(r"[\[\]|…]|\.\.\.|\b[A-Z][A-Z_]*\b")     # [opt], a|b, ..., KEY: a form, not a command


def shell_blocks() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for line, text in fenced_blocks(doc, ("", "sh", "bash", "console", "shell")):
            out.append((f"{doc.name}:{line}", text))
    return out


def commands_of(text: str) -> list[str]:
    """The commands a block shows: its `$ ` lines if it has any (the rest is their output), else
    every line; comments dropped, `&&` chains and side-by-side synopses split."""
    lines = re.sub(r"\\\n\s*", " ", text).splitlines()      # a line continued with a backslash is one command
    prompted = [line[2:] for line in lines if line.startswith("$ ")]
    out = []
    for line in prompted or lines:
        line = re.split(r"\s{2,}#|^#", line)[0].strip()
        for part in re.split(r"\s+&&\s+|\s{3,}(?=pulsectl )", line):
            if part.strip():
                out.append(part.strip())
    return out


def program(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_]+=", words[0]):      # PULSE_HOME=/var/lib/pulse pulsectl status
        words.pop(0)
    return words[0], words[1:]


def resolve(args: list[str]) -> tuple[list[str], click.Command, list[click.Command]]:
    """Parse a concrete pulsectl command line as pulsectl would, without running it: its path of
    subcommands, the command, and the chain of commands; a click.UsageError when it is wrong."""
    from pulse.cli.group import cli
    ctx = cli.make_context("pulsectl", list(args))
    command, path, chain = cli, [], [cli]
    while isinstance(command, click.Group):
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            break
        name, command, rest = command.resolve_command(ctx, rest)
        path.append(name)
        chain.append(command)
        ctx = command.make_context(name, rest, parent=ctx)
    return path, command, chain


def check_synopsis(args: list[str]) -> None:
    """A form such as `pulsectl events [--type T] [-f]`: its subcommands exist, every option it
    names is one that command (or pulsectl itself) takes, and each placeholder for an argument
    (`DEST`, `[COMMIT]`) is one the command has, by the name its help gives it."""
    from pulse.cli.group import cli
    words = [w for w in re.split(r"[\s\[\]|]+", " ".join(args).replace("...", " ").replace("…", " ")) if w]
    command, chain, placeholders, after_option = cli, [cli], [], None
    for word in words:
        if isinstance(command, click.Group) and not word.startswith("-") and word in command.list_commands(None):
            command = command.get_command(None, word)
            chain.append(command)
            after_option = None
        elif word.startswith("-"):
            option = word.split("=")[0]
            params = {name: p for c in chain for p in c.params for name in (*p.opts, *p.secondary_opts)}
            where = " ".join(c.name for c in chain)
            assert option in params or option in ("-h", "--help"), f"{option} is no option of {where}"
            param = params.get(option)
            after_option = param if param is not None and not getattr(param, "is_flag", False) else None
        elif after_option is not None:
            after_option = None             # the option's value (`--type T`, `-i NAME`)
        elif re.fullmatch(r"[A-Z][A-Z_]*", word):
            placeholders.append(word)
    names = [p.human_readable_name for p in command.params if isinstance(p, click.Argument)]
    for word in placeholders:
        assert word in names, f"{word}: {' '.join(c.name for c in chain)} takes {names or 'no argument'}"


def inline_forms() -> list:
    """`pulsectl ...` in running text and tables: forms, checked as synopses."""
    out = []
    for doc in DOCS:
        for form in sorted(set(re.findall(r"`(pulsectl [^`]+)`", doc.read_text()))):
            out.append(pytest.param(form, id=f"{doc.name}:{form[:60]}"))
    return out


@pytest.mark.parametrize("form", inline_forms())
def test_each_pulsectl_form_in_the_text_is_one_pulsectl_takes(form):
    for one in re.split(r"`?,\s*`?", form):
        words = one.split()
        if words and words[0] == "pulsectl":
            check_synopsis(words[1:])


BLOCKS = shell_blocks()


def test_every_shell_block_is_commands_or_exempted():
    assert len(BLOCKS) >= 8
    for where, text in BLOCKS:
        first = text.lstrip().splitlines()[0]
        if any(first.startswith(key) for key in NOT_COMMANDS):
            continue
        for command in commands_of(text):
            name, _ = program(command)
            assert name == "pulsectl" or name in OTHER_PROGRAMS, f"{where}: {command!r}: not pulsectl's and not exempted"


def pulsectl_lines() -> list:
    out = []
    for where, text in BLOCKS:
        if any(text.lstrip().startswith(key) for key in NOT_COMMANDS):
            continue
        for command in commands_of(text):
            name, args = program(command)
            if name == "pulsectl":
                out.append(pytest.param(command, args, id=f"{where}:{command[:60]}"))
    return out


@pytest.mark.parametrize(("command", "args"), pulsectl_lines())
def test_each_pulsectl_command_in_the_docs_is_one_pulsectl_takes(command, args):
    if SYNOPSIS.search(" ".join(args)):
        check_synopsis(args)
        return
    try:
        resolve(args)
    except click.UsageError as err:
        pytest.fail(f"{command!r}: {err.format_message()}")


def test_pulsed_as_the_docs_start_it_is_what_pulsed_takes():
    from pulse.supervisor import main
    checked = 0
    for where, text in BLOCKS:
        if any(text.lstrip().startswith(key) for key in NOT_COMMANDS):
            continue
        for command in commands_of(text):
            name, args = program(command)
            if name.endswith("pulsed"):
                checked += 1
                assert main.parse(args)[0] is None, f"{where}: {command!r}"
    assert checked


def test_the_commands_that_need_no_pulsed_run_against_a_fresh_home(tmp_path):
    home = tmp_path / "home"
    subprocess.run([PULSECTL, "--home", str(home), "init"], check=True, capture_output=True, timeout=60)
    ran = []
    for param in pulsectl_lines():
        command, args = param.values
        if SYNOPSIS.search(" ".join(args)) or command in NOT_RUN:
            continue
        path, _, _ = resolve(args)
        if tuple(path) not in RUN_OFFLINE:
            continue
        out = subprocess.run([PULSECTL, "--home", str(home), *args], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
        assert out.returncode == 0, f"{command!r} exited {out.returncode}: {out.stderr}"
        assert "Traceback" not in out.stderr
        ran.append(command)
    assert len(ran) >= 4, ran
