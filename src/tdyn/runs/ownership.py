"""What tdyn owns, checked file by file: ``--force`` deletes or overwrites only a directory tdyn wrote
(:func:`is_tdyn_dir`) whose every entry is tdyn's (:func:`foreign_entry`), never a user's file.
:func:`prepare_dir` makes an output directory ready (refusing, clearing, locking). The file names of
runs are known here; what a layer above writes into these directories (a sink's directory, a report
page) it declares with :func:`own`, at import time of the module that writes it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Iterable

from tdyn.errors import UserError
from tdyn.runs.atomic import _TEMP_RE
from tdyn.runs.locks import Locks, held_lock_files
from tdyn.runs.io import write_json
from tdyn.runs.names import (CKPT_DIR, CONFIG, ENSEMBLE, JOBS, LOCK, MARKERS, META, METRICS, REPRODUCE,
                             REPRODUCING, RESULTS, RUNS, SUMMARY, SWEEP, WRITTEN)
from tdyn.runs.records import is_run_dir, read_manifest


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


OWN_FILES = {CONFIG, META, METRICS, ENSEMBLE, SWEEP, SUMMARY, LOCK, WRITTEN}   # and markers, checked; what own() adds
OWN_TREES = {CKPT_DIR, JOBS}                                        # directories tdyn fills; and what own() adds
OS_LITTER = {".DS_Store", "Thumbs.db", "desktop.ini", ".ipynb_checkpoints"}          # a file browser's or Jupyter's
_REPRODUCTION_SUFFIXES = (".csv", ".png", ".json")                                  # a reproduction's tables and figures


def own(files: Iterable[str] = (), trees: Iterable[str] = ()) -> None:
    """Declare what a layer above writes into tdyn's directories, for ``--force`` to count as tdyn's:
    ``files`` (file names) and ``trees`` (directories, taken whole). Called at import time of the module
    that writes them, e.g. ``runs.own(trees=("tensorboard", "wandb"))`` in ``train/sinks.py``."""
    for name, where in [(f, OWN_FILES) for f in files] + [(t, OWN_TREES) for t in trees]:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name:
            raise ValueError(f"runs.own: {name!r} is not a file or directory name")
        where.add(name)


def record(directory: Path, *names: str) -> None:
    """Note in ``directory``'s :data:`WRITTEN` that tdyn wrote its entries ``names`` from a layer above runs
    (the report's page and its figures folder, a sweep's submitit folder): ``--force`` then counts them
    as tdyn's in that directory, and nowhere else; runs itself names none of them."""
    have = written(directory)
    if set(names) - have:
        write_json(Path(directory) / WRITTEN, sorted(have | set(names)))


def written(directory: Path) -> set[str]:
    """The entries recorded in ``directory``'s :data:`WRITTEN` (plain names only; none if unreadable)."""
    try:
        names = json.loads((Path(directory) / WRITTEN).read_bytes())
    except (OSError, ValueError):
        return set()
    return {n for n in names if isinstance(n, str) and n not in ("", ".", "..") and "/" not in n
            and "\\" not in n} if isinstance(names, list) else set()


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
    recorded = written(path)
    for p in sorted(path.iterdir()):
        if p.is_symlink():
            return p
        if p.name in OS_LITTER:
            continue
        if p.is_dir():
            if p.name in OWN_TREES or p.name in recorded or not _entries(p):
                continue
            if not (p.name in named or (p.name == RUNS and reproduction) or is_tdyn_dir(p)):
                return p
            inner = foreign_entry(p, reproduction=p.name in named)
            if inner is not None:
                return inner
        elif p.name in _MARKER_KEYS:
            if not _is_marker(p):
                return p
        elif not (p.name in OWN_FILES or p.name in recorded or _TEMP_RE.match(p.name)
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
