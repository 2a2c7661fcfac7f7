"""The one-layer, one-head masked-LM transformer of Li, Li & Risteski (2023)
(docs/reproductions/topic.md#model-as-in-the-paper).

    f(X) = W^dec · W^V E · softmax((W^K E)ᵀ(W^Q E)/√d)      E = W^E X,  X one-hot
    (docs/reproductions/topic.md#model-as-in-the-paper)

written as the authors' code computes it (docs/reproductions/topic.md#model-as-in-the-authors-code, its steps
numbered as the equations below):

    (1) E = W_E X                 (``emb_layernorm``: E = LN(W_E X + T₀)·γ + β, the authors' embedding)
    (2) Q = E W_Qᵀ + b_Q,   K = E W_Kᵀ + b_K,   V = E W_Vᵀ + b_V
    (3) A = softmax_j(Q Kᵀ/√d_h + M),   M_ij = −∞ if key j is invisible (PAD or selected)
    (4) H = A V                   (heads of d_h = d/n_heads, concatenated)
    (5) logits = H W_decᵀ + b_dec

No residual, LayerNorm or FFN unless ``block = "bert"`` (E5), which appends BERT's tail to (4):

    (4b) x = LN₁(E + H W_Oᵀ + b_O),   H ← LN₂(x + gelu(x W_1ᵀ + b_1) W_2ᵀ + b_2)

With ``n_layers > 1``, the H of one layer is the E of the next.

Variants are flags (docs/reproductions/topic.md#model-flags). A component that the flags fix (one-hot W_E,
uniform attention, W_V = I or the topic-block matrix B, W_dec = I) is a buffer, not a parameter, so it cannot
move; an identity (W_E, W_V or W_dec = I) is not multiplied in the forward (``affine`` with W = None: the same
numbers, as x·1 + 0 is exact).
Every parameter has a leading ensemble axis S; with ``n_layers > 1`` a layer axis follows it. The
parameters live on :class:`TopicTransformer` under the equations' names (``W_Q``, ``b_Q``, …: the
checkpoint layout and the optimizer's parameter groups); :class:`SelfAttention`, :class:`BertTail` and
:class:`Block` hold none and read one layer's slice, :class:`LayerWeights`. The forward's intermediate tensors
are named in ``TopicTransformer.ACTIVATIONS`` (:mod:`tdyn.models.activations`, docs/activations.md).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from tdyn.errors import ConfigError
from tdyn.models import activations
from tdyn.papers.topic import kernels
from tdyn.schema import Strict


class TopicModelConfig(Strict):
    """Model flags (docs/reproductions/topic.md#model-flags, docs/reproductions/topic.md#model-interface-in-tdyn).
    ``d = 0`` means d = |V| (needed by one-hot / identity maps)."""

    d: int = Field(0, ge=0)
    embedding: Literal["one_hot", "trained"] = "one_hot"
    emb_init: Literal["normal", "small_uniform", "small_normal"] = "normal"     # W_E: N(0,1) | ε·U[0,1) | N(0,ε²)
    emb_layernorm: bool = False          # the authors' LN(W_E x + T₀) with a trained token-type vector T₀
    attention: Literal["trained", "uniform"] = "trained"
    value: Literal["trained", "identity", "block"] = "trained"
    decoder: Literal["identity", "trained"] = "identity"
    init: Literal["default", "small_uniform", "small_normal"] = "default"       # W_Q, W_K, W_V
    init_eps: float = Field(1e-3, ge=0)  # ε of the small inits (U[0,ε) as the authors, or N(0,ε²))
    bias: bool = True
    loss: Literal["ce", "squared"] = "ce"
    l2: float = Field(0.0, ge=0)         # a real (λ/2)‖θ‖² over the parameters (docs/reproductions/topic.md#training-quirks-of-the-authors-code)
    n_layers: int = Field(1, ge=1)
    n_heads: int = Field(1, ge=1)
    block: Literal["attention", "bert"] = "attention"   # "bert": + W_O, residual, LN, FFN(d), LN (E5)

    @model_validator(mode="after")
    def _check(self):
        if self.n_layers > 1 and self.value != "trained":
            raise ConfigError(f"model.value = {self.value!r}: fixed value matrices need model.n_layers = 1")
        return self


# ---------------------------------------------------------------- per-member maps


def affine(E: torch.Tensor, W: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor:
    """E Wᵀ + b per member: E [S, ..., d], W [S, d_out, d] (None: the identity, E + b), b [S, d_out] (or None)."""
    S = E.shape[0]
    out = E
    if W is not None:
        out = (E.reshape(S, -1, E.shape[-1]) @ W.transpose(1, 2)).reshape(*E.shape[:-1], W.shape[1])
    if b is not None:
        out = out + b.view(S, *([1] * (E.dim() - 2)), -1)
    return out


def rows(X: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """X[s, idx[s, ...]] for X [S, N, d] and idx [S, ...] -> [S, ..., d] (a row lookup in the flattened
    [S·N, d] table)."""
    S, N, d = X.shape
    offset = (torch.arange(S, device=idx.device) * N).view(S, *([1] * (idx.dim() - 1)))
    return F.embedding(idx + offset, X.reshape(S * N, d))


def at_positions(X: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """X[s, b, pos[s, b, i]] for X [S, B, L, d] and pos [S, B, n] -> [S, B, n, d]."""
    return torch.gather(X, 2, pos[..., None].expand(-1, -1, -1, X.shape[-1]))


def layer_norm(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """LN(x)·γ + β per member (eps 1e-12 as HF BERT), x [S, B, n, d], γ and β [S, d]."""
    return F.layer_norm(x, x.shape[-1:], eps=1e-12) * g[:, None, None] + b[:, None, None]


def log_multiplicity(c: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The attention's mask term: log c for keys of multiplicity c ≥ 1 (c counts keys: a whole number), the
    most negative ``dtype`` value for invisible keys (c = 0). The log is taken of max(c, 1), which is c
    wherever it is kept: the same numbers as ``where(c > 0, c.log(), min)`` without computing log 0 = −∞
    (a slow path of the vectorised log)."""
    return torch.where(c > 0, c.clamp(min=1).log(), torch.finfo(dtype).min)


def score_table(Q: torch.Tensor, K: torch.Tensor, h: int) -> torch.Tensor:
    """Q Kᵀ per head for every pair of ids, Q and K [S, V, d]: [S, V (query id), h·V (head, key id)]."""
    S, n_ids = Q.shape[:2]
    return torch.einsum("suhc,svhc->suhv", Q.view(S, n_ids, h, -1), K.view(S, n_ids, h, -1)).reshape(S, n_ids, -1)


@dataclasses.dataclass
class Input:
    """A layer's input E [S, B, L, d] and the keys the attention sums over.

    Later layers hold E itself as ``source`` (``ids`` None): the keys are the L positions, each of
    multiplicity 1 if visible, 0 if not. Layer 0 holds the embedding table [S, V, d] as ``source`` and
    the ids [S, B, L] (``identity``: the table is I, one-hot E = X): E = W_E X is a row lookup, so every
    token-wise map E Wᵀ + b is the lookup of the |V| rows of (table Wᵀ + b), and the attention runs in
    *vocabulary form*. Q Kᵀ at a query with id u and a key with id v is the entry (u, v) of the |V|×|V|
    score table (table W_Qᵀ + b_Q)(table W_Kᵀ + b_K)ᵀ; visible keys that carry the same id v have the
    same score s_v and the same value V_v, so

        Σ_j A_j V_j = Σ_v c_v e^{s_v} V_v / Σ_u c_u e^{s_u} = Σ_v softmax_v(s_v + log c_v) V_v,

    c_v = the number of visible keys with id v. The keys are then the |V| ids with multiplicity c:
    scores and values are computed |V| times per member instead of B·L times, and the attention on a
    key position j is Â_{id_j} / c_{id_j}.
    """

    source: torch.Tensor
    ids: torch.Tensor | None = None
    identity: bool = False
    #: later layers: the distinct (document, layer-0 id) pairs of the B·L positions, whose rows of E repeat
    #: (``kernels.distinct_rows``); the keys' products then run once per pair. None: every position's row.
    rows: kernels.DistinctRows | None = None
    _distinct: tuple | None = dataclasses.field(default=None, repr=False)

    def table(self, W: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor:
        """E Wᵀ + b per key: [S, B, L, d_out] (positions) or [S, V, d_out] (ids)."""
        if self.identity:                                        # I Wᵀ + b = Wᵀ + b, not multiplied
            return affine(self.source if W is None else W.transpose(1, 2), None, b)
        if self.rows is not None and W is not None:              # once per distinct row (kernels: bit for bit)
            return kernels.distinct_rows_affine(self.source, W, b, self.rows)
        return affine(self.source, W, b)

    def distinct(self, q_pos: torch.Tensor) -> tuple[torch.Tensor, kernels.DistinctRows]:
        """Layer 0 (ids): the queries' ids [S, B·n_q] and their distinct (document, id) pairs, made once per
        ``q_pos`` tensor [S, B, n_q]."""
        if self._distinct is None or self._distinct[0] is not q_pos:
            S, B, n_q = q_pos.shape
            q_ids = torch.gather(self.ids, 2, q_pos).reshape(S, -1)
            docs = torch.arange(B, device=q_pos.device).repeat_interleave(n_q).expand(S, -1)
            self._distinct = (q_pos, q_ids, kernels.distinct_rows(docs, q_ids, B, self.source.shape[1]))
        return self._distinct[1], self._distinct[2]

    def dense(self) -> torch.Tensor:
        """E itself, [S, B, L, d]."""
        return self.source if self.ids is None else rows(self.source, self.ids)

    def at_positions(self, T: torch.Tensor) -> torch.Tensor:
        """A per-key table (``table``'s output: [S, B, L, d] or, by id, [S, V, d]) at every position: [S, B, L, d]."""
        return T if self.ids is None else rows(T, self.ids)

    def at_key_positions(self, T: torch.Tensor) -> torch.Tensor:
        """A tensor over the keys [S, B, h, n_q, N] (positions, or ids) at every key position: [S, B, h, n_q, L]
        (the entry of each position's id, not divided among the positions that share it: ``per_position``
        does that for the attention)."""
        if self.ids is None:
            return T
        S, B, h, n_q, _ = T.shape
        return torch.gather(T, 4, self.ids[:, :, None, None].expand(S, B, h, n_q, self.ids.shape[-1]))

    def scores(self, w: LayerWeights, q_pos: torch.Tensor, h: int) -> torch.Tensor:
        """Q Kᵀ per head, Q = E W_Qᵀ + b_Q at the query positions ``q_pos`` [S, B, n_q] and K = E W_Kᵀ + b_K
        per key: [S, B, h, n_q, N]."""
        S, B, n_q = q_pos.shape
        if self.ids is None:                                 # Q at the query rows only (kernels: bit for bit)
            Q = (kernels.query_rows_affine(self.source, w.W_Q, w.b_Q, q_pos) if w.W_Q is not None
                 else at_positions(self.table(w.W_Q, w.b_Q), q_pos))
            K = self.table(w.W_K, w.b_K)
            return torch.einsum("sbihc,sbjhc->sbhij", Q.view(S, B, n_q, h, -1), K.view(*K.shape[:3], h, -1))
        Q, K = self.table(w.W_Q, w.b_Q), self.table(w.W_K, w.b_K)
        n_ids = Q.shape[1]
        q_ids = torch.gather(self.ids, 2, q_pos)                                    # the queries' ids
        return rows(score_table(Q, K, h), q_ids).view(S, B, n_q, h, n_ids).transpose(2, 3)

    def mix(self, A: torch.Tensor, W: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor:
        """A V per head, V = E W_Vᵀ + b_V per key, for the attention per key A [S, B, h, n_q, N]:
        [S, B, n_q, d]."""
        V = self.table(W, b)
        if self.ids is None:
            V = V.view(*V.shape[:3], A.shape[2], -1)
            return torch.einsum("sbhij,sbjhc->sbihc", A, V).flatten(3)
        S, N = V.shape[:2]
        return torch.einsum("sbhij,sjhc->sbihc", A, V.view(S, N, A.shape[2], -1)).flatten(3)

    def multiplicity(self, visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The visible keys per key: [S, B, L] (0 or 1 per position) or [S, B, V] (c_v per id)."""
        m = visible.to(dtype)
        if self.ids is None:
            return m
        S, B, _ = visible.shape
        return m.new_zeros(S, B, self.source.shape[1]).scatter_add_(2, self.ids, m)

    def per_position(self, A: torch.Tensor, c: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """The attention on each key position [S, B, h, n_q, L] from the attention per key ``A``
        [S, B, h, n_q, N] and the multiplicities ``c`` [S, B, N]."""
        if self.ids is None:
            return A
        S, B, h, n_q, _ = A.shape
        per_key = A / c.clamp(min=1)[:, :, None, None]
        L = self.ids.shape[-1]
        A_pos = torch.gather(per_key, 4, self.ids[:, :, None, None].expand(S, B, h, n_q, L))
        return A_pos * visible[:, :, None, None].to(A.dtype)


@dataclasses.dataclass
class LayerWeights:
    """One layer's weights, each [S, ...] (None where the model has none; ``W_V`` None: the identity):
    attention (2), BERT tail (4b)."""

    W_Q: torch.Tensor | None
    b_Q: torch.Tensor | None
    W_K: torch.Tensor | None
    b_K: torch.Tensor | None
    W_V: torch.Tensor | None
    b_V: torch.Tensor | None
    W_O: torch.Tensor | None
    b_O: torch.Tensor | None
    ln1_g: torch.Tensor | None
    ln1_b: torch.Tensor | None
    W_1: torch.Tensor | None
    b_1: torch.Tensor | None
    W_2: torch.Tensor | None
    b_2: torch.Tensor | None
    ln2_g: torch.Tensor | None
    ln2_b: torch.Tensor | None


class SelfAttention(nn.Module):
    """Equations (2)–(4): one attention layer with ``n_heads`` heads over the visible keys, summed per
    key of ``Input`` (positions, or at layer 0 vocabulary ids with multiplicity c). ``uniform``:
    W_K = W_Q = 0 (``freeze_uniform_attention``), so A = 1/#visible keys and H is the same at every
    query, computed once per document: H = Σ_v (c_v / Σ_u c_u) V_v."""

    def __init__(self, d: int, n_heads: int, uniform: bool, name: str = "layer0"):
        super().__init__()
        self.d, self.h, self.d_h, self.uniform = d, n_heads, d // n_heads, uniform
        self.name = name   # the prefix of its named activations (``layer<i>``)

    def forward(self, E: Input, keys: torch.Tensor, q_pos: torch.Tensor, w: LayerWeights,
                need_attention: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(H [S, B, n_q, d], A [S, B, heads, n_q, L] or None unless ``need_attention``) at the query
        positions ``q_pos`` [S, B, n_q]."""
        S, B, L = keys.shape
        n_q, h = q_pos.shape[-1], self.h
        cache = activations.recording(self)                                          # None unless captured
        c = E.multiplicity(keys, E.source.dtype)                                     # visible keys per key
        if self.uniform:                                                             # A = 1/#visible      (3)
            A = (c / c.sum(-1, keepdim=True).clamp(min=1))[:, :, None, None].expand(S, B, h, 1, -1)
            H = E.mix(A, w.W_V, w.b_V).expand(S, B, n_q, self.d)                     # H = A V        (2), (4)
            if cache is not None:
                self._record(cache, E, keys, c, None, A.expand(S, B, h, n_q, -1), H, w)
            return H, (E.per_position(A.expand(S, B, h, n_q, -1), c, keys) if need_attention else None)
        if distinct_rows(E, h, need_attention, cache):                              # once per (document, id)
            S_ = score_table(E.table(w.W_Q, w.b_Q), E.table(w.W_K, w.b_K), h)              # Q Kᵀ  (2)
            q_ids, rows = E.distinct(q_pos)
            H = kernels.distinct_rows_mix(S_, log_multiplicity(c, S_.dtype), E.table(w.W_V, w.b_V), rows, q_ids,
                                          math.sqrt(self.d_h))                             # (3), (4)
            return H.view(S, B, n_q, self.d), None
        scores = E.scores(w, q_pos, h) / math.sqrt(self.d_h)                         # Q Kᵀ/√d_h  (2), (3)
        M = log_multiplicity(c, scores.dtype)                                        # log c; −∞: invisible
        A = torch.softmax(scores + M[:, :, None, None], dim=-1)                      # A [S, B, h, n_q, N]  (3)
        H = E.mix(A, w.W_V, w.b_V)                                                   # H = A V        (2), (4)
        if cache is not None:
            self._record(cache, E, keys, c, scores, A, H, w)
        return H, (E.per_position(A, c, keys) if need_attention else None)

    def _record(self, cache, E: Input, keys: torch.Tensor, c: torch.Tensor, scores: torch.Tensor | None,
                A: torch.Tensor, H: torch.Tensor, w: LayerWeights) -> None:
        """This layer's named activations (``TopicTransformer.ACTIVATIONS``), per key position: at layer 0 the
        forward works per vocabulary id (``Input``), so the per-position tensors are formed only where asked for."""
        if scores is not None:
            cache.put(f"{self.name}.scores", lambda: E.at_key_positions(scores))
        cache.put(f"{self.name}.attention", lambda: E.per_position(A, c, keys))
        cache.put(f"{self.name}.values", lambda: E.at_positions(E.table(w.W_V, w.b_V)))
        cache.put(f"{self.name}.attended", H)


def distinct_rows(E: Input, h: int, need_attention: bool, cache) -> bool:
    """Whether a layer's attention runs once per distinct (document, id) of its queries (``kernels.distinct_rows_mix``):
    layer 0 (ids), one head, no per-position attention asked for, nothing captured, not under autocast."""
    return (E.ids is not None and h == 1 and not need_attention and cache is None
            and not torch.is_autocast_enabled(E.ids.device.type))


class BertTail(nn.Module):
    """Equation (4b), E5's full BERT block after the attention: output projection, residual and LN,
    then the FFN (width d, gelu), residual and LN."""

    def forward(self, E: torch.Tensor, H: torch.Tensor, w: LayerWeights) -> torch.Tensor:
        x = layer_norm(E + affine(H, w.W_O, w.b_O), w.ln1_g, w.ln1_b)                # LN₁(E + H W_Oᵀ + b_O)
        return layer_norm(x + affine(F.gelu(affine(x, w.W_1, w.b_1)), w.W_2, w.b_2), w.ln2_g, w.ln2_b)


class Block(nn.Module):
    """One layer: the attention (2)–(4), then with ``block = "bert"`` the tail (4b) on the query positions."""

    def __init__(self, d: int, n_heads: int, uniform: bool, bert: bool, name: str = "layer0"):
        super().__init__()
        self.name = name
        self.attn = SelfAttention(d, n_heads, uniform, name)
        self.tail = BertTail() if bert else None

    def forward(self, E: Input, keys: torch.Tensor, q_pos: torch.Tensor, w: LayerWeights,
                need_attention: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        # the residual's E, looked up before the attention (the order in which W_E's gradients are summed)
        E_q = at_positions(E.dense(), q_pos) if self.tail is not None else None
        H, A = self.attn(E, keys, q_pos, w, need_attention)
        if self.tail is not None:
            H = self.tail(E_q, H, w)
            cache = activations.recording(self)
            if cache is not None:
                cache.put(f"{self.name}.out", H)
        return H, A


def member_size(cfg: TopicModelConfig, V: int) -> int:
    """Values in one member's parameters and buffers for vocabulary size ``V`` (an estimate from the config
    alone, within a few vectors): embedding and decoder (trained, or identity buffers) and per layer
    W_Q, W_K, W_V with biases, plus the BERT tail's W_O and FFN."""
    d = cfg.d or V
    layer = 3 * d * d + 3 * d + (3 * d * d + 8 * d if cfg.block == "bert" else 0)
    return 2 * V * d + V + 3 * d + cfg.n_layers * layer


class TopicTransformer(nn.Module):
    """See the module docstring. ``vocab_size``, ``words_per_topic`` and ``num_special`` come from
    the task (the block matrix B needs the vocabulary layout, docs/reproductions/topic.md#model-flags)."""

    #: the forward's named activations (:mod:`tdyn.models.activations`; docs/activations.md), each [S, ...], one
    #: ``layer<l>.`` set per layer (``activation_names()``: this model's). n_q: the query positions (all L, or
    #: ``queries``; ``data_loss``: each document's selected positions first, padded). Under a capture, ``data_loss``
    #: takes the padded-rows path (kernels.selected_query_loss' reference, equal to it bit for bit), so the logits exist.
    ACTIVATIONS = {
        "embedding": "E = W_E X, the embedding at every position, [S, B, L, d] (1) (LN(W_E X + T_0) with emb_layernorm)",
        "layer{l}.scores": "Q K^T/sqrt(d_h) per head at every (query, key position), before the mask, "
                           "[S, B, heads, n_q, L] (2), (3); not with attention = uniform",
        "layer{l}.attention": "A = softmax_j(Q K^T/sqrt(d_h) + M) per head on every key position (0 at invisible "
                              "keys), [S, B, heads, n_q, L] (3)",
        "layer{l}.values": "V = E W_V^T + b_V at every key position, [S, B, L, d] (2)",
        "layer{l}.attended": "H = A V, the heads' value outputs concatenated, [S, B, n_q, d] (4)",
        "layer{l}.out": "the BERT tail's output LN_2(x + FFN(x)), [S, B, n_q, d] (4b); block = bert only",
        "logits": "H W_dec^T + b_dec at the query positions, [S, B, n_q, |V|] (5)",
    }

    def activation_names(self) -> dict[str, str]:
        """This model's named activations: ``ACTIVATIONS`` with ``layer<l>.`` for each layer, without
        ``scores`` under uniform attention or ``out`` without the BERT tail."""
        out = {}
        for name, doc in self.ACTIVATIONS.items():
            if "{l}" not in name:
                out[name] = doc
                continue
            if (name.endswith(".scores") and self.cfg.attention == "uniform") or \
                    (name.endswith(".out") and self.cfg.block != "bert"):
                continue
            out |= {name.format(l=i): doc for i in range(self.cfg.n_layers)}
        return out

    def __init__(self, cfg: TopicModelConfig, vocab_size: int, words_per_topic: int, num_special: int,
                 S: int = 1):
        super().__init__()
        self.cfg = cfg
        V = vocab_size
        d = cfg.d or V
        self.V, self.d, self.S = V, d, S
        fixed_dims = cfg.embedding == "one_hot" or cfg.decoder == "identity" or cfg.value == "block"
        if fixed_dims and d != V:
            raise ConfigError(f"model.d = {cfg.d}: one-hot embeddings, block W_V and identity "
                              f"decoder need d = |V| = {V} (or d = 0)")
        if d % cfg.n_heads:
            raise ConfigError(f"model.n_heads = {cfg.n_heads}: must divide d = {d}")
        nl = cfg.n_layers
        z = lambda *shape: nn.Parameter(torch.zeros(S, *shape))  # noqa: E731
        lay = (nl,) if nl > 1 else ()
        if cfg.embedding == "trained":
            self.W_E = z(V, d)
        else:
            self.register_buffer("W_E", torch.eye(V).expand(S, V, V).clone(), persistent=False)
        if cfg.emb_layernorm:
            self.T_0, self.ln_gamma, self.ln_beta = z(d), z(d), z(d)
        if cfg.attention == "trained":
            self.W_Q, self.W_K = z(*lay, d, d), z(*lay, d, d)
            if cfg.bias:
                self.b_Q, self.b_K = z(*lay, d), z(*lay, d)
        if cfg.value == "trained":
            self.W_V = z(*lay, d, d)
            if cfg.bias:
                self.b_V = z(*lay, d)
        else:
            self.register_buffer("W_V", self.block_matrix(V, words_per_topic, num_special).expand(S, V, V).clone()
                                 if cfg.value == "block" else torch.eye(d).expand(S, d, d).clone(), persistent=False)
        if cfg.block == "bert":
            self.W_O, self.b_O = z(*lay, d, d), z(*lay, d)
            self.W_1, self.b_1, self.W_2, self.b_2 = z(*lay, d, d), z(*lay, d), z(*lay, d, d), z(*lay, d)
            self.ln1_g, self.ln1_b, self.ln2_g, self.ln2_b = z(*lay, d), z(*lay, d), z(*lay, d), z(*lay, d)
        if cfg.decoder == "trained":
            self.W_dec, self.b_dec = z(V, d), z(V)
        else:
            self.register_buffer("W_dec", torch.eye(V).expand(S, V, V).clone(), persistent=False)
        #: the fixed maps that are the identity: not multiplied in the forward (``affine`` with W = None)
        self.identities = {n for n, is_eye in (("W_E", cfg.embedding == "one_hot" and not cfg.emb_layernorm),
                                                ("W_V", cfg.value == "identity"), ("W_dec", cfg.decoder == "identity"))
                           if is_eye}
        self.blocks = nn.ModuleList(Block(d, cfg.n_heads, cfg.attention == "uniform", cfg.block == "bert", f"layer{i}")
                                    for i in range(nl))
        #: the loss computed on the selected query rows only (``kernels.selected_query_loss``): one layer of
        #: trained one-head attention, the identity decoder, cross-entropy
        self.selected_rows = (nl == 1 and cfg.block == "attention" and cfg.attention == "trained" and cfg.n_heads == 1
                              and cfg.decoder == "identity" and cfg.loss == "ce")

    @staticmethod
    def block_matrix(V: int, v: int, num_special: int) -> torch.Tensor:
        """B_ij = 1 iff i, j are words of the same topic (``freeze_block_value_matrix``,
        docs/reproductions/topic.md#model-flags)."""
        ids = torch.arange(V)
        t = torch.where(ids >= num_special, (ids - num_special) // v, -1)
        return ((t[:, None] == t[None, :]) & (t[:, None] >= 0)).float()

    # ---------------------------------------------------------------- init

    @torch.no_grad()
    def reset_parameters(self, gens: list[torch.Generator], scales: list[float]) -> None:
        """Member i draws from ``gens[i]``; ``scales[i]`` multiplies the drawn W_E, W_Q, W_K, W_V.

        Defaults (docs/reproductions/topic.md#model-as-in-the-authors-code): Q/K/V weights and biases U(±1/√d); W_E
        and T₀ ~ N(0,1) with a zero PAD row; decoder U(±1/√d) with zero bias; γ = 1, β = 0. Small inits (``init``,
        ``emb_init``): ε·U[0,1) (the authors' ``zero_init_*``, not centred) or N(0, ε²), biases 0.
        """
        cfg, d = self.cfg, self.d
        bound = 1 / math.sqrt(d)
        for i, (g, s) in enumerate(zip(gens, scales)):
            def draw(p, kind, scale=1.0):
                shape = p.shape[1:]
                if kind == "uniform_pm":
                    w = torch.empty(shape).uniform_(-bound, bound, generator=g)
                elif kind == "normal":
                    w = torch.randn(shape, generator=g)
                elif kind == "small_uniform":
                    w = cfg.init_eps * torch.rand(shape, generator=g)
                elif kind == "small_normal":
                    w = cfg.init_eps * torch.randn(shape, generator=g)
                else:
                    w = torch.full(shape, float(kind))
                p[i].copy_(w * scale)

            attn_kind = "uniform_pm" if cfg.init == "default" else cfg.init
            for name in ("W_Q", "W_K", "W_V"):
                if isinstance(getattr(self, name, None), nn.Parameter):
                    draw(getattr(self, name), attn_kind, s)
            for name in ("b_Q", "b_K", "b_V"):
                if hasattr(self, name):
                    draw(getattr(self, name), "uniform_pm" if cfg.init == "default" else 0.0)
            if cfg.embedding == "trained":
                draw(self.W_E, cfg.emb_init, s)
                self.W_E[i, 0].zero_()                                  # padding_idx = PAD
            if cfg.emb_layernorm:
                draw(self.T_0, "normal")
                draw(self.ln_gamma, 1.0)
                draw(self.ln_beta, 0.0)
            if cfg.block == "bert":
                for name in ("W_O", "W_1", "W_2"):
                    draw(getattr(self, name), "uniform_pm")
                for name in ("b_O", "b_1", "b_2", "ln1_b", "ln2_b"):
                    draw(getattr(self, name), 0.0)
                for name in ("ln1_g", "ln2_g"):
                    draw(getattr(self, name), 1.0)
            if cfg.decoder == "trained":
                draw(self.W_dec, "uniform_pm")
                draw(self.b_dec, 0.0)

    # ---------------------------------------------------------------- forward

    def layer_weights(self, layer: int) -> LayerWeights:
        """The weights of ``layer``, each [S, ...] (the layer axis of a multi-layer model indexed away)."""
        return LayerWeights(**{f.name: self._layer(f.name, layer) for f in dataclasses.fields(LayerWeights)})

    def _layer(self, name: str, layer: int) -> torch.Tensor | None:
        p = getattr(self, name, None)
        if name in self.identities:
            return None
        if p is None or self.cfg.n_layers == 1 or not isinstance(p, nn.Parameter):
            return p
        return p[:, layer]

    def embed_table(self) -> torch.Tensor:
        """ẽ_w for every vocabulary id, [S, V, d]: W_E (one-hot: I), or LN(W_E + T₀)·γ + β
        (docs/reproductions/topic.md#model-as-in-the-authors-code)."""
        E = self.W_E
        if self.cfg.emb_layernorm:
            E = F.layer_norm(E + self.T_0[:, None, :], (self.d,), eps=1e-12)
            E = E * self.ln_gamma[:, None, :] + self.ln_beta[:, None, :]
        return E

    def forward(self, tokens: torch.Tensor, keys: torch.Tensor, queries: torch.Tensor | None = None,
                return_attention: bool = False):
        """Logits [S, B, n_q, V] at the query positions ``queries`` [S, B, n_q] (default: all L).

        ``tokens`` [S, B, L] ids, ``keys`` [S, B, L] visible keys. Layer 0 reads the embedding table
        and the ids (``Input``: its projections run on the |V| table rows, its attention sums over the
        vocabulary ids with their multiplicities); later layers read the previous layer's H. Only the
        last layer restricts the queries. The attention per position (``return_attention``) is
        computed only when asked for.
        """
        S, B, L = tokens.shape
        all_pos = torch.arange(L, device=tokens.device).expand(S, B, L)
        table = self.embed_table()
        E = Input(table, tokens, identity="W_E" in self.identities)                  # E = W_E X      (1)
        cache = activations.recording(self)                                          # None unless captured
        if cache is not None:
            cache.put("embedding", E.dense)
        attns = []
        for layer, block in enumerate(self.blocks):
            q_pos = queries if (queries is not None and layer == len(self.blocks) - 1) else all_pos
            H, A = block(E, keys, q_pos, self.layer_weights(layer), return_attention)  # H = A V   (2)–(4)
            attns.append(A)
            if layer < len(self.blocks) - 1:
                E = Input(H, rows=self._later_rows(E, all_pos, cache))
        W_dec = None if "W_dec" in self.identities else self.W_dec
        logits = affine(H, W_dec, getattr(self, "b_dec", None))                      # H W_decᵀ + b_dec  (5)
        if cache is not None:
            cache.put("logits", logits)
        return (logits, attns) if return_attention else logits

    @torch.no_grad()
    def attention(self, tokens: torch.Tensor, keys: torch.Tensor, layer: int = 0) -> torch.Tensor:
        """Attention of ``layer`` over all positions, [S, B, heads, L, L]: the forward's layers up to that
        layer's attention (the same numbers as ``self(tokens, keys, return_attention=True)[1][layer]``,
        without the later layers, the BERT tail after it or the per-position attention of the layers before)."""
        layer = range(len(self.blocks))[layer]
        S, B, L = tokens.shape
        all_pos = torch.arange(L, device=tokens.device).expand(S, B, L)
        E = Input(self.embed_table(), tokens, identity="W_E" in self.identities)
        for i, block in enumerate(self.blocks[:layer]):
            E = Input(block(E, keys, all_pos, self.layer_weights(i))[0], rows=self._later_rows(E, all_pos, None))
        return self.blocks[layer].attn(E, keys, all_pos, self.layer_weights(layer), need_attention=True)[1]

    def _later_rows(self, E: Input, all_pos: torch.Tensor, cache) -> kernels.DistinctRows | None:
        """The repeated rows of the next layer's input (``Input.rows``): a layer's output at a position is a
        function of its document and its layer-0 id (layer 0 attends by id; later layers see such rows only), so
        the pairs of layer 0's ids at every position; None when captured or under autocast."""
        if E.rows is not None or (cache is None and E.ids is not None
                                  and not torch.is_autocast_enabled(E.ids.device.type)):
            return E.rows if E.rows is not None else E.distinct(all_pos)[1]
        return None

    def data_loss(self, tokens: torch.Tensor, labels: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Per-member loss [S] over the selected positions (labels ≠ −100) (docs/reproductions/topic.md#loss): cross-entropy
        over all |V| ids, or the squared error to one-hot targets averaged over n_sel·|V| entries.
        Only the selected query rows are computed."""
        if (self.selected_rows and not torch.is_autocast_enabled(tokens.device.type)   # selected rows only (kernels)
                and activations.recording(self) is None):                              # (captured: the padded rows)
            w = self.layer_weights(0)
            E = Input(self.embed_table(), tokens, identity="W_E" in self.identities)
            c = E.multiplicity(keys, E.source.dtype)
            S_ = score_table(E.table(w.W_Q, w.b_Q), E.table(w.W_K, w.b_K), 1)       # Q Kᵀ      (2)
            return kernels.selected_query_loss(S_, log_multiplicity(c, S_.dtype), lambda: E.table(w.W_V, w.b_V),
                                               tokens, labels, math.sqrt(self.d))
        sel = labels >= 0
        n_q = max(int(sel.sum(-1).max()), 1)
        q_pos = torch.argsort((~sel).to(torch.uint8), dim=-1, stable=True)[..., :n_q]   # selected first
        sel, y = torch.gather(sel, 2, q_pos), torch.gather(labels, 2, q_pos).clamp(min=0)
        logits = self(tokens, keys, queries=q_pos)
        if self.cfg.loss == "ce":
            per = F.cross_entropy(logits.reshape(-1, self.V), y.reshape(-1), reduction="none").view(y.shape)
        else:
            per = ((logits - F.one_hot(y, self.V).to(logits)) ** 2).sum(-1) / self.V
        return (per * sel).sum((1, 2)) / sel.sum((1, 2)).clamp(min=1)

    def loss(self, tokens: torch.Tensor, labels: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """The training loss [S]: ``data_loss`` plus the real ℓ2 term (λ/2)‖θ‖² when ``l2 > 0``."""
        loss = self.data_loss(tokens, labels, keys)
        if self.cfg.l2:
            loss = loss + 0.5 * self.cfg.l2 * sum(p.pow(2).reshape(self.S, -1).sum(1) for p in self.parameters())
        return loss
