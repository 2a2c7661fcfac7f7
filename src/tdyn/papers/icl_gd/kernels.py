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

import ctypes
from pathlib import Path

import torch
from torch.autograd.function import once_differentiable

from tdyn import native
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


# ---------------------------------------------------------------- K ≥ 2 layers: the Gram form, hand-written backward
#
# Every token, context and query, moves by one linear map per layer: e_j ← (I + A C G) e_j with C = Σ_i e_i e_iᵀ
# over the context tokens entering the layer (model.py's ``query_map``). So the model needs per sequence only C
# (D × D, symmetric) and the query, and the last two layers need C only applied to a few vectors:
#   * the last layer reads ŷ = −(q_y + aᵀ C_K G_K q) with a = A_K's row y: one vector c = C_K a;
#   * the layer before it, M = I + A C G, gives q_K = M q and c = C_K a = M C Mᵀ a: four products of C with a
#     vector (C α for α = Aᵀ a shared by the sequences, C Mᵀ a, C G (C Mᵀ a), C G q) and shared-weight products.
# Layers before those two (K ≥ 3) still move every token, written with C: E ← E + ((E Gᵀ) C) Aᵀ, rows (one
# per-sequence product besides C = XᵀX). Per layer before the last two: 2 per-sequence D × D products forward,
# 3 backward (the first layer 1: its C is the data's); the two last: C, four matrix-vector products forward and
# four backward, and, when C is not the data's, Γ = ∂C + ∂Cᵀ and ∂X = X Γ. K = 3 runs 6 per-sequence matrix
# products a step where the token form ran 12 (4 forward, 8 backward), K = 2 one where it ran 6. Shared weights
# act on rows, (n, D) @ (D, D) per member, one matmul over all of a member's sequences.
# Tested against ``model.py`` in float64 (tests/test_icl_gd_deep.py); docs/reproductions/icl-gd.md#speed.


def _cv(V: torch.Tensor, Cb: torch.Tensor) -> torch.Tensor:
    """Rows V (S, B, m, D) times each sequence's symmetric C, given batch-last as Cb (S, D, D, B): (S, B, m, D).
    D broadcast multiply-adds over contiguous batch rows. As a ``bmm`` of S·B (m × D) @ (D × D) products (m ≤ 2)
    this goes to torch's scalar loop for products under 400 multiply-adds, which made a K = 3 untied step 1.2–1.5×
    slower (benchmarks/README.md, "Issue 35, session 2026-11-28 (nineteenth, helper icl6)")."""
    S, B, m, D = V.shape
    Vb = V.permute(0, 3, 2, 1).contiguous()                      # (S, D, m, B)
    out = Vb[:, 0].unsqueeze(1) * Cb[:, 0].unsqueeze(2)          # (S, D, m, B): Σ_i v_i C_ij
    for i in range(1, D):
        out.addcmul_(Vb[:, i].unsqueeze(1), Cb[:, i].unsqueeze(2))
    return out.permute(0, 3, 2, 1).contiguous()


def _fwd(E: torch.Tensor, A: torch.Tensor, G: torch.Tensor):
    """ŷ (S, B) of K layers on tokens E (S, B, N+1, D) (contiguous), folded weights A, G (S, K, D, D), and what
    :func:`_bwd` needs."""
    S, B, T, D = E.shape
    N, K, SB = T - 1, A.shape[1], S * B
    full = []
    for layer in range(K - 2):                                   # layers whose every token the next one reads
        X = E.view(SB, T, D)[:, :N]
        C = torch.bmm(X.transpose(1, 2), X)                      # Σ_i e_i e_iᵀ                      (S·B, D, D)
        R = torch.bmm(E.view(S, B * T, D), G[:, layer].transpose(1, 2))      # rows (G e_j)ᵀ      (S, B·T, D)
        Q = torch.bmm(R.view(SB, T, D), C)                       # rows (C G e_j)ᵀ                    (S·B, T, D)
        full.append((E, C, R, Q))
        E = torch.baddbmm(E.view(S, B * T, D), Q.view(S, B * T, D), A[:, layer].transpose(1, 2)).view(S, B, T, D)
    X, q = E.view(SB, T, D)[:, :N], E[:, :, N]                   # context (S·B, N, D), query (S, B, D)
    C = torch.bmm(X.transpose(1, 2), X)
    a, GK = A[:, K - 1, -1], G[:, K - 1]                         # the last layer: A's row y, G
    if K == 1:
        c, qK, mid = torch.bmm(C.view(S, B * D, D), a.unsqueeze(-1)).view(S, B, D), q, None       # C a
    else:
        Al, Gl = A[:, K - 2], G[:, K - 2]                        # the layer before the last: M = I + A C G
        Cb = C.view(S, B, D, D).permute(0, 2, 3, 1).contiguous()  # C batch-last for _cv     (S, D, D, B)
        alpha = torch.bmm(a.unsqueeze(1), Al)                    # (Aᵀ a)ᵀ                            (S, 1, D)
        v1 = torch.bmm(C.view(S, B * D, D), alpha.transpose(1, 2)).view(S, B, D)     # C Aᵀ a
        t1 = torch.baddbmm(a.unsqueeze(1), v1, Gl)               # Mᵀ a = a + Gᵀ C Aᵀ a               (S, B, D)
        v2 = _cv(t1.unsqueeze(2), Cb).view(S, B, D)              # C Mᵀ a
        vq = torch.stack((v2, q), 2)                             # (S, B, 2, D)
        g = torch.bmm(vq.view(S, 2 * B, D), Gl.transpose(1, 2))  # G C Mᵀ a, G q
        v34 = _cv(g.view(S, B, 2, D), Cb)                        # C G C Mᵀ a, C G q                  (S, B, 2, D)
        cq = torch.baddbmm(vq.view(S, 2 * B, D), v34.view(S, 2 * B, D), Al.transpose(1, 2)).view(S, B, 2, D)
        c, qK = cq[:, :, 0], cq[:, :, 1]                         # C_K a = M C Mᵀ a, q_K = M q
        mid = (Cb, alpha, v1, t1, vq, g, v34)
    u = torch.bmm(qK, GK.transpose(1, 2))                        # G_K q_K                            (S, B, D)
    y = -(qK[..., -1] + (c * u).sum(-1))
    return y, (full, E.view(SB, T, D), C, c, qK, u, mid)


def _bwd(saved, dy: torch.Tensor, A: torch.Tensor, G: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """∂/∂A and ∂/∂G (S, K, D, D) of Σ dy·ŷ, from :func:`_fwd`'s ``saved``."""
    S, B, T, D = shape
    N, K, SB = T - 1, A.shape[1], S * B
    full, EL, C, c, qK, u, mid = saved
    dA, dG = torch.zeros_like(A), torch.zeros_like(G)
    ng = -dy.unsqueeze(-1)                                       # (S, B, 1)
    dq = torch.bmm(c, G[:, K - 1]) * ng                          # ∂q_K = −dy (e_y + G_Kᵀ c)
    dq[..., -1] += ng[..., 0]
    dc = ng * u                                                  # ∂c = −dy G_K q_K
    dG[:, K - 1] = torch.bmm((ng * c).transpose(1, 2), qK)
    if K == 1:
        dA[:, 0, -1] = torch.bmm(dc.view(S, 1, B * D), C.view(S, B * D, D)).view(S, D)           # Σ_b C ∂c
        return dA, dG
    Cb, alpha, v1, t1, vq, g, v34 = mid
    L, a = K - 2, A[:, K - 1, -1]
    Al, Gl = A[:, L], G[:, L]
    dcq = torch.stack((dc, dq), 2).view(S, 2 * B, D)
    dA[:, L] = torch.bmm(dcq.transpose(1, 2), v34.view(S, 2 * B, D))
    dv34 = torch.bmm(dcq, Al)                                    # Aᵀ ∂                               (S, 2B, D)
    dg = _cv(dv34.view(S, B, 2, D), Cb).view(S, 2 * B, D)        # C Aᵀ ∂
    dG[:, L] = torch.bmm(dg.transpose(1, 2), vq.view(S, 2 * B, D))
    dvq = torch.baddbmm(dcq, dg, Gl).view(S, B, 2, D)            # ∂(C Mᵀ a), ∂q
    dv2, dqL = dvq[:, :, 0], dvq[:, :, 1]
    dt1 = _cv(dv2.unsqueeze(2), Cb).view(S, B, D)                # ∂(Mᵀ a)
    dG[:, L] += torch.bmm(v1.transpose(1, 2), dt1)
    dv1 = torch.bmm(dt1, Gl.transpose(1, 2))                     # ∂(C Aᵀ a)
    dalpha = torch.bmm(dv1.reshape(S, 1, B * D), C.view(S, B * D, D))                         # Σ_b C ∂v1
    dA[:, L] += a.unsqueeze(-1) * dalpha
    dA[:, K - 1, -1] += dt1.sum(1) + torch.bmm(dalpha, Al.transpose(1, 2)).squeeze(1)
    if L == 0:                                                   # C is the data's: done
        return dA, dG
    # C = XᵀX entered four products C x; ∂X = X Γ, Γ = Σ (∂v xᵀ + x ∂vᵀ) over them: rows stacked, Γ = Z1ᵀ Z2
    gv, dvv, al = g.view(S, B, 2, D), dv34.view(S, B, 2, D), alpha.unsqueeze(1).expand(S, B, 1, D)
    Z1 = torch.cat((dv1.unsqueeze(2), t1.unsqueeze(2), gv, al, dv2.unsqueeze(2), dvv), 2).view(SB, 8, D)
    Z2 = torch.cat((al, dv2.unsqueeze(2), dvv, dv1.unsqueeze(2), t1.unsqueeze(2), gv), 2).view(SB, 8, D)
    dE = torch.bmm(EL, torch.bmm(Z1.transpose(1, 2), Z2)).view(S, B, T, D)   # rows e Γ: the context's ∂
    dE[:, :, N] = dqL                                            # and the query's
    for layer in range(K - 3, -1, -1):                           # the layers that moved every token
        E, C, R, Q = full[layer]
        dEr = dE.view(S, B * T, D)
        dA[:, layer] = torch.bmm(dEr.transpose(1, 2), Q.view(S, B * T, D))
        dQ = torch.bmm(dEr, A[:, layer])                         # ∂(C G e_j)               (S, B·T, D)
        dR = torch.bmm(dQ.view(SB, T, D), C)                     # ∂(G e_j)                 (S·B, T, D)
        dG[:, layer] = torch.bmm(dR.view(S, B * T, D).transpose(1, 2), E.view(S, B * T, D))
        if layer == 0:
            break
        dC = torch.bmm(R.view(SB, T, D).transpose(1, 2), dQ.view(SB, T, D))
        dE = torch.baddbmm(dEr, dR.view(S, B * T, D), G[:, layer]).view(S, B, T, D)
        dE.view(SB, T, D)[:, :N] += torch.bmm(E.view(SB, T, D)[:, :N], dC + dC.transpose(1, 2))
    return dA, dG


class _Deep(torch.autograd.Function):
    """ŷ (S, B) of K layers from the tokens E (S, B, N+1, D) (contiguous) and the folded weights A = P W_V,
    G = W_Kᵀ W_Q, each (S, K, D, D), in the Gram form above. Gradients for A and G only (the tokens are data).
    Tokens and vectors are rows: a weight acts as V Wᵀ."""

    @staticmethod
    def forward(ctx, E, A, G):
        y, ctx.saved = _fwd(E, A, G)
        ctx.save_for_backward(A, G)
        ctx.shape = E.shape
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        A, G = ctx.saved_tensors
        dA, dG = _bwd(ctx.saved, dy, A, G, ctx.shape)
        return None, dA, dG


def predict_deep(model: LSA, E: torch.Tensor) -> torch.Tensor:
    """ŷ (S, B) of ``model`` (any K; meant for K ≥ 2) on tokens E (S, B, N+1, D) (or (B, N+1, D) shared), equal to
    ``model.predict(E)`` to rounding, with the hand-written gradient of :class:`_Deep` for the weights."""
    S = model.W_K.shape[0]
    if E.dim() == 3:
        E = E.expand(S, *E.shape)
    A, G = _folded(model)
    return _Deep.apply(E.contiguous(), A, G)


# ---------------------------------------------------------------- the loss in C (lsa.c), where a compiler is at hand
#
# The same Gram-form layers, every product dense, the batch in the vector lanes of a chunk that stays in L1, the
# backward in the same pass (tdyn.native; docs/reproductions/icl-gd.md#speed). Tested against model.py in float64
# and against the torch path above in float32 (tests/test_icl_gd_native.py).

LSA_C = Path(__file__).with_name("lsa.c")
#: the sizes lsa.c is built for (its loops are unrolled over them at compile time)
C_MAX = {"layers": 8, "D": 16, "T": 33}


def lsa_library(T: int, D: int, K: int, dtype: torch.dtype):
    """lsa.c built for these sizes (its loops unrolled by the compiler), or None: no compiler (``tdyn.native``), a
    dtype other than float32/64, or sizes beyond :data:`C_MAX`."""
    if dtype not in (torch.float32, torch.float64) or K > C_MAX["layers"] or D > C_MAX["D"] or T > C_MAX["T"]:
        return None
    lib = native.library(LSA_C, {"T": T, "D": D, "K": K, "REAL": "float" if dtype == torch.float32 else "double"})
    if lib is not None and lib.lsa_loss.argtypes is None:            # once per build loaded
        p, n = ctypes.c_void_p, ctypes.c_long
        lib.lsa_loss.argtypes = [p, p, n, n, n, p, p, p, p, p]
        lib.lsa_forward.argtypes = [p, n, n, p, p, p]
        lib.lsa_loss.restype = lib.lsa_forward.restype = ctypes.c_int
    return lib


def _applies(model: LSA, E: torch.Tensor) -> bool:
    """Whether lsa.c computes this: on the CPU, tokens in the weights' dtype, and no autocast (under the trainer's
    ``autocast: bfloat16`` the folded weights would be bfloat16: the torch path computes that)."""
    return (E.device.type == "cpu" and E.dtype == model.W_K.dtype and model.W_K.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu"))


def _batch_last(x: torch.Tensor, lanes: int) -> torch.Tensor:
    """x (S, B, ...) as (S, ..., B') contiguous, B' = B rounded up to ``lanes``, the padding zero: x's own memory
    where it is already laid out so (the task's batches: ``ICLTask.sample_streams``), else a copy."""
    x = x.detach()
    B = x.shape[1]
    last = x.movedim(1, -1)
    if last.is_contiguous() and B % lanes == 0:
        return last
    out = x.new_zeros(x.shape[0], *x.shape[2:], -(-B // lanes) * lanes)
    out[..., :B] = last
    return out


class _LossC(torch.autograd.Function):
    """½ mean_b (ŷ_b − y_b)² per member (S,) from lsa.c's ``lsa_loss``, which returns the gradient for A and G
    with the loss (computed in the forward, scaled by the incoming gradient in the backward). With more than one
    torch thread the members run in groups on threads (``native.over_members``): the same bits."""

    @staticmethod
    def forward(ctx, E, y, A, G, lib, B):
        if not (E.dtype == y.dtype == A.dtype == G.dtype):    # the kernel reads them all as one C type
            raise TypeError(f"lsa.c: tokens, targets and weights must share a dtype ({E.dtype}, {y.dtype}, "
                            f"{A.dtype}, {G.dtype})")
        S, Bp = E.shape[0], E.shape[-1]
        loss = E.new_empty(S)
        dA, dG = torch.empty_like(A), torch.empty_like(G)
        native.over_members(lambda s, n: native.check(lib.lsa_loss(
            native.ptr(E, s), native.ptr(y, s), n, Bp, B, native.ptr(A, s), native.ptr(G, s), native.ptr(loss, s),
            native.ptr(dA, s), native.ptr(dG, s)), "lsa_loss"), S, torch.get_num_threads())
        ctx.save_for_backward(dA, dG)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        dA, dG = ctx.saved_tensors
        g = g.view(-1, 1, 1, 1)
        return None, None, g * dA, g * dG, None, None


def _folded(model: LSA) -> tuple[torch.Tensor, torch.Tensor]:
    """A = P W_V and G = W_Kᵀ W_Q, (S, K, D, D): a recurrent model's one set repeated over its K layers."""
    K = model.cfg.layers
    A = model.P @ model.W_V                                          # (S, weight sets, D, D)
    G = model.W_K.transpose(-1, -2) @ model.W_Q
    if model.cfg.tied:
        A, G = A.expand(-1, K, -1, -1), G.expand(-1, K, -1, -1)
    return A, G


def _c_setup(model: LSA, E: torch.Tensor):
    """(tokens (S, B, T, D), lsa.c built for them) where lsa.c applies (:func:`_applies`, :func:`lsa_library`), else
    None."""
    if E.dim() == 3:
        E = E.expand(model.W_K.shape[0], *E.shape)
    if not _applies(model, E):
        return None
    lib = lsa_library(E.shape[2], E.shape[3], model.cfg.layers, E.dtype)
    return None if lib is None else (E, lib)


def loss_c(model: LSA, E: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """The task's loss ½ mean_b (ŷ − y_q)² per member (S,), by lsa.c, equal to ``model.seq_loss(E, y).mean(-1)`` to
    rounding (its own fixed summation order); None where the C kernel does not apply (no compiler, not on the CPU,
    sizes beyond :data:`C_MAX`): the caller takes the torch path."""
    setup = _c_setup(model, E)
    if setup is None:
        return None
    E, lib = setup
    S, B = E.shape[:2]
    lanes = 64 // E.element_size()
    y = y.to(E.dtype).expand(S, B)
    A, G = _folded(model)
    Eb = _batch_last(E, lanes)                                       # (S, T, D, B')
    yb = _batch_last(y.unsqueeze(-1), lanes).view(S, -1)             # (S, B')
    return _LossC.apply(Eb, yb, A.contiguous(), G.contiguous(), lib, B)


def predict_c(model: LSA, E: torch.Tensor) -> torch.Tensor | None:
    """ŷ (S, B) by lsa.c's forward (no gradient), or None where it does not apply (see :func:`loss_c`)."""
    setup = _c_setup(model, E)
    if setup is None:
        return None
    E, lib = setup
    S, B = E.shape[:2]
    with torch.no_grad():
        A, G = (w.contiguous() for w in _folded(model))             # held here while the kernel reads them
        Eb = _batch_last(E, 64 // E.element_size())
        out = Eb.new_empty(S, Eb.shape[-1])
        native.over_members(lambda s, n: native.check(lib.lsa_forward(
            native.ptr(Eb, s), n, Eb.shape[-1], native.ptr(A, s), native.ptr(G, s), native.ptr(out, s)),
            "lsa_forward"), S, torch.get_num_threads())
    return out[:, :B]
