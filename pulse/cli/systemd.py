"""`pulsectl systemd install [--user]`: render the unit with this installation's real paths."""

import click

COMMANDS = []
