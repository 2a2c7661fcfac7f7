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
    task trains one layer through it and K ≥ 2 through ``predict_deep``; its batch-first K-layer path stays tested
    equal to model.py at every K (tests/test_icl_gd.py, tests/test_icl_gd_untied.py)."""
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


# ---------------------------------------------------------------- K ≥ 2 layers: batch-last, hand-written backward
#
# For K ≥ 2 the layers before the last need the per-sequence products (scores: N+1 × N, and scores × values) for
# every token; as batched matmuls of 11 × 10 matrices (``predict`` above) they ran at ≈ 4 GFLOP/s here and the
# weight products over (S, B·(N+1), D) rows at ≈ 0.8 ms each (benchmarks/README.md, "Issue 35, session 2026-11-27
# (seventeenth, helper icl4)"). ``predict_deep`` keeps every per-sequence quantity with the batch axis last,
# (S, D, N+1, B): a weight then acts as one (D × D) @ (D × (N+1)·B) product per member, and a per-sequence product
# is a sum over its inner index r of outer products of two (…, B) slices (:func:`_pmm`, r ≤ 11 fused
# multiply-adds over contiguous rows of B). Autograd through those loops would record every slice, so the
# gradient is written out (:class:`_Deep`); it is tested against ``model.py`` in float64 (tests/test_icl_gd_deep.py).


def _pmm(a: torch.Tensor, ra: int, b: torch.Tensor, rb: int, into: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sequence product over a shared index r: a (S, ·, ·, B) with r at axis ``ra`` ∈ {1, 2}, b likewise at
    ``rb``; out[s, p, q, :] = Σ_r a[s, p|r, :] ⊙ b[s, q|r, :] (p the other middle axis of a, q of b), (S, P, Q, B),
    added in place to ``into`` when given (and returned)."""
    R = a.shape[ra]
    if into is None:
        into = torch.mul(a.select(ra, 0).unsqueeze(2), b.select(rb, 0).unsqueeze(1))
    else:
        into.addcmul_(a.select(ra, 0).unsqueeze(2), b.select(rb, 0).unsqueeze(1))
    for r in range(1, R):
        into.addcmul_(a.select(ra, r).unsqueeze(2), b.select(rb, r).unsqueeze(1))
    return into


def _wmul(W: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """W X per member: W (S, D, D) acting on the D axis of X (S, D, …, B) as one matmul with the rest flattened."""
    return torch.matmul(W, X.reshape(X.shape[0], X.shape[1], -1)).view(X.shape)


def _wgrad(dY: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Σ over tokens and batch of dY Xᵀ per member: (S, D, …, B) × (S, D, …, B) → (S, D, D)."""
    S, D = X.shape[:2]
    return torch.matmul(dY.reshape(S, D, -1), X.reshape(S, D, -1).transpose(-1, -2))


class _Deep(torch.autograd.Function):
    """ŷ (S, B) of K layers from the tokens E (S, D, N+1, B) (batch last) and the folded weights A = P W_V,
    G = W_Kᵀ W_Q, each (S, K, D, D). Gradients for A and G only (the tokens are data)."""

    @staticmethod
    def forward(ctx, E, A, G):
        K = A.shape[1]
        N = E.shape[2] - 1
        saved = []
        for layer in range(K - 1):
            Al, Gl = A[:, layer], G[:, layer]
            X = E[:, :, :N]                                  # keys and values: the context    (S, D, N, B)
            g = _wmul(Gl, E)                                 # G e_j                           (S, D, N+1, B)
            v = _wmul(Al, X.contiguous())                    # A e_i                           (S, D, N, B)
            s = _pmm(g, 1, X, 1)                             # s_ji = e_iᵀ G e_j               (S, N+1, N, B)
            saved.append((E, g, v, s))
            E = _pmm(v, 2, s, 2, into=E.clone())             # e_j + Σ_i s_ji A e_i            (S, D, N+1, B)
        Al, Gl = A[:, K - 1], G[:, K - 1]                    # the last layer: the query's y entry only
        X, q = E[:, :, :N], E[:, :, N]                       # (S, D, N, B), (S, D, B)
        alpha = torch.matmul(Al[:, -1:], X.reshape(X.shape[0], X.shape[1], -1)).view(X.shape[0], N, -1)  # a·e_i
        u = torch.matmul(Gl, q)                              # G e_q                           (S, D, B)
        beta = (X * u.unsqueeze(2)).sum(1)                   # e_iᵀ G e_q                      (S, N, B)
        y = -(q[:, -1] + (alpha * beta).sum(1))
        ctx.save_for_backward(A, G)
        ctx.saved = saved
        ctx.last = (E, alpha, beta, u)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        A, G = ctx.saved_tensors
        K = A.shape[1]
        E, alpha, beta, u = ctx.last
        N = E.shape[2] - 1
        dA, dG = torch.zeros_like(A), torch.zeros_like(G)
        X, q = E[:, :, :N], E[:, :, N]
        c = -dy                                              # ∂/∂(q_y + Σ α β)                (S, B)
        dalpha, dbeta = (c.unsqueeze(1) * beta), (c.unsqueeze(1) * alpha)
        Al, Gl = A[:, K - 1], G[:, K - 1]
        dA[:, K - 1, -1] = torch.matmul(X.reshape(X.shape[0], X.shape[1], -1),
                                        dalpha.reshape(dalpha.shape[0], -1, 1)).squeeze(-1)
        du = (X * dbeta.unsqueeze(1)).sum(2)                 # Σ_i β̇_i e_i                     (S, D, B)
        dG[:, K - 1] = torch.matmul(du, q.transpose(-1, -2))
        dE = torch.empty_like(E)
        dE[:, :, :N] = Al[:, -1][:, :, None, None] * dalpha.unsqueeze(1) + u.unsqueeze(2) * dbeta.unsqueeze(1)
        dE[:, :, N] = torch.matmul(Gl.transpose(-1, -2), du)
        dE[:, -1, N] += c
        for layer in range(K - 2, -1, -1):
            E, g, v, s = ctx.saved[layer]
            Al, Gl = A[:, layer], G[:, layer]
            X = E[:, :, :N]
            dv = _pmm(dE, 2, s, 1)                           # ∂v_di = Σ_j ∂E'_dj s_ji          (S, D, N, B)
            ds = _pmm(dE, 1, v, 1)                           # ∂s_ji = Σ_d ∂E'_dj v_di          (S, N+1, N, B)
            dg = _pmm(X, 2, ds, 2)                           # ∂g_dj = Σ_i ∂s_ji e_di           (S, D, N+1, B)
            dA[:, layer] = _wgrad(dv, X)
            dG[:, layer] = _wgrad(dg, E)
            S, D = E.shape[:2]                               # the residual and G's input: ∂E' + Gᵀ ∂g
            dE = torch.baddbmm(dE.view(S, D, -1), Gl.transpose(-1, -2), dg.view(S, D, -1)).view(E.shape)
            dEx = dE[:, :, :N]                               # the context also enters as keys and values:
            dEx += _wmul(Al.transpose(-1, -2), dv)           # + Aᵀ ∂v
            _pmm(g, 2, ds, 1, into=dEx)                      # + Σ_j ∂s_ji g_j
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
    return _Deep.apply(E.permute(0, 3, 2, 1).contiguous(), A, G)
