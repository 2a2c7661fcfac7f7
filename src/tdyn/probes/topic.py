"""Topic-structure probes (docs/reproductions/topic.md#measured-quantities): attention by token-pair class, block contrast
of W_V, W_Vᵀ W_V, W_E W_Eᵀ and W_Kᵀ W_Q, embedding Gram by class, and the stage norms
(docs/reproductions/topic.md#two-stage-measurement).

Pure functions of tensors first (vectorised; tests compare them with brute-force loops), then the
registered probes that apply them to a model of ``tdyn.models.topic`` on the task's probe batch.
Vocabulary layout: ids < ``num_special`` are special (no topic); word id i has topic (i−ns)//v.
"""

from __future__ import annotations

import torch

from tdyn.probes import ProbeContext, probe

CLASSES = ("self", "same_token", "same_topic", "diff_topic")


def topic_of(ids: torch.Tensor, v: int, num_special: int) -> torch.Tensor:
    """Corrected topic map (docs/reproductions/topic.md#corrected-attention-classes): (id − ns)//v for words, −1
    for special ids."""
    return torch.where(ids >= num_special, torch.div(ids - num_special, v, rounding_mode="floor"), -1)


def pair_classes(tokens: torch.Tensor, v: int, num_special: int) -> dict[str, torch.Tensor]:
    """Boolean masks [..., L, L] of the ordered word-position pairs (i, j) in each class
    (docs/reproductions/topic.md#corrected-attention-classes): ``self`` (i = j), ``same_token`` (i ≠ j, same id),
    ``same_topic`` (different ids, same topic), ``diff_topic``. Pairs involving a special id (PAD, MASK, START,
    END) are in no class."""
    t = topic_of(tokens, v, num_special)
    word = t >= 0
    both = word[..., :, None] & word[..., None, :]
    eye = torch.eye(tokens.shape[-1], dtype=torch.bool, device=tokens.device)
    same_id = tokens[..., :, None] == tokens[..., None, :]
    same_t = t[..., :, None] == t[..., None, :]
    return {"self": both & eye, "same_token": both & same_id & ~eye,
            "same_topic": both & same_t & ~same_id, "diff_topic": both & ~same_t}


def attention_classes(A: torch.Tensor, tokens: torch.Tensor, keys: torch.Tensor, v: int,
                      num_special: int) -> dict[str, torch.Tensor]:
    """Average attention per pair class, relative to uniform (row i scaled by its number of visible
    keys, so uniform attention reads 1 in every class).

    A [S, B, L, L] (heads averaged), tokens [S, B, L], keys [S, B, L]. Returns, each [S]: the pooled
    average per class (sum over all pairs of all documents / count, as coded,
    docs/reproductions/topic.md#attention-statistic-of-the-authors-code), ``<class>_doc`` the mean over documents
    of the per-document average, ``gap`` = same_topic − diff_topic (pooled), ``gap_doc``, and ``start_mass`` = mean
    attention of word queries on START keys (unscaled).
    """
    n = keys.sum(-1).to(A.dtype)                                    # visible keys per document
    R = A * n[..., None, None]
    masks = pair_classes(tokens, v, num_special)
    out = {}
    for c, m in masks.items():
        s, k = (R * m).sum((-1, -2)), m.sum((-1, -2)).to(A.dtype)   # per document [S, B]
        out[c] = s.sum(1) / k.sum(1)
        out[f"{c}_doc"] = torch.nanmean(s / k, dim=1)
    out["gap"] = out["same_topic"] - out["diff_topic"]
    out["gap_doc"] = out["same_topic_doc"] - out["diff_topic_doc"]
    word_q = topic_of(tokens, v, num_special) >= 0
    start_k = tokens == 2
    mass = (A * start_k[..., None, :]).sum(-1)                      # [S, B, L]
    out["start_mass"] = (mass * word_q).sum((1, 2)) / word_q.sum((1, 2))
    return out


def block_contrast(M: torch.Tensor, v: int, num_special: int) -> dict[str, torch.Tensor]:
    """Block statistics of a |V|×|V| matrix on its word ids (docs/reproductions/topic.md#block-contrast), M [S, V, V].

    Returns ``diag``, ``same`` (same-topic off-diagonal mean), ``diff`` (different-topic mean) and
    ``contrast`` = same − diff, each [S]; ``per_topic`` [S, T]: for the rows of topic t, the mean
    same-topic off-diagonal entry minus the mean entry in other topics' columns.
    """
    W = M[:, num_special:, num_special:]
    n = W.shape[-1]
    T = n // v
    Z = torch.zeros(n, T, dtype=M.dtype, device=M.device)
    Z[torch.arange(n), torch.arange(n) // v] = 1                    # word → topic indicator
    diag = torch.diagonal(W, dim1=-2, dim2=-1)                      # [S, n]
    blocks = Z.T @ W @ Z                                            # [S, T, T] block sums
    within = torch.diagonal(blocks, dim1=-2, dim2=-1) - diag @ Z    # same-topic off-diagonal sums
    rows = W.sum(-1) @ Z                                            # row sums per topic
    n_same, n_diff = v * (v - 1), v * (n - v)
    same_t = within / n_same
    diff_t = (rows - torch.diagonal(blocks, dim1=-2, dim2=-1)) / n_diff
    return {"diag": diag.mean(-1), "same": within.sum(-1) / (T * n_same),
            "diff": diff_t.mean(-1), "contrast": within.sum(-1) / (T * n_same) - diff_t.mean(-1),
            "per_topic": same_t - diff_t}


def embedding_gram(E: torch.Tensor, v: int, num_special: int) -> dict[str, torch.Tensor]:
    """Block statistics of the dot-product Gram E Eᵀ and the cosine Gram, E [S, V, d]
    (docs/reproductions/topic.md#embedding-similarity)."""
    dot = E @ E.transpose(1, 2)
    En = E / E.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    cos = En @ En.transpose(1, 2)
    return {f"dot_{k}": x for k, x in block_contrast(dot, v, num_special).items()} | \
           {f"cos_{k}": x for k, x in block_contrast(cos, v, num_special).items()}


def stage_norms(W_V: torch.Tensor, W_V0: torch.Tensor, W_K: torch.Tensor | None,
                W_Q: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """‖W_V − W_V(0)‖_F, ‖W_K‖_F, ‖W_Q‖_F, ‖W_Kᵀ W_Q‖_F, each [S]
    (docs/reproductions/topic.md#two-stage-measurement); inputs [S, d, d]."""
    S = W_V.shape[0]
    f = lambda x: x.reshape(S, -1).norm(dim=1)  # noqa: E731
    out = {"dV": f(W_V - W_V0)}
    if W_K is not None:
        out |= {"K": f(W_K), "Q": f(W_Q), "KQ": f(W_K.transpose(1, 2) @ W_Q)}
    return out


# ---------------------------------------------------------------- registered probes (task: lda_mlm)


def _layer0(model, name: str) -> torch.Tensor | None:
    p = getattr(model, name, None)
    if p is None:
        return None
    return p[:, 0] if (model.cfg.n_layers > 1 and isinstance(p, torch.nn.Parameter)) else p


@probe("topic.norms")
def _norms(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    m = ctx.model
    return stage_norms(_layer0(m, "W_V"), ctx.task.facts["W_V0"], _layer0(m, "W_K"), _layer0(m, "W_Q"))


@probe("topic.attention")
def _attention(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    b, f = ctx.batch, ctx.task.facts
    A = ctx.model.attention(b["clean_tokens"], b["clean_keys"]).mean(2)       # heads averaged
    return attention_classes(A, b["clean_tokens"], b["clean_keys"], f["words_per_topic"], f["num_special"])


@probe("topic.blocks")
def _blocks(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    m, f = ctx.model, ctx.task.facts
    v, ns = f["words_per_topic"], f["num_special"]
    out = {}
    mats = {"V": _layer0(m, "W_V"), "VtV": None, "KtQ": None, "EEt": None}
    mats["VtV"] = mats["V"].transpose(1, 2) @ mats["V"]
    if _layer0(m, "W_K") is not None:
        mats["KtQ"] = _layer0(m, "W_K").transpose(1, 2) @ _layer0(m, "W_Q")
    if m.cfg.embedding == "trained":
        mats["EEt"] = m.embed_table() @ m.embed_table().transpose(1, 2)
    for name, M in mats.items():
        if M is not None and M.shape[-1] == m.V:
            for k, x in block_contrast(M, v, ns).items():
                out[f"{name}_{k}"] = x
    return out


@probe("topic.dev_loss")
def _dev_loss(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    b = ctx.batch
    return {"dev_loss": ctx.model.data_loss(b["tokens"], b["labels"], b["keys"])}
