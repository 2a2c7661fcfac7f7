"""Topic-structure probes (docs/reproductions/topic.md#measured-quantities): attention by token-pair class, block contrast
of W_V, W_Vᵀ W_V, W_E W_Eᵀ and W_Kᵀ W_Q, embedding Gram by class, and the stage norms
(docs/reproductions/topic.md#two-stage-measurement).

Pure functions of tensors first (vectorised; tests compare them with brute-force loops), then the
registered probes that apply them to a model of ``tdyn.papers.topic.model`` on the task's probe batch.
Vocabulary layout: ids < ``num_special`` are special (no topic); word id i has topic (i−ns)//v.

**Vocabulary form** (what the probes compute for a one-layer model, benchmarks/README.md#topic-probes):
at layer 0 the attention of a query depends only on its id u and its document (the keys' scores are the
entries (u, ·) of the |V|×|V| score table, ``tdyn.papers.topic.model.Input``), so the attention per key id
P[b, u, v] (summed over the visible positions carrying id v) holds every attention statistic: with n_u the
number of word positions of id u in document b and c_v the visible ones, the class sums over position pairs
are Σ_u n_u Σ_{v in the class of u} P[b, u, v] (``self``: Σ_u P[b, u, u] over visible u; ``same_token``: the
rest of Σ_u n_u P[b, u, u]) and the pair counts are sums of n_u n_v. That is [S, B, V, V] work per
evaluation instead of the [S, B, L, L] attention and four [S, B, L, L] masks per probe (12 members × 200
documents × 152 × 152), and nothing is kept between evaluations. Tests compare it with the per-position
statistic (``attention_classes``, kept for deeper models) to 1e-6.
"""

from __future__ import annotations

import math
import weakref

import torch

from tdyn.papers.topic.model import Input, log_multiplicity
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
    return classes_of_positions(A, tokens, *position_class_sums(A, tokens, keys, v, num_special), v, num_special)


def position_class_sums(A: torch.Tensor, tokens: torch.Tensor, keys: torch.Tensor, v: int,
                        num_special: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per-document class sums of the attention relative to uniform and pair counts, each [S, B] per class,
    from the per-position attention A [S, B, L, L] (``attention_classes``' statistic, which the gap probe
    ``tdyn.papers.topic.stages.attention_gap_docs`` reads too)."""
    n = keys.sum(-1).to(A.dtype)                                    # visible keys per document
    R = A * n[..., None, None]
    masks, counts = counted_pair_classes(tokens, v, num_special)
    sums = {c: (R * m).sum((-1, -2)) for c, m in masks.items()}     # per document [S, B]
    return sums, {c: k.to(A.dtype) for c, k in counts.items()}


_COUNTED: list[tuple] = []   # the last (weakref to tokens, v, num_special, masks, counts) of counted_pair_classes


def _drop_if_dead() -> None:
    if _COUNTED and _COUNTED[0][0]() is None:
        _COUNTED.clear()


def counted_pair_classes(tokens: torch.Tensor, v: int, num_special: int
                         ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``pair_classes`` of ``tokens`` [..., L] and each class's pair count [...] (integers), kept for the last
    ``tokens`` tensor asked about (the same object: a run's probe batch is one tensor, read at every
    evaluation, so its masks are made once per run; a tensor is never changed in place by the probes). The masks
    go when that tensor does (the run ends), not with the process."""
    if _COUNTED and _COUNTED[0][0]() is tokens and _COUNTED[0][1:3] == (v, num_special):
        return _COUNTED[0][3], _COUNTED[0][4]
    masks = pair_classes(tokens, v, num_special)
    counts = {c: m.sum((-1, -2)) for c, m in masks.items()}
    _COUNTED[:] = [(weakref.ref(tokens), v, num_special, masks, counts)]
    weakref.finalize(tokens, _drop_if_dead)
    return masks, counts


def classes_of_positions(A: torch.Tensor, tokens: torch.Tensor, sums: dict[str, torch.Tensor],
                         counts: dict[str, torch.Tensor], v: int, num_special: int) -> dict[str, torch.Tensor]:
    """``attention_classes``' output from ``position_class_sums``' sums and counts (and A, tokens for the
    START mass)."""
    out = {}
    for c in CLASSES:
        s, k = sums[c], counts[c]
        out[c] = s.sum(1) / k.sum(1)
        out[f"{c}_doc"] = torch.nanmean(s / k, dim=1)
    out["gap"] = out["same_topic"] - out["diff_topic"]
    out["gap_doc"] = out["same_topic_doc"] - out["diff_topic_doc"]
    word_q = topic_of(tokens, v, num_special) >= 0
    start_k = tokens == 2
    mass = (A * start_k[..., None, :]).sum(-1)                      # [S, B, L]
    out["start_mass"] = (mass * word_q).sum((1, 2)) / word_q.sum((1, 2))
    return out


def pair_counts(tokens: torch.Tensor, keys: torch.Tensor, V: int, v: int,
                num_special: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The document statistics of the vocabulary form (module docstring), from the ids alone: the number
    of ordered word-position pairs per class [S, B] (as ``pair_classes(...).sum((-1, -2))``), the word
    positions per id n [S, B, V] and the visible keys per id c [S, B, V]."""
    ids = torch.arange(V, device=tokens.device)
    word_id = (ids >= num_special)
    n = torch.zeros(*tokens.shape[:-1], V, dtype=torch.float64, device=tokens.device)
    n.scatter_add_(-1, tokens, torch.ones_like(tokens, dtype=torch.float64))
    c = torch.zeros_like(n).scatter_add_(-1, tokens, keys.to(torch.float64))
    n = n * word_id
    t = topic_of(ids, v, num_special).clamp(min=0)
    N_t = torch.zeros(*n.shape[:-1], int(t.max()) + 1, dtype=n.dtype, device=n.device).index_add_(-1, t, n)
    tot, sq = n.sum(-1), (n * n).sum(-1)
    counts = {"self": tot, "same_token": sq - tot, "same_topic": (N_t * N_t).sum(-1) - sq,
              "diff_topic": tot * tot - (N_t * N_t).sum(-1)}
    return counts, n, c


def class_sums_by_ids(P: torch.Tensor, n: torch.Tensor, c: torch.Tensor, v: int,
                      num_special: int) -> dict[str, torch.Tensor]:
    """Per-document class sums [S, B] of the attention relative to uniform (as Σ (A·#visible)·mask in
    ``attention_classes``) from the attention per key id P [S, B, V, V] (rows: query id), the word
    positions n and the visible keys c per id [S, B, V] (``pair_counts``); plus ``start``, the attention of
    word queries on START keys summed over word positions (unscaled)."""
    V = P.shape[-1]
    ids = torch.arange(V, device=P.device)
    t = topic_of(ids, v, num_special)
    word = t >= 0
    same_t = (t[:, None] == t[None, :]) & word[:, None] & word[None, :]
    M = {"same_topic": (same_t & (ids[:, None] != ids[None, :])).to(P.dtype),
         "diff_topic": (~same_t & word[:, None] & word[None, :]).to(P.dtype)}
    nP = n.to(P.dtype)
    vis = c.sum(-1).to(P.dtype)                                     # visible keys per document
    diag = torch.diagonal(P, dim1=-2, dim2=-1)                      # [S, B, V]
    out = {"self": (diag * ((c > 0) & word).to(P.dtype)).sum(-1)}
    out["same_token"] = (nP * diag).sum(-1) - out["self"]
    nP_P = nP[..., None] * P                                        # n_u P[b, u, v], once for both masks
    for k, m in M.items():
        out[k] = torch.einsum("sbuv,uv->sb", nP_P, m)               # the sums of einsum("sbu,sbuv,uv->sb", nP, P, m)
    out = {k: x * vis for k, x in out.items()}
    out["start"] = (nP * P[..., 2]).sum(-1)                        # START = id 2
    return out


def classes_from_sums(sums: dict[str, torch.Tensor], counts: dict[str, torch.Tensor],
                      word_positions: torch.Tensor) -> dict[str, torch.Tensor]:
    """``attention_classes``' output from per-document class sums and pair counts [S, B] and the word
    positions per document [S, B]."""
    out = {}
    for cl in CLASSES:
        s, k = sums[cl], counts[cl].to(sums[cl].dtype)
        out[cl] = s.sum(1) / k.sum(1)
        out[f"{cl}_doc"] = torch.nanmean(s / k, dim=1)
    out["gap"] = out["same_topic"] - out["diff_topic"]
    out["gap_doc"] = out["same_topic_doc"] - out["diff_topic_doc"]
    out["start_mass"] = sums["start"].sum(1) / word_positions.to(sums["start"].dtype).sum(1)
    return out


@torch.no_grad()
def attention_by_ids(model, tokens: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
    """The attention per key id P [S, B, V, V] of a one-layer ``TopicTransformer`` (heads averaged; rows:
    query id, columns: key id, summed over the visible positions of that id): equation (3) computed once per
    id instead of once per position, as the model's own vocabulary form does (``Input.scores``). None for a
    model whose layer-0 attention is not in that form (several layers, the BERT block)."""
    cfg = model.cfg
    if cfg.n_layers != 1 or cfg.block != "attention":
        return None
    table = model.embed_table()
    E = Input(table, tokens, identity="W_E" in model.identities)
    c = E.multiplicity(keys, table.dtype)                           # [S, B, V]
    S, V, h = table.shape[0], table.shape[1], cfg.n_heads
    if cfg.attention == "uniform":
        P = (c / c.sum(-1, keepdim=True).clamp(min=1))[:, :, None, :]
        return P.expand(S, tokens.shape[1], V, V)
    w = model.layer_weights(0)
    Q, K = E.table(w.W_Q, w.b_Q), E.table(w.W_K, w.b_K)            # [S, V, d]
    d_h = Q.shape[-1] // h
    scores = torch.einsum("suhc,svhc->shuv", Q.view(S, V, h, d_h), K.view(S, V, h, d_h)) / math.sqrt(d_h)
    M = log_multiplicity(c, scores.dtype)
    P = torch.softmax(scores[:, None] + M[:, :, None, None, :], dim=-1)   # [S, B, h, V, V]
    return P[:, :, 0] if h == 1 else P.mean(2)                      # one head: its mean is itself (x / 1)


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
                W_Q: torch.Tensor | None, W_K0: torch.Tensor | None = None,
                W_Q0: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """‖W_V − W_V(0)‖_F, ‖W_K‖_F, ‖W_Q‖_F, ‖W_Kᵀ W_Q‖_F and, given the initial W_K(0), W_Q(0), the
    changes ‖W_K − W_K(0)‖_F, ‖W_Q − W_Q(0)‖_F (``dK``, ``dQ``: the paper's "only the value matrix changes
    significantly" compares these with ``dV``), each [S] (docs/reproductions/topic.md#two-stage-measurement);
    inputs [S, d, d]."""
    S = W_V.shape[0]
    f = lambda x: x.reshape(S, -1).norm(dim=1)  # noqa: E731
    out = {"dV": f(W_V - W_V0)}
    if W_K is not None:
        out |= {"K": f(W_K), "Q": f(W_Q), "KQ": f(W_K.transpose(1, 2) @ W_Q)}
        if W_K0 is not None and W_Q0 is not None:
            out |= {"dK": f(W_K - W_K0), "dQ": f(W_Q - W_Q0)}
    return out


# ---------------------------------------------------------------- registered probes (task: lda_mlm)


def _layer0(model, name: str) -> torch.Tensor | None:
    p = getattr(model, name, None)
    if p is None:
        return None
    return p[:, 0] if (model.cfg.n_layers > 1 and isinstance(p, torch.nn.Parameter)) else p


@probe("topic.norms", "‖W_V − W_V(0)‖, ‖W_K‖, ‖W_Q‖, ‖W_KᵀW_Q‖ and the changes of W_K, W_Q since initialisation (layer 0)")
def _norms(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    m = ctx.model
    f = ctx.task.facts
    return stage_norms(_layer0(m, "W_V"), f["W_V0"], _layer0(m, "W_K"), _layer0(m, "W_Q"), f.get("W_K0"), f.get("W_Q0"))


@torch.no_grad()
def clean_class_sums(model, batch, v: int, num_special: int):
    """(per-document class sums, pair counts, word positions per document) of the probe batch's clean
    documents in the vocabulary form (module docstring), or None where the model's attention is not in it."""
    tokens, keys = batch["clean_tokens"], batch["clean_keys"]
    P = attention_by_ids(model, tokens, keys)
    if P is None:
        return None
    counts, n, c = pair_counts(tokens, keys, P.shape[-1], v, num_special)
    return class_sums_by_ids(P, n, c, v, num_special), counts, n.sum(-1)


@torch.no_grad()
def clean_statistics(ctx: ProbeContext) -> dict:
    """The clean probe documents' attention statistics, computed once per evaluation for ``topic.attention``
    and ``topic.stages`` (``ProbeContext.once``): ``sums`` and ``counts`` per document and class, and either
    ``words`` (the vocabulary form, ``clean_class_sums``) or the per-position attention ``A`` [S, B, L, L] of
    layer 0, heads averaged (deeper models, ``position_class_sums``)."""
    def compute():
        b, f = ctx.batch, ctx.task.facts
        v, ns = f["words_per_topic"], f["num_special"]
        by_ids = clean_class_sums(ctx.model, b, v, ns)
        if by_ids is not None:
            sums, counts, words = by_ids
            return {"sums": sums, "counts": counts, "words": words}
        tokens, keys = b["clean_tokens"], b["clean_keys"]
        A = ctx.model.attention(tokens, keys).mean(2)                               # heads averaged
        sums, counts = position_class_sums(A, tokens, keys, v, ns)
        return {"sums": sums, "counts": counts, "A": A}
    return ctx.once("topic.clean_statistics", compute)


@probe("topic.attention", "mean attention by class of key (self, same token, same topic, other topic) on clean probe documents")
@torch.no_grad()
def _attention(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    b, f = ctx.batch, ctx.task.facts
    st = clean_statistics(ctx)
    if "words" in st:
        return {k: x.float() for k, x in classes_from_sums(st["sums"], st["counts"], st["words"]).items()}
    return classes_of_positions(st["A"], b["clean_tokens"], st["sums"], st["counts"], f["words_per_topic"],
                                f["num_special"])


@probe("topic.blocks", "topic-block contrast of W_V, W_VᵀW_V, W_KᵀW_Q and the embedding Gram matrix")
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


@probe("topic.dev_loss", "the training loss on the probe batch")
def _dev_loss(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    b = ctx.batch
    return {"dev_loss": ctx.model.data_loss(b["tokens"], b["labels"], b["keys"])}
