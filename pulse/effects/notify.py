"""The notify executor: one notification through every configured channel (log, file, webhook, command)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from pulse.core import clock
from pulse.core.config import Notify
from pulse.core.wire.enginerpc import Effect
from pulse.core.wire.eventmsgs import EventType
from pulse.effects.kinds import EffectContext, EffectFailed, run_process, tail

log = logging.getLogger("pulse.executor")


# Pulse's own fields of a notification: no param sets them. An agent's params could otherwise say
# it is survival (origin), which rule spoke (rule), which effect it was, or that it is a digest.
PULSE_FIELDS = ("effect_id", "ts", "target", "origin", "agent", "task", "rule", "digest", "held_back", "window_s")
AGENT_ORIGIN = "agent"


def notification(effect: Effect) -> dict:
    """The JSON every channel gets: the effect's params, under Pulse's own fields. An agent's carries
    its agent and task (stamped on its params by the gate's tool server, after the agent's own) and
    none of its params named as Pulse's fields."""
    body = {k: v for k, v in effect.params.items() if k not in ("channels", "timeout_s")}
    own = {"effect_id": effect.id, "ts": time.time(), "target": effect.target, "origin": effect.origin}
    if effect.origin == AGENT_ORIGIN:
        body = {k: v for k, v in body.items() if k not in PULSE_FIELDS}
        own.update(agent=str(effect.params.get("agent") or ""), task=str(effect.params.get("task") or ""))
    return {**body, **own}


def group_key(label: str, payload: dict) -> tuple:
    """Whose budget a notification takes on a channel: Pulse's (survival, the operator, the engine)
    per target; an agent's, its own, whatever target it names, so its notifications can never
    use up Pulse's burst, nor a new target each buy it a new one."""
    if payload.get("origin") == AGENT_ORIGIN:
        return (label, AGENT_ORIGIN, payload.get("agent"))
    return (label, "target", payload.get("target"))


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


def wanted_channels(effect: Effect, ctx: EffectContext) -> list[tuple[str, Notify]]:
    """(label, channel) of every configured channel, or of those `channels` names."""
    wanted = effect.params.get("channels")
    channels = [(channel_label(c, i), c) for i, c in enumerate(ctx.config.notify)]
    if wanted is not None:
        unknown = set(wanted) - {label for label, _ in channels} if isinstance(wanted, list) else {wanted}
        if unknown:
            raise EffectFailed("bad-params", f"no such notify channel(s): {sorted(map(str, unknown))}")
        channels = [(label, c) for label, c in channels if label in wanted]
    return channels


def send(label: str, channel: Notify, payload: dict, ctx: EffectContext) -> str:
    """One channel's answer; raises what the channel raised. A notification beyond the channel's
    burst is held back for the window's digest (it counts as taken); one the channel failed to take
    gives its place in the burst back."""
    if not GROUPS.admit(label, channel, payload, ctx):
        return "held back: the digest of this window will count it"
    try:
        return CHANNELS[channel.kind](channel, payload, ctx)
    except BaseException:
        GROUPS.release(label, payload)
        raise


def run_notify(effect: Effect, ctx: EffectContext) -> dict:
    """Every wanted channel that has not taken this notification yet (`notify` events, one per
    channel that did, across retries and executor restarts) is tried; each that takes it is
    recorded at once, so it is never sent twice there. Then:
    - every channel has taken it: acked, with each channel's answer;
    - a channel failed and the effect is not idempotent: failed (reason notify), never retried;
    - idempotent, and no channel has taken it yet: failed (reason notify), and the executor puts it
      back in the queue, with backoff, for as long as that lasts (the kind never expires it);
    - idempotent, some channel has taken it: the others are tried again until its deadline, then it
      is acked with the channels that never took it (`undelivered`)."""
    channels = wanted_channels(effect, ctx)
    payload = notification(effect)
    taken = {fact.get("channel"): fact.get("result") for fact in ctx.recorded("notify")}
    results, failed = {}, []
    for label, channel in channels:
        if label in taken:
            results[label] = f"{taken[label]} (taken before)"
            continue
        try:
            results[label] = send(label, channel, payload, ctx)
        except Exception as err:                     # one broken channel must not keep the others silent
            results[label] = f"failed: {err}"
            failed.append(label)
        else:
            ctx.record(EventType.NOTIFY, {"channel": label, "result": results[label]})
    if not failed:
        return {"channels": results}
    delivered = [label for label in results if label not in failed]
    if delivered and effect.idempotent and time.time() >= effect.deadline:
        return {"channels": results, "undelivered": failed}
    raise EffectFailed("notify", f"notify channel(s) failed: {', '.join(failed)}", channels=results,
                       delivered=delivered)


# -- grouping: a burst, then one digest a window, per channel and target --------------------------------

@dataclass
class _Group:
    opened: float                          # time.monotonic() when this window began
    channel: Notify
    ctx: EffectContext
    sent: int = 0                          # notifications sent in this window
    held: int = 0                          # held back in it
    last: dict | None = None               # the last one held back


class Grouping:
    """Per channel and group_key (a target of Pulse's, or one agent), as Alertmanager groups alerts:
    the first `burst` notifications of a window of `group_s` go out at once; the others are held back, and when the window ends one
    digest says how many were and carries the last of them. Runner threads admit; a flusher
    thread, started at the first hold, sends the digests of windows that ended. Kept in the
    executor's memory: a restarted executor opens every window afresh."""

    FLUSH_EVERY_S = 0.25

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.groups: dict[tuple, _Group] = {}
        self.flusher: threading.Thread | None = None

    def admit(self, label: str, channel: Notify, payload: dict, ctx: EffectContext) -> bool:
        """True: send it now; False: held back for this window's digest."""
        now = time.monotonic()
        with self.lock:
            key = group_key(label, payload)
            group = self.groups.get(key)
            if group is None or now - group.opened >= channel.group_s:
                ended = group if group is not None and group.held else None
                group = self.groups[key] = _Group(now, channel, ctx)
            else:
                ended = None
            if group.sent < channel.burst:
                group.sent += 1
                held = False
            else:
                group.held, group.last, held = group.held + 1, payload, True
                if self.flusher is None:
                    self.flusher = threading.Thread(target=self._flush_forever, name="notify-digests", daemon=True)
                    self.flusher.start()
        if ended is not None:
            self._send_digest(label, ended)     # the window ended with holds: its digest first
        return not held

    def release(self, label: str, payload: dict) -> None:
        """A notification admitted by `admit` was not taken by its channel: its place in the burst
        is free again (while the channel is down, nothing is held back: each is kept and retried)."""
        with self.lock:
            group = self.groups.get(group_key(label, payload))
            if group is not None and group.sent > 0:
                group.sent -= 1

    def _flush_forever(self) -> None:
        while True:
            time.sleep(self.FLUSH_EVERY_S)
            now = time.monotonic()
            with self.lock:
                ended = [(key, g) for key, g in self.groups.items() if now - g.opened >= g.channel.group_s]
                for key, _ in ended:
                    del self.groups[key]
            for (label, *_), group in ended:
                if group.held:
                    self._send_digest(label, group)

    def _send_digest(self, label: str, group: _Group) -> None:
        last = group.last or {}
        about = (f"from agent {last.get('agent')}" if last.get("origin") == AGENT_ORIGIN
                 else f"about {last.get('target')}")
        digest = {**last, "digest": True, "held_back": group.held, "window_s": group.channel.group_s,
                  "message": f"{group.held} more notification(s) {about} were held back "
                             f"in {group.channel.group_s:g}s; the last: {last.get('message', '')}"}
        held = group.ctx           # the held effect's time is up: the digest gets the channel's own
        fresh = EffectContext(held.config, held.objects, group.channel.timeout_s * (group.channel.retries + 1),
                              paths=held.paths)
        try:
            CHANNELS[group.channel.kind](group.channel, digest, fresh)
        except Exception as err:                 # nothing to retry it: say so where the operator looks
            log.error("notify: the digest for %s through %s could not be sent: %s", last.get("target"), label, err)


GROUPS = Grouping()
