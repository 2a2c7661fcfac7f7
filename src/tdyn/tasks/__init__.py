"""Tasks: each wires one distribution (``tdyn.data``) to one model (``tdyn.models``) for the trainer.

One module per task holds its ``data``/``model`` config sections and its builder; the papers' manifests
(:mod:`tdyn.papers`) name the module of each task, imported only when the task is looked up
(``get_task``), so validating a config imports that task's module and nothing else.
"""

from __future__ import annotations

import torch

from tdyn.tasks.base import TASKS, Member, PlainTask, Task, TaskSpec, register_task



def get_task(name: str) -> TaskSpec:
    """The task registered as ``name`` (importing its module); a one-line error lists the allowed names."""
    return TASKS.get(name)


DTYPES = {"float32": torch.float32, "float64": torch.float64}


def build_task(cfg, members: list[Member]) -> Task:
    """The task of run config ``cfg`` (a RunConfig) for ``members``, built with the run's dtype as
    torch's default (its parameters and buffers get it). The one way trainer, runs and analyses build one."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(DTYPES[cfg.dtype])
    try:
        return get_task(cfg.task).build(cfg, members)
    finally:
        torch.set_default_dtype(old)


def all_tasks() -> dict[str, TaskSpec]:
    return TASKS.items()


__all__ = ["DTYPES", "TASKS", "build_task", "Member", "PlainTask", "Task", "TaskSpec", "all_tasks", "get_task", "register_task"]
