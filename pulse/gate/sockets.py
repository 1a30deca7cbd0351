"""Where the gate's sockets are: its main one, and where an agent account reaches the gate, a socket
of its own, in a directory only it can enter.

The gate's main socket is pulsed's account's alone (0600). A run under its own account ([[agent]]
user) cannot reach it; it is handed `<socket_dir>/<runtime>.gate-<uid>/gate.sock` instead, made
by the gate for each account the config names: the directory is made here (never one found in
place: a squatter's is refused, naming it), its socket bound while only root can enter it, then
the directory is given to that account, mode 0500. So no other account can even connect, let alone
send a byte, and what the account does to its own directory reaches nobody else. socket_dir itself
must be a real directory no other account may write to, or a link or a rename there could move
where the socket is made.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def socket_path(paths, socket_dir: str = "") -> str:
    """The gate's socket: in pulsed's private runtime directory, or in [gate] socket_dir (named for
    that runtime directory, so two homes never share one) when the runs' own accounts must reach it."""
    if not socket_dir:
        return str(paths.gate_socket)
    return os.path.join(socket_dir, f"{paths.runtime.name}.gate.sock")


class SocketDirError(Exception):
    """A directory the gate will not make its sockets in; the message says which and why."""


def account_dir(socket_dir: str, runtime: Path, uid: int) -> str:
    return os.path.join(socket_dir, f"{runtime.name}.gate-{uid}")


def account_socket(socket_dir: str, runtime: Path, uid: int) -> str:
    return os.path.join(account_dir(socket_dir, runtime, uid), "gate.sock")


def check_socket_dir(socket_dir: str, owner: int) -> None:
    """socket_dir must be a real directory (not a link) of root or `owner`, writable by nobody else."""
    try:
        st = os.lstat(socket_dir)
    except OSError as err:
        raise SocketDirError(f"[gate] socket_dir {socket_dir!r}: {err.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise SocketDirError(f"[gate] socket_dir {socket_dir!r} is not a directory (a link is refused)")
    if st.st_uid not in (0, owner):
        raise SocketDirError(f"[gate] socket_dir {socket_dir!r} belongs to uid {st.st_uid}, not to pulsed's "
                             f"account ({owner}) or root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SocketDirError(f"[gate] socket_dir {socket_dir!r} is writable by other accounts "
                             f"(mode {stat.S_IMODE(st.st_mode):o}): another account could move the gate's sockets")


def clear_stale(path: str, uid: int, owner: int) -> None:
    """Remove our own directory of an earlier life (a real directory, of root, pulsed's account or
    the account it was given to, and its entries, none followed); refuse anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, owner, uid):
        raise SocketDirError(f"{path} is in the way of the gate's socket for uid {uid} and is not one the "
                             "gate made (not a directory, or of another account): remove it")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, 0o700)          # its account may have taken write away: we remove what is in it
        for name in os.listdir(fd):
            try:
                os.unlink(name, dir_fd=fd)      # never follows: a link is removed, not its target
            except IsADirectoryError:
                raise SocketDirError(f"{path}/{name}: a directory the gate did not make: remove it") from None
    finally:
        os.close(fd)
    os.rmdir(path)


def make_account_dir(path: str, uid: int, owner: int) -> None:
    """A fresh directory only root (and pulsed's account) can enter, for the socket to be bound in."""
    clear_stale(path, uid, owner)
    os.mkdir(path, 0o700)


def hand_over(path: str, uid: int, gid: int) -> None:
    """Once its socket is bound: the directory is the account's, r-x for it alone."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o500)
    finally:
        os.close(fd)


def remove_account_dir(path: str, uid: int, owner: int) -> None:
    try:
        clear_stale(path, uid, owner)
    except (OSError, SocketDirError):
        pass            # the next gate's start says what is wrong with it
