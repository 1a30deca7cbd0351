"""What every process shares: stdlib, pyzmq and msgspec only, so pulsed can import it.

Modules: `config` (config.toml's schema and defaults), `wire` (every message that crosses a
process boundary), `states` (worker states and exit codes), `home` (the home and runtime
directory), `logs` (the one log writer), `procs` (process primitives), `sdnotify` (systemd's
notify protocol), `client` (sockets to a running pulsed).
"""
