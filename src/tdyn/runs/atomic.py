"""Atomic, durable writes: a file is written whole or not at all (a temporary file
``.<name>.tdyn-<pid>@<host>.<random>.tmp`` in the same directory, fsync, rename), so a kill never leaves
a half-written file; many files at once with one flush (:func:`atomic_write_many`, ``syncfs`` where it
is safe), or written now and committed later in a group (:class:`GroupCommit`, the trainer's
write-behind); and the clean-up of the temp files a killed writer left (:func:`remove_stale_temps`).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

from tdyn.errors import WriteError
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


def _failed(e: BaseException, path: Path) -> BaseException:
    """An OSError of writing ``path`` as a :class:`~tdyn.errors.WriteError` naming ``path`` (the target,
    never the temp file: the target is left as it was); anything else as it is."""
    return WriteError(e, path) if isinstance(e, OSError) and not isinstance(e, WriteError) else e


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


class GroupCommit:
    """Files written now and put in place together later, with one flush to disk for them all.

    :meth:`write` puts each ``(path, data)`` in a temp file beside ``path``; :meth:`commit` makes every
    pending temp durable (from ``_BATCH_SYNC`` files on a filesystem that allows it, one ``syncfs`` per
    filesystem, opened before the first write so that a write-back error of any file is reported; else
    one ``fsync`` per file), renames them into place in the order they were first written, and then
    deletes the files :meth:`remove` named. Durability: a file appears under its name only once its
    contents are on disk, so a kill or a power loss at any moment leaves each file either as it was or
    wholly new; a kill before a commit loses only the pending writes, temp files that nothing reads
    (:func:`remove_stale_temps` deletes them). A path written again while pending gets the newer
    contents and keeps its place in the rename order: the caller's newer contents must promise all the
    older did (``metrics.jsonl`` renamed before the checkpoints written after it). A failed commit
    renames nothing more and removes the temps left; leaving a ``with`` block by an exception discards
    what is pending, leaving it normally commits it. ``window``: :meth:`due` once something is pending
    and the last commit is that many seconds old (the trainer's write-behind: one flush per window)."""

    def __init__(self, window: float = 0.0):
        self.window = window
        self._pending: dict[Path, str] = {}      # target → its newest temp file, in first-write order
        self._held: dict[Path, int] = {}         # fds of the first files to fsync one by one if no syncfs
        self._synced: dict[Path, bool] = {}      # parent → whether one syncfs of its filesystem covers it
        self._fs: dict[int, tuple[int, Path]] = {}   # device → (fd, path) of a directory on it, for syncfs
        self._remove: list[Path] = []
        self._batched = 0                        # files written that one syncfs covers
        self._last = -math.inf                   # monotonic time of the last commit

    def __len__(self) -> int:
        return len(self._pending)

    def __enter__(self) -> "GroupCommit":
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()

    def due(self) -> bool:
        """Whether something is pending and the last commit is ``window`` seconds old."""
        return bool(self._pending or self._remove) and time.monotonic() - self._last >= self.window

    def write(self, path: Path, data: bytes | Callable[[], bytes]) -> None:
        """``data`` into a temp file beside ``path``, renamed into place by the next :meth:`commit`.
        ``data`` may be a function giving the contents, called by the commit (in this place of the
        rename order): a file rewritten at every step, such as ``metrics.jsonl``, is written once a commit."""
        path = Path(path)
        parent = path.parent
        if parent not in self._synced:
            if not parent.is_dir():
                parent.mkdir(parents=True, exist_ok=True)
            dev = os.stat(parent).st_dev
            self._synced[parent] = _syncfs_covers(dev)
            if self._synced[parent] and dev not in self._fs:
                self._fs[dev] = (os.open(parent, os.O_RDONLY), parent)
        self._drop(path)
        if callable(data):
            self._pending[path] = data
        else:
            self._write_temp(path, data)

    def _write_temp(self, path: Path, data: bytes) -> None:
        parent = path.parent
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.tdyn-{writer_tag()}.", suffix=".tmp")
        try:
            self._pending[path] = tmp
            os.fchmod(fd, _MODE)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if not self._synced[parent]:
                os.fsync(fd)
            else:
                self._batched += 1
                if self._batched < _BATCH_SYNC:
                    self._held[path], fd = fd, -1
                elif self._held:           # from here on one syncfs covers them all
                    for held in self._held.values():
                        os.close(held)
                    self._held.clear()
        except BaseException as e:
            self._drop(path)
            self._pending.pop(path, None)
            failed = _failed(e, path)
            if failed is e:
                raise
            raise failed from e
        finally:
            if fd >= 0:
                os.close(fd)

    def _drop(self, path: Path) -> None:
        """Forget ``path``'s pending temp file (deleted), keeping its place in the rename order."""
        fd = self._held.pop(path, None)
        if fd is not None:
            os.close(fd)
        tmp = self._pending.get(path)
        if isinstance(tmp, str) and os.path.exists(tmp):
            os.unlink(tmp)

    def remove(self, path: Path) -> None:
        """Delete ``path`` after the next commit's renames (a file that the files committed replace)."""
        if Path(path) in self._pending:
            self._drop(Path(path))
            del self._pending[Path(path)]
        self._remove.append(Path(path))

    def commit(self) -> None:
        """Make every pending file durable, rename each into place, delete the files to remove."""
        renamed, target = 0, None     # target: the file whose write failed (a WriteError names it)
        try:
            for path, later in list(self._pending.items()):
                if callable(later):
                    self._write_temp(path, later())
            temps = list(self._pending.items())
            if self._batched >= _BATCH_SYNC:
                for dfd, d in self._fs.values():
                    if _SYNCFS(dfd) != 0:
                        e = ctypes.get_errno()
                        target = next((p for p, _ in temps if p.parent == d), temps[0][0] if temps else d)
                        raise OSError(e, f"{os.strerror(e)} (syncfs of the filesystem of {str(d)!r})")
            for target, fd in self._held.items():
                os.fsync(fd)
            for target, tmp in temps:
                os.replace(tmp, target)
                renamed += 1
        except BaseException as e:
            for _, tmp in list(self._pending.items())[renamed:]:
                if isinstance(tmp, str) and os.path.exists(tmp):
                    os.unlink(tmp)
            self._remove.clear()
            failed = _failed(e, target) if target is not None else e
            if failed is e:
                raise
            raise failed from e
        finally:
            self._reset()
            self._last = time.monotonic()
        for path in self._remove:
            path.unlink(missing_ok=True)
        self._remove.clear()

    def discard(self) -> None:
        """Delete every pending temp file: nothing is renamed or removed."""
        try:
            for path in list(self._pending):
                self._drop(path)
        finally:
            self._remove.clear()
            self._reset()

    def _reset(self) -> None:
        for fd in [*self._held.values(), *(dfd for dfd, _ in self._fs.values())]:
            os.close(fd)
        self._pending.clear()
        self._held.clear()
        self._fs.clear()
        self._synced.clear()
        self._batched = 0


def atomic_write_many(files: Iterable[tuple[Path, bytes]]) -> None:
    """Write each ``(path, data)`` whole or not at all, as :func:`atomic_write_bytes` does, with one
    flush to disk for them all (:class:`GroupCommit`): every temp file is written, then made durable,
    then renamed into place (a job of 80 runs writes 80 files at a time, and each fsync is a journal
    commit: benchmarks/README.md#measurements-behind-the-code). ``files`` may be a generator: each
    ``data`` is written as it comes, never all held. A failure leaves each file either as before or
    wholly new (its temp file removed)."""
    with GroupCommit() as batch:
        for path, data in files:
            batch.write(path, data)


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
