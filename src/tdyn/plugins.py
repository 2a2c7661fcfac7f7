"""User extensions: modules that register tasks, probes or experiments with tdyn's decorators
(``@tdyn.register_task``, ``@tdyn.probe``), or a whole paper (a package whose ``__init__`` defines
``MANIFEST = tdyn.Paper(...)``, registered exactly as a built-in paper is), imported before their names
are looked up.

A plugin is named by

* ``tdyn --import MODULE_OR_FILE`` (repeatable; a dotted module importable from the current
  directory, or a path to a ``.py`` file), which the CLI also puts into ``$TDYN_IMPORT`` so that
  sweep workers — local processes, Ray tasks, Slurm jobs — import the same modules;
* ``$TDYN_IMPORT`` itself (entries separated by ``os.pathsep``);
* an installed package's entry point in the group ``tdyn.tasks`` (``[project.entry-points."tdyn.tasks"]
  mytasks = "mypkg.tasks"`` in its pyproject.toml); a whole paper's package is an entry point of the
  group ``tdyn.papers`` instead (``mypaper = "mypkg"``), read with the built-in papers by :mod:`tdyn.papers`.

Every registry looks plugins up lazily: a name it does not know triggers :func:`load` once, then the
lookup is retried, so any process that reads a config naming a user task imports what registers it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from tdyn import papers
from tdyn.errors import UserCodeError, UserError, user_code_error

ENV = "TDYN_IMPORT"
GROUP = "tdyn.tasks"
_done: set[str] = set()
HINT = " (one of your own: register it in a module and pass `tdyn --import MODULE`, see docs/library.md)"


def _entries() -> list[str]:
    return [s for s in os.environ.get(ENV, "").split(os.pathsep) if s]


def add(specs: list[str]) -> None:
    """Import ``specs`` now and add them to ``$TDYN_IMPORT`` (inherited by worker processes)."""
    env = _entries()
    for s in specs:
        s = str(Path(s).resolve()) if s.endswith(".py") else s
        if s not in env:
            env.append(s)
    os.environ[ENV] = os.pathsep.join(env)
    load()


def _import(spec: str, what: str | None = None) -> None:
    """Import one plugin; anything its code raises is a one-line :class:`~tdyn.errors.UserCodeError`
    naming the plugin, the exception and the line of the plugin's code (its traceback kept as the cause)."""
    what = what or f"--import {spec}"
    try:
        _import_one(spec)
    except UserError:
        raise
    except SyntaxError as e:   # the user's file does not parse: where, on one line
        raise UserError(f"{what}: {e.filename}, line {e.lineno}: {e.msg}") from None
    except SystemExit as e:    # sys.exit() at import would end tdyn silently, with the plugin's code (0 included)
        raise _exited(what, e) from e
    except Exception as e:
        err = user_code_error(e, f"{what}: importing it")
        if err is None:        # raised by an installed package it imports, not by the plugin itself
            err = UserCodeError(f"{what}: importing it raised {type(e).__name__}: {e}".replace("\n", " "))
            err.__cause__ = e
        raise err from e


def _exited(what: str, e: SystemExit) -> UserCodeError:
    """A plugin that calls ``sys.exit`` (or raises ``SystemExit``) while imported: whatever its code, tdyn did
    not do what it was asked, so it is the plugin's error (one line, exit 2), never a silent exit 0.
    KeyboardInterrupt is left alone: it is the user's interrupt, not the plugin's."""
    err = UserCodeError(f"{what}: importing it called sys.exit({e.code!r}) (SystemExit); a plugin module must "
                        f"not exit: remove the call or guard it with `if __name__ == '__main__':`".replace("\n", " "))
    err.__cause__ = e
    return err


def _check_name(spec: str) -> None:
    """A dotted module name (``mypkg.tasks``): a relative one (``..x``) has no package to be relative to."""
    if not all(part.isidentifier() for part in spec.split(".")):
        raise UserError(f"--import {spec!r}: not a module name (a dotted name such as mypkg.tasks, importable "
                        "from the current directory, or a path to a .py file)")


def _declare(obj) -> None:
    """A plugin module (or entry-point object) that defines a paper's manifest registers that paper."""
    manifest = obj if isinstance(obj, papers.Paper) else getattr(obj, "MANIFEST", None)
    if isinstance(manifest, papers.Paper):
        papers.register(manifest)


def _import_one(spec: str) -> None:
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            raise UserError(f"--import {spec}: no such file")
        if any(getattr(m, "__file__", None) and Path(m.__file__).resolve() == path.resolve()
               for m in list(sys.modules.values())):
            return   # already imported (e.g. the running script, ``__main__``, that called tdyn.plugins.add)
        name = f"tdyn_plugin_{path.stem}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
        _declare(module)
        return
    _check_name(spec)
    if os.getcwd() not in sys.path and "" not in sys.path:   # `tdyn` as a console script: make ./mypkg importable
        sys.path.append(os.getcwd())
    try:
        _declare(importlib.import_module(spec))
    except ModuleNotFoundError as e:
        if e.name and spec.startswith(e.name):
            raise UserError(f"--import {spec}: no module named {e.name!r} (not installed, not under "
                            f"{os.getcwd()!r})") from None
        raise


def load() -> list[str]:
    """Import every plugin of ``$TDYN_IMPORT`` and of the ``tdyn.tasks`` entry points not yet imported;
    returns the names imported now."""
    from importlib.metadata import entry_points

    new = []
    for s in _entries():
        if s not in _done:
            _done.add(s)
            _import(s)
            new.append(s)
    for ep in entry_points(group=GROUP):
        key = f"entry point {ep.name} = {ep.value}"
        if key not in _done:
            _done.add(key)
            try:
                _declare(ep.load())
            except SystemExit as e:
                raise _exited(key, e) from e
            except Exception as e:
                err = user_code_error(e, key) or UserCodeError(f"{key}: loading it raised {type(e).__name__}: {e}")
                raise err from e
            new.append(key)
    return new
