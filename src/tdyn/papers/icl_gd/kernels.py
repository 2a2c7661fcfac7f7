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
from torch.autograd.function import once_differentiable

from tdyn.papers.icl_gd.model import LSA


def predict(model: LSA, E: torch.Tensor) -> torch.Tensor:
    """ŷ (S, B) of ``model`` on tokens E (S, B, N+1, D) (or (B, N+1, D) shared), equal to ``model.predict(E)``. The
    task trains one layer through it and K ≥ 2 layers (separate or recurrent) through ``predict_deep``; its K-layer
    path stays tested equal to model.py at every K (tests/test_icl_gd.py, tests/test_icl_gd_untied.py)."""
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


# ---------------------------------------------------------------- K ≥ 2 layers: batch-first, hand-written backward
#
# For K ≥ 2 the layers before the last need the per-sequence products (scores: N+1 × N, and scores × values) for
# every token. ``predict_deep`` runs them as batched matmuls over contiguous (S·B, N+1, D) tokens and the weight
# products as one (B·(N+1), D) @ (D, D) matmul per member, with the gradient written out (:class:`_Deep`: 2
# per-sequence and 2 weight products forward per layer before the last, 4 and 4 backward; the last layer only the
# query's y entry), so autograd records no expand, mask or sum of its own. On the eighteenth session's Xeon
# (AVX-512) one K = 3 untied trainer step of S = 5 members × 2048 took 67–69 ms against 96 ms with the batch-last
# element-wise products below (benchmarks/README.md, "Issue 38, session 2026-11-27 (eighteenth, helper icl5)"; on the
# seventeenth session's EPYC the batch-last layout was the faster). Tested against ``model.py`` in float64
# (tests/test_icl_gd_deep.py).


class _Deep(torch.autograd.Function):
    """ŷ (S, B) of K layers from the tokens E (S, B, N+1, D) (contiguous) and the folded weights A = P W_V,
    G = W_Kᵀ W_Q, each (S, K, D, D). Gradients for A and G only (the tokens are data). Tokens are rows: a
    weight acts as E Wᵀ."""

    @staticmethod
    def forward(ctx, E, A, G):
        S, B, T, D = E.shape
        N, K = T - 1, A.shape[1]
        saved = []
        for layer in range(K - 1):
            Al, Gl = A[:, layer], G[:, layer]
            hv = torch.bmm(E.view(S, B * T, D), torch.cat((Gl, Al), 1).transpose(1, 2)).view(S * B, T, 2 * D)
            h, v = hv[..., :D], hv[..., D:]                                # G e_j, A e_i (the query's A e unused)
            X = E.view(S * B, T, D)[:, :N]                                 # keys and values: the context
            s = torch.bmm(h, X.transpose(1, 2))                            # s_ji = e_iᵀ G e_j  (S·B, N+1, N)
            saved.append((E, h, v, s))
            E = torch.baddbmm(E.view(S * B, T, D), s, v[:, :N]).view(S, B, T, D)   # e_j + Σ_i s_ji A e_i
        Al, Gl = A[:, K - 1], G[:, K - 1]                                  # the last layer: the query's y entry
        X, q = E.view(S * B, T, D)[:, :N], E[:, :, N]                      # (S·B, N, D), (S, B, D)
        alpha = torch.bmm(E.view(S, B * T, D), Al[:, -1].unsqueeze(-1)).view(S * B, T)[:, :N]    # a·e_i
        u = torch.bmm(q, Gl.transpose(1, 2))                               # G e_q        (S, B, D)
        beta = (X * u.view(S * B, 1, D)).sum(-1)                           # e_iᵀ G e_q   (S·B, N)
        y = -(q[..., -1] + (alpha * beta).sum(-1).view(S, B))
        ctx.save_for_backward(A, G)
        ctx.saved = saved
        ctx.last = (E, alpha, beta, u)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        A, G = ctx.saved_tensors
        E, alpha, beta, u = ctx.last
        S, B, T, D = E.shape
        N, K = T - 1, A.shape[1]
        dA, dG = torch.zeros_like(A), torch.zeros_like(G)
        X, q = E.view(S * B, T, D)[:, :N], E[:, :, N]
        c = -dy.reshape(S * B, 1)                                          # ∂/∂(q_y + Σ α β)
        dalpha, dbeta = c * beta, c * alpha                                # (S·B, N)
        Al, Gl = A[:, K - 1], G[:, K - 1]
        dalpha_t = E.new_zeros(S, 1, B, T)                                 # α̇ on every token, 0 on the query
        dalpha_t[:, 0, :, :N] = dalpha.view(S, B, N)
        dA[:, K - 1, -1] = torch.bmm(dalpha_t.view(S, 1, B * T), E.view(S, B * T, D)).view(S, D)  # Σ α̇_i e_i
        du = (X * dbeta.unsqueeze(-1)).sum(1).view(S, B, D)                # Σ_i β̇_i e_i  (S, B, D)
        dG[:, K - 1] = torch.bmm(du.transpose(1, 2), q)
        dE = torch.empty_like(E)
        dE[:, :, :N] = (dalpha.view(S, B, N, 1) * Al[:, -1].view(S, 1, 1, D)
                        + dbeta.view(S, B, N, 1) * u.view(S, B, 1, D))
        dE[:, :, N] = torch.bmm(du, Gl)                                    # Gᵀ ∂u
        dE[:, :, N, -1] += c.view(S, B)
        for layer in range(K - 2, -1, -1):
            E, h, v, s = ctx.saved[layer]
            Al, Gl = A[:, layer], G[:, layer]
            X = E.view(S * B, T, D)[:, :N]
            dEs = dE.view(S * B, T, D)
            ds = torch.bmm(dEs, v[:, :N].transpose(1, 2))                  # ∂s_ji = ∂e'_j · v_i     (S·B, N+1, N)
            dv = torch.bmm(s.transpose(1, 2), dEs)                         # ∂v_i = Σ_j s_ji ∂e'_j   (S·B, N, D)
            dh = torch.bmm(ds, X)                                          # ∂h_j = Σ_i ∂s_ji e_i    (S·B, N+1, D)
            dx = torch.bmm(ds.transpose(1, 2), h)                          # keys: Σ_j ∂s_ji h_j     (S·B, N, D)
            dG[:, layer] = torch.bmm(dh.view(S, B * T, D).transpose(1, 2), E.view(S, B * T, D))
            dv = dv.view(S, B * N, D)
            dA[:, layer] = torch.bmm(dv.transpose(1, 2), X.reshape(S, B * N, D))
            dx = torch.baddbmm(dx.view(S, B * N, D), dv, Al)               # values: + Aᵀ ∂v_i
            dE = torch.baddbmm(dE.view(S, B * T, D), dh.view(S, B * T, D), Gl).view(S, B, T, D)   # ∂e' + Gᵀ ∂h
            dE[:, :, :N] += dx.view(S, B, N, D)
        return None, dA, dG


def predict_deep(model: LSA, E: torch.Tensor) -> torch.Tensor:
    """ŷ (S, B) of ``model`` (any K; meant for K ≥ 2) on tokens E (S, B, N+1, D) (or (B, N+1, D) shared), equal to
    ``model.predict(E)`` to rounding, with the hand-written gradient of :class:`_Deep` for the weights."""
    S = model.W_K.shape[0]
    if E.dim() == 3:
        E = E.expand(S, *E.shape)
    K = model.cfg.layers
    A = model.P @ model.W_V                                          # (S, weight sets, D, D)
    G = model.W_K.transpose(-1, -2) @ model.W_Q
    if model.cfg.tied:
        A, G = A.expand(-1, K, -1, -1), G.expand(-1, K, -1, -1)
    return _Deep.apply(E.contiguous(), A, G)
