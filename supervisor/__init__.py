"""pulsed, the supervisor: spawn, reap, restart, heartbeats, control socket, sd_notify.
"""
