"""User-facing errors: the CLI prints their message on one line and exits with status 2.

Exit statuses of ``tdyn``: 0 done; 2 a mistake in the user's input, refused on one line
(:class:`UserError`: a config, an argument, a path, a file tdyn reads, the user's own code —
:class:`UserCodeError`); 1 a run that failed for a cause outside the input, said on one line with that
cause: a run that did not finish, or a file that could not be written because the disk is full, over
quota or failing (:class:`WriteError`; the file is left as it was, the directory can be resumed)."""

from __future__ import annotations

import errno
import os
from typing import Any


class UserError(Exception):
    """A mistake in the user's input (config, arguments, paths). Printed without a traceback."""


class ConfigError(UserError):
    """A config key has a bad value; the message names the key, the value and what is allowed."""


class UserCodeError(UserError):
    """The user's own code (a task, a model, a probe, a plugin module) raised or broke tdyn's contract.
    The message says whose code it is and where; ``__cause__`` keeps the user's exception (``tdyn -v``
    prints its traceback)."""


class RegisteredTwice(UserError, RuntimeError):
    """A name registered twice (a task, probe, reproduction, bench entry or paper): a plugin's name that
    is already taken by other code, a built-in one's included, is refused, never replaced (the same code
    registering it again, as a notebook cell run again does, replaces it: :mod:`tdyn.registry`)."""


class SweepFailed(RuntimeError):
    """``tdyn.sweep`` ended with runs that hold no result (failed, or never ran): the message names how many
    and which, the first job's error and how to continue; ``status`` is every run's status (run name →
    ``finished``, ``diverged``, ``failed``, ``pending``) and ``out`` the sweep directory, whose ``sweep.json``
    holds every error. Not a mistake in the input: the command line says the same on one line and exits 1."""

    def __init__(self, message: str, status: dict[str, str], out: Any):
        super().__init__(message)
        self.status = status
        self.out = out

    @property
    def failed(self) -> list[str]:
        """The runs without a result."""
        return [n for n, s in self.status.items() if s not in ("finished", "diverged")]


#: errno values that mean the machine, not the input, failed a write: exit 1 (the run failed with this cause)
ENVIRONMENT_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EIO", "EFBIG", "EROFS")
                               if hasattr(errno, n))
#: errno values of a resource the machine refused (a fork at the process limit, memory, file descriptors): exit 1
RESOURCE_ERRNOS = frozenset(getattr(errno, n) for n in ("EAGAIN", "ENOMEM", "EMFILE", "ENFILE") if hasattr(errno, n))


class WriteError(OSError):
    """A file tdyn writes whole or not at all (``tdyn.runs.atomic``) could not be written: ``filename`` is
    the file, which is left as it was before (its temporary file removed). An ``OSError`` with the errno
    of the failure."""

    def __init__(self, e: OSError, path: str | os.PathLike):
        super().__init__(e.errno, e.strerror or str(e), os.fspath(path))

    def __str__(self) -> str:
        return (f"{os.fsdecode(self.filename)!r} could not be written: {self.strerror}; nothing was left "
                "half-written (the file is as it was before)")

    @property
    def environment(self) -> bool:
        """Whether the machine failed (disk full, quota, I/O error, read-only filesystem), not the input."""
        return self.errno in ENVIRONMENT_ERRNOS


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _typename(types: tuple[type, ...]) -> str:
    names = [("None" if t is type(None) else t.__name__) for t in types]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def check_arg(fn: str, name: str, value: Any, *types: type, what: str = "") -> Any:
    """``value`` of argument ``name`` of ``fn`` if it is one of ``types`` (a bool never counts as an
    int or float), else a :class:`UserError` naming the function, the argument, its type and what is
    allowed. The public API's one argument check (``tdyn.train``, ``tdyn.sweep``, ``tdyn.load_run``, …)."""
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        got = "None" if value is None else f"{_a(type(value).__name__)} ({shown})"
        raise UserError(f"{fn}(): argument {name!r} is {got}, not {what or _a(_typename(types))}")
    return value


def check_path(fn: str, name: str, value: Any) -> Any:
    """``value`` of argument ``name`` of ``fn`` if it is a non-empty path (a str or ``os.PathLike``), else a
    one-line :class:`UserError` (an empty path names no file: it is not the current directory)."""
    check_arg(fn, name, value, str, os.PathLike, what="a path (str or pathlib.Path)")
    if not os.fspath(value):
        raise UserError(f"{fn}(): argument {name!r} is an empty path (it names no file or directory)")
    return value


def _library_dirs() -> tuple[str, ...]:
    """Directories whose code is not the user's: tdyn's package, the standard library, installed packages."""
    import site
    import sysconfig

    here = os.path.dirname(os.path.abspath(__file__))
    paths = sysconfig.get_paths()
    dirs = {here, *(paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib"))}
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:        # a virtualenv's old site module
        pass
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


def user_frame(e: BaseException):
    """The innermost frame of ``e``'s traceback (its causes' too) in the user's own code — a file outside
    tdyn, the standard library and the installed packages (a ``--import`` module, a script's task) — as a
    ``traceback.FrameSummary``, or None when the error arose in tdyn or a library alone."""
    import traceback

    lib = _library_dirs()
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for fs in reversed(traceback.extract_tb(e.__traceback__)):
            name = fs.filename
            if name.startswith("<") or not os.path.isabs(name):
                continue
            if not os.path.join(os.path.realpath(name), "").startswith(lib):
                return fs
        e = e.__cause__ or e.__context__
    return None


def user_code_error(e: BaseException, what: str = "your code") -> UserCodeError | None:
    """A one-line :class:`UserCodeError` for ``e`` when it arose in the user's code (:func:`user_frame`):
    the exception, and where in whose code; None when it did not."""
    fs = user_frame(e)
    if fs is None:
        return None
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    text = " ".join(text.split())
    if len(text) > 300:
        text = text[:297] + "..."
    err = UserCodeError(f"{what} raised {text} (at {fs.filename}, line {fs.lineno}, in {fs.name}): an error "
                        "in your code, not in tdyn (`tdyn -v` shows its traceback)")
    err.__cause__ = e
    return err
