"""What a pulsectl command imports, so that its speed does not rot: each module it does not need is
milliseconds of every invocation (operators and health checks run them in loops).

Each test runs pulsectl's entry point in a fresh interpreter and lists the modules it ended with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import click

from pulse.cli.group import COMMAND_MODULES, SHORT_HELP, cli
from support import init_home

GC_ON = "<the garbage collector is on>"     # PROBE's mark, beside the modules

# pulsectl's main() under a hook that prints sys.modules at the exit (the plain status path leaves
# through os._exit, which runs no atexit handler), and whether the garbage collector is on then: a line
# each (the probe imports no json: whether a command does is asked).
PROBE = textwrap.dedent(f"""\
    import gc, os, sys
    def report(code=0):
        with open(os.environ["PROBE_OUT"], "w") as f:
            f.write("\\n".join(sorted(sys.modules) + [{GC_ON!r}] * gc.isenabled()))
        real_exit(code)
    real_exit, os._exit = os._exit, report
    sys.argv = ["pulsectl", *sys.argv[1:]]
    from pulse.cli import main
    try:
        main()
    except SystemExit as exit:
        report(exit.code if isinstance(exit.code, int) else 1)
    report(0)
    """)

# Heavy for a command that does not use them: libzmq (loaded only to talk to pulsed), every effect
# kind's module, the engine's repository code, typing_extensions (through msgspec).
HEAVY = {"zmq", "pulse.effects.registry", "pulse.engine.repo", "typing_extensions", "importlib.metadata"}


def imported(tmp_path, *args: str, home=None, running=False) -> tuple[set[str], subprocess.CompletedProcess]:
    """`running`: the home's pulsed runs, and its runtime directory is the one recorded in the home."""
    out = tmp_path / "modules.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    env["PROBE_OUT"] = str(out)
    if home is not None:
        env["PULSE_HOME"] = str(home)
        if not running:
            env["PULSE_RUNTIME_DIR"] = str(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=60)
    assert out.exists(), proc.stderr
    return set(out.read_text().splitlines()), proc


def command_modules(modules: set[str]) -> set[str]:
    return {m for m in modules if m.removeprefix("pulse.cli.") in COMMAND_MODULES.values()}


def test_help_imports_no_command_module_and_nothing_heavy(tmp_path):
    modules, proc = imported(tmp_path, "--help")
    assert proc.returncode == 0 and "Commands:" in proc.stdout
    assert not command_modules(modules), "--help lists the commands from commandtable.SHORT_HELP, importing none"
    assert not modules & HEAVY, modules & HEAVY


# What pulsectl status does without: msgspec (~30 ms with its submodules), and so the Structs.
NOT_FOR_STATUS = HEAVY | {"click", "inspect", "dataclasses", "msgspec", "pulse.core.wire.controlmsgs"}


def test_plain_status_loads_neither_click_nor_zmq(tmp_path):
    modules, proc = imported(tmp_path, "status", home=tmp_path / "home")
    assert proc.returncode == 4, proc.stderr        # no pulsed on this home
    # (msgspec then: the registry of the Pulses that do run, to name them)
    assert not modules & (NOT_FOR_STATUS - {"msgspec"}), modules & NOT_FOR_STATUS


def test_task_add_rings_the_tick_without_zmq_and_checks_no_kind(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    modules, proc = imported(tmp_path, "task", "add", "--project", "p", "--title", "t", "--prompt", "x", home=home)
    assert proc.returncode == 0 and proc.stdout.startswith("task-"), proc.stderr
    # served without click (pulse.cli.fastpath): its body, none of the click commands' modules
    assert "pulse.cli.taskverbs" in modules and not command_modules(modules)
    assert not modules & (HEAVY | {"click"}), modules & (HEAVY | {"click"})


def test_status_task_add_and_reload_talk_to_a_running_pulsed_without_zmq(tmp_path, pulsed):
    """The request and the ring go over pulse.core.zmtp: libzmq is ~18 ms of import for one message."""
    pulsed.start()
    modules, proc = imported(tmp_path, "status", home=pulsed.home, running=True)
    assert proc.returncode == 0 and "running" in proc.stdout and "history: " in proc.stdout, proc.stderr
    assert "pulse.core.zmtp" in modules and not modules & NOT_FOR_STATUS, modules & NOT_FOR_STATUS
    # its history line reads pulse.store.historysize, not the mover (logging, dataclasses, zstandard, ~20 ms)
    assert not modules & {"pulse.store.retention", "pulse.store.archive", "logging", "dataclasses", "socket"}
    # ... and [store]'s bounds from pulsed's reply (Reply.store), not from the config (~12 ms)
    assert "of 512 MiB" in proc.stdout and "pulse.core.config" not in modules and "tomllib" not in modules
    modules, proc = imported(tmp_path, "task", "add", "--project", "p", "--title", "t", "--prompt", "x",
                             home=pulsed.home, running=True)
    assert proc.returncode == 0 and proc.stdout.startswith("task-"), proc.stderr
    assert "pulse.core.zmtp" in modules and not modules & (HEAVY | {"click"}), modules & (HEAVY | {"click"})
    assert "pulse.core.wire.controlmsgs" not in modules     # a ring asks pulsed nothing: no reply to decode
    # reload, served without click too (an operator runs it after each edit), nor the effect kinds' modules
    modules, proc = imported(tmp_path, "reload", home=pulsed.home, running=True)
    assert proc.returncode == 0 and "nothing to restart" in proc.stdout, proc.stderr
    assert "pulse.cli.reloadview" in modules and not command_modules(modules)
    assert not modules & (HEAVY | {"click"}), modules & (HEAVY | {"click"})


def test_status_says_the_bounds_pulsed_sent_and_reads_the_config_only_when_an_older_pulsed_sent_none(tmp_path):
    from pulse.cli import statusview
    paths = init_home(tmp_path / "home")
    (paths.home / "config.toml").write_text("[store]\nmax_mb = 64\nkeep_days = 7\n")
    sent = {"max_mb": 100, "keep_days": 3, "keep_free_mb": 10, "archive": False, "archive_max_mb": 0}
    assert {k: statusview.history_of(paths, sent)[k] for k in sent} == sent
    history = statusview.history_of(paths, None)
    assert (history["max_mb"], history["keep_days"], history["archive"]) == (64, 7, True)


# What reading a projection's checkpoint (pulse.store.projection) and the spend ledger once pulled in:
# inspect and dataclasses, logging, the archive's zstandard, statistics: ~35 ms of `budget` together;
# hashlib's OpenSSL (~3 ms) and linecache's tokenize (~1 ms) for a few KiB of sources and checkpoint.
NOT_FOR_READERS = {"inspect", "dataclasses", "logging", "statistics", "pulse.store.archive", "zstandard",
                   "_hashlib", "tokenize"}


def test_task_list_and_budget_read_their_projections_without_inspect_logging_or_the_archive(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    modules, proc = imported(tmp_path, "task", "list", home=home)
    assert proc.returncode == 0 and proc.stdout.startswith("ID "), proc.stderr
    assert "pulse.store.projection" in modules and not modules & (HEAVY | {"click"}), modules & (HEAVY | {"click"})
    assert not modules & NOT_FOR_READERS, modules & NOT_FOR_READERS
    assert "pulse.core.config" not in modules          # a listing needs no [[agent]]
    modules, proc = imported(tmp_path, "budget", home=home)
    assert proc.returncode == 0 and proc.stdout.startswith("AGENT "), proc.stderr
    assert "pulse.agents.spend" in modules and not modules & (HEAVY | {"click"}), modules & (HEAVY | {"click"})
    assert not modules & NOT_FOR_READERS, modules & NOT_FOR_READERS
    assert not modules & NOT_FOR_AGENT_TABLE_READERS, modules & NOT_FOR_AGENT_TABLE_READERS


# What loading config.toml does not need: the workers' slices (pulsed cuts them) and ast (the keys'
# help, read by init, check-config and the docs); nor, for the commands that read only the agents'
# tables (task add, task show, budget), the whole file's.
NOT_FOR_CONFIG_READERS = {"pulse.core.config.slices", "ast"}
NOT_FOR_AGENT_TABLE_READERS = NOT_FOR_CONFIG_READERS | {"pulse.core.config.whole", "pulse.core.config.services"}


def test_task_add_show_and_config_effective_load_what_they_read_of_the_config_and_not_the_archive(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    modules, proc = imported(tmp_path, "task", "add", "--project", "p", "--title", "t", "--prompt", "x", home=home)
    assert proc.returncode == 0 and "pulse.core.config.agenttables" in modules, proc.stderr
    assert not modules & NOT_FOR_AGENT_TABLE_READERS, modules & NOT_FOR_AGENT_TABLE_READERS
    modules, proc = imported(tmp_path, "task", "show", "task-1", home=home)   # its events all live: no archive
    assert proc.returncode == 0 and "unassignable" in proc.stdout, proc.stderr
    assert not modules & (NOT_FOR_READERS | NOT_FOR_AGENT_TABLE_READERS), modules & (NOT_FOR_READERS | NOT_FOR_AGENT_TABLE_READERS)
    modules, proc = imported(tmp_path, "config", "--effective", home=home)
    assert proc.returncode == 0 and "[timings]" in proc.stdout and "pulse.core.config.whole" in modules, proc.stderr
    assert not modules & NOT_FOR_CONFIG_READERS, modules & NOT_FOR_CONFIG_READERS


def test_the_commands_served_without_click_end_with_the_collector_off_and_clicks_keep_it(tmp_path):
    """Off: the passes over what the imports made were ~4 ms of a command that ends at once. On for
    click's commands, which may run for hours (`events --follow` turns it back on the same way)."""
    home = tmp_path / "home"
    init_home(home)
    modules, proc = imported(tmp_path, "task", "list", home=home)
    assert proc.returncode == 0 and GC_ON not in modules
    modules, proc = imported(tmp_path, "status", home=home)
    assert proc.returncode == 4 and GC_ON not in modules
    modules, proc = imported(tmp_path, "init", home=home)
    assert proc.returncode == 0 and GC_ON in modules, proc.stderr
    modules, proc = imported(tmp_path, "store", "check", home=home)    # served, but may run for minutes
    assert proc.returncode == 0 and "click" not in modules and GC_ON in modules, proc.stderr


def test_each_commands_line_in_help_is_its_docstrings_first_sentence():
    """commandtable.SHORT_HELP says what --help shows without importing the commands: it must match them."""
    ctx = click.Context(cli)
    for name in COMMAND_MODULES:
        command = cli.get_command(ctx, name)
        derived = command.get_short_help_str(limit=1000)
        assert name in SHORT_HELP, f"{name}: add its line to pulse/cli/commandtable.py: {derived!r}"
        # a first sentence longer than click's 45 characters may be said shorter there, on purpose
        assert SHORT_HELP[name] == derived or len(derived) > 45, (name, SHORT_HELP[name], derived)


def test_built_in_kinds_named_for_pulsectl_are_the_registrys():
    # check-config knows the built-in kinds from EffectKind, without importing every kind's module
    from pulse.core.wire.eventmsgs import EffectKind
    from pulse.effects import registry
    assert set(EffectKind) == set(registry.all_kinds())



# `pulsectl mcp` up to the moment it serves the client's initialize (its first line, on stdin; the
# gate is out of reach): the server's loop replaced by a report of what was imported by then and
# whom it serves.
MCP_PROBE = textwrap.dedent("""\
    import json, os, sys
    sys.argv = ["pulsectl", *sys.argv[1:]]
    from pulse.gate import mcpstdio
    def report(server, first):
        with open(os.environ["PROBE_OUT"], "w") as f:
            f.write(json.dumps({"modules": sorted(sys.modules), "socket": server.link.path, "first": first.decode(),
                                "token": server.link.hello.token, "agent": server.link.hello.agent}))
    mcpstdio.StdioServer.serve = report
    from pulse.cli import main
    main()
    """)
INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "probe", "version": "0"}}}) + "\n"
# Every agent run starts a `pulsectl mcp`: none of these is needed to carry its calls to the gate
# (the MCP SDK, with its event loop, only for a client that opens in the 2026-07-28 era).
NOT_FOR_MCP = {"click", "pulse.effects.registry", "pulse.cli.group", "zmq", "sqlite3", "mcp", "asyncio", "anyio"}


def mcp_imports(tmp_path, *args: str, **env: str) -> dict:
    out = tmp_path / "mcp-modules.json"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    proc = subprocess.run([sys.executable, "-c", MCP_PROBE, *args], env={**clean, **env, "PROBE_OUT": str(out)},
                          input=INITIALIZE, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and out.exists(), proc.stderr
    seen = json.loads(out.read_text())
    assert seen["first"] == INITIALIZE
    return seen


def test_an_agent_runs_pulsectl_mcp_without_click_the_store_the_registry_or_the_config(tmp_path):
    seen = mcp_imports(tmp_path, "--home", str(tmp_path / "out-of-reach"), "mcp", "--agent", "ignored",
                       PULSE_GATE_SOCKET=str(tmp_path / "gate.sock"), PULSE_RUN_TOKEN="a-run-token")
    assert (seen["socket"], seen["token"], seen["agent"]) == (str(tmp_path / "gate.sock"), "a-run-token", "ignored")
    modules = set(seen["modules"])
    assert not modules & (NOT_FOR_MCP | {"pulse.core.config"}), modules & (NOT_FOR_MCP | {"pulse.core.config"})
    assert sorted(m for m in modules if m.startswith(("pulse.store", "pulse.effects", "pulse.agents"))) == []
    assert sorted(m for m in modules if m.startswith("pulse.gate")) == ["pulse.gate", "pulse.gate.mcpstdio",
                                                                         "pulse.gate.protocol", "pulse.gate.proxy"]


def test_the_operators_pulsectl_mcp_reads_the_config_for_the_socket_and_nothing_heavier(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    (home / "config.toml").write_text(f'[gate]\nsocket_dir = "{tmp_path}"\n')
    seen = mcp_imports(tmp_path, "--home", str(home), "mcp")
    assert seen["socket"].startswith(str(tmp_path) + "/") and seen["socket"].endswith(".gate.sock")
    assert (seen["token"], seen["agent"]) == (None, None)
    modules = set(seen["modules"])
    assert not modules & NOT_FOR_MCP, modules & NOT_FOR_MCP
    assert sorted(m for m in modules if m.startswith(("pulse.store", "pulse.effects", "pulse.agents"))) == []


# pulse.core.leanimport in an interpreter without site (an editable install's finder loads pathlib and
# urllib.parse at startup): what it stands in for is absent after, and each works once imported for real.
LEAN = textwrap.dedent("""\
    import sys
    sys.path[:0] = sys.argv[1:]
    from pulse.core import leanimport
    leanimport.import_pathlib()
    leanimport.import_msgspec()
    leanimport.import_tomllib()
    stood_in = ("urllib.parse", "ipaddress", "platform", "textwrap", "typing_extensions", "msgspec.inspect", "string")
    assert not [m for m in stood_in if m in sys.modules], [m for m in stood_in if m in sys.modules]
    import pathlib, msgspec, uuid
    assert uuid._LINUX and uuid.uuid4().version == 4
    assert pathlib.PurePosixPath("/a b").as_uri() == "file:///a%20b"
    assert sys.modules["urllib.parse"].urlsplit("http://x/y").path == "/y"
    import tomllib
    assert tomllib.loads("k = 0xfF\\n_b-1 = 2") == {"k": 255, "_b-1": 2}
    import string
    assert string.Template("$x").substitute(x=1) == "1"
    import platform
    assert platform.system() == "Linux" and platform.python_implementation()
    class Doc(msgspec.Struct):
        '''First.
            Indented.'''
    assert msgspec.json.schema(Doc)["$defs"]["Doc"]["description"] == "First.\\nIndented."
    assert msgspec.inspect.type_info(int) == msgspec.inspect.IntType() and msgspec.inspect is sys.modules["msgspec.inspect"]
    colorsys = leanimport._module("colorsys")   # asked what it does not carry: the real module answers
    sys.modules["colorsys"] = colorsys
    assert colorsys.rgb_to_hsv(1, 0, 0) == (0, 1, 1) and sys.modules["colorsys"] is not colorsys
    print("ok")
    """)


def test_leanimport_stands_in_only_while_it_imports_and_the_real_modules_answer_after(tmp_path):
    import site
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-S", "-c", LEAN, root, *site.getsitepackages()],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr


# What commands that read a store once loaded for nothing: OpenSSL to hash a few bytes, dataclasses (and
# inspect) for the gate's ledger, zstandard where no archive segment is read, git (subprocess) where no
# rollback is the latest change, the template copier (shutil, importlib.resources) in `store check`.
NOT_FOR_STORE_READERS = {"_hashlib", "dataclasses", "inspect", "zstandard", "subprocess", "shutil",
                         "importlib.resources"}


def test_store_readers_load_no_openssl_dataclasses_zstandard_or_git_for_what_they_do_not_read(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    for args in (("gate", "sessions"), ("schedule", "list"), ("store", "check"), ("engine", "log")):
        modules, proc = imported(tmp_path, *args, home=home)
        assert proc.returncode == 0, (args, proc.stderr)
        assert not modules & (HEAVY | {"click"} | NOT_FOR_STORE_READERS), (args, modules & (HEAVY | {"click"} | NOT_FOR_STORE_READERS))
    for args in (("fleet", "tasks"), ("instances",), ("schedule", "list"), ("budget",), ("gate", "sessions")):
        # json: for their --json alone
        modules, proc = imported(tmp_path, *args, home=home)
        assert proc.returncode == 0 and "json" not in modules, (args, proc.stderr)
        modules, proc = imported(tmp_path, *args, "--json", home=home)
        assert proc.returncode == 0 and "json" in modules, (args, proc.stderr)


def test_check_config_opens_no_socket_for_a_web_page_that_is_off(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    modules, proc = imported(tmp_path, "check-config", home=home)
    assert proc.returncode == 0 and "socket" not in modules, (proc.stderr, "socket" in modules)


def test_the_commands_operators_run_in_loops_print_json_without_the_json_module(tmp_path):
    """events and effects print their data through msgspec, loaded already, --json or not (vitals.db's
    rows are read with json: json.dumps wrote NaN into some, which msgspec does not read)."""
    home = tmp_path / "home"
    init_home(home)
    for args in (("events",), ("events", "--json"), ("effects",), ("effects", "--json")):
        modules, proc = imported(tmp_path, *args, home=home)
        assert proc.returncode in (0, 1) and "json" not in modules, (args, proc.stderr)
