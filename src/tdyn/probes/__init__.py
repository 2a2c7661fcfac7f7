"""Probes: named measurements of the training state, logged as first-class metrics.

A probe is ``fn(ctx) -> dict[str, Tensor]``. A tensor of shape [S] (one value per ensemble member)
is a scalar metric written to ``metrics.jsonl`` as ``<probe>/<key>`` at every evaluation; a tensor
of shape [S, ...] is an array saved into the checkpoint files as ``probe/<probe>/<key>``.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable

import torch

from tdyn.errors import ConfigError


@dataclasses.dataclass
class ProbeContext:
    model: torch.nn.Module
    task: Any
    batch: Any
    step: int


_PROBES: dict[str, Callable[[ProbeContext], dict[str, torch.Tensor]]] = {}


def probe(name: str):
    """Decorator registering a probe under ``name``."""

    def deco(fn):
        if name in _PROBES:
            raise RuntimeError(f"probe {name!r} registered twice")
        _PROBES[name] = fn
        return fn

    return deco


def _load_all() -> None:
    import tdyn.experiments  # noqa: F401  (experiments may register task-specific probes)

    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")


def get_probes(names: list[str]) -> dict[str, Callable]:
    _load_all()
    bad = [n for n in names if n not in _PROBES]
    if bad:
        raise ConfigError(f"probes.names: unknown probe {bad[0]!r}; allowed: {', '.join(sorted(_PROBES))}")
    return {n: _PROBES[n] for n in names}
