"""`pulsectl systemd install [--user]`: render the unit with this installation's real paths.

The unit templates ship as package data of `pulse.systemd` (the repository's
top-level `systemd/` folder). Rendering fills in:

    @PULSED@  absolute path of the `pulsed` console script beside the running
              interpreter, so the unit runs the installation that rendered it
    @USER@    the account the system unit runs pulsed as (`pulse` by default)

This module is imported on every pulsectl invocation: everything but click is
imported inside the functions.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import click

from pulse.cli.context import fail
from pulse.cli.group import Context, pass_ctx

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).

UNIT_NAME = "pulse.service"
INSTANCE_UNIT_NAME = "pulse@.service"     # one unit file, `systemctl enable --now pulse@a pulse@b`
SYSTEM_TEMPLATE = "pulse.service"
USER_TEMPLATE = "pulse-user.service"
SYSTEM_UNIT_DIR = "/etc/systemd/system"
SYSTEM_HOME = "/var/lib/pulse"        # the system unit's StateDirectory=pulse, PULSE_HOME
DEFAULT_USER = "pulse"


class RenderError(Exception):
    pass


def pulsed_path() -> str:
    """The `pulsed` console script that belongs to the running interpreter."""
    path = Path(sys.executable).absolute().parent / "pulsed"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise RenderError(f"no executable pulsed beside this interpreter ({path}); "
                          f"install pulse into {Path(sys.executable).absolute().parent.parent} "
                          "(pip install pulse-supervisor) and run its own pulsectl")
    return str(path)


def template(name: str) -> str:
    from importlib import resources

    try:
        return (resources.files("pulse.systemd") / name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as err:
        raise RenderError(f"the unit template {name} is not installed with this pulse "
                          f"(package data pulse.systemd): {err}") from None


def exec_path(path: str) -> str:
    """`path` as the command of an Exec*= line (systemd.syntax(7), systemd.service(5))."""
    if re.search(r'[\x00-\x1f\x7f"\'\\$]', path):
        raise RenderError(f"cannot put {path!r} in a unit file: quotes, backslashes, '$' and control "
                          "characters are not supported in the pulsed path")
    path = path.replace("%", "%%")                       # %% is a literal % (specifiers)
    return f'"{path}"' if re.search(r"\s", path) else path


def check_user_name(name: str) -> str:
    # The portable subset of what systemd accepts for User= (and what useradd accepts).
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,31}", name):
        raise RenderError(f"invalid user name {name!r}")
    return name


def render(text: str, pulsed: str, user: str | None) -> str:
    text = text.replace("@PULSED@", exec_path(pulsed))
    if user is not None:
        text = text.replace("@USER@", check_user_name(user))
    left = sorted(set(re.findall(r"@[A-Z_]+@", text)))
    if left:
        raise RenderError(f"placeholders left unfilled in the unit: {', '.join(left)}")
    return text


# The template unit is the system unit with a home, a runtime directory and a state directory per
# instance (%i), and the registry of running Pulses shared by them (/run/pulsed/instances, kept when
# one of them stops: the others' entries are in it). Made from pulse.service, so the two never drift.
INSTANCE_LINES = {
    "Description=Pulse supervisor (pulsed) for an AI agent's host":
        "Description=Pulse supervisor (pulsed) for an AI agent's host, instance %i",
    "StateDirectory=pulse": "StateDirectory=pulse/%i",
    "Environment=PULSE_HOME=/var/lib/pulse": "Environment=PULSE_HOME=/var/lib/pulse/%i",
    "RuntimeDirectory=pulsed": "RuntimeDirectory=pulsed/%i pulsed/instances\nRuntimeDirectoryPreserve=yes",
    "Environment=PULSE_RUNTIME_DIR=%t/pulsed": "Environment=PULSE_RUNTIME_DIR=%t/pulsed/%i",
}


def instance_template(text: str) -> str:
    """pulse.service made into the template unit pulse@.service."""
    lines = text.split("\n")
    for old, new in INSTANCE_LINES.items():
        if old not in lines:
            raise RenderError(f"the system unit template has no line {old!r} to make per instance")
        lines[lines.index(old)] = new
    return "\n".join(lines).replace(
        "# Installed by `pulsectl systemd install`,",
        "# Installed by `pulsectl systemd install --instance NAME` as pulse@.service (one\n"
        "# file for every instance: `systemctl enable --now pulse@a pulse@b`),", 1)


def check_instance_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise RenderError(f"invalid instance name {name!r}: 1 to 64 letters, digits and _ . - "
                          "(not starting with a symbol)")
    return name


def warnings(pulsed: str, user_unit: bool, user: str | None) -> list[str]:
    """What would keep the rendered unit from working on this host (best effort)."""
    out = []
    path = Path(pulsed)
    if any(path.is_relative_to(d) for d in ("/tmp", "/var/tmp")):
        out.append(f"{pulsed} is under /tmp or /var/tmp, which the unit's PrivateTmp=yes replaces: "
                   "pulsed will not be found; install Pulse elsewhere (e.g. a virtualenv in /opt)")
    if not user_unit:
        for parent in path.parents:
            if parent.exists() and not os.stat(parent).st_mode & 0o001:
                out.append(f"{parent} is not searchable by other users: user {user} may not reach {pulsed}")
                break
        import pwd
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            pass
        else:
            if entry.pw_uid != 0 and entry.pw_dir.rstrip("/") != SYSTEM_HOME:
                out.append(f"user {user} already exists with home {entry.pw_dir} (another program's "
                           f"account? PulseAudio's system user is also called pulse): pick a dedicated "
                           f"account with --user-name")
    return out


def user_unit_dir() -> str:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(config, "systemd", "user")


def write(directory: str, text: str, unit_name: str = UNIT_NAME) -> str:
    """Write <directory>/<unit_name> atomically (mode 0644); returns its path."""
    import tempfile

    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, unit_name)
    fd, tmp = tempfile.mkstemp(prefix=f".{unit_name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


def next_steps(target: str, user_unit: bool, user: str | None, installed: bool,
               instance: str | None = None) -> list[str]:
    import shlex

    pulsectl = shlex.quote(str(Path(sys.executable).absolute().parent / "pulsectl"))
    steps = []
    if not installed:
        where = "~/.config/systemd/user/" if user_unit else f"{SYSTEM_UNIT_DIR}/"
        steps.append(f"cp {shlex.quote(target)} {where}{INSTANCE_UNIT_NAME if instance else UNIT_NAME}")
    if instance is not None:
        return steps + [f"id -u {user} >/dev/null 2>&1 || useradd --system --home-dir {SYSTEM_HOME} "
                        f"--shell /usr/sbin/nologin {user}",
                        f"systemctl daemon-reload && systemctl enable --now pulse@{instance}",
                        f"sudo -u {user} {pulsectl} -i {instance} status   # or --home {SYSTEM_HOME}/{instance}"]
    if user_unit:
        steps += ["systemctl --user daemon-reload && systemctl --user enable --now pulse",
                  'loginctl enable-linger "$USER"   # keep it running while you are logged out',
                  f"{pulsectl} status"]
    else:
        steps += [f"id -u {user} >/dev/null 2>&1 || useradd --system --home-dir {SYSTEM_HOME} "
                  f"--shell /usr/sbin/nologin {user}",
                  "systemctl daemon-reload && systemctl enable --now pulse",
                  f"sudo -u {user} {pulsectl} --home {SYSTEM_HOME} status"]
    return steps


def with_home(text: str, home, user_unit: bool) -> str:
    """The unit with the home pulsectl was given (--home or PULSE_HOME) in place of the default one.
    A user unit takes any home; the system unit's is /var/lib/pulse, made by its StateDirectory=."""
    if home == Path("~/.pulse").expanduser().absolute():
        return text
    if not user_unit:
        if home == Path(SYSTEM_HOME):
            return text
        raise RenderError(f"--home {home}: the system unit's home is {SYSTEM_HOME} (its StateDirectory=); "
                          "--home is for a --user unit, --instance NAME gives another system home")
    if re.search(r'[\s\x00-\x1f\x7f"\'\\$%]', str(home)):
        raise RenderError(f"--home {str(home)!r}: a unit's paths here take no spaces, quotes, '$', '%' or backslashes")
    return text.replace("%h/.pulse", str(home))


@click.group()
def systemd() -> None:
    """Run pulsed under systemd."""


@systemd.command("install")
@click.option("--user", "user_unit", is_flag=True,
              help="A user unit (systemctl --user, home ~/.pulse) instead of the system unit.")
@click.option("--user-name", default=None, metavar="NAME",
              help=f"Account the system unit runs pulsed as [default: {DEFAULT_USER}].")
@click.option("--output", type=click.Path(file_okay=False), metavar="DIR",
              help="Write pulse.service into DIR instead of systemd's directory.")
@click.option("--print", "to_stdout", is_flag=True, help="Print the unit instead of writing it.")
@click.option("--instance", metavar="NAME",
              help="Write the template unit pulse@.service (home /var/lib/pulse/%i) and show how to "
                   "run the instance NAME; run it again with another NAME for more.")
@pass_ctx
def install(ctx: Context, user_unit: bool, user_name: str | None, output: str | None, to_stdout: bool,
            instance: str | None) -> None:
    """Render the Pulse unit for this installation of pulsed and install it.

    The system unit goes to /etc/systemd/system/pulse.service and runs pulsed
    as a dedicated user with the home /var/lib/pulse; --user writes
    ~/.config/systemd/user/pulse.service, which runs pulsed as you with the
    home ~/.pulse. --instance NAME writes the template unit
    /etc/systemd/system/pulse@.service instead: each instance has its own home
    /var/lib/pulse/NAME and runtime directory, so several run side by side.
    """
    if output and to_stdout:
        raise click.UsageError("--output and --print are exclusive")
    if instance is not None and user_unit:
        raise click.UsageError("--instance writes the system template unit; for a user's second Pulse, "
                               "run pulsed --home DIR")
    if user_unit and user_name is not None:
        raise click.UsageError("--user-name is for the system unit; a user unit runs as its own user")
    user = None if user_unit else (user_name or DEFAULT_USER)
    try:
        pulsed = pulsed_path()
        text = template(USER_TEMPLATE if user_unit else SYSTEM_TEMPLATE)
        if instance is not None:
            text = instance_template(text)
            check_instance_name(instance)
        text = render(text, pulsed, user)
        text = with_home(text, ctx.home, user_unit)
    except RenderError as err:
        fail(str(err))
    for warning in warnings(pulsed, user_unit, user):
        click.echo(f"pulsectl: warning: {warning}", err=True)
    if to_stdout:
        click.echo(text, nl=False)
        return
    directory = output or (user_unit_dir() if user_unit else SYSTEM_UNIT_DIR)
    unit_name = INSTANCE_UNIT_NAME if instance is not None else UNIT_NAME
    try:
        target = write(directory, text, unit_name)
    except OSError as err:
        hint = "" if output or user_unit else " (run as root, or use --output DIR / --print)"
        fail(f"cannot write {directory}/{unit_name}: {err.strerror}{hint}")
    who = "you" if user_unit else f"user {user}"
    click.echo(f"wrote {target} (runs {pulsed} as {who})")
    click.echo("next:")
    for step in next_steps(target, user_unit, user, installed=output is None, instance=instance):
        click.echo(f"  {step}")


COMMANDS = [systemd]
