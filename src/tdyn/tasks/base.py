"""The contract between an experiment and the trainer.

A *task* wires one distribution and one model (a model never imports a distribution; a task module
in ``tdyn.tasks`` does the wiring). It is built from a resolved :class:`tdyn.config.RunConfig` and the list of ensemble
members, and exposes:

* ``model``: an ``nn.Module`` whose parameters all carry a leading ensemble axis of size S;
* ``sample(gen)``: one data stream's batch drawn with ``gen`` (members that share a seed share a
  stream), or ``None`` when the loss is an exact population loss;
* ``loss(batch)``: the per-member training loss, shape [S], where ``batch`` is the per-stream batches
  stacked on a leading axis of size S (``None`` for population losses);
* ``probe_batch(gen)``: a fixed batch the probes evaluate on (default: one ``sample``);
* ``facts``: the distribution's facts the probes need (e.g. P(l|n), the distinct-token sets);
* ``member_generators()``: any further random streams (e.g. dropout), one generator per member,
  which the trainer checkpoints and restores so that resume is exact.

Tasks are registered by name with the pydantic classes of their ``data`` and ``model`` config
sections, so that configs are validated before anything runs. The built-in tasks are listed in the
table of ``tdyn.tasks`` (name -> module), imported only when looked up.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from pydantic import BaseModel

from tdyn import plugins
from tdyn.registry import Registry


@dataclasses.dataclass(frozen=True)
class Member:
    """One ensemble member: a seed, its learning rates per parameter group, and an init scale."""

    seed: int
    lrs: dict[str, float]
    init_scale: float = 1.0
    name: str = ""


class Task:
    """Base class; subclasses set ``self.model`` and implement ``sample`` and ``loss``."""

    model: torch.nn.Module
    facts: dict[str, Any] = {}

    def sample(self, gen: torch.Generator) -> Any:
        raise NotImplementedError

    def loss(self, batch: Any) -> torch.Tensor:
        raise NotImplementedError

    def probe_batch(self, gen: torch.Generator) -> Any:
        return self.sample(gen)

    def member_generators(self) -> dict[str, list[torch.Generator]]:
        return {}


@dataclasses.dataclass
class TaskSpec:
    name: str
    data_config: type[BaseModel]
    model_config: type[BaseModel]
    build: Callable[..., Task]  # build(cfg: RunConfig, members: list[Member]) -> Task
    description: str = ""


#: Every task, by name; the table of built-in task modules is filled in by ``tdyn.tasks``.
TASKS: Registry[TaskSpec] = Registry("task", label="task", hint=plugins.HINT)


def register_task(name: str, data_config: type[BaseModel], model_config: type[BaseModel],
                  description: str = ""):
    """Decorator: ``@register_task("scan_snap", DataCfg, ModelCfg)`` on ``build(cfg, members)``."""

    def deco(build):
        TASKS.register(name, TaskSpec(name, data_config, model_config, build, description))
        return build

    return deco
