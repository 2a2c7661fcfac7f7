"""The model's speed paths (tested equal to ``model.py``'s equations and gradients in tests/test_birth.py;
docs/reproductions/birth.md#speed; benchmarks/README.md, issue 35).

:func:`masked_loss`, the training loss, is one autograd function (:class:`_Loss`) over :func:`forward`, its
backward written out by hand; :func:`forward` is also the probes' forward pass. What it saves against autograd
through ``torch.nn.functional.scaled_dot_product_attention`` (:func:`logits`, the first speed path), at the
reproductions' d = T = 128: 16.5 products of B·T·d² multiply-adds per member and step instead of about 21 for the
same equations through autograd (24.5 → 17 with W_F), about 25 % of a step's CPU time —

* the inputs x = w_E(z) + p are frozen: their products W_K¹ x and A¹ x are gathered from per-token and
  per-position tables (N + T rows), and layer 1's backward is only W_K¹'s gradient (no query, key or value
  gradients, which the attention kernel computes for both layers);
* each layer's value and output maps are one product A = W_O W_V, and layer 2's is folded into the read-out:
  ξ = W_U (I + W_F) (h¹ + A² a²) = h¹ Uᵀ + a² (U A²)ᵀ with U = W_U (I + W_F), N = 65 columns instead of d;
* the causal softmax is explicit (scores, −∞ above the diagonal, softmax) and its backward one pass.

Its results differ from :func:`logits`'s in float32 rounding only (a different order of the same sums).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tdyn.papers.birth.model import MemoryTransformer, _bmm


def logits(model: MemoryTransformer, z: torch.Tensor) -> torch.Tensor:
    """ξ (S, B, T, N), equal to ``model(z)``."""
    x = model.embed(z)
    a1 = F.scaled_dot_product_attention(x, _bmm(x, model.W_K1), x, is_causal=True)      # Σ_s β¹_ts x_s
    h1 = x + _bmm(a1, model.W_O1 @ model.W_V1)
    a2 = F.scaled_dot_product_attention(h1, _bmm(h1, model.W_K2), h1, is_causal=True)   # Σ_s β²_ts h¹_s
    h2 = h1 + _bmm(a2, model.W_O2 @ model.W_V2)
    if model.cfg.final_ffn:
        h2 = h2 + _bmm(h2, model.W_F)
    return _bmm(h2, model.W_U)


def masked_ce(xi: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per member (S,): the mean cross-entropy of logits ξ (S, B, T, N) against y (S, B, T) over the positions of
    ``mask`` (S, B, T) (NaN for a member with none)."""
    ce = F.cross_entropy(xi.flatten(0, -2), y.flatten(), reduction="none").view(y.shape)
    m = mask.to(ce.dtype)
    return (ce * m).sum((1, 2)) / m.sum((1, 2))


# ---------------------------------------------------------------- the fused step
def _rows(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Rows W x of X (S, n, d) by the members' W (S, d_out, d)."""
    return X @ W.transpose(-1, -2)


def _tokens(model: MemoryTransformer, z: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """W x_t = W w_E(z_t) + W p_t (S, B, T, d_out) from the tables W w_E(k) (N of them) and W p_t (T): a gather
    instead of a product over every position (the inputs x are frozen)."""
    S, B, T = z.shape
    idx = torch.arange(S, device=z.device).view(S, 1, 1)
    return _rows(model.w_E, W)[idx, z] + _rows(model.p[:, :T], W)[:, None]


def _attend(Q: torch.Tensor, K: torch.Tensor, scale: float, causal: torch.Tensor) -> torch.Tensor:
    """β (S·B, T, T) = causal softmax_s(scale · q_tᵀ k_s) of rows Q, K (S, B, T, d)."""
    S, B, T, d = Q.shape
    sc = torch.bmm(Q.reshape(S * B, T, d), K.reshape(S * B, T, d).transpose(1, 2)).mul_(scale)
    return sc.masked_fill_(causal, float("-inf")).softmax(-1)


def _softmax_back(beta: torch.Tensor, dbeta: torch.Tensor) -> torch.Tensor:
    """The scores' gradient β ⊙ (dβ − Σ_s β_s dβ_s) (masked entries: β = 0, so 0), by softmax's own backward
    kernel (one pass instead of four)."""
    return torch.ops.aten._softmax_backward_data(dbeta, beta, -1, beta.dtype)


def forward(model: MemoryTransformer, z: torch.Tensor) -> dict[str, torch.Tensor]:
    """The fused forward pass of tokens z (S, B, T) (or (B, T), shared), without autograd's graph: the logits ``xi``
    (S, B, T, N), equal to ``model(z)``, and what :class:`_Loss`'s backward and the probes read (β¹ and β² as
    (S·B, T, T)). Written with A¹ = W_O¹ W_V¹, A² = W_O² W_V², the read-out U = W_U (I + W_F) (W_U without W_F),
    x = w_E(z) + p, and per sequence (rows are positions):

        h¹ = x + β¹ (x A¹ᵀ),          β¹ = causal softmax of the scores x_tᵀ W_K¹ x_s / √d
        ξ  = h¹ Uᵀ + a² (U A²)ᵀ,      a² = β² h¹,   β² = causal softmax of h¹_tᵀ W_K² h¹_s / √d

    which is ``model.py``'s h² = h¹ + A² a² (then + W_F h²) read out by W_U, with x A¹ᵀ and x W_K¹ᵀ gathered from
    per-token and per-position tables."""
    if z.dim() == 2:
        z = z.expand(model.S, *z.shape)
    with torch.no_grad():
        x = model.embed(z)
        S, B, T, d = x.shape
        scale = 1.0 / math.sqrt(d)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        A1, A2 = model.W_O1 @ model.W_V1, model.W_O2 @ model.W_V2
        U = model.W_U + model.W_U @ model.W_F if model.cfg.final_ffn else model.W_U
        UA2 = U @ A2
        v1 = _tokens(model, z, A1)                                              # A¹ x_s
        beta1 = _attend(x, _tokens(model, z, model.W_K1), scale, causal)        # layer 1
        h1 = x + (beta1 @ v1.reshape(S * B, T, d)).view(S, B, T, d)
        k2 = _rows(h1.reshape(S, B * T, d), model.W_K2).view(S, B, T, d)        # layer 2
        beta2 = _attend(h1, k2, scale, causal)
        a2 = (beta2 @ h1.reshape(S * B, T, d)).view(S, B, T, d)
        xi = torch.baddbmm(_rows(h1.reshape(S, B * T, d), U), a2.reshape(S, B * T, d),
                           UA2.transpose(1, 2)).view(S, B, T, -1)               # ξ = W_U h² (h² after W_F)
    return dict(x=x, v1=v1, beta1=beta1, h1=h1, k2=k2, beta2=beta2, a2=a2, xi=xi, U=U, A2=A2, UA2=UA2)


class _Loss(torch.autograd.Function):
    """Per member (S,): the masked mean cross-entropy of ``model(z)`` (see :func:`masked_loss`) through
    :func:`forward`, with the gradients of the trained W_K¹, W_K², W_O² (and W_F) by hand (the parameters are
    passed in so that autograd sees them; :func:`forward` reads them from the model)."""

    @staticmethod
    def forward(ctx, model, z, y, mask, W_K1, W_K2, W_O2, W_F):
        f = forward(model, z)
        with torch.no_grad():
            ce = F.cross_entropy(f["xi"].flatten(0, -2), y.flatten(), reduction="none").view(y.shape)
            m = mask.to(ce.dtype)
            count = m.sum((1, 2))
            loss = (ce * m).sum((1, 2)) / count
        ctx.model, ctx.scale = model, 1.0 / math.sqrt(f["x"].shape[-1])
        ctx.save_for_backward(*(f[k] for k in ("x", "v1", "beta1", "h1", "k2", "beta2", "a2", "xi")), y,
                              m / count.view(-1, 1, 1), *(f[k] for k in ("U", "A2", "UA2")))
        return loss

    @staticmethod
    def backward(ctx, g):
        model, scale = ctx.model, ctx.scale
        x, v1, beta1, h1, k2, beta2, a2, xi, y, w, U, A2, UA2 = ctx.saved_tensors
        S, B, T, d = x.shape
        flat = lambda t: t.reshape(S, B * T, t.shape[-1])                      # noqa: E731
        seq = lambda t: t.reshape(S * B, T, t.shape[-1])                       # noqa: E731
        # dξ = g w (softmax(ξ) − onehot(y)), w = mask / count
        dxi = xi.softmax(-1)
        dxi.scatter_add_(-1, y.unsqueeze(-1), torch.full_like(dxi[..., :1], -1.0))
        dxi = flat(dxi.mul_((g.view(-1, 1, 1) * w).unsqueeze(-1)))
        # ξ = h¹ Uᵀ + a² (U A²)ᵀ
        dh1 = (dxi @ U).view(S, B, T, d)
        da2 = seq(dxi @ UA2)
        Ga = dxi.transpose(1, 2) @ flat(a2)                                    # Σ dξ a²ᵀ (S, N, d)
        dW_O2 = U.transpose(1, 2) @ Ga @ model.W_V2.transpose(1, 2)            # dA² W_V²ᵀ, dA² = Uᵀ Σ dξ a²ᵀ
        dW_F = None
        if model.cfg.final_ffn:                                                # U = W_U (I + W_F)
            dU = dxi.transpose(1, 2) @ flat(h1) + Ga @ A2.transpose(1, 2)
            dW_F = model.W_U.transpose(1, 2) @ dU
        # a² = β² h¹, β² = causal softmax of scale · h¹_tᵀ W_K² h¹_s
        h1s = seq(h1)
        dbeta2 = da2 @ h1s.transpose(1, 2)
        dh1 += (beta2.transpose(1, 2) @ da2).view(S, B, T, d)                 # values h¹_s
        ds2 = _softmax_back(beta2, dbeta2).mul_(scale)
        dh1 += (ds2 @ seq(k2)).view(S, B, T, d)                                # queries h¹_t
        dk2 = flat(ds2.transpose(1, 2) @ h1s)                                  # keys W_K² h¹_s
        dW_K2 = dk2.transpose(1, 2) @ flat(h1)
        dh1 += (dk2 @ model.W_K2).view(S, B, T, d)
        # h¹ = x + β¹ (A¹ x), β¹ = causal softmax of scale · x_tᵀ W_K¹ x_s: W_K¹'s gradient only (x is frozen)
        xs = seq(x)
        dbeta1 = seq(dh1) @ seq(v1).transpose(1, 2)
        ds1 = _softmax_back(beta1, dbeta1).mul_(scale)
        dW_K1 = flat(x).transpose(1, 2) @ flat(ds1 @ xs)
        ctx.model = None
        return None, None, None, None, dW_K1, dW_K2, dW_O2, dW_F


def masked_loss(model: MemoryTransformer, z: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per member (S,): ``masked_ce(model(z), y, mask)``, fused (see the module docstring); z, y, mask (S, B, T),
    or (B, T) shared by the members."""
    z, y, mask = (t.expand(model.S, *t.shape) if t.dim() == 2 else t for t in (z, y, mask))
    W_F = model.W_F if model.cfg.final_ffn else None
    return _Loss.apply(model, z, y, mask, model.W_K1, model.W_K2, model.W_O2, W_F)
