"""The decision-list task (docs/reproductions/decision-lists.md): the exact population loss of f_{W,V} on a decision
list (``tdyn.papers.decision_list.data``, enumerated or Monte Carlo sequence types from
``tdyn.papers.decision_list.theory``) with the one-layer model (``tdyn.papers.decision_list.model``); the trainer runs
population-loss GD (docs/reproductions/decision-lists.md#enumeration-over-types). Config sections: ``data`` =
:class:`DecisionListData`, ``model`` =
:class:`DecisionListModelConfig` (init: W₀, V₀ ~ init_std·N(0,1) per member, V₀ += c·P + E with
E ~ V_noise·U(−½, ½), W₀ = 0 with ``W_init: zero``). Probes: ``tdyn.papers.decision_list.probes``.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from tdyn.papers.decision_list import data as dl
from tdyn.papers.decision_list import kernels
from tdyn.papers.decision_list.model import DecisionListModel, DecisionListModelConfig, member_size, uniform_perturbation
from tdyn.schema import Strict
from tdyn.tasks.base import Member, Task, register_task
from tdyn.papers.decision_list import theory as th
from tdyn.seeding import generator


class DecisionListData(Strict):
    L: int = Field(8, ge=2)
    M: int = Field(2, ge=1)
    n: int = Field(3, ge=1)
    sampler: Literal["A", "B"] = "B"
    task_seed: int = 0
    zipf: float = Field(0.0, ge=0)
    equal_lengths: bool = True
    mc_samples: int = Field(0, ge=0)   # > 0: fixed Monte Carlo set of this size instead of enumeration


class DecisionListTrainTask(Task):
    """Exact population loss (``sample`` → None): the trainer runs population-loss GD
    (docs/reproductions/decision-lists.md#enumeration-over-types)."""

    def __init__(self, cfg, members: list[Member]):
        d = DecisionListData.model_validate(cfg.data)
        mc = DecisionListModelConfig.model_validate(cfg.model)
        self.dist = dl.make_task(d.L, d.M, d.task_seed, equal_lengths=d.equal_lengths, zipf=d.zipf)
        self.types = (th.sampled_types(self.dist, d.n, d.sampler, d.mc_samples, generator(d.task_seed, "mc_eval"))
                      if d.mc_samples else th.enumerate_types(self.dist, d.n, d.sampler))
        self.model = DecisionListModel(mc.model_copy(update={"L": d.L, "dtype": torch.get_default_dtype()}),
                                       S=len(members))
        with torch.no_grad():
            for i, m in enumerate(members):
                g = generator(m.seed, "init")
                std = mc.init_std * m.init_scale
                self.model.W[i] = std * torch.randn(d.L, d.L, generator=g, dtype=torch.float64)
                self.model.V[i] = std * torch.randn(d.L, d.L, generator=g, dtype=torch.float64) + mc.c * self.dist.P
                if mc.W_init == "zero":
                    self.model.W[i] = 0.0
                if mc.V_noise:
                    seed = m.seed if mc.V_noise_seed is None else mc.V_noise_seed
                    self.model.V[i] += uniform_perturbation(d.L, mc.V_noise, seed)
        self.V0 = self.model.V.detach().clone()   # the probes' V drift max|V_k − V₀| is measured from it
        # parameters frozen at every step: the loss is not differentiated with respect to them (kernels.population_loss)
        self.frozen = tuple(name for name, rule in cfg.optim.freeze.items() if rule.always)
        self.facts = {"perm": self.dist.perm, "lists": self.dist.lists, "P": self.dist.P}

    def sample(self, gen):
        return None

    def probe_batch(self, gen):
        return None

    def loss(self, batch):
        """F per member in token space with its closed-form gradient (``kernels.population_loss``; the
        reference ``theory.population_loss`` where a W column spans more than ``kernels.SPAN_MAX``), not formed for
        a parameter frozen at every step (``optim.freeze.<name>.always``)."""
        return kernels.population_loss(self.model, self.dist, self.types, frozen=self.frozen)


def _size(cfg) -> int:
    return member_size(cfg.typed_data().L)


@register_task("decision_list", DecisionListData, DecisionListModelConfig,
               "decision lists, exact population loss of f_{W,V} (population-loss GD)", size=_size)
def _build(cfg, members):
    return DecisionListTrainTask(cfg, members)


def decision_list_config(*, L: int, n: int, M: int, task_seed: int, seeds: list[int], steps: int, lrs: list[float],
              optimizer: str = "sgd", model: dict | None = None, frozen: list[str] = (), hessian_every: int | None = None,
              probe_steps: list[int] | None = None, hessian_max_only: bool = False) -> dict:
    """A run config of the ``decision_list`` task: exact population loss (sampler B), float64, members =
    ``seeds`` × ``lrs`` (one group ``all`` over W and V), ``frozen`` parameters never updated. Probes:
    classification and V at every step (or at ``probe_steps``), plus λ_max of the Hessian when
    ``hessian_every`` is given (every non-perfect step, and every ``hessian_every`` steps), exactly only where it may
    be the run's largest with ``hessian_max_only`` (the probe's ``max_only``)."""
    probes = {"names": ["decision_list.classify", "decision_list.V"] + (["decision_list.hessian"] if hessian_every is not None else []),
              "every": 1 if probe_steps is None else 0, "steps": list(probe_steps or [])}
    if hessian_every is not None:
        probes["options"] = {"decision_list.hessian": {"every": hessian_every} | ({"max_only": True} if hessian_max_only else {})}
    return {"task": "decision_list", "data": {"L": L, "M": M, "n": n, "sampler": "B", "task_seed": task_seed},
            "model": dict(model or {}), "seeds": list(seeds),
            "ensemble": {"lrs": [{"all": lr} for lr in lrs]} if len(lrs) > 1 else {},
            "optim": {"steps": steps, "groups": {"all": {"params": ["W", "V"], "optimizer": optimizer, "lr": lrs[0]}},
                      "freeze": {p: {"always": True} for p in frozen}},
            "probes": probes, "checkpoint": {"schedule": "log", "num": 6}, "dtype": "float64"}
