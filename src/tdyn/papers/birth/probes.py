"""Probes of the ``birth`` task (docs/reproductions/birth.md#measures): Bietti et al.'s memory recall of each
trained matrix, and the in-context measures on the fixed probe set (the authors' ``ihead_basic_main.py`` logs).

Pure functions first (:func:`icl_measures`), then the ``@probe`` adapters. Every value is per member ([S]).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tdyn.papers.birth import kernels
from tdyn.papers.birth import theory as th
from tdyn.papers.birth.model import MemoryTransformer
from tdyn.probes import ProbeContext, probe

#: sequences per chunk of the probe's forward pass (the dense T × T attention of every member is kept)
CHUNK = 32


def _masked_mean(v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(torch.float64)
    return (v.to(torch.float64) * m).sum((1, 2)) / m.sum((1, 2))


def icl_measures(model: MemoryTransformer, x: torch.Tensor, y: torch.Tensor, occ: torch.Tensor
                 ) -> dict[str, torch.Tensor]:
    """Per member (S,), on sequences x, y, occ (S, n, T), through the speed path's forward (``kernels.forward``,
    tested equal to ``model.py``'s equations):

    * ``loss_out`` / ``acc_out``: cross-entropy and top-1 accuracy on the in-context outputs (occ ≥ 2: the authors'
      ``loss_head`` and ``acc_end``); ``acc_first``: accuracy on first occurrences (occ = 1, not predictable from
      the context); ``loss_bigram``: cross-entropy on the other positions (occ = 0, the authors' ``loss_bigram``);
      ``loss_all``: on every position;
    * ``attn1_prev``: at the positions right after a trigger, the fraction whose layer-1 attention peaks on the
      previous position (the authors' ``score_acc``);
    * ``attn2_ind``: at occ ≥ 2, the fraction whose layer-2 attention peaks on a position s ≥ 1 with z_{s−1} = z_t,
      the token after an earlier occurrence of the current token (the authors' ``score2_acc``).
    """
    sums: dict[str, list[torch.Tensor]] = {}
    n = x.shape[1]
    acc = {k: [] for k in ("ce", "hit", "a1", "a2")}
    for lo in range(0, n, CHUNK):
        xs, ys = x[:, lo:lo + CHUNK], y[:, lo:lo + CHUNK]
        L = kernels.forward(model, xs)
        xi = L["xi"]
        acc["ce"].append(F.cross_entropy(xi.flatten(0, -2).float(), ys.flatten(), reduction="none").view(ys.shape))
        acc["hit"].append(xi.argmax(-1) == ys)
        S, c, T = xs.shape
        t = torch.arange(T, device=x.device)
        acc["a1"].append(L["beta1"].view(S, c, T, T).argmax(-1) == (t - 1).clamp_min(0))
        s2 = L["beta2"].view(S, c, T, T).argmax(-1)                             # (S, c, T)
        prev = torch.gather(xs, 2, (s2 - 1).clamp_min(0))                       # z_{s−1}
        acc["a2"].append((s2 >= 1) & (prev == xs))
    ce, hit, a1, a2 = (torch.cat(acc[k], 1) for k in ("ce", "hit", "a1", "a2"))
    after_trigger = torch.zeros_like(occ, dtype=torch.bool)
    after_trigger[..., 1:] = occ[..., :-1] >= 1
    sums = {"loss_out": _masked_mean(ce, occ >= 2), "acc_out": _masked_mean(hit, occ >= 2),
            "acc_first": _masked_mean(hit, occ == 1), "loss_bigram": _masked_mean(ce, occ == 0),
            "loss_all": _masked_mean(ce, torch.ones_like(occ, dtype=torch.bool)),
            "attn1_prev": _masked_mean(a1, after_trigger), "attn2_ind": _masked_mean(a2, occ >= 2)}
    return sums


def bigram_kl(model: MemoryTransformer, bigram: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
    """KL(π_b(·|k) ‖ softmax(W_U W_F w_E(k))) averaged over the tokens k not in ``skip`` (the authors' ``test_ff1``:
    the global-bigram memory of the feed-forward W_F), per member (S,)."""
    keep = torch.ones(bigram.shape[0], dtype=torch.bool, device=bigram.device)
    keep[skip] = False
    e = model.w_E[:, keep]                                                      # (S, n, d)
    logits = (e @ model.W_F.transpose(-1, -2)) @ model.W_U.transpose(-1, -2)   # (S, n, N)
    p = bigram[keep].to(torch.float64)
    logq = logits.to(torch.float64).log_softmax(-1)
    return (torch.xlogy(p, p) - p * logq).sum(-1).mean(-1)


@probe("birth.memory")
def _memory(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """Memory recall of W_O², W_K², W_K¹ (the authors' test_wo1, test_wk1, test_wk0; W_K1_64: the first 64
    positions; W_K2_ood: W_K² over the held-out trigger tokens, with ``ood_triggers``), and the global-bigram
    memory's KL when the model has W_F."""
    f = ctx.task.facts
    r = th.recall_scores(ctx.model, out_tokens=f["out_tokens"], triggers=f["triggers"])
    out = {"W_O2": r["W_O2"], "W_K2": r["W_K2"], "W_K1": r["W_K1"],
           "W_K1_64": th.recall_scores(ctx.model, out_tokens=f["out_tokens"][:1], triggers=f["triggers"][:1],
                                       cutoff=64)["W_K1"]}
    if f.get("triggers_ood") is not None:
        out["W_K2_ood"] = th.recall_scores(ctx.model, out_tokens=f["out_tokens"][:1],
                                           triggers=f["triggers_ood"], cutoff=2)["W_K2"]
    if ctx.model.cfg.final_ffn:
        out["bigram_kl"] = bigram_kl(ctx.model, f["bigram"], f["triggers"] if ctx.task.data.fixed_triggers
                                     else f["triggers"][:0])
    return out


@probe("birth.icl")
def _icl(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """In-context measures on the probe set (:func:`icl_measures`); with held-out outputs, ``acc_out_ood`` and
    ``loss_out_ood`` on the second set; with held-out triggers, ``acc_out_tood``, ``loss_out_tood`` and
    ``attn2_ind_tood`` on the set whose triggers are held out."""
    b = ctx.batch
    out = icl_measures(ctx.model, b["x"], b["y"], b["occ"])
    if "x_ood" in b:
        ood = icl_measures(ctx.model, b["x_ood"], b["y_ood"], b["occ_ood"])
        out |= {"acc_out_ood": ood["acc_out"], "loss_out_ood": ood["loss_out"]}
    if "x_tood" in b:
        tood = icl_measures(ctx.model, b["x_tood"], b["y_tood"], b["occ_tood"])
        out |= {"acc_out_tood": tood["acc_out"], "loss_out_tood": tood["loss_out"],
                "attn2_ind_tood": tood["attn2_ind"]}
    return out
