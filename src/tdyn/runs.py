"""Run directories: ``config.json``, ``meta.json``, ``metrics.jsonl``, ``checkpoints/*.safetensors``.

Every file is written atomically (temporary file ``.<name>.tdyn-<pid>@<host>.<random>.tmp`` in the
same directory, fsync, rename), so a kill never leaves a half-written file. Checkpoints are safetensors
(no pickle); a checkpoint at step t holds the state *before* step t's update (as the Scan and Snap
authors' ``iter-t.pth``), the optimizer state and the data RNG state; ``final.safetensors`` holds the
state after the last update. Each carries the SHA-256 of its tensors in its metadata
(:func:`tensor_checksum`), verified whenever it is read.

Whatever reads a file checks it: a missing, truncated, garbled or ill-typed file is a
:class:`CorruptFile` error (a UserError: exit 2) naming the file and what is wrong.

One writer per directory: a process writing a run, job, sweep or reproduction directory holds the
``fcntl`` lock of its ``.tdyn.lock`` (which names the holder, ``pid@host``) through :class:`Locks`;
a second writer is refused naming the holder. A lock left by a killed process is released by the
kernel and taken over.
"""

from __future__ import annotations

import csv
import ctypes
import errno
import functools
import hashlib
import io
import json
import logging
import os
import re
import shutil
import socket
import struct
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable

import datetime as _dt
import numpy as np
import platform
import subprocess
import torch
from safetensors.torch import load as load_safetensors, save

try:
    import fcntl
except ImportError:   # not POSIX: lock files hold pid@host, checked by pid (see _acquire)
    fcntl = None

from tdyn.config import RunConfig, validate_config
from tdyn.errors import UserError
from tdyn.tasks import Member, build_task

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- file names (defined here only)

CONFIG = "config.json"          # a run's resolved config (trains that member alone)
META = "meta.json"              # versions, seed, times, status
METRICS = "metrics.jsonl"       # one record per evaluation
CKPT_DIR = "checkpoints"        # step-XXXXXXX.safetensors and final.safetensors
FINAL = "final.safetensors"
ENSEMBLE = "ensemble.json"      # a job's manifest: config, members, member directories
SWEEP = "sweep.json"            # a sweep's spec and every run's status
SUMMARY = "summary.csv"         # a sweep's per-cell summary
RESULTS = "results.json"        # a reproduction's claims and numbers
REPRODUCE = "reproduce.json"    # a `reproduce --all` directory's options, metadata, each reproduction's status
LOCK = ".tdyn.lock"             # the writer's lock (pid@host) while a process writes the directory
JOBS = ".jobs"                  # a sweep's job directories (ensemble.json of each job, their locks)
REPRODUCING = ".reproducing.json"   # a reproduction under way (its name): removed once its results.json is written

STATUSES = ("running", "finished", "diverged", "failed", "interrupted")   # meta.json's status
DONE = ("finished", "diverged")                                          # a result: nothing left to train
CHECKSUM = "sha256"             # checkpoint metadata key: tensor_checksum of its tensors

_STEP_RE = re.compile(r"step-(\d+)\.safetensors$")
_TMP_RE = re.compile(r"\.tdyn-(\d+)@(.+)\.[^.]+\.tmp$")   # a temp file's writer: pid@host


class CorruptFile(UserError):
    """A file of a tdyn directory is missing, truncated, garbled or inconsistent; names it and what is wrong."""

    def __init__(self, path: Path, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{str(path)!r} {problem}")


def host() -> str:
    return socket.gethostname()


def writer_tag() -> str:
    """``pid@host`` of this process: what lock files and temp file names record."""
    return f"{os.getpid()}@{host()}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):   # no /proc here
        return True


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
    one ``syncfs`` per filesystem replaces the ``fsync`` of each file (a journal commit costs ~0.2 ms
    here, and a job of 80 runs writes 80 files at a time); the filesystem is opened before the first
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


_leaf = json.JSONEncoder(allow_nan=False).encode    # one value: C-encoded (a container is never passed)


class _NotPlain(Exception):
    """A dict key that is not a str: left to json.dumps, which converts it."""


def _indented(obj: Any, pad: str) -> str:
    """``obj`` as json.dumps(indent=2) writes it at indentation ``pad``: containers here, values by json's C encoder."""
    inner = pad + "  "
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        if not all(type(k) is str for k in obj):
            raise _NotPlain
        return "{\n" + ",\n".join(f"{inner}{_leaf(k)}: {_indented(v, inner)}" for k, v in obj.items()) + f"\n{pad}}}"
    if isinstance(obj, (list, tuple)):
        if not obj:
            return "[]"
        return "[\n" + ",\n".join(inner + _indented(v, inner) for v in obj) + f"\n{pad}]"
    return _leaf(obj)


def dumps_json(obj: Any) -> str:
    """``json.dumps(obj, indent=2, allow_nan=False)``, the same text (tested), ~5× faster on tdyn's
    files: with ``indent`` the json module encodes in pure Python, here only the nesting is Python and
    every value goes through json's C encoder (a run's config.json: 0.1 against 0.57 ms; a job of 80
    runs writes 240 such files)."""
    try:
        return _indented(obj, "")
    except (_NotPlain, ValueError, RecursionError):   # json.dumps says what is wrong, in its own words
        return json.dumps(obj, indent=2, allow_nan=False)


def json_file(path: Path, obj: Any) -> tuple[Path, bytes]:
    """``(path, contents)`` of ``obj`` as tdyn writes JSON (for :func:`atomic_write_many`)."""
    return Path(path), (dumps_json(obj) + "\n").encode()


def write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(*json_file(path, obj))


def write_csv(path: str | Path, rows: list[dict[str, Any]], columns: list[str]) -> Path:
    """Write ``rows`` with exactly ``columns`` (atomically)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r[c] for c in columns})
    atomic_write_text(Path(path), buf.getvalue())
    return Path(path)


def _os_error(path: Path, e: OSError) -> CorruptFile:
    """The one-line error for a file tdyn cannot read."""
    if isinstance(e, FileNotFoundError):
        return CorruptFile(path, "is missing")
    if isinstance(e, IsADirectoryError):
        return CorruptFile(path, "is a directory, not a file")
    return CorruptFile(path, f"cannot be read ({e.strerror})")


def _read_bytes(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise _os_error(path, e) from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")   # NaN / Infinity: tdyn never writes them


def _parse_json(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"), parse_constant=_no_constant)


def read_json(path: Path) -> Any:
    """A JSON file tdyn wrote; missing, truncated, garbled (not UTF-8, not JSON) is a :class:`CorruptFile`."""
    data = _read_bytes(path)
    try:
        return _parse_json(data)
    except UnicodeDecodeError as e:
        raise CorruptFile(path, f"is not UTF-8 text (byte {e.start}): garbled") from None
    except json.JSONDecodeError as e:
        raise CorruptFile(path, f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}): "
                                f"truncated or garbled") from None
    except ValueError as e:
        raise CorruptFile(path, f"is not valid JSON ({e}): garbled") from None


def _json_type(v: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(v), "number")


def _object(path: Path, what: str) -> dict:
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise CorruptFile(path, f"holds a JSON {_json_type(obj)}, not {what} (a JSON object)")
    return obj


def read_results(path: Path) -> dict:
    """A reproduction's ``results.json``, checked: a JSON object whose ``claims`` (if present) is a list of
    objects (what the report and the verdict table read)."""
    path = Path(path)
    res = _object(path, "a reproduction's results")
    claims = res.get("claims", [])
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise CorruptFile(path, f"has 'claims' = {_short(claims)}, not a list of claims (JSON objects)")
    return res


def read_manifest(path: Path) -> dict:
    """A ``reproduce --all`` directory's ``reproduce.json``, checked: a JSON object whose ``reproductions``
    is a list of objects each naming its ``dir`` (a subdirectory's name)."""
    path = Path(path)
    man = _object(path, "a reproduce --all manifest")
    entries = _field(path, man, "reproductions", list, "a list of reproductions")
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("dir"), str) or not e["dir"] \
                or Path(e["dir"]).name != e["dir"] or e["dir"] in (".", ".."):
            raise CorruptFile(path, f"has a reproduction {_short(e)} without a subdirectory name 'dir'")
    return man


def _field(path: Path, obj: dict, key: str, typ: type, what: str) -> Any:
    v = obj.get(key)
    if not isinstance(v, typ) or (isinstance(v, bool) and typ is not bool):
        raise CorruptFile(path, f"has {key!r} = {_short(v)}, not {what}")
    return v


def _short(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def metrics_file(run_dir: Path, records: list[dict]) -> tuple[Path, bytes]:
    """``metrics.jsonl``'s path and contents for ``records`` (for :func:`atomic_write_many`)."""
    return Path(run_dir) / METRICS, "".join(json.dumps(r, allow_nan=False) + "\n" for r in records).encode()


def write_metrics(run_dir: Path, records: list[dict]) -> None:
    atomic_write_bytes(*metrics_file(run_dir, records))


def _record_problem(rec: Any, prev: int | None) -> str | None:
    if not isinstance(rec, dict):
        return f"is a JSON {_json_type(rec)}, not a record"
    step = rec.get("step")
    if type(step) is not int or step < 0:
        return f"has step {_short(step)}, not a whole number"
    if prev is not None and step <= prev:
        return f"has step {step} after step {prev} (steps must increase)"
    for k, v in rec.items():
        if v is not None and not isinstance(v, (int, float)):
            return f"has {k!r} = {_short(v)}, not a number"
    return None


def scan_metrics(run_dir: Path) -> tuple[list[dict], CorruptFile | None]:
    """``metrics.jsonl``'s records up to its first bad line, and what is wrong with that line (None
    when all are good; a missing file gives no records and its problem). Resume keeps such a prefix;
    every other reader uses :func:`read_metrics`."""
    p = Path(run_dir) / METRICS
    try:
        data = _read_bytes(p)
    except CorruptFile as e:
        return [], e
    recs: list[dict] = []
    lines = data.split(b"\n")
    for n, line in enumerate(lines, 1):
        if n == len(lines) and not line:   # after the last newline
            break
        try:
            rec = _parse_json(line)
        except ValueError:                  # not UTF-8, not JSON (UnicodeDecodeError is a ValueError)
            return recs, CorruptFile(p, f"line {n} is not valid JSON: truncated or garbled")
        problem = _record_problem(rec, recs[-1]["step"] if recs else None)
        if problem:
            return recs, CorruptFile(p, f"line {n} {problem}")
        recs.append(rec)
    return recs, None


def read_metrics(run_dir: Path) -> list[dict]:
    """Every record of ``metrics.jsonl``; a bad line is a :class:`CorruptFile` naming it. No file yet is
    no records only for a run without a checkpoint or a result (running, or failed or interrupted before
    its first checkpoint when ``checkpoint.initial`` is false)."""
    recs, problem = scan_metrics(run_dir)
    if problem is None:
        return recs
    if not (Path(run_dir) / METRICS).exists() and not checkpoint_steps(run_dir) \
            and read_meta(run_dir)["status"] not in DONE:
        return []
    if not (Path(run_dir) / METRICS).exists():
        raise CorruptFile(problem.path, "is missing, but the run has checkpoints or has ended")
    raise problem


def read_config(run_dir: Path) -> dict:
    """``config.json`` as written (a JSON object; :func:`load_run_config` validates it)."""
    return _object(Path(run_dir) / CONFIG, "a run config")


def config_from(raw: Any, path: Path) -> RunConfig:
    """``raw``, read from ``path``, validated as a run config; a bad key is a CorruptFile naming the file."""
    if not isinstance(raw, dict):
        raise CorruptFile(path, f"holds {_short(raw)} where a run config (a JSON object) belongs")
    try:
        return validate_config(raw)
    except UserError as e:
        raise CorruptFile(path, f"is not a valid run config: {e}") from None


def load_run_config(run_dir: Path) -> RunConfig:
    """A run's ``config.json``, validated."""
    return config_from(read_config(run_dir), Path(run_dir) / CONFIG)


def read_meta(run_dir: Path) -> dict:
    """``meta.json``, checked: a JSON object with a known ``status`` and a whole-number ``seed``."""
    path = Path(run_dir) / META
    meta = _object(path, "run metadata")
    _field(path, meta, "status", str, f"one of {', '.join(STATUSES)}")
    if meta["status"] not in STATUSES:
        raise CorruptFile(path, f"has status {meta['status']!r}, not one of {', '.join(STATUSES)}")
    _field(path, meta, "seed", int, "a whole number")
    return meta


def _ckpt_name(step: int | str) -> str:
    return FINAL if step == "final" else f"step-{int(step):07d}.safetensors"


def tensor_checksum(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over a checkpoint's tensors in key order: for each, the line ``name dtype shape`` and then
    its bytes (native order). Stored in the checkpoint's metadata (``sha256``), checked on every read."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous().cpu()
        h.update(f"{k} {str(t.dtype).removeprefix('torch.')} {list(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def checkpoint_file(run_dir: Path, step: int | str, tensors: dict[str, torch.Tensor],
                    metadata: dict[str, str] | None = None) -> tuple[Path, bytes]:
    """A checkpoint's path and contents (for :func:`atomic_write_many`; :func:`save_checkpoint` writes one)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    return checkpoint_path(run_dir, step), _safetensors_bytes(
        tensors, dict(metadata or {}) | {CHECKSUM: tensor_checksum(tensors)})


def _safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """``safetensors.torch.save`` with the header's metadata in key order: safetensors writes it from a
    Rust hash map, whose order changes from process to process, so the same checkpoint's bytes did too.
    The header is the same JSON with its keys reordered (same length, same padding), the data untouched."""
    data = save(tensors, metadata=metadata)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    fixed = {"__metadata__": dict(sorted(meta.items()))} | header if meta is not None else header
    text = json.dumps(fixed, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > n:      # never: the same keys and values, reordered
        raise RuntimeError("safetensors header grew when its metadata was sorted")
    return data[:8] + text + b" " * (n - len(text)) + data[8 + n:]


def save_checkpoint(run_dir: Path, step: int | str, tensors: dict[str, torch.Tensor],
                    metadata: dict[str, str] | None = None) -> Path:
    path, data = checkpoint_file(run_dir, step, tensors, metadata)
    atomic_write_bytes(path, data)
    return path


def checkpoint_steps(run_dir: Path) -> list[int]:
    d = Path(run_dir) / CKPT_DIR
    if not d.exists():
        return []
    return sorted(int(m.group(1)) for f in d.iterdir() if (m := _STEP_RE.fullmatch(f.name)))


def _unreadable(path: Path, e: Exception) -> CorruptFile:
    what = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
    return CorruptFile(path, f"is not a readable safetensors file ({what}): truncated or garbled")


def _header_metadata(data: bytes, size: int | None = None) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file from its first bytes (length prefix + JSON header).
    ``size``: the whole file's length, checked against the tensor bytes the header declares."""
    (n,) = struct.unpack("<Q", data[:8])
    if len(data) < 8 + n:
        raise ValueError("header cut short")
    header = json.loads(data[8:8 + n])
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise ValueError("bad __metadata__")
    if size is not None:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        if size < 8 + n + end:
            raise ValueError(f"{size} bytes, but its header declares {8 + n + end}")
    return meta


def _checksum_of(path: Path, meta: dict[str, str]) -> str:
    if CHECKSUM not in meta:
        raise CorruptFile(path, f"carries no checksum ({CHECKSUM!r} in its metadata): damaged, or written "
                                f"by a tdyn without checksums")
    return meta[CHECKSUM]


def read_checkpoint_metadata(path: Path) -> dict[str, str]:
    """A checkpoint file's metadata (its ``step``, ``sha256``, ...) from its header alone, checked as far as
    the header allows (a checksum is present, the file is as long as its header declares), but neither its
    tensors nor their checksum are read: for a run whose files were verified or written moments before
    (the sweep's check of a job's runs after training them). Every other read is :func:`read_checkpoint`."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            (n,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
            meta = _header_metadata(head + f.read(min(n, size)), size)
    except OSError as e:
        raise _os_error(path, e) from None
    except Exception as e:   # struct / JSON errors of a damaged header, a file shorter than declared
        raise _unreadable(path, e) from None
    _checksum_of(path, meta)
    return meta


def read_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A checkpoint file's tensors and metadata, its checksum verified: a truncated, garbled or
    bit-flipped file (or one without a checksum) is a :class:`CorruptFile`."""
    data = _read_bytes(path)
    try:
        tensors = load_safetensors(data)
        meta = _header_metadata(data)
    except Exception as e:   # safetensors' own error type, struct / JSON errors of a damaged header
        raise _unreadable(path, e) from None
    want = _checksum_of(path, meta)
    if tensor_checksum(tensors) != want:
        raise CorruptFile(path, "fails its checksum: its tensors are damaged (a flipped bit, a partial overwrite)")
    return tensors, meta


def checkpoint_path(run_dir: Path, step: int | str = "final") -> Path:
    return Path(run_dir) / CKPT_DIR / _ckpt_name(step)


def load_checkpoint(run_dir: Path, step: int | str = "final") -> dict[str, torch.Tensor]:
    """The tensors of checkpoint ``step`` (or ``"final"``), verified (:func:`read_checkpoint`)."""
    path = checkpoint_path(run_dir, step)
    if not path.exists():
        raise UserError(f"no checkpoint {path.name} in {run_dir}")
    tensors, meta = read_checkpoint(path)
    if step != "final" and meta.get("step") != str(int(step)):
        raise CorruptFile(path, f"holds step {_short(meta.get('step'))}, not {int(step)} as its name says")
    return tensors


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


def params_of(ckpt: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model parameters stored in a checkpoint (keys without the ``param/`` prefix)."""
    return {k[len("param/"):]: v for k, v in ckpt.items() if k.startswith("param/")}


def is_run_dir(path: Path) -> bool:
    return (Path(path) / CONFIG).exists() and (Path(path) / META).exists()


def now() -> str:
    """UTC time stamp written into run and reproduction metadata."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def machine_info() -> dict:
    """The machine and torch settings of this process (bench.json, report pages)."""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available()}


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the tdyn checkout in use, or None outside a git checkout."""
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                           capture_output=True, text=True, timeout=5)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


MARKERS = (ENSEMBLE, SWEEP, RESULTS, REPRODUCE, REPRODUCING)   # besides CONFIG + META (a run): what makes a directory tdyn's
RUNS = "runs"        # a reproduction's trained runs: OUT/runs/<job> (jobs, sweeps)


def is_tdyn_dir(path: Path) -> bool:
    """Whether ``path`` is a directory tdyn wrote: a run (config + meta), a job (ensemble.json), a sweep
    (sweep.json), a reproduction (results.json, or .reproducing.json while it runs) or a ``reproduce --all``
    directory (reproduce.json), or a reproduction stopped before its results.json by an older tdyn: a
    ``runs/`` with nothing in or beside it that tdyn did not write (:func:`foreign_entry`)."""
    path = Path(path)
    return (is_run_dir(path) or any(_is_marker(path / m) for m in MARKERS)
            or ((path / RUNS).is_dir() and foreign_entry(path) is None))


_MARKER_KEYS = {RESULTS: "experiment", REPRODUCE: "reproductions", REPRODUCING: "experiment"}   # a file of the user's so named is not tdyn's


def reproduction_of(path: Path) -> str | None:
    """The experiment whose reproduction ``path`` holds: named by its results.json, or by its
    .reproducing.json where it stopped before one; None where neither is tdyn's."""
    for name in (RESULTS, REPRODUCING):
        if _is_marker(Path(path) / name):
            return str(json.loads((Path(path) / name).read_bytes())["experiment"])
    return None


def _is_marker(p: Path) -> bool:
    """Whether ``p`` (one of :data:`MARKERS`) is tdyn's: it exists and, for a results.json or reproduce.json,
    holds a JSON object with tdyn's key (``experiment``, ``reproductions``)."""
    if not p.is_file():
        return False
    key = _MARKER_KEYS.get(p.name)
    if key is None:
        return True
    try:
        obj = json.loads(p.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(obj, dict) and key in obj


OWN_FILES = {CONFIG, META, METRICS, ENSEMBLE, SWEEP, SUMMARY, LOCK, "index.html"}   # and markers, checked
OWN_TREES = {CKPT_DIR, JOBS, "tensorboard", "wandb", "report_files", ".submitit"}   # directories tdyn (or its sinks) fill
OS_LITTER = {".DS_Store", "Thumbs.db", "desktop.ini", ".ipynb_checkpoints"}          # a file browser's or Jupyter's
_REPRODUCTION_SUFFIXES = (".csv", ".png", ".json")                                  # a reproduction's tables and figures
_TEMP_RE = re.compile(r"^\..+\.tdyn-.+\.tmp$")                                      # atomic_write's temp files


def foreign_entry(path: Path, reproduction: bool = False) -> Path | None:
    """The first entry below ``path`` that tdyn did not write, or None: what ``--force`` would otherwise
    delete. tdyn's are its file names (:data:`OWN_FILES`; results.json, reproduce.json and
    .reproducing.json only with tdyn's content), its trees (:data:`OWN_TREES`), its temp files, empty
    directories, a file browser's litter (:data:`OS_LITTER`), a reproduction's tables and figures (files
    beside its results.json, .reproducing.json or runs/; the subdirectories a ``reproduce --all``
    manifest names are reproductions; ``reproduction``: ``path`` is one), and directories tdyn wrote
    (:func:`is_tdyn_dir`, and a reproduction's ``runs/``) whose own entries are all tdyn's."""
    path = Path(path)
    reproduction = (reproduction or _is_marker(path / RESULTS) or _is_marker(path / REPRODUCING)
                    or (path / RUNS).is_dir())
    named: set[str] = set()
    if _is_marker(path / REPRODUCE):
        try:
            named = {e["dir"] for e in read_manifest(path / REPRODUCE)["reproductions"]}
        except UserError:
            pass
    for p in sorted(path.iterdir()):
        if p.is_symlink():
            return p
        if p.name in OS_LITTER:
            continue
        if p.is_dir():
            if p.name in OWN_TREES or not _entries(p):
                continue
            if not (p.name in named or (p.name == RUNS and reproduction) or is_tdyn_dir(p)):
                return p
            inner = foreign_entry(p, reproduction=p.name in named)
            if inner is not None:
                return inner
        elif p.name in _MARKER_KEYS:
            if not _is_marker(p):
                return p
        elif not (p.name in OWN_FILES or _TEMP_RE.match(p.name)
                  or (reproduction and p.suffix in _REPRODUCTION_SUFFIXES)):
            return p
    return None


def _entries(out: Path) -> list[Path]:
    """What ``out`` holds besides a lock file (a directory holding only one counts as empty)."""
    return sorted(p for p in out.iterdir() if p.name != LOCK) if out.is_dir() else []


def _check_out(out: Path, force: bool, hint: str, flag: str = "--force") -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file, not a directory")
    entries = _entries(out)
    if entries:
        if not force:
            raise UserError(f"output directory {str(out)!r} already exists and is not empty; "
                            f"use --force to overwrite{hint}")
        if not is_tdyn_dir(out):
            raise UserError(f"{flag}: {str(out)!r} is not a tdyn output directory (it holds {entries[0].name!r}, and no "
                            f"{CONFIG}/{META}, {', '.join(MARKERS)}); tdyn deletes only its own outputs — "
                            f"choose another --out")


def prepare_dir(out: Path, force: bool, *, clear: bool = False, hint: str = "", locks: "Locks | None" = None,
                flag: str = "--force") -> Path:
    """Create ``out`` for writing. A non-empty ``out`` is a UserError unless ``force``; then with
    ``clear`` its contents are removed first (a run directory), else its files get overwritten (a
    reproduction directory). ``force`` applies only to a directory tdyn wrote (:func:`is_tdyn_dir`):
    anything else is refused, so ``--force`` never deletes or overwrites a user's files.
    ``hint`` is appended to the error (e.g. "or --resume to continue it"); ``flag`` names the option that
    allowed a non-empty ``out`` (``--force``, or ``--resume``).

    With ``locks``, ``out``'s lock is taken (a directory another process writes is refused naming it,
    before anything else is said about it) and kept in ``locks``; clearing then spares the lock files
    this process holds and stops at a directory below ``out`` that another process writes."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file, not a directory")
    if locks is not None and (out / LOCK).exists():
        locks.acquire(out)
    _check_out(out, force, hint, flag)
    if locks is not None and not locks.holds(out):
        locks.acquire(out)
        _check_out(out, force, hint, flag)     # again: written by someone else between the check and the lock?
    if clear and _entries(out):
        clear_own(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def clear_own(out: Path, reproduction: bool = False) -> None:
    """Delete ``out``'s contents, all of which tdyn wrote (:func:`check_own`; ``reproduction``: ``out`` is
    one, e.g. a subdirectory a ``reproduce --all`` manifest names), sparing the locks this process holds."""
    check_own(out, reproduction)
    _clear(out)


def check_own(out: Path, reproduction: bool = False) -> None:
    """Before ``--force`` deletes ``out``'s contents: a UserError naming the first entry tdyn did not write."""
    bad = foreign_entry(out, reproduction)
    if bad is not None:
        raise UserError(f"--force: {str(out)!r} holds {str(bad.relative_to(out))!r}, which tdyn did not write; "
                        f"tdyn deletes only its own outputs — move it, or choose another --out")


def _clear(out: Path) -> None:
    """Remove ``out``'s contents except the lock files this process holds. A directory below ``out``
    that another process is writing (its lock held) stops the clear with that process named."""
    inner = sorted({p.parent for p in Path(out).rglob(LOCK)} - {Path(out)})
    with Locks() as below:
        for d in inner:
            below.acquire(d)
        _remove_contents(Path(os.path.realpath(out)), held_lock_files())
    for d in sorted(inner, key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()          # emptied: its lock file went with the release
        except OSError:
            pass


def _remove_contents(root: Path, keep: set[str]) -> None:
    for p in root.iterdir():
        if str(p) in keep:
            continue
        if p.is_dir() and not p.is_symlink():
            if any(k.startswith(str(p) + os.sep) for k in keep):
                _remove_contents(p, keep)
            else:
                shutil.rmtree(p)
        else:
            p.unlink()


# ---------------------------------------------------------------- one writer per directory


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
    try:
        with open(lock, "rb") as f:
            return f.read(300).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def holder_gone(holder: str) -> bool:
    """Whether the holder ``pid@host`` a lock file names is a process of this host that no longer runs."""
    pid, _, h = holder.partition("@")
    return h == host() and pid.isdigit() and not pid_alive(int(pid))


def _in_use(d: Path, holder: str) -> str:
    who = f"pid {holder}" if holder else "another process"
    why = " (that process has ended, but a process it started still holds the lock)" if holder_gone(holder) else ""
    return (f"{str(d)!r} is in use by {who}{why}: another tdyn process is writing it (lock file {LOCK}); "
            f"wait for it to finish or stop it")


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
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, _MODE)
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


# ---------------------------------------------------------------- reading a run directory


class Run:
    """One run directory, read: ``config``, ``meta``, ``metrics`` (records, or ``arrays()`` /
    ``frame()``), checkpoints by step, and the model rebuilt from a checkpoint.

    Everything that reads run directories (trainer resume, sweep, report, analyses) goes through
    this class or the functions above, so the format has one owner.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not is_run_dir(self.path):
            raise UserError(f"{str(self.path)!r} is not a run directory (no {CONFIG}/{META})")

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @functools.cached_property
    def config(self) -> dict:
        return read_config(self.path)

    @property
    def meta(self) -> dict:  # not cached: the status changes while a run trains
        return read_meta(self.path)

    @property
    def status(self) -> str:
        return self.meta["status"]

    @property
    def seed(self) -> int:
        return self.meta["seed"]

    @property
    def lrs(self) -> dict[str, float]:
        """The learning rate of each parameter group."""
        return {g: v["lr"] for g, v in self.config["optim"]["groups"].items()}

    @property
    def metrics(self) -> list[dict]:
        return read_metrics(self.path)

    def arrays(self, *keys: str) -> dict[str, "np.ndarray"]:
        """Metrics as arrays keyed by name (``step`` included); a record missing a key gives NaN."""
        recs = self.metrics
        keys = keys or tuple(dict.fromkeys(k for r in recs for k in r))
        return {k: np.array([r.get(k, np.nan) for r in recs], dtype=np.float64) for k in keys}

    def frame(self):
        """Metrics as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame.from_records(self.metrics)

    @property
    def df(self):
        """The metrics, one row per evaluated step: a pandas DataFrame when pandas is installed, else
        ``arrays()`` (a dict of arrays, NaN where a step lacks a metric)."""
        try:
            import pandas  # noqa: F401
        except ImportError:
            return self.arrays()
        return self.frame()

    def steps(self) -> list[int]:
        """Steps with a checkpoint (the final state is ``checkpoint("final")``)."""
        return checkpoint_steps(self.path)

    def checkpoint(self, step: int | str = "final") -> dict[str, torch.Tensor]:
        return load_checkpoint(self.path, step)

    def params(self, step: int | str = "final") -> dict[str, torch.Tensor]:
        """This member's model parameters at ``step`` (no ensemble axis)."""
        return params_of(self.checkpoint(step))

    def param(self, name: str, step: int | str = "final") -> torch.Tensor:
        return self.params(step)[name]

    def probe(self, key: str, step: int | str = "final") -> torch.Tensor:
        """An array probe ``<probe>/<key>`` saved at ``step``."""
        return self.checkpoint(step)[f"probe/{key}"]

    def task(self):
        """The run's task built from its config (one member; no weights loaded), on the CPU whatever device
        it trained on: analysis reads checkpoints, which hold CPU tensors, and may run where no GPU is."""
        cfg = load_run_config(self.path).model_copy(update={"device": "cpu"})
        lrs = {g: gc.lr for g, gc in cfg.optim.groups.items()}
        scale = (cfg.ensemble.init_scales or [1.0])[0]
        return build_task(cfg, [Member(cfg.seeds[0], lrs, scale, self.path.name)])

    def model(self, step: int | str = "final") -> torch.nn.Module:
        """The model rebuilt from its config (ensemble axis of size 1) with the weights of ``step``."""
        model = self.task().model
        ckpt = self.checkpoint(step)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(ckpt[f"param/{name}"].to(p.dtype).reshape(p.shape))  # the model's ensemble axis has size 1
            for name, b in model.named_buffers():
                if f"buffer/{name}" in ckpt:   # persistent buffers (running statistics)
                    b.copy_(ckpt[f"buffer/{name}"].to(b.dtype).reshape(b.shape))
        return model


def load_run(path: str | Path) -> Run:
    """The run in ``path``: a run directory, or a job / sweep directory that holds exactly one run
    (an ensemble of several: use :func:`load_sweep`, or ``load_run(path / member)``)."""
    path = Path(path)
    if is_run_dir(path):
        return Run(path)
    dirs = job_dirs(path)
    if len(dirs) != 1:
        raise UserError(f"{str(path)!r} holds {len(dirs)} runs, not one; use tdyn.load_sweep({str(path)!r}) "
                        f"or load_run on one of {', '.join(d.name for d in dirs[:4])}")
    return Run(dirs[0])


def load_sweep(path: str | Path):
    """Every run of a sweep, ensemble or run directory with its metrics in one long table: one row per
    (run, evaluated step) with columns ``run``, ``seed``, the sweep's axes (or the member's learning
    rates ``lr.<group>`` and ``init_scale``), ``status``, ``step`` and every metric. A pandas DataFrame
    when pandas is installed, else a dict of columns (numpy arrays; strings as object arrays)."""
    path = Path(path)
    dirs = job_dirs(path)
    if not dirs:
        raise UserError(f"{str(path)!r} holds no run directory")
    axes = {r["name"]: r["axes"] for r in read_sweep(path)["runs"]} if (path / SWEEP).exists() else {}
    rows = []
    for d in dirs:
        run = Run(d)
        meta = run.meta
        info = {"run": d.name if d != path else path.name, "seed": meta.get("seed")}
        info |= axes.get(d.name) or {f"lr.{g}": v for g, v in (meta.get("lrs") or {}).items()} | \
            {"init_scale": meta.get("init_scale")}
        info["status"] = meta.get("status")
        rows += [info | r for r in run.metrics]
    try:
        import pandas as pd
    except ImportError:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        cols = {}
        for k in keys:
            vals = [r.get(k) for r in rows]
            num = all(v is None or isinstance(v, (int, float)) for v in vals)
            cols[k] = (np.array([np.nan if v is None else v for v in vals], dtype=np.float64) if num
                       else np.array(vals, dtype=object))
        return cols
    return pd.DataFrame.from_records(rows)


def read_ensemble(out: str | Path) -> dict:
    """A job's ``ensemble.json``, checked: ``config`` (an object), ``members`` and ``dirs`` (lists of names,
    as many of each). :func:`ensemble_dirs` checks where the directories lie."""
    path = Path(out) / ENSEMBLE
    ens = _object(path, "an ensemble manifest")
    _field(path, ens, "config", dict, "a run config (a JSON object)")
    for key in ("members", "dirs"):
        v = _field(path, ens, key, list, "a list of names")
        if not all(isinstance(x, str) and x for x in v):
            raise CorruptFile(path, f"has {key!r} = {_short(v)}, not a list of names")
    if len(ens["members"]) != len(ens["dirs"]):
        raise CorruptFile(path, f"lists {len(ens['members'])} members but {len(ens['dirs'])} directories")
    return ens


def ensemble_dirs(out: str | Path) -> list[Path]:
    """The member directories ``ensemble.json`` in ``out`` lists, each checked to lie inside ``out`` (or,
    for a sweep's job manifest ``SWEEP_DIR/.jobs/<job>``, inside the sweep directory): a manifest
    naming ``../elsewhere`` is refused, so resume never writes outside the job."""
    out = Path(out)
    root = out.parent.parent if out.parent.name == ".jobs" else out
    dirs = []
    for p in read_ensemble(out)["dirs"]:
        d = out / p
        if not d.resolve().is_relative_to(root.resolve()) or d.resolve() == root.resolve():
            raise UserError(f"{str(out / ENSEMBLE)!r}: member directory {p!r} lies outside {str(root)!r}")
        dirs.append(d)
    return dirs


def read_sweep(out: str | Path) -> dict:
    """A sweep's ``sweep.json``, checked: ``spec`` (an object) and ``runs``, each with a ``name`` (one
    path component: a directory of the sweep), a ``status`` and its ``axes``."""
    path = Path(out) / SWEEP
    sw = _object(path, "a sweep record")
    _field(path, sw, "spec", dict, "a sweep spec (a JSON object)")
    for i, r in enumerate(_field(path, sw, "runs", list, "a list of runs")):
        if not isinstance(r, dict):
            raise CorruptFile(path, f"has runs[{i}] = {_short(r)}, not a run record")
        name = _field(path, r, "name", str, "a run name")
        if name in ("", ".", "..") or Path(name).name != name or "\\" in name or "\0" in name:
            raise CorruptFile(path, f"has run name {name!r}, not a directory name inside the sweep")
        _field(path, r, "status", str, "a status")
        _field(path, r, "axes", dict, "the run's axes (a JSON object)")
    return sw


def job_dirs(out: str | Path) -> list[Path]:
    """The run directories of a job (``ensemble.json``), a sweep (``sweep.json``), or ``out`` itself."""
    out = Path(out)
    if (out / SWEEP).exists():
        return [out / r["name"] for r in read_sweep(out)["runs"] if is_run_dir(out / r["name"])]
    if (out / ENSEMBLE).exists():
        return [d for d in ensemble_dirs(out) if is_run_dir(d)]
    return [out] if is_run_dir(out) else []
