"""Scan and Snap's one-layer attention + decoder (Tian et al. 2023 §3, Eqn 1–2; docs/reproductions/scan-snap.md#model).

Two parameterisations of the same forward pass:

* ``yz`` (what the synthetic figures train; the authors' ``Model2``): the pairwise logits
  Z = K2.weight (query m's logit on key l is Z[m, l], no 1/√d, no bias) and the decoder
  Y = K1.weightᵀ are the parameters;
* ``embedding`` (Eqn 1–2): Z := U W_Q W_Kᵀ Uᵀ/√d and Y := U W_Vᵀ Uᵀ from embeddings U ∈ R^{M×d}.

Every parameter has a leading ensemble axis S. Inputs are token ids x [S, B, L]; the last token is
the query and (by default) is not a key. The forward's intermediate tensors are named in
``YZModel.ACTIVATIONS`` (:mod:`tdyn.models.activations`, docs/activations.md).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from tdyn.models import activations
from tdyn.papers.scan_snap import kernels
from tdyn.schema import Strict


class YZConfig(Strict):
    """The ``model`` section of a ``scan_snap`` run config, and the model's own config.

    ``M`` (vocabulary size) is not a config key: the task sets it from the distribution
    (``cfg.model_copy(update={"M": ...})``); it is excluded from dumps so config.json holds the section.
    """

    M: int | None = Field(None, ge=1, exclude=True)
    parameterization: Literal["yz", "embedding"] = "yz"
    d: int = Field(128, ge=1)
    residual: bool = False            # ū = LN(LN(Xᵀb) + e_query) (the paper's §7 extension)
    include_query_key: bool = False   # the authors' attn_include_base_token
    normalize: bool = True            # LN(x) = x/‖x‖₂ on the attended vector
    init: Literal["zero", "torch_default"] = "zero"


def member_size(cfg: YZConfig, M: int) -> int:
    """Values in one member's parameters for vocabulary size ``M``, from the config alone."""
    return 2 * M * M if cfg.parameterization == "yz" else M * cfg.d + 3 * cfg.d * cfg.d


class YZModel(nn.Module):
    #: the forward's named activations (:mod:`tdyn.models.activations`; docs/activations.md), each [S, ...]. On the
    #: support path (``forward(x, support)``, the training path) the per-position ``scores`` and ``attention`` are
    #: computed from x by Eqn 1 only where asked for (the kernel works on each sample's distinct keys), and need x
    #: with its keys (the probe batch, ``task.full_sample``), not the training batch's query column alone.
    ACTIVATIONS = {
        "scores": "Z[x_T, x_t], the query's attention logit on each key position, [S, B, T_k] (Eqn 1's exponent; "
                  "T_k = L - 1 context positions, L with include_query_key)",
        "attention": "b_T = softmax_t Z[x_T, x_t], the attention on each key position, [S, B, T_k] (Eqn 1)",
        "context": "X^T b_T, the attention-weighted context before LN (attention summed per token), [S, B, M]",
        "attended": "the normalised attended vector the decoder reads, [S, B, M]: LN(X^T b_T) = X^T b_T/||X^T b_T||_2 "
                    "(Eqn 2); with residual LN(LN(X^T b_T) + e_query) (par. 7); with normalize = false X^T b_T",
        "logits": "Y^T attended, the decoder's output logits, [S, B, M] (Eqn 2; the forward's output)",
    }

    def __init__(self, cfg: YZConfig, S: int = 1):
        super().__init__()
        if cfg.M is None:
            raise ValueError("YZConfig.M (the vocabulary size) must be set to build the model")
        self.cfg = cfg
        M, d = cfg.M, cfg.d
        if cfg.parameterization == "yz":
            self.Y = nn.Parameter(torch.zeros(S, M, M))   # Y[l, n] = K1.weight[n, l]
            self.Z = nn.Parameter(torch.zeros(S, M, M))   # Z[m, l] = K2.weight[m, l]
        else:
            self.U = nn.Parameter(torch.zeros(S, M, d))
            self.W_Q = nn.Parameter(torch.zeros(S, d, d))
            self.W_K = nn.Parameter(torch.zeros(S, d, d))
            self.W_V = nn.Parameter(torch.zeros(S, d, d))

    @torch.no_grad()
    def reset_parameters(self, gens: list[torch.Generator], scales: list[float]) -> None:
        """Member i draws from ``gens[i]``: zero init, or nn.Linear's U(−1/√fan_in, 1/√fan_in),
        drawn in the authors' order (decoder K1 first, then K2), times ``scales[i]``."""
        if self.cfg.init == "zero":
            for p in self.parameters():
                p.zero_()
            return
        for i, (g, s) in enumerate(zip(gens, scales)):
            for name, p in self.named_parameters():
                fan_in = p.shape[-1]
                bound = 1 / math.sqrt(fan_in)
                w = torch.empty(p.shape[1:], dtype=p.dtype).uniform_(-bound, bound, generator=g)
                # K1.weight is [n, l]; Y stores its transpose.
                p[i].copy_((w.T if name == "Y" else w) * s)

    def logits_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(Z, Y), each [S, M, M] (§3.1 reparameterisation)."""
        if self.cfg.parameterization == "yz":
            return self.Z, self.Y
        U = self.U
        Z = U @ self.W_Q @ self.W_K.transpose(1, 2) @ U.transpose(1, 2) / math.sqrt(self.cfg.d)
        Y = U @ self.W_V.transpose(1, 2) @ U.transpose(1, 2)
        return Z, Y

    def attention(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """b_T = softmax_t(Z[x_T, x_t]) over the keys (Eqn 1). Returns (b [S, B, T_k], keys)."""
        keys = x if self.cfg.include_query_key else x[..., :-1]
        return torch.softmax(self._query_logits(x[..., -1], keys), dim=-1), keys

    def _query_logits(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Z[x_T, k] for every key k (shape of ``keys``), read from the flat [S, M·M] view: no
        [S, B, M] copy of the query rows z_m, and the backward scatters only into those rows."""
        Z, _ = self.logits_matrices()
        S, M = Z.shape[0], Z.shape[-1]
        flat = (query[..., None] * M + keys).reshape(S, -1)
        return torch.gather(Z.reshape(S, M * M), 1, flat).view(keys.shape)

    def forward(self, x: torch.Tensor, support: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        """Output logits Yᵀ LN(Xᵀ b_T) (Eqn 2), shape [S, B, M].

        ``support`` (each sample's distinct keys and the logs of their counts, from the task): the same
        logits on the keys' multiset, the fast path of :func:`tdyn.papers.scan_snap.kernels.forward_on_support`
        (tested equal to the equations below, tests/test_yz_support.py)."""
        cache = activations.recording(self)                  # None unless activations are captured
        if support is not None and not self.cfg.include_query_key:
            return kernels.forward_on_support(self, x, support, cache)
        _, Y = self.logits_matrices()
        keys = x if self.cfg.include_query_key else x[..., :-1]
        scores = self._query_logits(x[..., -1], keys)
        b_T = torch.softmax(scores, dim=-1)                                                    # Eqn 1
        u = torch.zeros(*keys.shape[:2], Y.shape[-1], dtype=b_T.dtype, device=b_T.device).scatter_add_(2, keys, b_T)  # Xᵀb_T
        if cache is not None:
            cache.put("scores", scores), cache.put("attention", b_T), cache.put("context", u)
        if self.cfg.normalize:
            u = F.normalize(u, dim=-1)                                                         # LN(Xᵀb_T)
        u = self.with_query(u, x)
        logits = u @ Y                                                                         # Eqn 2: Σ_l u_l Y[l, n]
        if cache is not None:
            cache.put("attended", u), cache.put("logits", logits)
        return logits

    def with_query(self, u: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The attended vector, with the query's own embedding added (ū = LN(u + e_query), §7) when
        ``residual``; ``u`` as it is otherwise."""
        if not self.cfg.residual:
            return u
        u = u + F.one_hot(x[..., -1], u.shape[-1]).to(u)
        return F.normalize(u, dim=-1) if self.cfg.normalize else u

    def loss(self, x: torch.Tensor, y: torch.Tensor, support=None) -> torch.Tensor:
        """Cross-entropy over all M tokens, averaged over the batch: shape [S]."""
        logits = self(x, support)
        S, B, M = logits.shape
        return F.cross_entropy(logits.reshape(S * B, M), y.reshape(S * B), reduction="none").view(S, B).mean(1)
