"""msgspec imported without typing_extensions, by the processes that start often or stay resident.

msgspec uses typing_extensions when it is installed (the MCP SDK brings it in), and importing it
costs ~11-16 ms (python -X importtime), inspect, ast and dis included, and their pages stay resident
for the life of the process; no type of ours needs it. pulsectl, pulsed and its forkserver import
msgspec this way before anything else does; a module that needs typing_extensions itself (the MCP
SDK, in `pulsectl mcp`) imports it as usual afterwards.
"""

from __future__ import annotations

import sys


def import_msgspec() -> None:
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None
    try:
        import msgspec  # noqa: F401  (what this function is for)
    finally:
        del sys.modules["typing_extensions"]
