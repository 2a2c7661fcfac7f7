"""Probes: named measurements of the training state, logged as first-class metrics.

A probe is ``fn(ctx) -> dict[str, Tensor]`` registered with ``@tdyn.probe(name)`` and named in a run
config's ``probes.names``; ``ctx`` is a :class:`ProbeContext`. A tensor of shape [S] (one value per
ensemble member) is a scalar metric written to ``metrics.jsonl`` as ``<probe>/<key>`` at every
evaluation; a tensor of shape [S, ...] is an array saved into the checkpoint files as
``probe/<probe>/<key>`` (at checkpoint steps and in the final checkpoint). See docs/library.md#probes.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any, Callable, Sequence

import torch

from tdyn.errors import ConfigError, UserError, check_arg
from tdyn import plugins
from tdyn.registry import Registry


@dataclasses.dataclass
class ProbeContext:
    """What a probe ``fn(ctx)`` sees at one evaluation (docs/library.md#probes).

    * ``model``: the whole ensemble of S members, in eval mode, under ``torch.no_grad()``. For a
      :class:`tdyn.Task` it is the task's model, every parameter with a leading member axis ``[S, ...]``
      (``ctx.model.W[i]`` is member i's); for a :class:`tdyn.PlainTask` it is a :class:`tdyn.Stacked`:
      ``ctx.model.map(fn, *args)`` runs ``fn(module, *args_i)`` on every member's plain module (under
      ``torch.func.vmap``, each tensor argument split on its leading axis S) and stacks the results on a
      leading axis S; ``ctx.model.member(i)`` is member i as a plain module (a copy). Its intermediate tensors
      (attention, attended vectors, logits) by name: ``tdyn.models.activations.capture(ctx.model, names)``
      (docs/activations.md).
    * ``task``: the task object (``ctx.task.facts``: what it knows about its distribution).
    * ``batch``: the probe batch, the same at every evaluation of the run: the task's
      ``probe_batch(gen)`` (by default ``sample(gen)``: one training-sized batch) drawn once, before
      step 0, from each seed's own ``probe`` random stream (not the training stream), stacked on a
      leading member axis: a ``sample`` returning ``[B, L]`` tokens gives ``ctx.batch`` of shape
      ``[S, B, L]`` (dicts, lists and tuples of tensors alike, each tensor stacked); members that share
      a seed see the same batch. On the run's device.
    * ``step``: the step measured (0 is before the first update; ``optim.steps`` after the last).
    * ``options``: the run config's ``probes.options[name]`` for this probe (``{}`` when none).
    * ``shared``: scratch shared by the probes of one evaluation (see :meth:`once`).

    Probes run at step 0 and every ``probes.every`` steps, at each of ``probes.steps``, at **every
    checkpoint step** (the ``checkpoint`` schedule) and at the last step; a probe's arrays ([S, ...]) are
    kept where a checkpoint is written (the checkpoint steps and the final one). A probe leaves training as it would be without it
    (its random streams, the model's mode and its checkpoints)."""

    model: torch.nn.Module
    task: Any
    batch: Any
    step: int
    options: dict[str, Any] = dataclasses.field(default_factory=dict)   # the run's probes.options[name]
    #: one evaluation's scratch, the same dict for all its probes (the trainer makes one per evaluation): a
    #: statistic that several probes need is computed once (:meth:`once`); nothing in it outlives the evaluation
    shared: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the records the run has written before this evaluation, per member (``history[i]``: member i's metrics.jsonl
    #: records so far, restored on resume; read only): a probe that depends on its own earlier values reads them
    #: here, so that a resumed run computes what the uninterrupted one did
    history: Sequence[Sequence[dict]] = ()

    def once(self, key: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, computed by the first probe of this evaluation that asks under ``key`` and handed to the
        others (the probes of one evaluation see the same model and batch)."""
        if key not in self.shared:
            self.shared[key] = fn()
        return self.shared[key]


#: Every probe, by name; the papers' manifests name the module of each built-in probe, imported on lookup.
PROBES: Registry[Callable[[ProbeContext], dict[str, torch.Tensor]]] = Registry(
    "probe", error=ConfigError, label="probes.names", hint=plugins.HINT, papers="probes")


ProbeFn = Callable[[ProbeContext], "dict[str, torch.Tensor]"]


def probe(name: str, description: str | None = None) -> Callable[[ProbeFn], ProbeFn]:
    """Decorator registering ``fn(ctx: ProbeContext) -> {key: tensor}`` as probe ``name``, run where a run
    config names it in ``probes.names``::

        @tdyn.probe("mine.margin", "the logit margin on the probe batch")
        def margin(ctx):
            logits = ctx.model.map(lambda m, x: m(x), ctx.batch["x"])     # a PlainTask's Stacked: [S, B, C]
            top2 = logits.topk(2, dim=-1).values
            return {"mean": (top2[..., 0] - top2[..., 1]).mean(-1)}       # [S]: metric "mine.margin/mean"

    A value of shape [S] is a scalar metric, ``<name>/<key>`` in ``metrics.jsonl``; [S, ...] an array kept in
    the checkpoints. ``description``: its line in ``tdyn list`` (default: the first line of ``fn``'s
    docstring). Registering the same name again from the same code (a notebook cell run again) replaces it
    with a one-line notice; a name another module registered, or a built-in one, is refused. A paper's probe
    is also named in its manifest. See :class:`ProbeContext` for what ``ctx`` holds and when probes run."""
    PROBES._check_name(name)
    if description is not None:
        check_arg(f"probe({name!r})", "description", description, str)

    def deco(fn: ProbeFn) -> ProbeFn:
        if not callable(fn):
            raise UserError(f"@probe({name!r}) decorates {type(fn).__name__}, not a function of the ProbeContext")
        return PROBES.register(name, fn, description=first_line(fn) if description is None else description)

    return deco


def first_line(fn: Any) -> str:
    """The first paragraph of ``fn``'s docstring on one line, without reST markup ("" without one)."""
    doc = " ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split())
    return re.sub(r":\w+:`~?([^`]*)`", r"\1", doc).replace("``", "")


def get_probes(names: list[str]) -> dict[str, Callable]:
    return {n: PROBES.get(n) for n in names}
