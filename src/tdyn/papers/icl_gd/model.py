"""Linear self-attention (LSA), the model of von Oswald et al. 2023, with a leading ensemble axis S
(docs/reproductions/icl-gd.md#model).

One LSA layer updates every token e_j (context tokens and the query) by

    e_j ← e_j + P Σ_{i=1}^{N} (W_V e_i) (W_K e_i)ᵀ (W_Q e_j)                        (LSA update)

— no softmax, no 1/√d, no normalisation by N (the 1/N of gradient descent lives in P), keys and values from the
N context tokens only, queries from every token: the authors' ``MultiHeadAttention`` with ``use_softmax=False``,
one head, ``include_query=False``, no biases, a residual connection, no MLP, no layer norm (their
``constructed_token_setup.ipynb``). The paper's equation numbers are not cited here: its full text was not
available to tdyn (docs/reproductions/icl-gd.md#paper-and-code). K layers apply the update K times, with
separate weights per layer (``tied: false``) or one set shared by all (``tied: true``, the authors'
"recurrent Transformer", their notebook's default). The prediction is read from the query token's y entry with
its sign flipped, ŷ = −(e_{N+1})_y, as the authors' ``h[:, -1, -1] * (-1.0)``: the GD construction writes
−ŷ there (:func:`tdyn.papers.icl_gd.theory.construction`).

Weights act on column vectors (W e, the paper's notation); the authors' Haiku ``Linear`` computes e W with W
stored (in, out), so their matrices are the transposes of these.

Because keys and values exclude the query, the context never sees the query and every layer maps the query
token linearly: e_q ← (I + P W_V C W_Kᵀ W_Q) e_q with C = Σ_i e_i e_iᵀ the context tokens' Gram matrix at
that layer. :meth:`LSA.query_map` returns the product of these maps over the layers: ŷ is linear in x_q and
its sensitivity ∂ŷ/∂x_q is exact (:meth:`LSA.sensitivity`; tested against autograd).
"""

from __future__ import annotations

import math

import torch
from pydantic import ConfigDict, Field
from torch import nn

from tdyn.schema import Strict

#: Haiku's truncated-normal correction: VarianceScaling draws N(0, 1) truncated to [−2, 2] and divides its
#: std by the std of that truncated law, so the weights have variance scale / fan_in (haiku.initializers)
TRUNC_STD = 0.87962566103423978


class LSAConfig(Strict):
    """The run config's ``model`` section of the ``icl_gd`` task. ``D`` (= d + 1, from the data) and ``dtype``
    are filled in by the task (``exclude=True``); ``LSAConfig(D)`` builds one directly."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True,
                              allow_inf_nan=False)

    layers: int = Field(1, ge=1, le=64, description="K, the number of LSA layers")
    tied: bool = Field(True, description="one set of weights for every layer (the authors' recurrent "
                                         "Transformer, their default); false: separate weights per layer")
    init_scale: float = Field(0.002, gt=0, description="the authors' init: Haiku VarianceScaling(init_scale / K), "
                                                       "N(0, s^2) truncated to +-2s, s = sqrt(init_scale / K / (d+1)) "
                                                       "/ 0.8796, so the weights' std is sqrt(init_scale / K / (d+1))")
    D: int | None = Field(None, exclude=True)
    dtype: torch.dtype = Field(torch.float32, exclude=True)

    def __init__(self, D: int | None = None, /, **kw):
        if D is not None:
            kw["D"] = D
        super().__init__(**kw)

    @property
    def weight_sets(self) -> int:
        """How many sets of (W_K, W_Q, W_V, P) there are: 1 when tied, else K."""
        return 1 if self.tied else self.layers

    def init_std(self) -> float:
        """s of the authors' init N(0, s²) truncated to ±2s (before the member's init scale); the weights' std is
        0.8796·s = √(init_scale / K / D)."""
        return math.sqrt(self.init_scale / self.layers / self.D) / TRUNC_STD


def member_size(D: int, weight_sets: int) -> int:
    """Values in one member's parameters: four D × D matrices per weight set."""
    return 4 * weight_sets * D * D


class LSA(nn.Module):
    """K layers of linear self-attention on tokens E (B, N+1, D); every parameter [S, weight sets, D, D]."""

    def __init__(self, cfg: LSAConfig, S: int = 1):
        super().__init__()
        self.cfg = cfg
        shape = (S, cfg.weight_sets, cfg.D, cfg.D)
        self.W_K = nn.Parameter(torch.zeros(shape, dtype=cfg.dtype))
        self.W_Q = nn.Parameter(torch.zeros(shape, dtype=cfg.dtype))
        self.W_V = nn.Parameter(torch.zeros(shape, dtype=cfg.dtype))
        self.P = nn.Parameter(torch.zeros(shape, dtype=cfg.dtype))

    def weights(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W_K, W_Q, W_V, P) of layer ``layer`` (0-based), each [S, D, D]."""
        w = 0 if self.cfg.tied else layer
        return self.W_K[:, w], self.W_Q[:, w], self.W_V[:, w], self.P[:, w]

    def layer(self, E: torch.Tensor, layer: int) -> torch.Tensor:
        """One LSA update of every token: E (S, B, N+1, D) → E + P Σ_i (W_V e_i)(W_K e_i)ᵀ(W_Q e_j)."""
        W_K, W_Q, W_V, P = (m.unsqueeze(1).transpose(-1, -2) for m in self.weights(layer))  # (S, 1, D, D), transposed
        ctx = E[:, :, :-1]                          # keys and values: the N context tokens
        k, v = ctx @ W_K, ctx @ W_V                 # rows W_K e_i, W_V e_i   (S, B, N, D)
        q = E @ W_Q                                 # rows W_Q e_j            (S, B, N+1, D)
        scores = q @ k.transpose(-1, -2)            # (W_K e_i)ᵀ(W_Q e_j)     (S, B, N+1, N): no softmax
        return E + (scores @ v) @ P                 # e_j + P Σ_i (W_V e_i)(W_K e_i)ᵀ(W_Q e_j)

    def forward(self, E: torch.Tensor) -> torch.Tensor:
        """The tokens after K layers: E (B, N+1, D) shared by the members, or (S, B, N+1, D)."""
        if E.dim() == 3:
            E = E.expand(self.W_K.shape[0], *E.shape)
        for layer in range(self.cfg.layers):
            E = self.layer(E, layer)
        return E

    def stack(self, E: torch.Tensor) -> list[torch.Tensor]:
        """The prediction after each layer, [ŷ after layer 1, …, ŷ after layer K], each (S, B) (the authors'
        ``stack_h``)."""
        if E.dim() == 3:
            E = E.expand(self.W_K.shape[0], *E.shape)
        out = []
        for layer in range(self.cfg.layers):
            E = self.layer(E, layer)
            out.append(-E[..., -1, -1])
        return out

    def predict(self, E: torch.Tensor) -> torch.Tensor:
        """ŷ = −(e_{N+1})_y after K layers, (S, B): the query token's y entry, sign flipped."""
        return -self(E)[..., -1, -1]

    def seq_loss(self, E: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """½ (ŷ − y_q)² per sequence, (S, B) (the authors' ``compute_loss``: ½ Σ (t − p)² / B)."""
        return 0.5 * (self.predict(E) - y) ** 2

    def query_map(self, E: torch.Tensor) -> torch.Tensor:
        """R (S, B, D, D) with e_q after K layers = R e_q: R = Π_l (I + P W_V C_l W_Kᵀ W_Q), C_l = Σ_i e_i e_iᵀ
        over the context tokens entering layer l (the query is neither key nor value, so the context
        evolves without it)."""
        return self._query_map(E)[0]

    def _query_map(self, E: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(R, the tokens after K layers): the layers run once for both (the same operations as ``forward``)."""
        if E.dim() == 3:
            E = E.expand(self.W_K.shape[0], *E.shape)
        eye = torch.eye(self.cfg.D, dtype=E.dtype, device=E.device)
        R = eye.expand(*E.shape[:2], -1, -1)
        for layer in range(self.cfg.layers):
            W_K, W_Q, W_V, P = (m.unsqueeze(1) for m in self.weights(layer))
            ctx = E[:, :, :-1]
            C = ctx.transpose(-1, -2) @ ctx                              # Σ_i e_i e_iᵀ   (S, B, D, D)
            M = P @ W_V @ C @ W_K.transpose(-1, -2) @ W_Q
            R = (eye + M) @ R
            E = self.layer(E, layer)
        return R, E

    def sensitivity(self, E: torch.Tensor) -> torch.Tensor:
        """∂ŷ/∂x_q (S, B, d), exact: ŷ = −[R (x_q, 0)]_y is linear in x_q, so the gradient is −R[y, :d]."""
        return -self.query_map(E)[..., -1, :-1]

    def outputs(self, E: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ŷ (S, B), ∂ŷ/∂x_q (S, B, d)) from one pass through the layers: bit for bit ``predict(E)`` and
        ``sensitivity(E)`` (the tokens go through the same ``layer`` calls; tested), at the cost of one of them."""
        R, E = self._query_map(E)
        return -E[..., -1, -1], -R[..., -1, :-1]
