"""pulsed, the supervisor: spawn, reap, restart, heartbeats, control socket, sd_notify.
"""

from pulse.core.leanimport import import_msgspec

# Before pulsed (pulse.supervisor.main) or its forkserver imports anything: pulsed keeps resident what
# it imports, and every pulsed start pays for both processes' imports.
import_msgspec()
