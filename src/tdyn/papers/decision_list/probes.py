"""Probes of the decision-list task (``tdyn.papers.decision_list.task``): exact classification on the task's
enumerated (or Monte Carlo) sequence types, V against the permutation matrix P, and the top Hessian
eigenvalue of the population loss (docs/reproductions/decision-lists.md#perfect-classification,
docs/reproductions/decision-lists.md#reproductions).

Pure functions first (``centred_cosine``, ``perm_recovery``), then the ``@probe`` adapters. Every value
is per member ([S]); the Hessian probe reports NaN (logged as null) at steps where it does not run.
"""

from __future__ import annotations

import math

import torch

from tdyn.papers.decision_list.model import DecisionListModel
from tdyn.probes import ProbeContext, probe
from tdyn.papers.decision_list import kernels, theory as th


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


def _classification(ctx: ProbeContext) -> th.Classification:
    """The members' classification at this evaluation, computed once for the classify and Hessian probes."""
    return ctx.once("decision_list.classification", lambda: kernels.classify(ctx.model, ctx.task.dist, ctx.task.types))


@probe("decision_list.classify")
def _classify(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """Err_sup (misclassified (set, query) pairs, strict argmax), Acc_pop and the minimum logit margin
    over the task's types (docs/reproductions/decision-lists.md#perfect-classification): ``perfect`` = 1 where
    Err_sup = 0."""
    cl = _classification(ctx)
    return {"err_sup": cl.err_sup, "acc_pop": cl.acc_pop, "min_margin": cl.min_margin,
            "perfect": cl.perfect.double()}


@probe("decision_list.V")
def _v(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """V against P: centred cosine ``cos_c``, argmax recovery of π, ‖V‖_F, and the drift max|V − V₀|."""
    V = ctx.model.V.detach()
    return {"cos_c": centred_cosine(V, ctx.task.facts["P"].to(V)), "perm_recovery": perm_recovery(V, ctx.task.facts["perm"]),
            "norm": V.flatten(1).norm(dim=1), "drift": (V - ctx.task.V0.to(V)).abs().flatten(1).amax(1)}


#: a block bracket no wider than this (relative) is taken as λ_max; wider: Lanczos. 10× inside the 1e-9 margin
#: of result (2)'s check η·λ_max ≤ 1 (docs/reproductions/decision-lists.md#hessian-blocks)
BRACKET_TOL = 1e-10
#: up to this many parameters (2L², L ≤ 14) λ_max is the top eigenvalue of the dense closed-form Hessian
#: (``kernels.dense_hessian``): exact to rounding, and there cheaper than the bracket (rarely tight at such L: c is
#: small) with Lanczos behind it
DENSE_MAX = 400


def lambda_max(model: DecisionListModel, task, types, fw: kernels.TokenForward | None = None) -> tuple[float, float, str]:
    """λ_max of one member's population Hessian over (W, V) as (value, certified upper end, method), at the
    forward ``fw`` of that member: the probe passes the training loss's token-space one
    (``kernels.token_forward``); by default member 0's with the logits by the model's own products
    (``kernels.model_forward``, rounded as the autograd Hessian of ``theory.population_loss``). ``model`` is that
    member as a model of its own, for the fallbacks.

    * 2L² ≤ ``DENSE_MAX``: the top eigenvalue of the dense closed-form Hessian (``kernels.dense_hessian``, one
      symmetric eigenvalue problem, exact to rounding; value = upper end): "dense";
    * else the per-query block bracket (``kernels.hessian_blocks``, equal to ``th.hessian_blocks`` to rounding: the
      largest W–W block eigenvalue, a lower bound, and a closed-form upper bound) when its relative width is
      ≤ ``BRACKET_TOL``: "blocks";
    * else Lanczos to 1e-12, started from the block's top eigenvector (value = upper end): "lanczos".

    Depends on the iterate only (no warm start carried between steps), so a resumed run measures the same λ as the
    uninterrupted one."""
    if fw is None:
        fw = kernels.model_forward(model, task, types)
    L = model.W.shape[-1]
    if fw is not None and 2 * L * L <= DENSE_MAX:
        lam = float(torch.linalg.eigvalsh(kernels.dense_hessian(fw))[-1])
        return lam, lam, "dense"
    bb = kernels.hessian_blocks(model, task, types, fw=fw)
    if bb.rel_width <= BRACKET_TOL:
        return bb.lower, bb.upper, "blocks"
    lam = th.top_hessian_eigenvalue(model, task, types, v0=bb.vector, closed_form=True)
    return lam, lam, "lanczos"


@probe("decision_list.hessian")
def _hessian(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """λ_max of the member's population Hessian over (W, V) (:func:`lambda_max`): ``lambda_max`` and the upper end
    of its certified bracket ``lambda_max_upper`` (equal when Lanczos decided it), at every step where the member's
    iterate is not perfect (so at every step before its first perfect iterate k*), and every
    ``options.every`` steps (0: never on a grid); NaN elsewhere.

    With ``options.max_only`` (what result (2)'s check reads: the largest λ_max along the path), a step whose cheap
    certified bound (``kernels.lambda_upper``, from per-query sums first, then by products: a fortieth to a third of
    the blocks' cost; where the dense Hessian decides λ_max (2L² ≤ ``DENSE_MAX``) by products, then the block
    bracket's upper end ``kernels.block_upper``, within 1.0005 of λ_max there) is already below the largest
    ``lambda_max_upper`` this member has recorded so far records that bound as ``lambda_max_upper`` and NaN as
    ``lambda_max`` instead of the exact value. The largest recorded value over any set of steps that starts at the
    first measured one is then the same number as without the option (docs/reproductions/decision-lists.md#cheap-upper-bound):
    every skipped step's exact value lies below its bound, which lies below a value recorded before it. The running
    largest value is read from the run's records (``ctx.history``), so a resumed run records what the uninterrupted
    one did."""
    every = int(ctx.options.get("every", 0))
    max_only = bool(ctx.options.get("max_only", False))
    perfect = _classification(ctx).perfect
    lam = torch.full((len(perfect),), math.nan, dtype=torch.float64)
    up = lam.clone()
    fw = kernels.token_forward(ctx.model, ctx.task.dist, ctx.task.types)     # the classification's (shared)
    best = _recorded_max(ctx) if max_only else {}
    dense = 2 * ctx.model.W.shape[-1] ** 2 <= DENSE_MAX
    with torch.enable_grad():   # the trainer measures under no_grad; the Lanczos fallback's HVPs need autograd
        for i in range(len(perfect)):
            if not perfect[i] or (every and ctx.step % every == 0):
                fwi = None if fw is None else fw.member(i)
                if fwi is not None and i in best:
                    if dense:       # small L: the products' bound (there cheaper and tighter), then the bracket
                        bound = kernels.lambda_upper(fwi)
                        if bound >= best[i]:
                            bound = kernels.block_upper(fwi)
                    else:           # the bound from per-query sums first (no pass over the outputs), then products
                        bound = kernels.lambda_upper(fwi, per_query=True)
                        if bound >= best[i]:
                            bound = kernels.lambda_upper(fwi)
                    if bound < best[i]:
                        up[i] = bound
                        continue
                lam[i], up[i], _ = lambda_max(member_model(ctx.model, i), ctx.task.dist, ctx.task.types, fwi)
    return {"lambda_max": lam, "lambda_max_upper": up}


def _recorded_max(ctx: ProbeContext) -> dict[int, float]:
    """The largest ``lambda_max_upper`` each member has recorded so far in this run (``max_only``), from the run's
    records (``ctx.history``, restored on resume: a resumed run skips the steps the uninterrupted one skipped). The
    records only grow while a run trains, so each member's maximum is carried over from the records read at the last
    evaluation (:data:`_SCANNED`, by the records' identity) and only the new ones are read (the full scan at every
    step was O(steps²): 6 CPU-s of claim2's full run)."""
    key = "decision_list.hessian/lambda_max_upper"
    best = {}
    for i, records in enumerate(ctx.history):
        seen = _SCANNED.get(id(records))
        start, top = (seen[1], seen[2]) if seen is not None and seen[0] is records and seen[1] <= len(records) else (0, None)
        for j in range(start, len(records)):
            v = records[j].get(key)
            if v is not None and not math.isnan(v) and (top is None or v > top):
                top = v
        if len(_SCANNED) >= 64:
            _SCANNED.clear()
        _SCANNED[id(records)] = (records, len(records), top)
        if top is not None:
            best[i] = top
    return best


#: id(member's records) → (the records, how many were read, their largest ``lambda_max_upper`` or None)
_SCANNED: dict[int, tuple] = {}
