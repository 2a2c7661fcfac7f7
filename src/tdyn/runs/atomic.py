"""Atomic, durable writes: a file is written whole or not at all (a temporary file
``.<name>.tdyn-<pid>@<host>.<random>.tmp`` in the same directory, fsync, rename), so a kill never leaves
a half-written file; many files at once with one flush (:func:`atomic_write_many`, ``syncfs`` where it
is safe); and the clean-up of the temp files a killed writer left (:func:`remove_stale_temps`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import tempfile
from pathlib import Path
from typing import Iterable

from tdyn.runs.machine import host, pid_alive, writer_tag

_TMP_RE = re.compile(r"\.tdyn-(\d+)@(.+)\.[^.]+\.tmp$")   # a temp file's writer: pid@host
_TEMP_RE = re.compile(r"^\..+\.tdyn-.+\.tmp$")            # any temp file of atomic_write_many (for --force)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_MODE = 0o666 & ~_umask()   # what open() would give a new file: 0644 under umask 022


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a temp file in the same directory, fsync, rename), readable
    as the umask allows (``mkstemp`` alone would leave it 0600, unreadable by colleagues)."""
    atomic_write_many([(path, data)])


def _syncfs_fn():
    """libc's ``syncfs`` where it reports write errors (Linux ≥ 5.8): flushes one filesystem, one
    journal commit for any number of files. Python's ``os`` has no binding; None elsewhere."""
    if not hasattr(os, "sched_getaffinity"):     # not Linux
        return None
    try:
        if tuple(int(x) for x in re.findall(r"\d+", os.uname().release)[:2]) < (5, 8):
            return None
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError, ValueError):
        return None
    fn.argtypes = [ctypes.c_int]
    return fn


_SYNCFS = _syncfs_fn()
_BATCH_SYNC = 4     # from this many files on, one syncfs per filesystem instead of one fsync per file
#: Filesystems whose syncfs writes back every file's data (FUSE's does not reach its daemon; a network
#: filesystem's is its own matter): elsewhere each file gets its own fsync.
SYNCFS_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs"})


def mount_types(mountinfo: str) -> dict[int, str]:
    """Device number → filesystem type, from the text of ``/proc/self/mountinfo``."""
    out = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and len(fields) > 2 and ":" in fields[2] and right.split():
            major, minor = fields[2].split(":", 1)
            out.setdefault(os.makedev(int(major), int(minor)), right.split()[0])
    return out


@functools.lru_cache(maxsize=None)
def _syncfs_covers(dev: int) -> bool:
    """Whether one syncfs makes the files of device ``dev`` durable (see SYNCFS_FILESYSTEMS)."""
    if _SYNCFS is None:
        return False
    try:
        with open("/proc/self/mountinfo") as f:
            return mount_types(f.read()).get(dev) in SYNCFS_FILESYSTEMS
    except OSError:
        return False


def atomic_write_many(files: Iterable[tuple[Path, bytes]]) -> None:
    """Write each ``(path, data)`` whole or not at all, as :func:`atomic_write_bytes` does, with one
    flush to disk for them all: every temp file is written, then made durable, then renamed into place.
    From ``_BATCH_SYNC`` files on a filesystem that allows it (:data:`SYNCFS_FILESYSTEMS`, Linux ≥ 5.8),
    one ``syncfs`` per filesystem replaces the ``fsync`` of each file (a job of 80 runs writes 80 files at
    a time, and each fsync is a journal commit: benchmarks/README.md#measurements-behind-the-code); the filesystem is opened before the first
    write, so a write-back error of any of these files is reported. ``files`` may be a generator: each
    ``data`` is written as it comes, never all held. A failure leaves each file either as before or
    wholly new (its temp file removed)."""
    synced: dict[Path, bool] = {}   # parent → whether one syncfs of its filesystem covers it (else fsync per file)
    fs: dict[int, tuple[int, Path]] = {}    # device → (fd, path) of a directory on it, for syncfs
    temps: list[tuple[str, Path]] = []
    held: list[int] = []             # fds of the first batched files, fsynced one by one if the batch stays small
    batched = renamed = 0
    try:
        for path, data in files:
            path = Path(path)
            parent = path.parent
            if parent not in synced:
                if not parent.is_dir():
                    parent.mkdir(parents=True, exist_ok=True)
                dev = os.stat(parent).st_dev
                synced[parent] = _syncfs_covers(dev)
                if synced[parent] and dev not in fs:
                    fs[dev] = (os.open(parent, os.O_RDONLY), parent)
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.tdyn-{writer_tag()}.", suffix=".tmp")
            temps.append((tmp, path))
            try:
                os.fchmod(fd, _MODE)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if not synced[parent]:
                    os.fsync(fd)
                else:
                    batched += 1
                    if batched < _BATCH_SYNC:
                        keep, fd = fd, -1
                        held.append(keep)
            finally:
                if fd >= 0:
                    os.close(fd)
            if batched == _BATCH_SYNC:
                while held:
                    os.close(held.pop())
        if batched >= _BATCH_SYNC:
            for dfd, d in fs.values():
                if _SYNCFS(dfd) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"syncfs of the filesystem of {str(d)!r}: {os.strerror(e)}")
        while held:
            os.fsync(held[0])
            os.close(held.pop(0))
        for n, (tmp, path) in enumerate(temps):
            os.replace(tmp, path)
            renamed = n + 1
    except BaseException:
        for tmp, _ in temps[renamed:]:
            if os.path.exists(tmp):
                os.unlink(tmp)
        raise
    finally:
        for fd in held + [dfd for dfd, _ in fs.values()]:
            os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())

def remove_stale_temps(d: Path) -> list[Path]:
    """Delete the temporary files below ``d`` that no live writer owns: this process's own and those of
    dead processes on this host (a kill mid-write). Another live process's, another host's and temp
    files that do not name their writer are kept. Returns the files removed."""
    me, here, removed = os.getpid(), host(), []
    for tmp in Path(d).rglob(".*.tmp"):
        m = _TMP_RE.search(tmp.name)
        if m and m.group(2) == here and (int(m.group(1)) == me or not pid_alive(int(m.group(1)))):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed
