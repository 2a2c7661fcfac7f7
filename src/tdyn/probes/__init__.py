"""Probes: named measurements of the training state, logged as first-class metrics.

A probe is ``fn(ctx) -> dict[str, Tensor]``. A tensor of shape [S] (one value per ensemble member)
is a scalar metric written to ``metrics.jsonl`` as ``<probe>/<key>`` at every evaluation; a tensor
of shape [S, ...] is an array saved into the checkpoint files as ``probe/<probe>/<key>``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from tdyn.errors import ConfigError
from tdyn import plugins
from tdyn.registry import Registry


@dataclasses.dataclass
class ProbeContext:
    model: torch.nn.Module
    task: Any
    batch: Any
    step: int
    options: dict[str, Any] = dataclasses.field(default_factory=dict)   # the run's probes.options[name]
    #: one evaluation's scratch, the same dict for all its probes (the trainer makes one per evaluation): a
    #: statistic that several probes need is computed once (:meth:`once`); nothing in it outlives the evaluation
    shared: dict[str, Any] = dataclasses.field(default_factory=dict)

    def once(self, key: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, computed by the first probe of this evaluation that asks under ``key`` and handed to the
        others (the probes of one evaluation see the same model and batch)."""
        if key not in self.shared:
            self.shared[key] = fn()
        return self.shared[key]


#: Every probe, by name; the papers' manifests name the module of each built-in probe, imported on lookup.
PROBES: Registry[Callable[[ProbeContext], dict[str, torch.Tensor]]] = Registry(
    "probe", error=ConfigError, label="probes.names", hint=plugins.HINT, papers="probes")


def probe(name: str):
    """Decorator registering a probe under ``name`` (a paper's probe is also named in its manifest)."""
    return PROBES.decorator(name)


def get_probes(names: list[str]) -> dict[str, Callable]:
    return {n: PROBES.get(n) for n in names}
