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


#: Every probe, by name; the table names the module of each built-in probe, imported on lookup.
PROBES: Registry[Callable[[ProbeContext], dict[str, torch.Tensor]]] = Registry(
    "probe", error=ConfigError, label="probes.names", hint=plugins.HINT, table={
        "scan_snap.attention": "tdyn.probes.scan_snap",
        "scan_snap.decoder": "tdyn.probes.scan_snap",
        "topic.norms": "tdyn.probes.topic",
        "topic.attention": "tdyn.probes.topic",
        "topic.blocks": "tdyn.probes.topic",
        "topic.dev_loss": "tdyn.probes.topic",
        "topic.stages": "tdyn.probes.topic_stages",
        "corpus_lm.attention": "tdyn.probes.corpus_lm",
        "decision_list.classify": "tdyn.probes.decision_list",
        "decision_list.V": "tdyn.probes.decision_list",
        "decision_list.hessian": "tdyn.probes.decision_list",
    })


def probe(name: str):
    """Decorator registering a probe under ``name`` (a built-in one also goes into the table above)."""
    return PROBES.decorator(name)


def get_probes(names: list[str]) -> dict[str, Callable]:
    return {n: PROBES.get(n) for n in names}
