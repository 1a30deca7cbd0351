"""A loop's wakeup pipe: other threads write a byte to wake it; it drains the pipe when it wakes.
Both ends are non-blocking: a full pipe already means "woken", and an empty one "nothing more"."""

import os


def drain(fd: int) -> None:
    """Empty a non-blocking wakeup pipe."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def poke(fd: int) -> None:
    """Wake a loop from another thread through its pipe (already full means already woken)."""
    try:
        os.write(fd, b"\0")
    except BlockingIOError:
        pass
