"""Registry of named experiments (`tdyn list`, `tdyn run NAME`, `tdyn reproduce NAME`).

An experiment module registers its reproductions with :func:`register`; the table ``MODULES`` below
names the module of every built-in one (``tdyn reproduce NAME`` imports only NAME's module; ``tdyn
list`` imports them all). A new reproduction adds one line to the table (a test checks the table and
the registrations agree).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from tdyn.registry import Registry

_SS = "tdyn.experiments.scan_snap"
MODULES = {
    "scan-snap/fig3": f"{_SS}_theory",
    "scan-snap/fig8": f"{_SS}_theory",
    "scan-snap/fig9": f"{_SS}_theory",
    "scan-snap/fig4": _SS,
    "scan-snap/fig5": f"{_SS}_sweeps",
    "scan-snap/fig6": f"{_SS}_sweeps",
    "scan-snap/fig11-12": f"{_SS}_sweeps",
    "scan-snap/thm3": f"{_SS}_sweeps",
    "scan-snap/snap-time": f"{_SS}_sweeps",
    "real/topic-embeddings": "tdyn.experiments.real_text",
    "real/attention-maps": "tdyn.experiments.real_text",
    "real/entropy-vs-lr": "tdyn.experiments.real_text",
    "topic/embeddings": "tdyn.experiments.topic",
    "topic/stage1": "tdyn.experiments.topic",
    "topic/stage2": "tdyn.experiments.topic",
    "topic/no-unchanged-mask": "tdyn.experiments.topic",
    "topic/two-stage": "tdyn.experiments.topic",
    "topic/robustness": "tdyn.experiments.topic",
    "topic/squared-loss": "tdyn.experiments.topic",
    "decision-list/claim1": "tdyn.experiments.decision_lists",
    "decision-list/claim2": "tdyn.experiments.decision_lists",
    "decision-list/uniform-attention": "tdyn.experiments.decision_lists",
}


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


EXPERIMENTS: Registry[Experiment] = Registry("experiment", table=MODULES)
_REGISTRY = EXPERIMENTS._items  # the registered entries (tests add temporary ones with monkeypatch.setitem)


def register(name: str, description: str, default_config: Callable[[], dict] | None = None):
    """Decorator registering ``reproduce(ctx) -> results`` under ``name``.

    ``default_config`` (optional) returns a run config dict so that ``tdyn run NAME`` works.
    """

    def deco(fn):
        EXPERIMENTS.register(name, Experiment(name, description, fn, default_config))
        return fn

    return deco


def all_experiments() -> dict[str, Experiment]:
    return EXPERIMENTS.items()


def get(name: str) -> Experiment:
    return EXPERIMENTS.get(name)
