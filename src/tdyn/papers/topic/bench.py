"""``tdyn bench`` entries of the topic paper: the hand-written ensemble axis of the topic transformer
against :class:`PlainTopicAttention` under vmap. Timings: benchmarks/README.md."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tdyn.bench import compare, register_bench
from tdyn.papers.topic.data import LdaDataConfig
from tdyn.papers.topic.task import QUICK_DATA, dataset, lda_config
from tdyn.tasks import PlainTask


class PlainTopicAttention(nn.Module):
    """The topic transformer of ``tdyn.papers.topic.model`` in the E4 setting (one-hot embeddings, one layer,
    one head, trained W_Q, W_K, W_V with biases, identity decoder) for one member: tokens [B, L] ids,
    keys [B, L] visible keys, q_pos [B, n_q] query positions -> logits [B, n_q, V]. The attention in
    position form (softmax over the L keys), each projection E Wᵀ + b computed on the |V| table rows
    and then looked up, the fixed maps W_E = I and W_dec = I multiplied. The hand-written model runs
    the same math in vocabulary form (``models.topic.Input``: the score table, softmax over the ids
    with log-multiplicities, identities not multiplied), so the bench's ratio holds that algorithmic
    difference as well as vmap's."""

    def __init__(self, V: int):
        super().__init__()
        self.W_Q, self.W_K, self.W_V = nn.Linear(V, V), nn.Linear(V, V), nn.Linear(V, V)
        self.register_buffer("W_E", torch.eye(V), persistent=False)
        self.register_buffer("W_dec", torch.eye(V), persistent=False)

    def forward(self, tokens: torch.Tensor, keys: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
        rows = lambda lin: lin(self.W_E)[tokens]  # noqa: E731                  E Wᵀ + b  [B, L, V]
        Q = torch.gather(rows(self.W_Q), 1, q_pos[..., None].expand(-1, -1, self.W_E.shape[1]))
        scores = Q @ rows(self.W_K).transpose(1, 2) / math.sqrt(Q.shape[-1])     # [B, n_q, L]
        scores = scores.masked_fill(~keys[:, None, :], torch.finfo(scores.dtype).min)
        return (torch.softmax(scores, dim=-1) @ rows(self.W_V)) @ self.W_dec.T   # W_dec H


class PlainTopicTask(PlainTask):
    """Masked LM on LDA documents with :class:`PlainTopicAttention` (cross-entropy on the selected
    positions). The query positions are chosen outside vmap (their number is data-dependent), for all
    members at once, as ``TopicTransformer.data_loss`` does."""

    def __init__(self, cfg, members):
        self.data_cfg = LdaDataConfig.model_validate(cfg.data)
        self.ds = dataset(self.data_cfg)
        super().__init__(cfg, members)

    def make_model(self) -> nn.Module:
        return PlainTopicAttention(self.data_cfg.vocab_size)

    def sample(self, gen):
        return self.ds.sample(gen)

    def loss(self, batch):
        sel = batch["labels"] >= 0                                                   # [S, B, L]
        n_q = max(int(sel.sum(-1).max()), 1)
        q_pos = torch.argsort((~sel).to(torch.uint8), dim=-1, stable=True)[..., :n_q]
        return self.model.map(self.member_loss, {
            "tokens": batch["tokens"], "keys": batch["keys"], "q_pos": q_pos, "sel": torch.gather(sel, 2, q_pos),
            "y": torch.gather(batch["labels"], 2, q_pos).clamp(min=0)})

    def member_loss(self, model, b):
        per = F.cross_entropy(model(b["tokens"], b["keys"], b["q_pos"]).transpose(1, 2), b["y"], reduction="none")
        return (per * b["sel"]).sum() / b["sel"].sum().clamp(min=1)


@register_bench("plain_vs_handwritten_topic")
def _plain_topic(quick: bool) -> dict:
    """Topic model, E4 (topic/two-stage: trained attention and value, identity decoder), batch 40,
    S = 1 and 8 members: the hand-written axis (``models.topic.TopicTransformer``) vs
    :class:`PlainTopicAttention` under vmap, steps/s of one training step (Adam)."""
    model = {"attention": "trained", "value": "trained", "decoder": "identity", "init": "small_uniform"}
    names = [f"{w}__{k}" for w in ("W_Q", "W_K", "W_V") for k in ("weight", "bias")]
    return compare(lambda S: lda_config(model, data=QUICK_DATA, seeds=range(S)), PlainTopicTask, (1, 8),
                    5 if quick else 25, {"all": names})
