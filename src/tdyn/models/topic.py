"""The one-layer, one-head masked-LM transformer of Li, Li & Risteski (2023) (spec topic_structure.md §3).

    f(X) = W^dec · W^V E · softmax((W^K E)ᵀ(W^Q E)/√d)      E = W^E X,  X one-hot     (spec §3.1)

written as the authors' code computes it (spec §3.2): Q = E W_Qᵀ + b_Q, K = E W_Kᵀ + b_K,
V = E W_Vᵀ + b_V; A = softmax_j(Q Kᵀ/√d + M) with M = −∞ on invisible keys; H = A V;
logits = H W_decᵀ + b_dec. No residual, LayerNorm or FFN unless ``block = "bert"`` (E5).

Variants are flags (spec §3.3–3.5). A component that the flags fix (one-hot W_E, uniform attention,
W_V = I or the topic-block matrix B, W_dec = I) is a buffer, not a parameter, so it cannot move.
Every parameter has a leading ensemble axis S; with ``n_layers > 1`` a layer axis follows it.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from tdyn.errors import ConfigError
from tdyn.schema import Strict


class TopicModelConfig(Strict):
    """Model flags (spec §3.3, §3.5). ``d = 0`` means d = |V| (needed by one-hot / identity maps)."""

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
    l2: float = Field(0.0, ge=0)         # a real (λ/2)‖θ‖² over the parameters (spec §4.2)
    n_layers: int = Field(1, ge=1)
    n_heads: int = Field(1, ge=1)
    block: Literal["attention", "bert"] = "attention"   # "bert": + W_O, residual, LN, FFN(d), LN (E5)

    @model_validator(mode="after")
    def _check(self):
        if self.n_layers > 1 and self.value != "trained":
            raise ConfigError(f"model.value = {self.value!r}: fixed value matrices need model.n_layers = 1")
        return self


class TopicTransformer(nn.Module):
    """See the module docstring. ``vocab_size``, ``words_per_topic`` and ``num_special`` come from
    the task (the block matrix B needs the vocabulary layout, spec §3.3)."""

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

    @staticmethod
    def block_matrix(V: int, v: int, num_special: int) -> torch.Tensor:
        """B_ij = 1 iff i, j are words of the same topic (``freeze_block_value_matrix``, spec §3.3)."""
        ids = torch.arange(V)
        t = torch.where(ids >= num_special, (ids - num_special) // v, -1)
        return ((t[:, None] == t[None, :]) & (t[:, None] >= 0)).float()

    # ---------------------------------------------------------------- init

    @torch.no_grad()
    def reset_parameters(self, gens: list[torch.Generator], scales: list[float]) -> None:
        """Member i draws from ``gens[i]``; ``scales[i]`` multiplies the drawn W_E, W_Q, W_K, W_V.

        Defaults (spec §3.2): Q/K/V weights and biases U(±1/√d); W_E and T₀ ~ N(0,1) with a zero
        PAD row; decoder U(±1/√d) with zero bias; γ = 1, β = 0. Small inits (``init``, ``emb_init``):
        ε·U[0,1) (the authors' ``zero_init_*``, not centred) or N(0, ε²), biases 0.
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

    def _layer(self, name: str, layer: int) -> torch.Tensor | None:
        """Weight ``name`` of ``layer`` with the ensemble axis kept: [S, ...] (None if absent)."""
        p = getattr(self, name, None)
        if p is None or self.cfg.n_layers == 1 or not isinstance(p, nn.Parameter):
            return p
        return p[:, layer]

    def embed_table(self) -> torch.Tensor:
        """ẽ_w for every vocabulary id, [S, V, d]: W_E (one-hot: I), or LN(W_E + T₀)·γ + β (spec §3.2.1)."""
        E = self.W_E
        if self.cfg.emb_layernorm:
            E = F.layer_norm(E + self.T_0[:, None, :], (self.d,), eps=1e-12)
            E = E * self.ln_gamma[:, None, :] + self.ln_beta[:, None, :]
        return E

    @staticmethod
    def _affine(E: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """E Wᵀ + b for E [S, ..., d], W [S, d_out, d], b [S, d_out]."""
        S = E.shape[0]
        out = (E.reshape(S, -1, E.shape[-1]) @ W.transpose(1, 2)).reshape(*E.shape[:-1], W.shape[1])
        if b is not None:
            out = out + b.view(S, *([1] * (E.dim() - 2)), -1)
        return out

    @staticmethod
    def _rows(X: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """X[s, idx[s, ...]] for X [S, N, d] and idx [S, ...] -> [S, ..., d]."""
        S, d = X.shape[0], X.shape[-1]
        return torch.gather(X, 1, idx.reshape(S, -1, 1).expand(-1, -1, d)).view(*idx.shape, d)

    def _bert_tail(self, E: torch.Tensor, H: torch.Tensor, layer: int) -> torch.Tensor:
        """E5's full block: LN(E + W_O H + b_O), then LN(x + W_2 gelu(W_1 x + b_1) + b_2)."""
        p = lambda n: self._layer(n, layer)  # noqa: E731
        ln = lambda x, g, b: F.layer_norm(x, (self.d,), eps=1e-12) * g[:, None, None] + b[:, None, None]  # noqa: E731
        x = ln(E + self._affine(H, p("W_O"), p("b_O")), p("ln1_g"), p("ln1_b"))
        return ln(x + self._affine(F.gelu(self._affine(x, p("W_1"), p("b_1"))), p("W_2"), p("b_2")),
                  p("ln2_g"), p("ln2_b"))

    def forward(self, tokens: torch.Tensor, keys: torch.Tensor, queries: torch.Tensor | None = None,
                return_attention: bool = False):
        """Logits [S, B, n_q, V] at the query positions ``queries`` [S, B, n_q] (default: all L).

        ``tokens`` [S, B, L] ids, ``keys`` [S, B, L] visible keys. At layer 0, E = W_E X is a row
        lookup, so every token-wise map (Q, K, V projections) is applied to the |V| table rows and
        then looked up — the same numbers as E W_Qᵀ + b_Q on all positions, computed |V| times
        instead of B·L times. Only the last layer restricts the queries.
        """
        cfg = self.cfg
        S, B, L = tokens.shape
        h, dh = cfg.n_heads, self.d // cfg.n_heads
        all_pos = torch.arange(L, device=tokens.device).expand(S, B, L)
        table = self.embed_table()
        E = self._rows(table, tokens)                                                # E = W_E X  [S, B, L, d]
        attns = []
        for layer in range(cfg.n_layers):
            q_pos = queries if (queries is not None and layer == cfg.n_layers - 1) else all_pos
            n_q = q_pos.shape[-1]
            p = lambda n: self._layer(n, layer)  # noqa: E731

            def project(W, b):                                                       # E Wᵀ + b
                return self._rows(self._affine(table, W, b), tokens) if layer == 0 else self._affine(E, W, b)

            V = project(p("W_V"), p("b_V"))                                          # V = E W_Vᵀ + b_V
            vis = keys[:, :, None, None, :]
            if cfg.attention == "uniform":                                           # W_K = W_Q = 0: A = 1/#visible
                A = (vis.to(V.dtype) / keys.sum(-1).clamp(min=1)[:, :, None, None, None]).expand(S, B, h, n_q, L)
                H = torch.einsum("sbj,sbjc->sbc", A[:, :, 0, 0], V)[:, :, None].expand(S, B, n_q, self.d)
            else:
                Q = torch.gather(project(p("W_Q"), p("b_Q")), 2, q_pos[..., None].expand(-1, -1, -1, self.d))
                K = project(p("W_K"), p("b_K"))                                     # K = E W_Kᵀ + b_K
                scores = torch.einsum("sbihc,sbjhc->sbhij", Q.view(S, B, n_q, h, dh),
                                      K.view(S, B, L, h, dh)) / math.sqrt(dh)        # Q Kᵀ/√d_h
                scores = scores.masked_fill(~vis, torch.finfo(scores.dtype).min)     # + M (invisible keys)
                A = torch.softmax(scores, dim=-1)                                    # A [S, B, h, n_q, L]
                H = torch.einsum("sbhij,sbjhc->sbihc", A, V.view(S, B, L, h, dh)).reshape(S, B, n_q, self.d)  # H = A V
            if cfg.block == "bert":
                E_q = torch.gather(E, 2, q_pos[..., None].expand(-1, -1, -1, self.d))
                H = self._bert_tail(E_q, H, layer)
            attns.append(A)
            E = H
        logits = self._affine(H, self.W_dec, getattr(self, "b_dec", None))          # W_dec H + b_dec
        return (logits, attns) if return_attention else logits

    def attention(self, tokens: torch.Tensor, keys: torch.Tensor, layer: int = 0) -> torch.Tensor:
        """Attention of ``layer`` over all positions, [S, B, heads, L, L]."""
        with torch.no_grad():
            return self(tokens, keys, return_attention=True)[1][layer]

    def data_loss(self, tokens: torch.Tensor, labels: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Per-member loss [S] over the selected positions (labels ≠ −100) (spec §2.6): cross-entropy
        over all |V| ids, or the squared error to one-hot targets averaged over n_sel·|V| entries.
        Only the selected query rows are computed."""
        sel = labels >= 0
        n_q = max(int(sel.sum(-1).max()), 1)
        q_pos = torch.argsort((~sel).to(torch.uint8), dim=-1, stable=True)[..., :n_q]   # selected first
        sel, y = torch.gather(sel, 2, q_pos), torch.gather(labels, 2, q_pos).clamp(min=0)
        logits = self(tokens, keys, queries=q_pos)
        if self.cfg.loss == "ce":
            per = F.cross_entropy(logits.permute(0, 3, 1, 2), y, reduction="none")
        else:
            per = ((logits - F.one_hot(y, self.V).to(logits)) ** 2).sum(-1) / self.V
        return (per * sel).sum((1, 2)) / sel.sum((1, 2)).clamp(min=1)

    def loss(self, tokens: torch.Tensor, labels: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """The training loss [S]: ``data_loss`` plus the real ℓ2 term (λ/2)‖θ‖² when ``l2 > 0``."""
        loss = self.data_loss(tokens, labels, keys)
        if self.cfg.l2:
            loss = loss + 0.5 * self.cfg.l2 * sum(p.pow(2).reshape(self.S, -1).sum(1) for p in self.parameters())
        return loss
