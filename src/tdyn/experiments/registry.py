"""Registry of named experiments (`tdyn list`, `tdyn run NAME`, `tdyn reproduce NAME`).

An experiment module registers itself with :func:`register`; ``tdyn.experiments`` imports every
module of the package, so adding a file is enough to make its experiments known.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from tdyn.errors import UserError


@dataclasses.dataclass
class ReproduceContext:
    """What a reproduction receives: where to write, and the user's options."""

    out: Path
    seed: int = 0
    quick: bool = False
    overrides: list[str] = dataclasses.field(default_factory=list)
    device: str = "cpu"
    progress: bool = True


@dataclasses.dataclass
class Experiment:
    name: str
    description: str
    reproduce: Callable[[ReproduceContext], dict[str, Any]]
    default_config: Callable[[], dict[str, Any]] | None = None


_REGISTRY: dict[str, Experiment] = {}


def register(name: str, description: str, default_config: Callable[[], dict] | None = None):
    """Decorator registering ``reproduce(ctx) -> results`` under ``name``.

    ``default_config`` (optional) returns a run config dict so that ``tdyn run NAME`` works.
    """

    def deco(fn):
        if name in _REGISTRY:
            raise RuntimeError(f"experiment {name!r} registered twice")
        _REGISTRY[name] = Experiment(name, description, fn, default_config)
        return fn

    return deco


def all_experiments() -> dict[str, Experiment]:
    import tdyn.experiments  # noqa: F401  (imports every experiment module)

    return dict(sorted(_REGISTRY.items()))


def get(name: str) -> Experiment:
    exps = all_experiments()
    if name not in exps:
        raise UserError(f"unknown experiment {name!r}; known: {', '.join(exps)}")
    return exps[name]
