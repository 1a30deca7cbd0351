"""pulsed, the supervisor: spawn, reap, restart, heartbeats, control socket, sd_notify.

Modules: `main` (the pulsed command), `arbiter` (the one loop), `child` (one
worker's state, the edges it may take, its restart policy), `forkserver` (forks workers from a clean,
preloaded process), `eventqueue` (lifecycle events, held until the event writer commits them),
`control` (control requests).
"""
