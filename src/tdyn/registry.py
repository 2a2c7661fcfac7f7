"""One registry helper for tdyn's named things (tasks, probes, benches, experiments).

A :class:`Registry` maps names to items: ``register`` refuses a duplicate name, ``get`` raises a
one-line :class:`~tdyn.errors.UserError` (or the subclass given) listing the allowed names, and
``items`` lists them sorted. ``table`` (optional) is an explicit map name → module path, and ``papers`` names
the section of the papers' manifests (:mod:`tdyn.papers`) that adds to it: looking a name up imports
only its module; listing imports every module of the table (never a package walk,
no import side effects beyond the registrations of the modules named).
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, Iterator, TypeVar

from tdyn import papers, plugins
from tdyn.errors import RegisteredTwice, UserError, check_arg

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, *, table: dict[str, str] | None = None,
                 error: type[UserError] = UserError, label: str | None = None, hint: str = "",
                 papers: str | None = None):
        self.kind = kind                  # "task", "probe", "bench", "experiment"
        self.label = label or kind        # how the key is named in errors, e.g. "probes.names"
        self.error = error
        self._table = dict(table or {})   # name -> module that registers it (besides the papers')
        self.papers = papers              # the manifests' section ("tasks", "probes", …) that adds to it
        self.hint = hint                  # appended to the unknown-name error
        self._items: dict[str, T] = {}

    @property
    def table(self) -> dict[str, str]:
        """Name -> module of every entry known without importing it: the explicit table and the papers'."""
        return {**self._table, **(papers.table(self.papers) if self.papers else {})}

    def _load(self, name: str | None = None) -> None:
        """Import the module of ``name`` (or, for None, every module of the table); a name that is
        neither registered nor in the table loads the user's plugins (``tdyn.plugins``) first."""
        if name is not None:
            if name not in self._items and name in self.table:
                importlib.import_module(self.table[name])
            if name not in self._items and plugins.load() and name in self.table:
                importlib.import_module(self.table[name])   # a plugin's paper declared it
            return
        for mod in dict.fromkeys(self.table.values()):
            importlib.import_module(mod)

    def register(self, name: str, item: T) -> T:
        """Add ``item`` under ``name``; a name already taken is a :class:`~tdyn.errors.RegisteredTwice`.
        A name the table declares (a built-in or an installed paper's) belongs to its module, which is
        imported first, so a plugin registering it is refused whether or not that module was loaded yet
        (importing the module that is registering it returns at once: it is already in ``sys.modules``)."""
        self._check_name(name)
        owner = self.table.get(name) if name not in self._items else None
        if owner is not None:
            importlib.import_module(owner)
        if name in self._items:
            where = self.table.get(name)
            raise RegisteredTwice(f"{self.kind} {name!r} registered twice" + (f": {name!r} is {where}'s" if where else "")
                                  + "; a name is registered once (give yours another name)")
        self._items[name] = item
        return item

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@reg.decorator(name)`` registers the decorated object under ``name``."""

        self._check_name(name)

        def deco(item: T) -> T:
            return self.register(name, item)

        return deco

    def _check_name(self, name: object) -> None:
        check_arg(f"register {self.kind}", "name", name, str, what="a name (a non-empty str)")
        if not name.strip():
            raise UserError(f"register {self.kind}: an empty name")

    def get(self, name: str) -> T:
        self._load(name)
        if name not in self._items:
            where = f"{self.label}: " if self.label != self.kind else ""
            known = sorted(set(self.table) | set(self._items))   # no module imported to say so
            raise self.error(f"{where}unknown {self.kind} {name!r}; allowed: {', '.join(known)}{self.hint}")
        return self._items[name]

    def __contains__(self, name: str) -> bool:
        self._load(name)
        return name in self._items

    def names(self) -> list[str]:
        self._load()
        return sorted(self._items)

    def items(self) -> dict[str, T]:
        self._load()
        return dict(sorted(self._items.items()))

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests that register a temporary entry)."""
        self._items.pop(name, None)
