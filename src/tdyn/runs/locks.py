"""One writer per directory: a process writing a run, job, sweep or reproduction directory holds the
``fcntl`` lock of its ``.tdyn.lock`` (which names the holder, ``pid@host``) through :class:`Locks`;
a second writer is refused naming the holder (:class:`LockError`). A lock left by a killed process is
released by the kernel and taken over.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from pathlib import Path

try:
    import fcntl
except ImportError:   # not POSIX: lock files hold pid@host, checked by pid (see _acquire)
    fcntl = None

from tdyn.errors import UserError
from tdyn.runs.atomic import _MODE
from tdyn.runs.machine import host, pid_alive, writer_tag
from tdyn.runs.names import LOCK

log = logging.getLogger(__name__)


class LockError(UserError):
    """The directory is being written by another process (named, ``pid@host``)."""


_held: dict[str, list] = {}          # realpath of a directory this process has locked -> [fd, count]
_held_guard = threading.RLock()


def _forget_held_in_child() -> None:
    """A forked child (a sweep's pool worker) is another writer: it holds nothing. It closes its copies of
    the parent's lock descriptors (the parent's locks stay: ``flock`` ends when every copy is closed), so
    a worker outliving its parent cannot keep the parent's directories locked, and takes a new guard (a
    parent thread may have held the old one at the fork)."""
    global _held_guard
    _held_guard = threading.RLock()
    for fd, _ in _held.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_held_in_child)


def held_lock_files() -> set[str]:
    """The lock files (real paths) this process holds."""
    with _held_guard:
        return {os.path.join(k, LOCK) for k in _held}


def lock_holder(d: str | Path) -> str:
    """``pid@host`` that ``d``'s lock file names (its holder, or a dead writer's), or "" without one."""
    return _holder(os.path.join(d, LOCK))


def _holder(lock: str) -> str:
    try:   # never through a link, never blocking on a FIFO: only a lock file tdyn made names a holder
        fd = os.open(lock, os.O_RDONLY | _NOFOLLOW)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return os.pread(fd, 300, 0).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)


def holder_gone(holder: str) -> bool:
    """Whether the holder ``pid@host`` a lock file names is a process of this host that no longer runs."""
    pid, _, h = holder.partition("@")
    return h == host() and pid.isdigit() and not pid_alive(int(pid))


def _in_use(d: Path, holder: str) -> str:
    who = f"pid {holder}" if holder else "another process"
    why = " (that process has ended, but a process it started still holds the lock)" if holder_gone(holder) else ""
    return (f"{str(d)!r} is in use by {who}{why}: another tdyn process is writing it (lock file {LOCK}); "
            f"wait for it to finish or stop it")


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def _not_a_lock(shown: str, what: str) -> UserError:
    return UserError(f"{shown!r} is {what}, not a lock file tdyn made: tdyn writes its lock there and never "
                     f"writes through or into it; move it away (keep what it holds) and retry")


def _open_lock(lock: str, shown: str) -> int:
    """The lock file's descriptor, opened (or created) without following a symbolic link: a link or
    anything but a regular file at the lock path (a user's file linked there) is refused, naming it, and
    nothing is written into it."""
    if os.path.islink(lock):
        raise _not_a_lock(shown, f"a symbolic link (to {os.readlink(lock)!r})")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | _NOFOLLOW, _MODE)
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(lock):   # made a link between the check and the open
            raise _not_a_lock(shown, "a symbolic link") from None
        if e.errno == errno.EISDIR:
            raise _not_a_lock(shown, "a directory") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_a_lock(shown, "not a regular file (a FIFO, socket or device)")
    return fd


def _acquire(d: Path) -> str:
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(d)
    lock, mine = os.path.join(key, LOCK), writer_tag()
    with _held_guard:
        if key in _held:                 # this process already writes it (a nested call)
            _held[key][1] += 1
            return key
        for _ in range(20):
            fd = _open_lock(lock, os.path.join(d, LOCK))
            try:
                if fcntl is None:
                    raise OSError(errno.ENOSYS, "no fcntl")
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(lock)
                os.close(fd)
                raise LockError(_in_use(d, holder)) from None
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    os.close(fd)
                    raise
                holder = _holder(lock)   # no locks on this filesystem: the pid the file names decides
                if holder and holder != mine and not holder_gone(holder):
                    os.close(fd)
                    raise LockError(_in_use(d, holder)) from None
            try:   # a holder releasing removes the file: the one locked must still be the one there
                st, now_ = os.fstat(fd), os.stat(lock)
                same = (st.st_ino, st.st_dev) == (now_.st_ino, now_.st_dev)
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            previous = _holder(lock)
            if previous and previous != mine:
                log.warning("%s: took over the stale lock of pid %s (no longer running)", d, previous)
            os.ftruncate(fd, 0)
            os.pwrite(fd, (mine + "\n").encode(), 0)
            _held[key] = [fd, 1]
            return key
    raise LockError(f"{str(d)!r}: its lock file {LOCK} keeps being replaced; is another process starting on it?")


def _release(key: str) -> None:
    with _held_guard:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _held[key]
        fd, lock = entry[0], os.path.join(key, LOCK)
        try:
            st, now_ = os.fstat(fd), os.stat(lock)
            if (st.st_ino, st.st_dev) == (now_.st_ino, now_.st_dev):
                os.unlink(lock)          # while still locked: a waiting opener sees it gone and retries
        except OSError:
            pass
        os.close(fd)


class Locks:
    """Directory locks taken together and released together: ``with Locks() as locks: locks.acquire(d)``.

    Each directory's lock is ``fcntl.flock`` on ``d/.tdyn.lock``, which holds the writer's ``pid@host``.
    A directory another process holds is a :class:`LockError` naming it; a lock file left by a process
    that died is taken over (the kernel released its lock). The same process may lock a directory
    again (nested writers: a reproduction training into its own directory)."""

    def __init__(self):
        self._keys: list[str] = []

    def acquire(self, d: str | Path) -> None:
        self._keys.append(_acquire(Path(d)))

    def holds(self, d: str | Path) -> bool:
        return os.path.realpath(d) in self._keys

    def release(self) -> None:
        for k in reversed(self._keys):
            _release(k)
        self._keys = []

    def __enter__(self) -> "Locks":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
