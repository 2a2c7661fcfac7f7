"""Probes of the decision-list task (``tdyn.tasks.decision_list``): exact classification on the task's
enumerated (or Monte Carlo) sequence types, V against the permutation matrix P, and the top Hessian
eigenvalue of the population loss (docs/reproductions/decision-lists.md#perfect-classification,
docs/reproductions/decision-lists.md#reproductions).

Pure functions first (``centred_cosine``, ``perm_recovery``), then the ``@probe`` adapters. Every value
is per member ([S]); the Hessian probe reports NaN (logged as null) at steps where it does not run.
"""

from __future__ import annotations

import math

import torch

from tdyn.models.decision_list import DecisionListModel
from tdyn.probes import ProbeContext, probe
from tdyn.theory import decision_list as th


def centred_cosine(V: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """cos between column-centred V and column-centred P (docs/reproductions/decision-lists.md#gauge-invariance); V
    (..., L, L) → (...)."""
    Vc = V - V.mean(-2, keepdim=True)
    Pc = P - P.mean(-2, keepdim=True)
    return (Vc * Pc).sum((-1, -2)) / (Vc.norm(dim=(-1, -2)) * Pc.norm())


def perm_recovery(V: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """mean_t 1[argmax_r V[r,t] = π(t)]; V (..., L, L) → (...)."""
    return (V.argmax(-2) == perm).double().mean(-1)


def member_model(model: DecisionListModel, i: int) -> DecisionListModel:
    """Member ``i`` of an ensemble as a model of its own (S = 1, same weights)."""
    one = DecisionListModel(model.cfg, S=1)
    with torch.no_grad():
        one.W[0], one.V[0] = model.W[i], model.V[i]
    return one


@probe("decision_list.classify")
def _classify(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """Err_sup (misclassified (set, query) pairs, strict argmax), Acc_pop and the minimum logit margin
    over the task's types (docs/reproductions/decision-lists.md#perfect-classification): ``perfect`` = 1 where
    Err_sup = 0."""
    cl = th.classify(ctx.model, ctx.task.dist, ctx.task.types)
    return {"err_sup": cl.err_sup, "acc_pop": cl.acc_pop, "min_margin": cl.min_margin,
            "perfect": cl.perfect.double()}


@probe("decision_list.V")
def _v(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """V against P: centred cosine ``cos_c``, argmax recovery of π, ‖V‖_F, and the drift max|V − V₀|."""
    V = ctx.model.V.detach()
    return {"cos_c": centred_cosine(V, ctx.task.facts["P"].to(V)), "perm_recovery": perm_recovery(V, ctx.task.facts["perm"]),
            "norm": V.flatten(1).norm(dim=1), "drift": (V - ctx.task.V0.to(V)).abs().flatten(1).amax(1)}


@probe("decision_list.hessian")
def _hessian(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """λ_max of the member's population Hessian over (W, V) (Lanczos, converged to 1e-12 relative): at
    every step where the member's iterate is not perfect (so at every step before its first perfect
    iterate k*), and every ``options.every`` steps (0: never on a grid); NaN elsewhere.

    Lanczos is warm-started from the member's previous eigenvector (kept on the task; 7× faster at
    L = 30). The start vector changes λ only below the 1e-12 tolerance, so a resumed run's λ agrees
    with the uninterrupted run's to that tolerance (parameters and losses stay bit-identical)."""
    every = int(ctx.options.get("every", 0))
    perfect = th.classify(ctx.model, ctx.task.dist, ctx.task.types).perfect
    lam = torch.full((len(perfect),), math.nan, dtype=torch.float64)
    start = ctx.task.__dict__.setdefault("_lanczos_start", {})
    with torch.enable_grad():   # the trainer measures under no_grad; the HVPs need autograd
        for i in range(len(perfect)):
            if not perfect[i] or (every and ctx.step % every == 0):
                lam[i], start[i] = th.top_hessian_eigenvalue(
                    member_model(ctx.model, i), ctx.task.dist, ctx.task.types, v0=start.get(i),
                    return_vector=True, gen=torch.Generator().manual_seed(0))
    return {"lambda_max": lam}
