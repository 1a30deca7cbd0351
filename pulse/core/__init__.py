"""What every process shares: stdlib, pyzmq and msgspec only, so pulsed can import it
(`guarded` and `toolscan` alone use psutil, and pulsed never imports them).

Modules: `config` (config.toml's schema, defaults and per-worker slices), `argvtemplate` (an
[[agent]]'s argv placeholders), the package `wire` (every
message that crosses a process boundary, one module per family), `states` (worker, effect and task states, exit
codes), `childspecs` (what each worker is to pulsed, one row each), `home` (the home and
runtime directory), `logs` (the one log writer), `procs`
(process primitives and the one git runner), `clock` (UTC stamps, durations, backoff),
`sdnotify` (systemd's notify protocol), `client` (sockets to a running pulsed; pyzmq, imported
only by what talks to pulsed), `zmtp` (pulsectl's one request and its rings in ZMTP 3.0, without
pyzmq), `instances`
(the registry of running Pulses on the host), `guarded` (how a [[process]] is found; psutil,
imported by the workers only), `plugins` (the Watcher and Executor an engine plugs in, which the
built-in sensors are too), `wakepipe` (a loop's wakeup pipe), `rotation` (the names of the
copies a file's rotation keeps beside it), `schedule` (a [[schedule]]'s slots and the fold of
what it ran; croniter, imported only where a cron expression is read), `fleetnames` (the fleet's
subjects, buckets, host tokens and view, for the fleet worker and `pulsectl fleet`), `safepath`
(paths reached without following a link, and acted on with the rights of whoever could place them),
`dirscan` (a [[watch.dir]] directory's files, walked without following a link, planned oldest
first, and which of them a process holds open for writing),
`staleness` (when a [[watch.fresh]] is stale: its samples' last sign of work against within_s),
`toolscan` (what of OpenClaw, Hermes and LiteLLM is on the host, for `pulsectl guard`; psutil), and
the package `presets` (the [[process]] presets, as data, merged by `config`).
"""
