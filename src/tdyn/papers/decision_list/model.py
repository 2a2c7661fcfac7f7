"""The decision-list paper's one-layer model (paper §I.A, Eqn 1–2), with a leading ensemble axis S.

    f_{W,V}(X) = σ(V X σ(Xᵀ W X))      σ = column-wise softmax; X = one-hot tokens (L × n)

W[key, query] is the key token's score for the query token; column j of the attention is position j's
attention; no mask, no positional encoding, no 1/√d (docs/reproductions/decision-lists.md#forward-pass).
The forward's intermediate tensors are named in ``DecisionListModel.ACTIVATIONS`` (:mod:`tdyn.models.activations`,
docs/activations.md).
"""

from __future__ import annotations

import torch
from typing import Literal

from pydantic import ConfigDict, Field
from torch import nn

from tdyn.models import activations
from tdyn.schema import Strict


class DecisionListModelConfig(Strict):
    """The run config's ``model`` section of the ``decision_list`` task, and the model's construction
    config. ``L`` and ``dtype`` come from the data / the run (``exclude=True``: the task fills them in);
    ``DecisionListModelConfig(L)`` or ``DecisionListModelConfig(L, dtype)`` builds one directly."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True)

    init_std: float = Field(0.0, ge=0)   # W₀, V₀ ~ init_std·init_scale·N(0,1) (the task's init)
    c: float = 0.0                        # V₀ += c·P (the task's init)
    W_init: Literal["drawn", "zero"] = "drawn"   # "zero": W₀ = 0 after the draw (V₀ as with "drawn")
    V_noise: float = Field(0.0, ge=0)     # V₀ += E, E_ij ~ V_noise·U(−½, ½) (result (2)'s ‖V₀ − cP‖_∞ ≤ ε/2)
    V_noise_seed: int | None = None       # E's seed (uniform_perturbation); None: the member's seed
    L: int | None = Field(None, exclude=True)
    dtype: torch.dtype = Field(torch.float64, exclude=True)

    def __init__(self, L: int | None = None, dtype: torch.dtype | None = None, /, **kw):
        if L is not None:
            kw["L"] = L
        if dtype is not None:
            kw["dtype"] = dtype
        super().__init__(**kw)


def uniform_perturbation(L: int, eps: float, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """E with E_ij ~ ε·U(−½, ½) i.i.d. from ``torch.Generator().manual_seed(seed)`` (L × L): the V₀
    perturbation of result (2). One function for the task's init and the analyses that need E."""
    g = torch.Generator().manual_seed(seed)
    return eps * (torch.rand(L, L, generator=g, dtype=torch.float64) - 0.5).to(dtype)


def member_size(L: int) -> int:
    """Values in one member's parameters (W and V, L × L each)."""
    return 2 * L * L


class DecisionListModel(nn.Module):
    #: the forward's named activations (:mod:`tdyn.models.activations`; docs/activations.md), each [S, ...] for
    #: tokens s [B, n]; recorded by ``logits`` (and ``forward``, which calls it)
    ACTIVATIONS = {
        "scores": "X^T W X, the key token's score for each query token, [S, B, n_key, n_query] (Eqn 1)",
        "attention": "sigma(X^T W X), the column-wise softmax over the keys (a column sums to 1), [S, B, n_key, n_query] (Eqn 1)",
        "values": "V X, column i = V[:, s_i], [S, B, L, n] (Eqn 1)",
        "logits": "V X sigma(X^T W X), the outputs before the outer softmax, [S, B, L, n] (Eqn 1)",
        "log_probs": "log f_{W,V}(X) = log sigma(V X sigma(X^T W X)), column j position j's log-distribution over the "
                     "L tokens, [S, B, L, n] (Eqn 1; forward's output)",
    }

    def __init__(self, cfg: DecisionListModelConfig, S: int = 1):
        super().__init__()
        self.cfg = cfg
        self.W = nn.Parameter(torch.zeros(S, cfg.L, cfg.L, dtype=cfg.dtype))
        self.V = nn.Parameter(torch.zeros(S, cfg.L, cfg.L, dtype=cfg.dtype))

    def logits(self, s: torch.Tensor) -> torch.Tensor:
        """Pre-softmax outputs Z = V X σ(Xᵀ W X) for tokens s (B, n): shape (S, B, L, n)."""
        W, V = self.W, self.V
        S_ = W[:, s[:, :, None], s[:, None, :]]       # (S, B, n_key, n_query): Xᵀ W X
        A = torch.softmax(S_, dim=2)                  # σ over keys (columns sum to 1)
        VX = V[:, :, s].permute(0, 2, 1, 3)           # (S, B, L, n): column i = V[:, s_i]
        Z = VX @ A                                    # Eqn 1 before the outer σ
        cache = activations.recording(self)           # None unless activations are captured
        if cache is not None:
            cache.put("scores", S_), cache.put("attention", A), cache.put("values", VX), cache.put("logits", Z)
        return Z

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        """log f_{W,V}(X) = log σ(V X σ(Xᵀ W X)) (Eqn 1) for tokens s (B, n): (S, B, L, n), column j the
        log-distribution of position j's output over the L tokens."""
        out = torch.log_softmax(self.logits(s), dim=2)
        cache = activations.recording(self)
        if cache is not None:
            cache.put("log_probs", out)
        return out

    log_probs = forward

    def seq_loss(self, s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Eqn 2 per sequence: (1/n) Σ_j −log f(X)_{y_j, j}; shape (S, B)."""
        logp = self(s)
        idx = y[None, :, None, :].expand(logp.shape[0], -1, 1, -1)
        return -logp.gather(2, idx).squeeze(2).mean(-1)
