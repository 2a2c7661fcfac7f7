"""JSON and CSV as tdyn writes and reads them, and :class:`CorruptFile`.

Writing: :func:`dumps_json` (``json.dumps(indent=2)``'s text, faster), :func:`write_json`,
:func:`write_csv`, all atomic; a record named in :data:`~tdyn.runs.names.SEALED` (a run's ``meta.json``) is
sealed by :func:`json_file`, its one writer, with the checksum of its content (:func:`content_checksum`),
which its reader verifies. Reading: whatever reads a file checks it, and a missing, truncated,
garbled or ill-typed file is a :class:`CorruptFile` (a UserError: exit 2) naming the file and what is
wrong; the small checks here (:func:`_object`, :func:`_field`) are what the readers of each file use.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import stat
from pathlib import Path
from typing import Any

from tdyn.errors import UserError
from tdyn.runs.atomic import atomic_write_bytes, atomic_write_text
from tdyn.runs.names import SEAL, SEALED


class CorruptFile(UserError):
    """A file of a tdyn directory is missing, truncated, garbled or inconsistent; names it and what is wrong."""

    def __init__(self, path: Path, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{str(path)!r} {problem}")


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
    """``json.dumps(obj, indent=2, allow_nan=False)``, the same text (tested), faster on tdyn's files: with
    ``indent`` the json module encodes in pure Python, here only the nesting is Python and every value goes
    through json's C encoder (a job of 80 runs writes 240 such files; benchmarks/README.md#measurements-behind-the-code)."""
    try:
        return _indented(obj, "")
    except (_NotPlain, ValueError, RecursionError):   # json.dumps says what is wrong, in its own words
        return json.dumps(obj, indent=2, allow_nan=False)


def content_checksum(obj: dict) -> str:
    """The first 16 hex digits of the SHA-256 of ``obj`` (but its :data:`~tdyn.runs.names.SEAL`) as compact JSON
    with sorted keys: what a sealed record carries, recomputed from what a reader parsed (so the layout of
    the file does not matter, every key and value does)."""
    what = {k: v for k, v in obj.items() if k != SEAL}
    text = json.dumps(what, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def json_file(path: Path, obj: Any) -> tuple[Path, bytes]:
    """``(path, contents)`` of ``obj`` as tdyn writes JSON (for :func:`atomic_write_many`); a record named in
    :data:`~tdyn.runs.names.SEALED` (``meta.json``) gets its checksum, last (one it carried is replaced)."""
    path = Path(path)
    if path.name in SEALED and isinstance(obj, dict):
        obj = {k: v for k, v in obj.items() if k != SEAL}
        obj[SEAL] = content_checksum(obj)
    return path, (dumps_json(obj) + "\n").encode()


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


MB = 1 << 20
JSON_LIMIT = 64 * MB          # a config, meta.json, ensemble.json, sweep.json, results.json, a spec
METRICS_LIMIT = 4096 * MB     # metrics.jsonl: a long dense schedule's records
TABLE_LIMIT = 1024 * MB       # a reproduction's table (CSV)


def _size(n: int) -> str:
    return f"{n / MB:.1f} MB" if n >= MB else f"{n} bytes"


def _read_bytes(path: Path, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (a symlink followed), at most ``limit`` of them (None: no bound,
    for a checkpoint, whose header declares its size). A FIFO, device or socket in its place (which would
    block, or read without end: ``/dev/zero``) or a file over the limit is a :class:`CorruptFile` naming it;
    opened without blocking and checked on the open descriptor, so a FIFO never blocks the reader."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _os_error(path, e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or
                    stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else
                    "a directory" if stat.S_ISDIR(st.st_mode) else "a special file")
            raise CorruptFile(path, f"is {what}, not a regular file: tdyn reads only the files it wrote")
        if limit is not None and st.st_size > limit:
            raise CorruptFile(path, f"holds {_size(st.st_size)}, over the {_size(limit)} tdyn reads from such a "
                                    f"file: not a file tdyn wrote")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            data = f.read() if limit is None else f.read(limit + 1)   # a file grown since the fstat: bounded too
    except OSError as e:
        raise _os_error(path, e) from None
    finally:
        if fd >= 0:
            os.close(fd)
    if limit is not None and len(data) > limit:
        raise CorruptFile(path, f"holds over {_size(limit)}, the most tdyn reads from such a file: not a file tdyn wrote")
    return data


def read_text(path: Path, limit: int = JSON_LIMIT) -> str:
    """A text file tdyn reads (a table, a config, a spec): missing, unreadable, not a regular file, over
    ``limit`` bytes or not UTF-8 is a :class:`CorruptFile` naming it (and the byte)."""
    data = _read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptFile(path, f"is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}): garbled, "
                                "or not a file tdyn wrote") from None


def read_csv(path: Path) -> list[list[str]]:
    """The rows of a CSV file (:func:`read_text`'s checks, then the CSV's own, such as a NUL byte)."""
    return _csv(path, csv.reader)


def read_csv_dicts(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header, as ``csv.DictReader`` gives them (:func:`read_csv`'s checks)."""
    return _csv(path, csv.DictReader)


def _csv(path: Path, reader) -> list:
    text = read_text(path, TABLE_LIMIT)
    try:
        return list(reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise CorruptFile(path, f"is not a valid CSV table ({e})") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")   # NaN / Infinity: tdyn never writes them


class TooDeep(ValueError):
    """JSON nested deeper than Python's recursion allows: never a file tdyn wrote."""


def _parse_json(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise TooDeep("nested too deep") from None


def read_json(path: Path) -> Any:
    """A JSON file tdyn wrote; missing, not a regular file, over :data:`JSON_LIMIT`, truncated, garbled (not
    UTF-8, not JSON, nested too deep) is a :class:`CorruptFile`."""
    data = _read_bytes(path, JSON_LIMIT)
    try:
        return _parse_json(data)
    except UnicodeDecodeError as e:
        raise CorruptFile(path, f"is not UTF-8 text (byte {e.start}): garbled") from None
    except json.JSONDecodeError as e:
        raise CorruptFile(path, f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}): "
                                f"truncated or garbled") from None
    except TooDeep:
        raise CorruptFile(path, "is JSON nested too deep to read: garbled, or not a file tdyn wrote") from None
    except ValueError as e:
        raise CorruptFile(path, f"is not valid JSON ({e}): garbled") from None


def _json_type(v: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(v), "number")


def _object(path: Path, what: str) -> dict:
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise CorruptFile(path, f"holds a JSON {_json_type(obj)}, not {what} (a JSON object)")
    return obj


def _field(path: Path, obj: dict, key: str, typ: type, what: str) -> Any:
    v = obj.get(key)
    if not isinstance(v, typ) or (isinstance(v, bool) and typ is not bool):
        raise CorruptFile(path, f"has {key!r} = {_short(v)}, not {what}")
    return v


def _short(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
