"""The LSA model's speed path (tested equal to ``model.py``'s equations in tests/test_icl_gd.py;
docs/reproductions/icl-gd.md#speed).

The update of one layer, e_j ← e_j + P Σ_i (W_V e_i)(W_K e_i)ᵀ(W_Q e_j), is computed with the weights folded into
A = P W_V and G = W_Kᵀ W_Q: (W_K e_i)ᵀ(W_Q e_j) = e_iᵀ G e_j, so a layer is two matrix products shared by every
token (G e_j, A e_i: one matmul per member over all the batch's tokens) and two per-sequence products (the
N+1 × N scores and scores × values), instead of four shared and two per-sequence ones. The last layer needs only
the query's y entry: Δy_q = Σ_i (a·e_i)(e_i·G e_q) with a = A's row y, O(N D) per sequence. On this CPU (one
thread) one training step (forward and backward) of S = 5 members × batch 2048 at the authors' sizes (d = 10,
N = 10) takes ~8 ms for one layer against ~90 ms by the attention as ``model.py`` writes it
(``tdyn bench icl_gd_one_layer_steps``).
"""

from __future__ import annotations

import torch

from tdyn.papers.icl_gd.model import LSA


def predict(model: LSA, E: torch.Tensor) -> torch.Tensor:
    """ŷ (S, B) of ``model`` on tokens E (S, B, N+1, D) (or (B, N+1, D) shared), equal to ``model.predict(E)``."""
    S = model.W_K.shape[0]
    if E.dim() == 3:
        E = E.expand(S, *E.shape)
    _, B, T, D = E.shape
    K = model.cfg.layers
    for layer in range(K):
        W_K, W_Q, W_V, P = model.weights(layer)
        A = P @ W_V                                                  # (S, D, D)
        G = W_K.transpose(-1, -2) @ W_Q
        ctx = E[:, :, :-1]                                           # keys and values: the context
        if layer == K - 1:                                           # only the query's y entry is read
            q = E[:, :, -1]
            Gq = q @ G.transpose(-1, -2)                             # G e_q              (S, B, D)
            dy = ((ctx * A[:, None, None, -1]).sum(-1) * (ctx * Gq.unsqueeze(2)).sum(-1)).sum(-1)
            return -(q[..., -1] + dy)
        g = (E.reshape(S, B * T, D) @ G.transpose(-1, -2)).reshape(S, B, T, D)          # G e_j
        v = (ctx.reshape(S, B * (T - 1), D) @ A.transpose(-1, -2)).reshape(S, B, T - 1, D)  # A e_i
        E = E + (g @ ctx.transpose(-1, -2)) @ v                      # e_j + Σ_i (e_iᵀ G e_j) A e_i
    raise AssertionError("unreachable")
