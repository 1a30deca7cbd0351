"""The names a rotation gives the copies it keeps beside a file ([[watch.file]] action rotate):
`<file>.1.gz` (the newest) … `<file>.<keep>.gz`, and the hidden temporary copy it writes first.

The watcher never counts them as files to watch (a glob like `app.log*` matches them too), and
the rotate-file effect makes them; both read the names from here.
"""

from __future__ import annotations

import os
import re

COPY = re.compile(r"\.[0-9]+\.gz$")          # <file>.N.gz
TEMP_SUFFIX = ".pulse-rotating.gz"          # .<basename>.pulse-rotating.gz, beside the file


def copy_name(path: str, n: int) -> str:
    """The n-th newest copy of `path` (1: the last rotation)."""
    return f"{path}.{n}.gz"


def temp_name(path: str) -> str:
    """Where a rotation writes its copy before renaming it to copy_name(path, 1): hidden, so a
    glob like `*.log*` does not match it, and in the same directory, so the rename is atomic."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}{TEMP_SUFFIX}")


def is_copy(path: str) -> bool:
    """A copy a rotation keeps, or one it is writing: never a file to watch."""
    return bool(COPY.search(path)) or path.endswith(TEMP_SUFFIX)
