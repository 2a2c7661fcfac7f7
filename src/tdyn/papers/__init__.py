"""The papers tdyn knows: the built-in paper packages (one line each below) and users' papers.

Every paper enters through :func:`register` with its :class:`~tdyn.manifest.Paper`: the built-in
ones and the installed ones (entry points of the group ``tdyn.papers``) when the list is first read,
a user's module when it is imported (``tdyn --import MODULE``, see :mod:`tdyn.plugins`: a module that
defines ``MANIFEST`` is registered by that import). The core reads the papers only through this module:
:func:`table` (name -> module of the tasks, probes, reproductions, benches), :func:`manifests`,
:func:`of` (the paper of a reproduction name) and :func:`exports`. Importing this module or a paper's
``__init__`` imports no torch.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys

from tdyn.errors import RegisteredTwice
from tdyn.manifest import Paper, Reproduction

#: The built-in papers, in the order the report and the docs show them.
BUILTIN = ("tdyn.papers.scan_snap", "tdyn.papers.topic", "tdyn.papers.decision_list", "tdyn.papers.real_text",
           "tdyn.papers.icl_gd", "tdyn.papers.birth")

_PAPERS: dict[str, Paper] = {}
_builtin_done = False


def register(manifest: Paper) -> Paper:
    """Add a paper (the same path for a built-in paper and a user's); a second paper with the same
    name or reproduction prefix is an error."""
    _builtin()
    old = _PAPERS.get(manifest.name)
    if old is manifest:
        return manifest
    if old is not None or any(p.prefix == manifest.prefix for p in _PAPERS.values()):
        raise RegisteredTwice(f"paper {manifest.name!r} (prefix {manifest.prefix!r}) registered twice")
    _PAPERS[manifest.name] = manifest
    return manifest


#: The entry-point group of installed papers (``[project.entry-points."tdyn.papers"] mypaper = "mypkg"``).
GROUP = "tdyn.papers"


def _builtin() -> None:
    """The built-in papers, then the installed ones (entry points of :data:`GROUP`), once per process."""
    global _builtin_done
    if not _builtin_done:
        _builtin_done = True
        for pkg in BUILTIN:
            manifest = importlib.import_module(pkg).MANIFEST
            _PAPERS[manifest.name] = manifest
        from importlib.metadata import entry_points

        for ep in entry_points(group=GROUP):
            obj = ep.load()
            register(obj if isinstance(obj, Paper) else obj.MANIFEST)


def manifests() -> list[Paper]:
    """Every registered paper: the built-in ones first, in :data:`BUILTIN` order."""
    _builtin()
    return list(_PAPERS.values())


def table(kind: str) -> dict[str, str]:
    """Name -> module of every paper's ``kind`` ("tasks", "probes", "reproductions", "benches")."""
    out: dict[str, str] = {}
    for p in manifests():
        for name, mod in getattr(p, kind).items():
            out[name] = mod.module if isinstance(mod, Reproduction) else mod
    return out


def of(reproduction: str) -> Paper | None:
    """The paper whose prefix begins the reproduction name ``reproduction`` (None: no paper's)."""
    prefix = reproduction.split("/", 1)[0]
    return next((p for p in manifests() if p.prefix == prefix), None)


def exports(section: str) -> dict[str, str]:
    """Public name -> module of the papers' ``section`` ("models", "data", "theory")."""
    out: dict[str, str] = {}
    for p in manifests():
        out.update(p.exports.get(section, {}))
    return out


#: Module paths of earlier tdyn versions in the core (the papers' own are their manifests' ``aliases``).
CORE_ALIASES = {"tdyn.experiments": "tdyn.reproduce", "tdyn.experiments.registry": "tdyn.reproduce.registry",
                "tdyn.experiments.runner": "tdyn.reproduce.runner", "tdyn.experiments.common": "tdyn.reproduce.common",
                "tdyn.train.seeding": "tdyn.seeding", "tdyn.train.threads": "tdyn.threads"}


_ALIASES: dict[str, str] = {}


def _builtin_aliases() -> dict[str, str]:
    """Old path -> module of the built-in papers' manifests (only tdyn's own modules ever moved, so an installed
    paper's entry point, whose scan costs tens of milliseconds, is never read for an import of ``tdyn.*``)."""
    if not _ALIASES:
        for pkg in BUILTIN:
            _ALIASES.update(importlib.import_module(pkg).MANIFEST.aliases)
    return _ALIASES


class _Aliases:
    """Old module paths (:data:`CORE_ALIASES`, a manifest's ``aliases``) import the module that now holds
    the code: the same module object under both names (first on ``sys.meta_path``, so that a submodule
    of an aliased package is never loaded a second time under the old name)."""

    _busy = False

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("tdyn.") or name.startswith("tdyn.papers") or _Aliases._busy:
            return None
        _Aliases._busy = True
        try:
            real = CORE_ALIASES.get(name) or _builtin_aliases().get(name)
        finally:
            _Aliases._busy = False
        return None if real is None else importlib.machinery.ModuleSpec(name, self, origin=real)

    def create_module(self, spec):
        return importlib.import_module(spec.origin)

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Aliases) for f in sys.meta_path):
    sys.meta_path.insert(0, _Aliases())

__all__ = ["BUILTIN", "Paper", "Reproduction", "exports", "manifests", "of", "register", "table"]
