"""The notify executor: one notification through every configured channel (log, file, webhook, command)."""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request

from pulse.core import clock
from pulse.core.config import Notify
from pulse.effects.kinds import EffectContext, EffectFailed, run_process, tail
from pulse.core.wire import Effect

log = logging.getLogger("pulse.executor")


def notification(effect: Effect) -> dict:
    """The JSON every channel gets."""
    body = {k: v for k, v in effect.params.items() if k not in ("channels", "timeout_s")}
    return {"effect_id": effect.id, "ts": time.time(), "target": effect.target, "origin": effect.origin, **body}


def channel_label(channel: Notify, index: int) -> str:
    return channel.name or f"{channel.kind}#{index}"


def notify_log(channel: Notify, payload: dict, ctx: EffectContext) -> str:
    level = logging.getLevelName(str(payload.get("level", "info")).upper())
    log.log(level if isinstance(level, int) else logging.WARNING, "notify: %s",
            json.dumps(payload, default=str, sort_keys=True))
    return "logged"


def notify_file(channel: Notify, payload: dict, ctx: EffectContext) -> str:
    line = (json.dumps(payload, default=str, sort_keys=True) + "\n").encode()
    fd = os.open(channel.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line)        # one write with O_APPEND: lines from concurrent writers never interleave
        os.fsync(fd)
    finally:
        os.close(fd)
    return "appended"


def post_json(url: str, body: bytes, headers: dict, timeout_s: float) -> int:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "pulse", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def notify_webhook(channel: Notify, payload: dict, ctx: EffectContext) -> str:
    """POST, retried on 5xx, 408, 429 and network errors with doubling backoff, within the effect's deadline."""
    body = json.dumps(payload, default=str).encode()
    problem = "no attempt"
    for attempt in range(1 + max(0, channel.retries)):
        left = ctx.deadline - time.monotonic()
        if left <= 0:
            break
        try:
            status = post_json(channel.url, body, channel.headers, min(channel.timeout_s, left))
        except (urllib.error.URLError, OSError) as err:
            problem = str(getattr(err, "reason", err))
        else:
            if 200 <= status < 300:
                return f"HTTP {status} after {attempt + 1} attempt(s)"
            problem = f"HTTP {status}"
            if 400 <= status < 500 and status not in (408, 429):
                break                                   # the request itself is wrong: retrying won't help
        delay = clock.backoff(attempt + 1, 0.5, 5.0)
        if time.monotonic() + delay >= ctx.deadline:
            break
        time.sleep(delay)
    raise RuntimeError(problem)


def notify_command(channel: Notify, payload: dict, ctx: EffectContext) -> str:
    stdin = (json.dumps(payload, default=str) + "\n").encode()
    code, output, timed_out = run_process(channel.argv, ctx, stdin_data=stdin, timeout_s=channel.timeout_s)
    if timed_out:
        raise RuntimeError(f"timed out after {channel.timeout_s:g}s")
    if code != 0:
        raise RuntimeError(f"exit code {code}: {tail(output)[-200:].strip()}")
    return "exit code 0"


CHANNELS = {"log": notify_log, "file": notify_file, "webhook": notify_webhook, "command": notify_command}


def run_notify(effect: Effect, ctx: EffectContext) -> dict:
    wanted = effect.params.get("channels")
    channels = [(channel_label(c, i), c) for i, c in enumerate(ctx.config.notify)]
    if wanted is not None:
        unknown = set(wanted) - {label for label, _ in channels} if isinstance(wanted, list) else {wanted}
        if unknown:
            raise EffectFailed("bad-params", f"no such notify channel(s): {sorted(map(str, unknown))}")
        channels = [(label, c) for label, c in channels if label in wanted]
    payload = notification(effect)
    results, failed = {}, []
    for label, channel in channels:
        try:
            results[label] = CHANNELS[channel.kind](channel, payload, ctx)
        except Exception as err:                     # one broken channel must not keep the others silent
            results[label] = f"failed: {err}"
            failed.append(label)
    if failed:
        raise EffectFailed("notify", f"notify channel(s) failed: {', '.join(failed)}", channels=results)
    return {"channels": results}
