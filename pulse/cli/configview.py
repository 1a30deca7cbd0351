"""`pulsectl config --effective`, and the check of allow.kinds that check-config and reload make,
click-free: pulse.cli.configcmd declares them to click, pulse.cli.fastpath runs them without it."""

from __future__ import annotations

from pulse.cli.context import Context, echo

# Imports inside functions: pulsectl loads a command's module, and the views it imports, for any one of
# its commands (--help for none), so each command imports what only it uses: pulse.store ~5-25 ms,
# pulse.effects ~120-170 ms, pulse.report ~110 ms, pulse.engine.repo ~26 ms (python -X importtime, this
# 2-core host).


def effective(ctx: Context) -> None:
    """The configuration in force: the running pulsed's (and where it differs from config.toml),
    else config.toml's with every default and PULSE_* override."""
    import msgspec

    from pulse.core import client
    from pulse.core.config import Config, ConfigError, load, to_toml, without_secrets
    from pulse.core.wire import controlmsgs
    try:
        reply = client.request(ctx.paths, controlmsgs.GetConfig(), ctx.timeout)
    except client.Unreachable:
        on_disk = without_secrets(ctx.config())
        echo(f"# pulsed is not running: {ctx.paths.config} with every default and PULSE_* override")
        echo(to_toml(on_disk), nl=False)
        return
    running = msgspec.convert(reply.config, Config)
    echo("# what the running pulsed uses")
    try:
        file_only = without_secrets(load(ctx.paths.config, {}))   # the file and defaults, no PULSE_* override
    except ConfigError as err:
        echo(f"# {ctx.paths.config} is not valid now ({err}); pulsed keeps this until it is")
        file_only = running
    for key in differing(msgspec.to_builtins(running), msgspec.to_builtins(file_only)):
        echo(f"# {key}: not what {ctx.paths.config} says (a PULSE_* override, or an edit not yet reloaded)")
    echo(to_toml(running), nl=False)


def differing(running: object, on_disk: object, path: str = "") -> list[str]:
    """The dotted keys whose values differ between two plain configs (arrays of tables whole)."""
    if isinstance(running, dict) and isinstance(on_disk, dict):
        return [key for name in sorted(set(running) | set(on_disk))
                for key in differing(running.get(name), on_disk.get(name), f"{path}.{name}" if path else name)]
    return [] if running == on_disk else [path]


def unknown_kinds(ctx: Context, config) -> list[str]:
    """allow.kinds may name built-in kinds and the kinds the engine's executors declare; anything
    else is a typo (exit 78, with the nearest name). The engine is asked only when needed: loading
    it runs agent code, in a throwaway process."""
    from pulse.core.wire.eventmsgs import EffectKind
    if set(EffectKind).issuperset(config.allow.kinds):
        return []          # as nearly always: said without importing every kind's module (registry)
    from pulse.effects import registry
    problems = registry.unknown_kinds(config.allow.kinds)
    if problems and ctx.paths.engine.is_dir():
        from pulse.engine import repo
        try:
            declared = repo.probe(ctx.paths.engine)["kinds"]
        except repo.EngineDirError as err:
            echo(f"pulsectl: could not ask the engine which kinds it declares: {err}", err=True)
            declared = []
        problems = registry.unknown_kinds(config.allow.kinds, declared)
    return [f"{ctx.paths.config}: $.allow.kinds: {problem}" for problem in problems]
