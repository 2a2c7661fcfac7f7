"""The simplified two-layer transformer of Bietti et al. 2023 (their Section 4.2, the authors'
``ihead_basic_model.Transformer``), with a leading ensemble axis S (docs/reproductions/birth.md#model).

For tokens z_1 … z_T, with frozen random token embeddings w_E(z) ∈ R^d and positional embeddings p_t ∈ R^d:

    x_t   = w_E(z_t) + p_t                                                               (input)
    h¹_t  = x_t  + W_O¹ W_V¹ Σ_{s≤t} β¹_{ts} x_s,    β¹_t = softmax_s(x_tᵀ W_K¹ x_s / √d)     (layer 1)
    h²_t  = h¹_t + W_O² W_V² Σ_{s≤t} β²_{ts} h¹_s,   β²_t = softmax_s(h¹_tᵀ W_K² h¹_s / √d)   (layer 2)
    h²_t ← h²_t + W_F h²_t                              (only with ``final_ffn``: the linear feed-forward)
    ξ_t   = W_U h²_t                                                                    (logits)

The query matrices are the identity (the authors' ``wq = nn.Identity()``), there is no layer norm and no first
feed-forward. Trained: W_K¹, W_K², W_O² (and W_F with ``final_ffn``); frozen at their random initialisation:
w_E, p, W_V¹, W_O¹, W_V², W_U (the authors' ``freeze_embeddings=True freeze_output=True``; their values and
W_O¹ are always frozen in the simplified model). Init as PyTorch's defaults the authors rely on: w_E and p
N(0, 1), every d × d matrix and W_U uniform on ±1/√d (``nn.Linear``).

Matrices act on column vectors (W x); the authors' ``nn.Linear`` stores the same W (``x @ W.T``).
The equation numbers of the paper are not cited: its full text was not available to tdyn
(docs/reproductions/birth.md#paper-and-code).
"""

from __future__ import annotations

import math

import torch
from pydantic import ConfigDict, Field
from torch import nn

from tdyn.schema import Strict

#: the trained matrices, in the order the init draws them with the frozen ones (see :data:`INIT_ORDER`)
TRAINED = ("W_K1", "W_K2", "W_O2")
#: every matrix in the order one member's init stream draws it
INIT_ORDER = ("w_E", "p", "W_K1", "W_V1", "W_O1", "W_K2", "W_V2", "W_O2", "W_F", "W_U")


class BirthModelConfig(Strict):
    """The run config's ``model`` section of the ``birth`` task. ``N`` and ``T`` (from the data) and ``dtype`` are
    filled in by the task (``exclude=True``); ``BirthModelConfig(N, T)`` builds one directly."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True,
                              allow_inf_nan=False)

    d: int = Field(256, ge=2, le=8192, description="embedding dimension (the authors' model_args.dim)")
    final_ffn: bool = Field(False, description="a trained linear feed-forward W_F after layer 2 (the authors' "
                                               "final_ffn with linear_final_ffn)")
    N: int | None = Field(None, exclude=True)
    T: int | None = Field(None, exclude=True)
    dtype: torch.dtype = Field(torch.float32, exclude=True)

    def __init__(self, N: int | None = None, T: int | None = None, /, **kw):
        if N is not None:
            kw["N"] = N
        if T is not None:
            kw["T"] = T
        super().__init__(**kw)

    def shapes(self) -> dict[str, tuple[int, int]]:
        """One member's shape of every matrix in :data:`INIT_ORDER` (W_F only with ``final_ffn``)."""
        d, N, T = self.d, self.N, self.T
        out = {"w_E": (N, d), "p": (T, d)} | {m: (d, d) for m in ("W_K1", "W_V1", "W_O1", "W_K2", "W_V2", "W_O2")}
        if self.final_ffn:
            out["W_F"] = (d, d)
        return out | {"W_U": (N, d)}

    @property
    def trained(self) -> tuple[str, ...]:
        return TRAINED + (("W_F",) if self.final_ffn else ())


def member_size(cfg: BirthModelConfig) -> int:
    """Values in one member's trained parameters."""
    return len(cfg.trained) * cfg.d * cfg.d


def _bmm(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Rows W x of the vectors X (S, B, T, d) by the members' W (S, d_out, d)."""
    S, B, T, d = X.shape
    return (X.reshape(S, B * T, d) @ W.transpose(-1, -2)).reshape(S, B, T, W.shape[-2])


class MemoryTransformer(nn.Module):
    """The two-layer attention-only model above; trained matrices are parameters [S, d, d], frozen ones
    buffers (rebuilt from each member's seed, not checkpointed)."""

    def __init__(self, cfg: BirthModelConfig, S: int = 1):
        super().__init__()
        self.cfg = cfg
        for name, shape in cfg.shapes().items():
            t = torch.zeros((S, *shape), dtype=cfg.dtype)
            if name in cfg.trained:
                setattr(self, name, nn.Parameter(t))
            else:
                self.register_buffer(name, t, persistent=False)

    @property
    def S(self) -> int:
        return self.W_K1.shape[0]

    def embed(self, z: torch.Tensor) -> torch.Tensor:
        """x_t = w_E(z_t) + p_t for tokens z (S, B, T) or (B, T) shared → (S, B, T, d)."""
        if z.dim() == 2:
            z = z.expand(self.S, *z.shape)
        S, B, T = z.shape
        idx = torch.arange(S, device=z.device).view(S, 1, 1)
        return self.w_E[idx, z] + self.p[:, None, :T]

    @staticmethod
    def attention(X: torch.Tensor, W_K: torch.Tensor) -> torch.Tensor:
        """β (S, B, T, T): β_t = softmax over s ≤ t of x_tᵀ W_K x_s / √d (causal)."""
        d = X.shape[-1]
        scores = X @ _bmm(X, W_K).transpose(-1, -2) / math.sqrt(d)              # x_tᵀ (W_K x_s)
        T = X.shape[-2]
        mask = torch.ones(T, T, dtype=torch.bool, device=X.device).triu(1)
        return scores.masked_fill(mask, float("-inf")).softmax(-1)

    def layers(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every intermediate (S, B, T, ·): ``x``, ``beta1``, ``h1``, ``beta2``, ``h2`` (after W_F if any)."""
        x = self.embed(z)
        beta1 = self.attention(x, self.W_K1)
        h1 = x + _bmm(_bmm(beta1 @ x, self.W_V1), self.W_O1)                   # layer 1
        beta2 = self.attention(h1, self.W_K2)
        h2 = h1 + _bmm(_bmm(beta2 @ h1, self.W_V2), self.W_O2)                 # layer 2
        if self.cfg.final_ffn:
            h2 = h2 + _bmm(h2, self.W_F)
        return {"x": x, "beta1": beta1, "h1": h1, "beta2": beta2, "h2": h2}

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Logits ξ = W_U h² (S, B, T, N) of tokens z (S, B, T) or (B, T) shared by the members."""
        return _bmm(self.layers(z)["h2"], self.W_U)
