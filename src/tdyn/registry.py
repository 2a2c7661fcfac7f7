"""One registry helper for tdyn's named things (tasks, probes, benches, experiments).

A :class:`Registry` maps names to items: ``register`` refuses a name taken by other code (a built-in
name always) and replaces an entry registered again by the same code (a notebook cell run again: see
:meth:`Registry.register`), ``get`` raises a one-line :class:`~tdyn.errors.UserError` (or the subclass
given) listing the allowed names, and ``items`` lists them sorted. ``table`` (optional) is an explicit map name → module path, and ``papers`` names
the section of the papers' manifests (:mod:`tdyn.papers`) that adds to it: looking a name up imports
only its module; listing imports every module of the table (never a package walk,
no import side effects beyond the registrations of the modules named).
"""

from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, TypeVar

from tdyn import papers, plugins
from tdyn.errors import RegisteredTwice, UserError, check_arg

T = TypeVar("T")
log = logging.getLogger(__name__)

#: The built-in tasks' and probes' one-line descriptions, ``{"tasks": {name: line}, "probes": {...}}``,
#: generated from their registrations by ``make catalog`` (with the reproductions' catalog) so
#: that ``tdyn list`` shows them without importing their modules (``tests/test_library_door.py`` checks it).
NAMES = Path(__file__).with_name("names.json")


def described() -> dict[str, dict[str, str]]:
    """The generated :data:`NAMES` catalog."""
    return json.loads(NAMES.read_text(encoding="utf-8"))

#: Who registered an entry: the ``(__module__, __qualname__)`` of the function or class registered.
Origin = tuple[str, str]
_OF_ITEM = object()   # register()'s default origin: the item's own (origin_of)


def origin_of(obj: Any) -> Origin | None:
    """``(obj.__module__, obj.__qualname__)`` of a function or class (the code that defines it), else None
    (a value with no code behind it: registering its name again is always refused)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return (module, qualname) if isinstance(module, str) and isinstance(qualname, str) else None


def same_code(old: Origin | None, new: Origin | None) -> bool:
    """Whether ``new`` is ``old`` defined again: the same module and qualified name, or both in ``__main__``
    (a notebook or script, whose cell may be edited, renaming the function, and run again)."""
    if old is None or new is None or old[0] != new[0]:
        return False
    return old[1] == new[1] or old[0] == "__main__"


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
        self._origins: dict[str, Origin | None] = {}     # name -> the code that registered it (origin_of)
        self._descriptions: dict[str, str] = {}          # name -> its one-line description (``tdyn list``)

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

    def register(self, name: str, item: T, *, origin: Origin | None | object = _OF_ITEM, description: str = "") -> T:
        """Add ``item`` under ``name``. ``origin`` is the code registering it, ``(module, qualname)``
        (default: :func:`origin_of` ``item``); ``description`` its one line for ``tdyn list``.

        A name already registered is replaced when the same code registers it again (:func:`same_code`: a
        notebook cell or ``importlib.reload`` run again), with a one-line notice (a ``logging`` warning);
        registered by other code it is a :class:`~tdyn.errors.RegisteredTwice` naming whose it is. A name
        the table declares (a built-in or an installed paper's) belongs to its module, which is imported
        first, and is never replaced: a plugin registering it is refused whether or not that module was
        loaded yet (importing the module that is registering it returns at once: it is already in
        ``sys.modules``)."""
        self._check_name(name)
        if origin is _OF_ITEM:
            origin = origin_of(item)
        owner = self.table.get(name) if name not in self._items else None
        if owner is not None:
            importlib.import_module(owner)
        if name in self._items:
            where = self.table.get(name)
            old = self._origins.get(name)
            if where is not None:
                raise RegisteredTwice(f"{self.kind} {name!r} registered twice: {name!r} is {where}'s, which is never "
                                      f"replaced; give yours another name")
            if not same_code(old, origin):
                def who(o):
                    return ".".join(o) if o else "a value"
                raise RegisteredTwice(f"{self.kind} {name!r} registered twice: by {who(old)} and now by {who(origin)}; "
                                      f"a name is registered once (give yours another name; the same code "
                                      f"registering it again replaces it)")
            log.warning("%s %r registered again by %s.%s: the new one replaces the old", self.kind, name, *origin)
        self._items[name] = item
        self._origins[name] = origin
        self._descriptions[name] = description
        return item

    def description(self, name: str) -> str:
        """The one-line description ``name`` was registered with ("" when none)."""
        self._load(name)
        return self._descriptions.get(name, "")

    def decorator(self, name: str, description: str = "") -> Callable[[T], T]:
        """``@reg.decorator(name)`` registers the decorated object under ``name`` (:meth:`register`)."""

        self._check_name(name)

        def deco(item: T) -> T:
            return self.register(name, item, description=description)

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
        self._origins.pop(name, None)
        self._descriptions.pop(name, None)
