"""Named activations: the intermediate tensors of a model's forward pass, by name (docs/activations.md).

A model lists what it can record in a class attribute ``ACTIVATIONS = {name: description}`` (a model whose
names depend on its config, e.g. one set per layer, also defines ``activation_names()`` returning the
instance's own), and its ``forward`` hands each tensor to the cache that :func:`recording` returns::

    cache = activations.recording(self)           # None unless someone captures this model
    ...
    if cache is not None:
        cache.put("attention", A)                 # or cache.put("context", lambda: dense(...)): computed
                                                  # only where that name was asked for

Nothing is recorded, and nothing is computed for it, unless a caller asks: ``recording`` returns None at
the cost of one test of an empty dict while no capture is open (the training path), and a tensor that the
forward does not form on its fast path is passed as a function, called only where its name is requested.
No ``nn.Module`` hooks are registered.

One entry point, two spellings (TransformerLens' ``run_with_cache``, or a ``with`` block)::

    logits, cache = run_with_cache(model, x, names=["attention", "logits"])
    with capture(model, ["layer*.attention"]) as cache:     # fnmatch patterns select several
        model.loss(x, y)
    cache["layer0.attention"]                              # [S, ...]: the ensemble axis first, detached

``names=None`` records every name the call produces. A name (or a pattern matching none) that the model
does not declare is a :class:`~tdyn.errors.UserError` listing the allowed ones; a requested name the call
did not produce is one too, raised when the capture closes. Every tensor is detached (not copied) and
keeps the model's leading ensemble axis ``[S, ...]``; a name recorded twice in one capture (two forward
calls) keeps the last. ``model`` may be a :class:`tdyn.Stacked` (a ``PlainTask``'s model): its plain
module declares ``ACTIVATIONS`` and records as above, for one member; each ``map`` call returns its
members' tensors stacked on the leading axis S (under vmap or the per-member loop).
"""

from __future__ import annotations

import contextlib
import fnmatch
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from tdyn.errors import UserError

#: the open captures, by ``id`` of each module they cover (empty: nobody captures; the forward records nothing)
_ACTIVE: dict[int, "Cache"] = {}


def recording(module: nn.Module) -> "Cache | None":
    """The cache ``module``'s forward records into, or None (always None while no capture is open)."""
    return _ACTIVE.get(id(module)) if _ACTIVE else None


class Cache(dict):
    """Name → tensor [S, ...] (detached) of one capture; ``allowed`` the model's names and descriptions,
    ``requested`` the names asked for (None: every one)."""

    def __init__(self, allowed: dict[str, str], requested: set[str] | None):
        super().__init__()
        self.allowed = allowed
        self.requested = requested

    def wants(self, name: str) -> bool:
        """Whether ``name`` is to be recorded (asked for, or every name is)."""
        return self.requested is None or name in self.requested

    def asked(self, name: str) -> bool:
        """Whether ``name`` was asked for by name (not only as part of "every name")."""
        return self.requested is not None and name in self.requested

    def put(self, name: str, value: torch.Tensor | Callable[[], torch.Tensor]) -> None:
        """Record ``value`` (a tensor, or a function computing it, called only if ``name`` is wanted)."""
        if name not in self.allowed:
            raise ValueError(f"activation {name!r} is not among the model's names ({', '.join(self.allowed)})")
        if self.wants(name):
            self[name] = (value() if callable(value) else value).detach()

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {list(v.shape)}" for k, v in self.items())
        return f"Cache({{{shapes}}})"


def available(model: nn.Module) -> dict[str, str]:
    """The named activations ``model`` can record, with their descriptions (``activation_names()`` where the
    model defines it, else its class attribute ``ACTIVATIONS``)."""
    if callable(getattr(model, "activation_names", None)):
        return dict(model.activation_names())
    table = getattr(type(model), "ACTIVATIONS", None)
    if not isinstance(table, dict):
        raise UserError(f"{type(model).__name__} declares no named activations (a class attribute "
                        f"ACTIVATIONS = {{name: description}}, see docs/activations.md)")
    return dict(table)


def resolve(model: nn.Module, requested: str | Iterable[str] | None) -> set[str] | None:
    """The names ``requested`` (names or fnmatch patterns; None: every name) checked against ``model``'s."""
    allowed = available(model)
    if requested is None:
        return None
    if isinstance(requested, str):
        requested = [requested]
    out: set[str] = set()
    for r in requested:
        if not isinstance(r, str):
            raise UserError(f"activation names are strings, not {type(r).__name__} ({r!r})")
        hits = [n for n in allowed if fnmatch.fnmatchcase(n, r)] if any(c in r for c in "*?[") else \
            ([r] if r in allowed else [])
        if not hits:
            raise UserError(f"unknown activation {r!r} of {type(model).__name__}; allowed: {', '.join(allowed)}")
        out.update(hits)
    return out


@contextlib.contextmanager
def _open(cache: Cache, modules: Iterable[nn.Module]) -> Iterator[Cache]:
    """Route the records of ``modules`` to ``cache`` for the block (an enclosing capture of the same modules
    is restored after)."""
    ids = {id(m) for m in modules}
    before = {i: _ACTIVE[i] for i in ids if i in _ACTIVE}
    _ACTIVE.update(dict.fromkeys(ids, cache))
    try:
        yield cache
    finally:
        for i in ids:
            _ACTIVE.pop(i, None)
        _ACTIVE.update(before)


@contextlib.contextmanager
def capture(model: nn.Module, names: str | Iterable[str] | None = None) -> Iterator[Cache]:
    """Record ``model``'s named activations (``names``, or fnmatch patterns of them; None: all) in the
    yielded :class:`Cache` while the block runs: ``with capture(model, ["attention"]) as cache: model(x)``.
    Unknown names are refused before the block runs; requested names the block did not produce, when it
    ends (each a one-line :class:`~tdyn.errors.UserError`)."""
    requested = resolve(model, names)
    cache = Cache(available(model), requested)
    with _open(cache, model.modules()):
        yield cache
    missing = sorted(requested - cache.keys()) if requested is not None else []
    if missing:
        raise UserError(f"activation{'s' if len(missing) > 1 else ''} {', '.join(missing)} of "
                        f"{type(model).__name__} not produced by this call (the forward, or the method called, "
                        f"does not compute {'them' if len(missing) > 1 else 'it'}; see docs/activations.md)")


def run_with_cache(model: nn.Module | Callable[..., Any], *args: Any, names: str | Iterable[str] | None = None,
                   **kwargs: Any) -> tuple[Any, Cache]:
    """``(model(*args, **kwargs), cache)``: the output and the named activations the call recorded
    (``names`` as in :func:`capture`). ``model`` may be a bound method of the model (``model.loss``): the
    method is called and the model's activations recorded."""
    target = getattr(model, "__self__", model)
    if not isinstance(target, nn.Module):
        raise UserError(f"run_with_cache: {type(model).__name__} is neither a model (nn.Module) nor one of its "
                        f"methods")
    with capture(target, names) as cache:
        out = model(*args, **kwargs)
    return out, cache


def member_fn(cache: Cache, module: nn.Module, fn: Callable[..., Any]) -> Callable[..., Any]:
    """For :meth:`tdyn.Stacked.map` under a capture: ``fn(m, *a)`` made to return ``(output, {name: tensor})``
    with what ``m`` (the plain module, one member) recorded, so that vmap or the per-member loop stacks the
    members' tensors on the leading axis S like any output."""

    def recorded(m, *a):
        inner = Cache(cache.allowed, cache.requested)
        with _open(inner, module.modules()):
            out = fn(m, *a)
        return out, dict(inner)

    return recorded


__all__ = ["Cache", "available", "capture", "recording", "resolve", "run_with_cache"]
