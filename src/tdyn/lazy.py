"""Lazy exports: a package names its public objects and the module defining each, and imports that
module on first attribute access (PEP 562), so ``import tdyn`` or ``import tdyn.models`` stays light
(no torch) and ``tdyn list`` / ``--help`` stay fast."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def exports(package: str, table: dict[str, str]) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package``: ``table`` maps a name to its module (absolute,
    or relative to ``package`` when it starts with a dot; ``"."``: the submodule ``package.name`` itself)."""
    names = sorted(table)

    def getattr_(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        mod = table[name]
        if mod == ".":                   # a subpackage / submodule of ``package`` itself
            return importlib.import_module(f"{package}.{name}")
        return getattr(importlib.import_module(mod if not mod.startswith(".") else package + mod), name)

    return names, getattr_, lambda: names


def callable_package(package: str, target: str) -> None:
    """Make module ``package`` callable: ``package(*a, **kw)`` calls ``target`` ("module:function"),
    imported on the first call (``tdyn.train(config, out)``, ``tdyn.sweep(spec, out)``). ``inspect.signature``
    and ``help()`` of the package show the target's real signature and docstring (read when asked for, so
    importing the package imports nothing more), followed by the package's own docstring."""
    import sys
    import types

    mod_name, fn_name = target.split(":")

    def fn() -> Callable[..., Any]:
        return getattr(importlib.import_module(mod_name), fn_name)

    class _Callable(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return fn()(*args, **kwargs)

        @property
        def __signature__(self):
            import inspect

            return inspect.signature(fn())

        def _doc(self) -> str | None:
            import inspect

            f = fn()
            own = self.__dict__.get("__doc__")
            return (f"{package}{inspect.signature(f)}\n\n{inspect.getdoc(f) or ''}"
                    + (f"\n\nThe package {package}: {inspect.cleandoc(own)}" if own else ""))

        __doc__ = property(_doc)   # a data descriptor: read before the module's own __doc__

    sys.modules[package].__class__ = _Callable
