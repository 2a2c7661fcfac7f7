"""Scan and Snap measurements (Tian et al. 2023 §5–6; docs/reproductions/scan-snap.md#attention-dynamics,
docs/reproductions/scan-snap.md#measured-quantities).

Pure functions of the attention logits Z [S, M, M] (query m's logit on key l is Z[..., m, l]) and
the decoder Y [S, M, M], with a leading ensemble axis S, and of the distribution's facts passed as
plain tensors: ``table`` [K, M] = P(l|n), ``query`` [K] = ψ(n), ``distinct`` [K, M] bool (class n's
distinct tokens), ``common`` [M] bool, ``next_token`` [K]. The registered probes at the end read
those facts from ``task.facts``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tdyn.models.activations import capture
from tdyn.probes import ProbeContext, probe


def _class_logits(Z: torch.Tensor, table: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """ln P(l|n) + Z[ψ(n), l], shape [S, K, M] (−inf off the support)."""
    return torch.log(table.to(Z.dtype)) + Z[..., query, :]


def c_n(Z: torch.Tensor, table: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Eqn 5 (docs/reproductions/scan-snap.md#class-attention-maps): c_{l|n} = P(l|n)e^{Z[ψ(n),l]} / Σ_l'
    P(l'|n)e^{Z[ψ(n),l']}, shape [S, K, M]."""
    return torch.softmax(_class_logits(Z, table, query), dim=-1)


def f_n(Z: torch.Tensor, table: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """f_n = c_n/‖c_n‖₂ (Lemma 2): the attended vector in the long-sequence limit, [S, K, M]."""
    return F.normalize(c_n(Z, table, query), dim=-1)


def distinct_distribution(Z: torch.Tensor, table: torch.Tensor, query: torch.Tensor,
                          distinct: torch.Tensor) -> torch.Tensor:
    """c_n restricted to class n's distinct tokens and renormalised
    (docs/reproductions/scan-snap.md#distinct-token-entropy): the softmax over the distinct tokens of ln P(l|n) +
    Z[ψ(n), l]; zero elsewhere. Shape [S, K, M]."""
    logits = _class_logits(Z, table, query).masked_fill(~distinct, float("-inf"))
    return torch.softmax(logits, dim=-1)


def class_entropy(Z: torch.Tensor, table: torch.Tensor, query: torch.Tensor, distinct: torch.Tensor) -> torch.Tensor:
    """H_n = −Σ c ln c (nats) of the renormalised distinct-token distribution, shape [S, K]."""
    p = distinct_distribution(Z, table, query, distinct)
    return -torch.where(p > 0, p * torch.log(p), torch.zeros_like(p)).sum(-1)


def distinct_entropy(Z: torch.Tensor, table: torch.Tensor, query: torch.Tensor, distinct: torch.Tensor) -> torch.Tensor:
    """The Fig 6 metric (docs/reproductions/scan-snap.md#distinct-token-entropy): H_n averaged over the K classes,
    shape [S]."""
    return class_entropy(Z, table, query, distinct).mean(-1)


def recall(Z: torch.Tensor, query: torch.Tensor, distinct: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Recall at attention thresholds (Figs 11–12; docs/reproductions/scan-snap.md#recall-at-threshold), shape [S, T].

    For each query m: softmax(z_m) over all M tokens, tag entries ≥ threshold; recall = tagged
    distinct tokens of the classes in ψ⁻¹(m) / their number; averaged over the queries.
    """
    attn = torch.softmax(Z[..., query, :], dim=-1)                          # [S, K, M]
    tagged = attn[..., None, :, :] >= thresholds.to(attn)[:, None, None]     # [S, T, K, M]
    hits = (tagged & distinct).sum(-1).to(attn.dtype)                       # [S, T, K]
    uq, group = torch.unique(query, return_inverse=True)
    num = torch.zeros(*hits.shape[:-1], len(uq), dtype=attn.dtype).index_add_(-1, group, hits)
    den = torch.zeros(len(uq), dtype=attn.dtype).index_add_(0, group, distinct.sum(-1).to(attn.dtype))
    return (num / den).mean(-1)


def descent_rate(thresholds, recall, how: str = "lsq"):
    """Descent rate of a recall–threshold curve, −d(recall)/d(threshold) (App G; Figs 11/12 read
    sparsity from it: sparser attention, slower descent). ``recall`` [..., T] at ``thresholds`` [T];
    returns [...] (numpy).

    ``how="lsq"``: minus the least-squares slope of recall on threshold over all T points;
    ``how="secant"``: (recall at the first threshold − recall at the last)/(last − first threshold).
    """
    x = np.asarray(thresholds, dtype=np.float64)
    y = np.asarray(recall, dtype=np.float64)
    if how == "lsq":
        xc = x - x.mean()
        return -((y - y.mean(-1, keepdims=True)) * xc).sum(-1) / (xc ** 2).sum()
    if how == "secant":
        return (y[..., 0] - y[..., -1]) / (x[-1] - x[0])
    raise ValueError(f"unknown descent-rate fit {how!r}")


def thm3_invariant(Z: torch.Tensor, table: torch.Tensor, query: torch.Tensor, distinct: torch.Tensor,
                   Z0: torch.Tensor | None = None) -> torch.Tensor:
    """e^{−2z_{ml}(0)}(1 − e^{−2(z_{ml} − z_{ml}(0))})/P(l|n)² = (e^{−2z_{ml}(0)} − e^{−2z_{ml}})/P(l|n)²
    on class n's distinct tokens (Thm 3, Eqn 108–111; docs/reproductions/scan-snap.md#attention-dynamics), NaN
    elsewhere; shape [S, K, M].

    Equal across a class's distinct tokens in theory: ż_l = η_Z f_{nl}² ξ_n with f_{nl}² ∝ P(l|n)²e^{2z_l}
    and a factor common to the class, so d(e^{−2z_l})/dt = −2P(l|n)²·(the same factor) and
    e^{−2z_l(0)} − e^{−2z_l(t)} ∝ P(l|n)². From Z(0) = 0 this is (1 − e^{−2z})/P²; from a non-zero
    Z(0) the factor e^{−2z(0)} is needed (without it the quantity is e^{2z(0)} times the invariant)."""
    z = Z[..., query, :]
    z0 = torch.zeros_like(z) if Z0 is None else Z0[..., query, :].to(z.dtype).expand_as(z)
    inv = torch.exp(-2 * z0) * -torch.expm1(-2 * (z - z0)) / table.to(z.dtype) ** 2
    return torch.where(distinct, inv, torch.full_like(inv, float("nan")))


def thm3_cv(Z: torch.Tensor, table: torch.Tensor, query: torch.Tensor, distinct: torch.Tensor,
            Z0: torch.Tensor | None = None) -> torch.Tensor:
    """Coefficient of variation std/|mean| (population std) of the Thm 3 invariant over each
    class's distinct tokens, shape [S, K]."""
    inv = thm3_invariant(Z, table, query, distinct, Z0)
    x = torch.nan_to_num(inv)
    n = distinct.sum(-1).to(x.dtype)
    mean = x.sum(-1) / n
    var = (torch.where(distinct, x - mean[..., None], torch.zeros_like(x)) ** 2).sum(-1) / n
    return var.sqrt() / mean.abs()


def logit_signs(Z: torch.Tensor, table: torch.Tensor, query: torch.Tensor, distinct: torch.Tensor,
                common: torch.Tensor) -> dict[str, torch.Tensor]:
    """Thm 2: signs of the common vs distinct logits in each class's query row, each [S].

    ``common_negative`` / ``distinct_positive``: fractions of (class, token) pairs with
    z < 0 on the class's common tokens / z > 0 on its distinct tokens; ``max_common`` and
    ``min_distinct``: the extreme logits; ``mean_common``: the mean common logit over (class, common
    token) pairs (−B_n(t) in the setting of docs/reproductions/scan-snap.md#snap-phase-transition, where
    e^{−4z_common} = 1 + 4Γ/C0 and B_n = −z_common).
    """
    z = Z[..., query, :]                                                    # [S, K, M]
    com = common & (table > 0)                                              # [K, M]
    inf = torch.tensor(float("inf"), dtype=z.dtype)
    return {
        "common_negative": ((z < 0) & com).flatten(-2).sum(-1) / com.sum(),
        "distinct_positive": ((z > 0) & distinct).flatten(-2).sum(-1) / distinct.sum(),
        "max_common": torch.where(com, z, -inf).flatten(-2).amax(-1),
        "mean_common": torch.where(com, z, torch.zeros_like(z)).flatten(-2).sum(-1) / com.sum(),
        "min_distinct": torch.where(distinct, z, inf).flatten(-2).amin(-1),
    }


def top_distinct_logit(Z: torch.Tensor, table: torch.Tensor, query: torch.Tensor, distinct: torch.Tensor) -> torch.Tensor:
    """Z[ψ(n), l₀] for each class's most probable distinct token l₀ (the Thm 3 winner), [S, K]."""
    l0 = torch.where(distinct, table, torch.zeros_like(table)).argmax(-1)   # [K]
    return Z[..., query, l0]


def p_correct(Y: torch.Tensor, u: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The decoder's probability of the right next token, softmax(Yᵀu)[target] (Eqn 7's α_n).

    ``u`` [S, B, M] attended vectors (e.g. ``f_n`` for the long-sequence limit), ``target`` [B] or
    [S, B]; returns [S, B]."""
    logp = torch.log_softmax(u @ Y, dim=-1)
    target = target.expand(logp.shape[:-1])
    return logp.gather(-1, target[..., None]).squeeze(-1).exp()


# ---------------------------------------------------------------- registered probes (trainer)


def _facts(ctx: ProbeContext):
    f = ctx.task.facts
    Z, Y = ctx.model.logits_matrices()
    return Z.detach().double(), Y.detach().double(), f


@probe("scan_snap.attention")
def _attention(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """Scalars per member: distinct entropy, mean top-distinct logit, sign fractions; array: Z rows."""
    Z, _, f = _facts(ctx)
    args = (Z, f["table"], f["query"], f["distinct"])
    out = {"entropy": distinct_entropy(*args), "top_logit": top_distinct_logit(*args).mean(-1)}
    out |= logit_signs(*args, f["common"])
    out["z_rows"] = Z[..., f["query"], :]                                    # [S, K, M] into checkpoints
    return out


@probe("scan_snap.decoder")
def _decoder(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """p(correct): on the probe batch (finite L), and in the long-sequence limit (u = f_n), per member."""
    Z, Y, f = _facts(ctx)
    x, y = ctx.batch[:2]
    p_batch = torch.softmax(ctx.model(x).double(), -1).gather(-1, y[..., None]).squeeze(-1)
    p_lim = p_correct(Y, f_n(Z, f["table"], f["query"]), f["next_token"])
    return {"p_correct": p_batch.mean(-1), "p_correct_limit": p_lim.mean(-1)}


@probe("scan_snap.attention_entropy")
def _attention_entropy(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """Entropy (nats) of the query's attention on the probe batch, mean over its sequences: over the key
    positions (b_T) and over the tokens (Xᵀb_T, the attention summed per token); read through the model's named
    activations (docs/activations.md)."""
    x, _, support = ctx.batch
    with capture(ctx.model, ["attention", "context"]) as cache:
        ctx.model(x, support)
    return {"entropy": entropy(cache["attention"].double()).mean(-1),
            "token_entropy": entropy(cache["context"].double()).mean(-1)}


def entropy(p: torch.Tensor) -> torch.Tensor:
    """−Σ p ln p (nats, 0 ln 0 = 0) over the last axis."""
    return -torch.special.xlogy(p, p).sum(-1)
