"""`pulsectl process config PROCESS [--pin | --restore]`: a [[process]]'s config files, known good
against current (hashes, times, a diff summary); take the current files as known good, or write
the known-good ones back by hand. Both are effects of origin `operator` (keep-config,
restore-config), so each is in the history like every operator action; after a restore,
processWatchdog restarts the process, as after its own.
"""

from __future__ import annotations

import json
import sys

import click

from pulse.cli.group import Context, pass_ctx
from pulse.core import clock

SHORT_HASH = 12                 # hex digits of a sha256 shown beside a file


@click.group()
def process() -> None:
    """A critical process ([[process]])."""


def configured(ctx: Context, name: str):
    """The [[process]] named `name`, with config files; exit 2 saying what is wrong otherwise."""
    processes = ctx.config().process
    proc = next((p for p in processes if p.name == name), None)
    if proc is None:
        click.echo(f"pulsectl: no [[process]] named {name!r} in config.toml "
                   f"(known: {', '.join(p.name for p in processes) or 'none'})", err=True)
        sys.exit(2)
    if not proc.config:
        click.echo(f"pulsectl: [[process]] {name!r} lists no config files: add config = [\"/path/to/file\"]", err=True)
        sys.exit(2)
    return proc


def when(ts: float | None) -> str:
    return "never" if ts is None else clock.iso(ts, ms=False)


def short(digest: str | None) -> str:
    return "-" if not digest else digest[:SHORT_HASH]


def file_report(path: str, good: str | None, state: dict, objects_root) -> dict:
    """One config file, known good against current: its verdict and, when they differ, a diff summary
    (known good → current)."""
    from pulse.effects import configfiles
    from pulse.store import objects
    if good is None:
        verdict = "never kept (never restored)"
    elif "error" in state:
        verdict = f"unreadable: {state['error']}"
    elif state.get("missing"):
        verdict = "missing (known good kept)"
    else:
        verdict = "known good" if state.get("sha256") == good else "changed since known good"
    out = {"path": path, "verdict": verdict, "known_good": good, "current": state}
    if good is not None and state.get("sha256") != good and "error" not in state:
        try:
            before = objects.get(objects_root, good)
            if not state.get("missing"):
                with open(path, "rb") as current:
                    out["diff"] = configfiles.diff_summary("known good → current", before,
                                                           current.read(objects.MAX_FILE_BYTES))
        except (OSError, ValueError) as err:
            out["diff"] = f"no diff: {getattr(err, 'strerror', None) or err}"
    return out


def show(proc, known, restores, objects_root, as_json: bool) -> None:
    from pulse.store import objects
    files = [file_report(path, known.files.get(path), objects.file_state(path), objects_root) for path in proc.config]
    last = restores[-1] if restores else None
    if as_json:
        click.echo(json.dumps({"process": proc.name, "kept_at": known.kept_at, "pinned": known.pinned,
                               "files": files, "last_restore": None if last is None else
                               {"ts": last.ts, "type": last.type, **last.data}}, default=str))
        return
    by = "pinned by an operator" if known.pinned else "kept by survival"
    click.echo(f"{proc.name}: {len(proc.config)} config file(s); "
               + (f"known good {by} at {when(known.kept_at)}" if known.kept_at else "nothing kept as known good yet"))
    for f in files:
        state = f["current"]
        click.echo(f"  {f['path']}: {f['verdict']}")
        if f["known_good"]:
            click.echo(f"    known good  {short(f['known_good'])}")
        if "sha256" in state:
            click.echo(f"    current     {short(state['sha256'])}  {state['size']} bytes, changed {when(state['ctime'])}")
        elif state.get("missing"):
            click.echo("    current     missing")
        for line in (f.get("diff") or "").splitlines():
            click.echo(f"    {line}")
    if last is not None:
        outcome = last.type.removeprefix("effect-")
        click.echo(f"last restore: {when(last.ts)}, {outcome}" + (f": {last.data['error']}" if last.data.get("error") else ""))
        for f in last.data.get("files") or []:
            if f.get("restored"):
                replaced = f"what it replaced is kept as {f['broken']}" if f.get("broken") else "it was missing"
                click.echo(f"  {f['path']}: written back; {replaced}")


@process.command("config")
@click.argument("name")
@click.option("--pin", is_flag=True, help="Take the current files as known good.")
@click.option("--restore", is_flag=True, help="Write the known-good files back (processWatchdog then restarts it).")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
@click.option("--wait", default=15.0, show_default=True, help="Seconds to wait for --pin or --restore to be done.")
@pass_ctx
def config(ctx: Context, name: str, pin: bool, restore: bool, as_json: bool, wait: float) -> None:
    """NAME's config files: known good against current; --pin or --restore to act on them."""
    from pulse.cli.pipeline import _connect, queue_effect
    from pulse.core import wire
    from pulse.effects import configfiles
    from pulse.store import objects
    if pin and restore:
        raise click.UsageError("--pin and --restore are exclusive")
    proc = configured(ctx, name)
    deadline_s = ctx.config().timings.effect_deadline_s
    if pin:
        sys.exit(queue_effect(ctx, wire.Effect(kind=configfiles.KEEP, target=name, idempotent=True), deadline_s, wait))
    known, restores = configfiles.known_good_of(_connect(ctx, "events.db"), name)
    if restore:
        files = {path: objects.ref(digest) for path, digest in sorted(known.files.items()) if path in proc.config}
        if not files:
            click.echo(f"pulsectl: nothing of {name} was kept as known good, so nothing can be restored "
                       "(Pulse never writes a file it did not keep); --pin keeps the current files", err=True)
            sys.exit(1)
        effect = wire.Effect(kind=configfiles.RESTORE, target=name, params={"files": files, "why": "operator"})
        sys.exit(queue_effect(ctx, effect, deadline_s, wait))
    show(proc, known, restores, ctx.paths.objects, as_json)


COMMANDS = [process]
