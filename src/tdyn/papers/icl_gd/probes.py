"""Probes of the ``icl_gd`` task (docs/reproductions/icl-gd.md#measures): the in-context loss on the fixed probe
set beside the loss of K GD steps at η*_K, the alignment of the trained model with that GD (the authors'
``analyse``: prediction difference, sensitivity difference and cosine), and the weight match of each layer
against the GD construction.

Pure functions first (:func:`alignment`, :func:`layer_match`), then the ``@probe`` adapters. Every value is per
member ([S]); the sensitivities ∂ŷ/∂x_q are exact (:meth:`tdyn.papers.icl_gd.model.LSA.sensitivity`).
"""

from __future__ import annotations

import torch

from tdyn.papers.icl_gd import theory as th
from tdyn.papers.icl_gd.model import LSA
from tdyn.probes import ProbeContext, probe

F64 = torch.float64


def alignment(pred: torch.Tensor, sens: torch.Tensor, pred_ref: torch.Tensor, sens_ref: torch.Tensor
              ) -> dict[str, torch.Tensor]:
    """The authors' alignment measures of a model against a reference (``analyse``), per member, means over the
    sequences: ``pred_diff`` = mean |ŷ − ŷ_ref|, ``sens_diff`` = mean ‖∂ŷ/∂x_q − ∂ŷ_ref/∂x_q‖, ``sens_cos`` = mean
    cosine of the two sensitivities; and tdyn's relative versions ``pred_diff_rel`` = pred_diff / mean |ŷ_ref|,
    ``sens_diff_rel`` = sens_diff / mean ‖∂ŷ_ref/∂x_q‖. pred, pred_ref (S, n); sens, sens_ref (S, n, d)
    (a reference without the S axis is shared by the members)."""
    pred, sens = pred.to(F64), sens.to(F64)
    pred_ref, sens_ref = pred_ref.to(F64).expand_as(pred), sens_ref.to(F64).expand_as(sens)
    pd = (pred - pred_ref).abs().mean(-1)
    sd = (sens - sens_ref).norm(dim=-1).mean(-1)
    cos = (sens * sens_ref).sum(-1) / (sens.norm(dim=-1) * sens_ref.norm(dim=-1)).clamp_min(1e-300)
    return {"pred_diff": pd, "pred_diff_rel": pd / pred_ref.abs().mean(-1), "sens_cos": cos.mean(-1),
            "sens_diff": sd, "sens_diff_rel": sd / sens_ref.norm(dim=-1).mean(-1)}


def layer_match(model: LSA, eta_star: float, N: int) -> dict[str, torch.Tensor]:
    """Per weight set (one when tied), the cosine of its effective map with the construction's and η_eff / η*
    (:func:`tdyn.papers.icl_gd.theory.weight_match`, N context points): keys ``cos``, ``eta_eff``, ``eta_ratio``
    (one weight set) or the same with the suffix ``_l<layer>`` (untied layers)."""
    sets = model.W_K.shape[1]
    res = {}
    for w in range(sets):
        cos, eta = th.weight_match(model.W_K[:, w], model.W_Q[:, w], model.W_V[:, w], model.P[:, w], N)
        suffix = "" if sets == 1 else f"_l{w + 1}"
        res |= {f"cos{suffix}": cos, f"eta_eff{suffix}": eta, f"eta_ratio{suffix}": eta / eta_star}
    return res


def _model_outputs(ctx: ProbeContext) -> tuple[torch.Tensor, torch.Tensor]:
    """The members' predictions (S, n) and sensitivities (S, n, d) on the probe set, computed once per evaluation
    in one pass through the layers (``LSA.outputs``, bit for bit ``predict`` and ``sensitivity``)."""
    def run():
        E, _ = ctx.batch
        return ctx.model.outputs(E)
    return ctx.once("icl_gd.outputs", run)


@probe("icl_gd.loss")
def _loss(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """In-context loss ½(ŷ − y_q)² on the probe set (``loss``), the loss of K GD steps at η*_K on the same set
    (``loss_gd``), their ratio (``loss_ratio``) and the loss of predicting 0 (``loss_zero``)."""
    pred, _ = _model_outputs(ctx)
    _, y = ctx.batch
    loss = (0.5 * (pred.to(F64) - y.to(F64)) ** 2).mean(-1)
    f = ctx.task.facts
    gd = f["loss_gd"].to(loss).expand_as(loss)
    return {"loss": loss, "loss_gd": gd, "loss_ratio": loss / gd, "loss_zero": f["loss_zero"].to(loss).expand_as(loss)}


@probe("icl_gd.align")
def _align(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """Alignment with K GD steps at η*_K on the probe set (:func:`alignment`): pred_diff(_rel), sens_diff(_rel),
    sens_cos."""
    pred, sens = _model_outputs(ctx)
    f = ctx.task.facts
    return alignment(pred, sens, f["pred_gd"], f["sens_gd"])


@probe("icl_gd.weights")
def _weights(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """Weight match with the GD construction at η*_K (:func:`layer_match`): cos, eta_eff, eta_ratio per weight set."""
    return layer_match(ctx.model, float(ctx.task.facts["eta_star"]), ctx.task.data.N)
