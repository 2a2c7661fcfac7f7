"""Speed kernels of the decision-list model, each tested equal to the reference it replaces
(``tests/test_decision_list_kernels.py``).

:func:`hessian_blocks` is :func:`theory.hessian_blocks` (the per-query W–W blocks of the population Hessian and
the bracket of λ_max they give, docs/reproductions/decision-lists.md#hessian-blocks) without its N·L³ term. The
reference builds, per (type, query position), an L × L Gram contribution: 29,640 positions × 40³ multiply-adds
at decision-list/claim2's L = 40, at every step before a member's first perfect iterate. Here the attention is
written in token space, α̃ = f ⊙ c / Z with f = exp W[:, q] shared by every row of query q and c the type's
token counts, so the expensive sum

    Σ_rows ω Σ_l p_l (α̃ ⊙ V[l])(α̃ ⊙ V[l])ᵀ = (f fᵀ) ⊙ Σ_l (V[l] V[l]ᵀ) ⊙ Q_l,   Q_l = Σ_rows ω p_l c cᵀ / Z²,

needs only Q, and c = b·1 + e with e sparse (b = 1: e marks the few absent tokens of a large subset; b = 0:
e = c, the few present ones) makes Q a scatter over e's nonzero pairs: N·k²·L work (k = e's nonzeros per
row) and an L⁴ contraction, instead of N·L³. Rows are (type, query token) pairs, a repeated query token counted
once with its multiplicity (its positions have the same column).
"""

from __future__ import annotations

import torch

from tdyn.papers.decision_list import theory as th
from tdyn.papers.decision_list.data import DecisionListTask, labels
from tdyn.papers.decision_list.model import DecisionListModel


class _Rows:
    """The token-space rows of a type set, built once per (task, types) and reused at every step: one row per
    distinct (type, query token), grouped by query and zero-padded to the largest group, so every row tensor
    is (L·G, ·) and viewed (L, G, ·) per query without a gather. Padding rows have weight 0 and a real row's
    counts (Z > 0)."""

    def __init__(self, task: DecisionListTask, types, L: int, dtype: torch.dtype):
        s = types.seqs
        T, n = s.shape
        c = torch.zeros(T, L, dtype=torch.float64).scatter_add_(1, s, torch.ones(T, n, dtype=torch.float64))
        first = torch.ones_like(s, dtype=torch.bool)
        first[:, 1:] = s[:, 1:] != s[:, :-1]                 # types are sorted: one row per (type, query token)
        t_idx, j_idx = first.nonzero(as_tuple=True)
        q = s[t_idx, j_idx]
        order = torch.argsort(q, stable=True)
        counts = torch.bincount(q, minlength=L)
        G = max(int(counts.max()), 1)
        start = torch.cumsum(counts, 0) - counts
        off = torch.arange(G)
        valid = off[None, :] < counts[:, None]                                   # (L, G)
        src = order[(start[:, None] + off[None, :]).clamp(0, max(len(q) - 1, 0))]
        src = torch.where(counts[:, None] > 0, src, 0).reshape(-1)              # a real row under every pad
        valid = valid.reshape(-1)
        self.L, self.G, self.valid = L, G, valid
        self.s, self.t_src, self.j_src = s, t_idx[src], j_idx[src]
        self.keys = s[self.t_src]                                                # (L·G, n): each row's key tokens
        self.c = c[t_idx[src]].to(dtype)                                         # (L·G, L) counts
        mult = c[t_idx[src], q[src]]
        self.omega = torch.where(valid, types.prob.to(torch.float64)[t_idx[src]] * mult / n, 0.0).to(dtype)[:, None]
        self.y = labels(task, s)[t_idx[src], j_idx[src]]
        self.q = torch.arange(L).repeat_interleave(G)
        # c = b·1 + e with e sparse: its nonzeros per row (token, value), ≤ k per row
        self.b = 1.0 if float((c != 0).sum(1).double().mean()) > L / 2 else 0.0
        e = self.c - self.b
        self.e = e.reshape(L, G, L)
        nz = e != 0
        k = int(nz.sum(1).max()) if len(e) else 0
        self.k = k
        if k:
            tok = torch.sort(torch.where(nz, torch.arange(L), L), dim=1).values[:, :k]   # each row's nonzero tokens
            ok = tok < L
            tok = torch.where(ok, tok, 0)
            val = torch.where(ok, e.gather(1, tok), torch.zeros((), dtype=dtype))
            self.tok, self.val = tok, val
            idx = (self.q[:, None, None] * L + tok[:, :, None]) * L + tok[:, None, :]
            self.keep = (ok[:, :, None] & ok[:, None, :] & valid[:, None, None]).reshape(-1)
            self.pair_idx = idx.reshape(-1)[self.keep]

    _cache: dict = {}

    @classmethod
    def of(cls, task: DecisionListTask, types, L: int, dtype: torch.dtype) -> "_Rows":
        """The rows of (task, types), from a small cache keyed by the objects' identity (kept alive by it)."""
        key = (id(task), id(types), L, dtype)
        hit = cls._cache.get(key)
        if hit is None or hit[0] is not task or hit[1] is not types:
            if len(cls._cache) >= 8:
                cls._cache.clear()
            hit = cls._cache[key] = (task, types, cls(task, types, L, dtype))
        return hit[2]


def hessian_blocks(model: DecisionListModel, task: DecisionListTask, types):
    """:func:`theory.hessian_blocks` (member 0): the same :class:`theory.BlockBound` (lower = the largest per-query
    W–W block eigenvalue, the closed-form upper bound, the top eigenvector), the blocks assembled in token space
    (module docstring); sums over outputs taken relative to each row's top output (below), where the reference
    centres each row: both free of the cancellation a peaked p would cause (tested against the dense Hessian at
    c up to 4·10⁷)."""
    W, V = model.W.detach()[0], model.V.detach()[0]
    L, dt = W.shape[-1], W.dtype
    Wq = W.T                                                     # (query, token)
    if float((Wq.amax(1) - Wq.amin(1)).max()) > 300:             # f·f/Z² could underflow: the reference path
        return th.hessian_blocks(model, task, types)
    R = _Rows.of(task, types, L, dt)
    G, om = R.G, R.omega
    N = L * G
    ar = torch.arange(N)
    # the attention and logits by the model's own products (DecisionListModel.logits: σ over keys of Xᵀ W X, then
    # V X σ), so z has the rounding of the loss that λ_max(0)'s Lanczos and the trainer differentiate: at result
    # (2)'s c (V ≈ 4·10⁷ at L = 40) z's rounding moves λ by ~1e-11 relative, and by ~1e-9 at c = 10⁹
    s = R.s
    Ak = torch.softmax(W[s[:, :, None], s[:, None, :]], dim=1)  # (T, n_key, n_query)
    zk = V[:, s].permute(1, 0, 2) @ Ak                           # (T, L, n_query)
    z = zk.transpose(1, 2)[R.t_src, R.j_src]                     # logits per row
    at = torch.zeros(N, L, dtype=dt).scatter_add_(1, R.keys, Ak.transpose(1, 2)[R.t_src, R.j_src])   # α̃ = X α
    # the same attention as f ⊙ c / Z, f = exp(W[:, q] − max_t W[t, q]) (for the main term)
    f_all = torch.exp(Wq - Wq.amax(1, keepdim=True))             # (L, L): f per query
    Z = (R.c.view(L, G, L) * f_all[:, None, :]).view(N, L).sum(1, keepdim=True)
    # sums over outputs l relative to the row's top output ŷ (Σ_p ignores a shift of V's rows or of z): V[l] − V[ŷ]
    # and z − z_ŷ stand in, p's ŷ entry dropped (p̄) and 1 − p_ŷ summed from the rest, so that where p is peaked
    # nothing of size V² cancels to a result of size (1 − p_ŷ)·V² (the reference centres each row instead)
    yh = z.argmax(1)
    z1 = z - z[ar, yh][:, None]                                  # z' = z − z_ŷ ≤ 0
    pt = torch.softmax(z1, dim=1)
    py = pt[ar, yh][:, None]                                     # p_ŷ
    pb = pt.clone()
    pb[ar, yh] = 0                                               # p̄
    q1 = pb.sum(1, keepdim=True)                                 # 1 − p_ŷ
    Vy = V[yh]                                                   # V[ŷ] per row
    nb = pb @ V                                                  # Σ_{l≠ŷ} p_l V[l]
    m1 = nb - q1 * Vy                                            # m − V[ŷ] = Σ_l p_l (V[l] − V[ŷ])
    mu = (pb * z1).sum(1, keepdim=True)                          # p·z'
    zeta = z1 - mu                                               # ζ = z − p·z
    pzeta = pt * zeta
    kap = pzeta @ V - pzeta.sum(1, keepdim=True) * Vy            # κ = Σ_l p_l ζ_l (V[l] − V[ŷ])
    sig2 = py * mu * mu + (pb * zeta * zeta).sum(1, keepdim=True)    # σ² = Σ_l p_l ζ_l²
    g = m1 + Vy - V[R.y]                                         # Vᵀ r = m − V[y], r = p − e_y
    a = at * (g - (at * g).sum(1, keepdim=True))                 # ã
    # --- the bracket's closed-form ends (theory.hessian_blocks), from the same ŷ-relative quantities
    pb2 = pb * pb
    sp2 = pb2.sum(1, keepdim=True)
    x_mean = m1 - mu                                             # p·x_t, x_t = V[:, t] − V[ŷ, t] − z' (x_ŷ = 0)
    pb2z = pb2 * z1
    s_xx = pb2 @ (V * V) - 2 * (pb2z @ V) + (pb2z * z1).sum(1, keepdim=True)            # Σ p̄² (V[:, t] − z')²
    s_x = pb2 @ V - pb2z.sum(1, keepdim=True)                                         # Σ p̄² (V[:, t] − z')
    x2 = s_xx - 2 * Vy * s_x + Vy * Vy * sp2                     # Σ_l p̄_l² x_lt²
    x1 = s_x - Vy * sp2                                          # Σ_l p̄_l² x_lt
    col2 = (x2 - 2 * x_mean * x1 + x_mean * x_mean * (sp2 + py * py)).clamp_min(0)      # ‖Σ_p x_t‖²
    a2 = at * at
    S_F = (a2 * col2).sum(1).sqrt()
    s2 = a2.sum(1)
    J_F = (s2 - 2 * (a2 * at).sum(1) + s2 * s2).clamp_min(0).sqrt()
    hn = s2.sqrt()
    py_y = pt[ar, R.y]
    one_minus_py = torch.where(R.y == yh, q1[:, 0], 1 - py_y)
    rn = ((pt * pt).sum(1) - py_y * py_y + one_minus_py * one_minus_py).clamp_min(0).sqrt()   # ‖p − e_y‖
    beta_q = (om[:, 0] * (S_F * hn + rn * J_F)).view(L, G).sum(1)
    c_up = float((om[:, 0] * (q1[:, 0] * (1 + py[:, 0]) - sp2[:, 0]) * s2).sum())          # 1 − ‖p‖² = q̄(1 + p_ŷ) − Σp̄²
    # --- the blocks: Σ_rows ω [main − (α̃⊙m)(α̃⊙m)ᵀ − (α̃⊙κ)α̃ᵀ − α̃(α̃⊙κ)ᵀ + σ²α̃α̃ᵀ + diag(ã) − ãα̃ᵀ − α̃ãᵀ], with
    # main − (α̃⊙m)(α̃⊙m)ᵀ = Σ_l p̄_l (α̃⊙V[l])(α̃⊙V[l])ᵀ − p_ŷ (v nnᵀ + nn vᵀ) + (1 − p_ŷ) p_ŷ v vᵀ − nn nnᵀ,
    # v = α̃ ⊙ V[ŷ], nn = α̃ ⊙ Σ_{l≠ŷ} p_l V[l] (every term of size (1 − p_ŷ)·V²)
    def outer_sum(x: torch.Tensor, y_: torch.Tensor) -> torch.Tensor:
        """Σ_rows∈q x yᵀ for every q: (L, L, L)."""
        return x.view(L, G, L).transpose(1, 2) @ y_.view(L, G, L)

    v, nn = at * Vy, at * nb
    A = outer_sum(om * (sig2 * at - 2 * (at * kap) - 2 * a), at) + outer_sum(om * py * (q1 * v - 2 * nn), v)
    A = 0.5 * (A + A.transpose(1, 2))
    A -= outer_sum(om * nn, nn)
    A += torch.diag_embed((om * a).view(L, G, L).sum(1))
    A += _main_term(R, f_all, V, om * pb / (Z * Z))
    return th.block_bound(A, beta_q, c_up)


def _main_term(R: _Rows, f_all: torch.Tensor, V: torch.Tensor, wl: torch.Tensor) -> torch.Tensor:
    """(f fᵀ) ⊙ Σ_l (V[l] V[l]ᵀ) ⊙ Q_l per query, Q_l = Σ_rows∈q w_l c cᵀ (w = ω p / Z²), with c = b·1 + e:
    Q_l = b² S0_l 11ᵀ + b (S1_l 1ᵀ + 1 S1_lᵀ) + Σ w_l e eᵀ, S0 = Σ w, S1 = Σ w_l e; the last term contracted with
    V[l] V[l]ᵀ row by row over e's nonzero pairs only."""
    L, G = R.L, R.G
    Vt = V.T                                                     # (token, l)
    main = torch.zeros(L * L * L, dtype=V.dtype)
    if R.k:
        right = Vt[R.tok] * R.val[:, :, None]                    # (N, k, L): e_j V[:, j]
        sc = (right * wl[:, None, :]) @ right.transpose(1, 2)    # (N, k, k): Σ_l w_l e_i e_j V_li V_lj
        main.index_add_(0, R.pair_idx, sc.reshape(-1)[R.keep])
    main = main.view(L, L, L)
    if R.b:
        S0 = wl.view(L, G, L).sum(1)                             # (q, l)
        main += (Vt[None] * S0[:, None, :]) @ V                  # Vᵀ diag(S0_q) V
        S1 = R.e.transpose(1, 2) @ wl.view(L, G, L)              # (q, i, l): Σ w_l e_i
        M1 = (S1 * Vt[None]) @ V                                 # Σ_l S1[q,i,l] V_li V_lj
        main += M1 + M1.transpose(1, 2)
    return main * f_all[:, :, None] * f_all[:, None, :]
