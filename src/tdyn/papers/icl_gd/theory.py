"""von Oswald et al. 2023: the closed forms and exact computations tdyn checks the trained models against
(docs/reproductions/icl-gd.md#theory).

* :func:`construction`: the LSA weights whose layer makes one step of gradient descent on the in-context
  least-squares loss L(W) = 1/(2N) Σ_i (W x_i − y_i)², as the authors' ``create_weights`` builds them;
  :func:`lsa` applies layers of given weights (float64) and :func:`gd_steps` runs plain GD, so the two can be
  compared to rounding.
* :func:`one_step`: E[y_q b], E[b²], E[y_q²] in closed form for x ~ U(−a, a)^d, w ~ N(0, s² I), label noise σ,
  with b = (1/N) Σ_i y_i x_iᵀ x_q the one-step prediction at η = 1 from W₀ = 0; hence the optimal learning rate
  η* = E[y_q b]/E[b²] and the population loss of one GD step at any η, exactly.
* :func:`gd_poly` / :func:`optimal_eta`: K steps of GD from W₀ = 0 predict ŷ_K(η) = Σ_{j=1..K} a_j η^j with
  a_j = (−1)^{j+1} C(K, j) x_qᵀ Σ̂^{j−1} ĝ (Σ̂ = XᵀX/N, ĝ = Xᵀy/N), so the Monte Carlo loss is a polynomial
  of degree 2K in η, minimised exactly on a fixed sample; its error is the sample's (the standard error of the
  per-sequence losses, reported).
* GD++ (:func:`gdpp_construction`, :func:`optimal_gdpp`): the authors' curvature-corrected layer (their
  ``create_weights(..., lin_diag=True)`` trained in ``pre_train_gd_hps``): besides the GD step on y, every
  token's x is multiplied by (I − γ Σ̂); (η, γ) shared by the K layers and fitted by Monte Carlo.
* :func:`weight_match`: the trained layer's effective map against the construction's, up to the layer's
  invariances (docs/reproductions/icl-gd.md#weight-match).

Everything is float64 and batched over leading axes.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import torch

from tdyn import stats

from tdyn.papers.icl_gd import data as icl
from tdyn.seeding import generator

F64 = torch.float64


# ---------------------------------------------------------------- the construction (one LSA layer = one GD step)
def construction(d: int, eta: float, N: int, W0: torch.Tensor | None = None, dtype=F64):
    """(W_K, W_Q, W_V, P), each (d+1, d+1), of the LSA layer that makes one GD step of size η from W₀ on
    L(W) = 1/(2N) Σ (W x_i − y_i)²: W_K = W_Q = [[I, 0], [0, 0]], W_V = [[0, 0], [W₀, −1]], P = [[0, 0], [0, η/N]]
    (the authors' ``create_weights``). With the query token (x_q, −W₀ x_q), its y entry becomes −W₁ x_q."""
    D = d + 1
    W_K = torch.zeros(D, D, dtype=dtype)
    W_K[:d, :d] = torch.eye(d, dtype=dtype)
    W_V = torch.zeros(D, D, dtype=dtype)
    W_V[d, d] = -1.0
    if W0 is not None:
        W_V[d, :d] = W0.to(dtype).reshape(d)
    P = torch.zeros(D, D, dtype=dtype)
    P[d, d] = eta / N
    return W_K, W_K.clone(), W_V, P


def gdpp_construction(d: int, eta: float, gamma: float, N: int, dtype=F64):
    """(W_K, W_Q, W_V, P) of one GD++ layer: the GD step of size η on y and x_j ← (I − γ Σ̂) x_j for every token,
    Σ̂ = (1/N) Σ_i x_i x_iᵀ (the authors' ``lin_diag`` construction, whose P carries −γ/N on the x block)."""
    W_K, W_Q, W_V, P = construction(d, eta, N, dtype=dtype)
    W_V[:d, :d] = torch.eye(d, dtype=dtype)
    P[:d, :d] = -(gamma / N) * torch.eye(d, dtype=dtype)
    return W_K, W_Q, W_V, P


def lsa(E: torch.Tensor, layers: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens E (..., N+1, D) after the LSA layers ``layers`` [(W_K, W_Q, W_V, P), …] (the update of
    :mod:`tdyn.papers.icl_gd.model`, keys and values from the context), and the query map R (..., D, D) with
    e_q ← R e_q (:meth:`~tdyn.papers.icl_gd.model.LSA.query_map`)."""
    eye = torch.eye(E.shape[-1], dtype=E.dtype)
    R = eye.expand(*E.shape[:-2], -1, -1)
    for W_K, W_Q, W_V, P in layers:
        ctx = E[..., :-1, :]
        C = ctx.transpose(-1, -2) @ ctx
        M = P @ W_V @ C @ W_K.T @ W_Q
        R = (eye + M) @ R
        scores = (E @ W_Q.T) @ (ctx @ W_K.T).transpose(-1, -2)
        E = E + (scores @ (ctx @ W_V.T)) @ P.T
    return E, R


def gd_steps(E: torch.Tensor, eta: float, steps: int = 1, W0: torch.Tensor | None = None):
    """``steps`` steps of GD of size η from W₀ (default 0) on L(W) = 1/(2N) Σ_i (W x_i − y_i)², per sequence of
    tokens E (..., N+1, d+1): (the query prediction W_K x_q (...), the weights W_K (..., d))."""
    x, y, x_q = icl.split(E)
    N = x.shape[-2]
    W = torch.zeros_like(x_q) if W0 is None else W0.expand_as(x_q).clone()
    for _ in range(steps):
        r = y - (x @ W.unsqueeze(-1)).squeeze(-1)                   # y_i − W x_i
        W = W + (eta / N) * (x.transpose(-1, -2) @ r.unsqueeze(-1)).squeeze(-1)
    return (W * x_q).sum(-1), W


# ---------------------------------------------------------------- one step: closed form
@dataclasses.dataclass(frozen=True)
class OneStep:
    """The one-step moments (b = (1/N) Σ y_i x_iᵀ x_q), η* = E[y_q b]/E[b²], the loss at η* and at η = 0."""

    E_yy: float
    E_yb: float
    E_bb: float

    @property
    def eta_star(self) -> float:
        return self.E_yb / self.E_bb

    def loss(self, eta: float) -> float:
        """½ E[(y_q − η b)²], exactly."""
        return 0.5 * (self.E_yy - 2 * eta * self.E_yb + eta * eta * self.E_bb)

    @property
    def loss_star(self) -> float:
        return 0.5 * (self.E_yy - self.E_yb ** 2 / self.E_bb)

    @property
    def loss_zero(self) -> float:
        """The loss of predicting 0 (W₀ = 0, no step)."""
        return 0.5 * self.E_yy


def uniform_moments(x_max: float) -> tuple[float, float]:
    """E[x²] = a²/3 and E[x⁴] = a⁴/5 for x ~ U(−a, a)."""
    return x_max ** 2 / 3, x_max ** 4 / 5


def one_step(d: int, N: int, x_max: float = 1.0, w_scale: float = 1.0, noise: float = 0.0) -> OneStep:
    """The exact moments of one GD step from W₀ = 0 (docs/reproductions/icl-gd.md#optimal-step):

        E[y_q²]  = s d m₂ + σ²
        E[y_q b] = s d m₂²
        E[b²]    = (1/N) [s m₂ (d m₄ + d(d−1) m₂²) + σ² d m₂²] + ((N−1)/N) s d m₂³

    with m₂ = E[x²], m₄ = E[x⁴], s = w_scale², σ = noise (the i = j terms carry the uniform's fourth moment,
    the i ≠ j terms only second moments)."""
    m2, m4 = uniform_moments(x_max)
    s, v = w_scale ** 2, noise ** 2
    E_yy = s * d * m2 + v
    E_yb = s * d * m2 ** 2
    E_bb = (s * m2 * (d * m4 + d * (d - 1) * m2 ** 2) + v * d * m2 ** 2) / N + (N - 1) / N * s * d * m2 ** 3
    return OneStep(E_yy, E_yb, E_bb)


# ---------------------------------------------------------------- K steps: exact polynomial in η on a sample
def gd_poly(E: torch.Tensor, steps: int) -> torch.Tensor:
    """The coefficients a_1..a_K (..., K) of ŷ_K(η) = Σ_j a_j η^j, K steps of GD from W₀ = 0
    (a_j = (−1)^{j+1} C(K, j) x_qᵀ Σ̂^{j−1} ĝ)."""
    x, y, x_q = icl.split(E)
    N = x.shape[-2]
    S = x.transpose(-1, -2) @ x / N
    v = (x.transpose(-1, -2) @ y.unsqueeze(-1)) / N                  # ĝ
    out = []
    for j in range(1, steps + 1):
        out.append((-1) ** (j + 1) * math.comb(steps, j) * (x_q.unsqueeze(-2) @ v).reshape(x_q.shape[:-1]))
        v = S @ v
    return torch.stack(out, -1)


def mc_sample(n: int, d: int, N: int, seed: int, *, x_max: float = 1.0, w_scale: float = 1.0, noise: float = 0.0,
              chunk: int = 1 << 16):
    """``n`` sequences (float64) from the keyed stream ``icl_gd/mc`` of ``seed``, in chunks of ``chunk``."""
    g = generator(seed, "icl_gd/mc")
    for i in range(0, n, chunk):
        yield icl.sample(min(chunk, n - i), d, N, g, x_max=x_max, w_scale=w_scale, noise=noise, dtype=F64)


@dataclasses.dataclass(frozen=True)
class MCLoss:
    """A Monte Carlo loss: its mean over n sequences and the standard error of that mean."""

    loss: float
    se: float
    n: int


def _loss_poly(a: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ over sequences of ½(Σ_j a_j η^j − y)², as the coefficients c_0..c_2K (ascending) of a polynomial in η,
    and the number of sequences."""
    K = a.shape[-1]
    c = torch.zeros(2 * K + 1, dtype=F64)
    c[0] = 0.5 * (y * y).sum()
    c[1:K + 1] -= (a * y.unsqueeze(-1)).sum(0)
    aa = a.T @ a
    for i in range(K):
        for j in range(K):
            c[i + j + 2] += 0.5 * aa[i, j]
    return c, torch.tensor(float(len(y)))


def _argmin_poly(c: torch.Tensor) -> float:
    """The η > 0 minimising the polynomial with ascending coefficients ``c`` (a real root of its derivative)."""
    deriv = np.polynomial.polynomial.polyder(c.numpy())
    roots = np.polynomial.polynomial.polyroots(deriv)
    cand = [r.real for r in roots if abs(r.imag) < 1e-9 * max(1.0, abs(r)) and r.real > 0]
    if not cand:
        raise ValueError("the K-step GD loss has no minimum at η > 0 on this sample")
    return min(cand, key=lambda r: np.polynomial.polynomial.polyval(r, c.numpy()))


@functools.lru_cache(maxsize=64)
def optimal_eta(steps: int, d: int, N: int, x_max: float = 1.0, w_scale: float = 1.0, noise: float = 0.0,
                n: int = 1 << 17, seed: int = 0) -> tuple[float, MCLoss]:
    """η*_K, the step size minimising the loss of K GD steps from W₀ = 0, and that loss: for K = 1 the closed form
    (:func:`one_step`, n = 0, se = 0); for K > 1 exactly minimised on ``n`` Monte Carlo sequences (the loss a
    polynomial in η on the sample), with the standard error of the loss at η*_K."""
    if steps == 1:
        os = one_step(d, N, x_max, w_scale, noise)
        return os.eta_star, MCLoss(os.loss_star, 0.0, 0)
    c = torch.zeros(2 * steps + 1, dtype=F64)
    for E, y in mc_sample(n, d, N, seed, x_max=x_max, w_scale=w_scale, noise=noise):
        c += _loss_poly(gd_poly(E, steps), y)[0]
    eta = _argmin_poly(c / n)
    return eta, gd_loss_mc(steps, eta, d, N, x_max, w_scale, noise, n, seed)


def gd_loss_mc(steps: int, eta: float, d: int, N: int, x_max: float = 1.0, w_scale: float = 1.0,
               noise: float = 0.0, n: int = 1 << 17, seed: int = 0) -> MCLoss:
    """The loss of K GD steps of size η from W₀ = 0 on ``n`` Monte Carlo sequences, with its standard error."""
    losses = []
    for E, y in mc_sample(n, d, N, seed, x_max=x_max, w_scale=w_scale, noise=noise):
        pred = gd_poly(E, steps) @ torch.tensor([eta ** j for j in range(1, steps + 1)], dtype=F64)
        losses.append(0.5 * (pred - y) ** 2)
    ls = torch.cat(losses)
    return MCLoss(float(ls.mean()), float(stats.se_along(ls, 0)), len(ls))


# ---------------------------------------------------------------- GD++
def gdpp_predict(E: torch.Tensor, eta: float, gamma: float, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K GD++ layers (shared (η, γ)) on tokens E (..., N+1, d+1), by the LSA update itself (float64):
    (ŷ (...), ∂ŷ/∂x_q (..., d)). The reference for :func:`spectral_predict`."""
    d = E.shape[-1] - 1
    N = E.shape[-2] - 1
    layer = gdpp_construction(d, eta, gamma, N)
    out, R = lsa(E.to(F64), [layer] * steps)
    return -out[..., -1, -1], -R[..., -1, :-1]


@dataclasses.dataclass(frozen=True)
class Spectral:
    """Per sequence, Σ̂ = XᵀX/N = V diag(λ) Vᵀ, h = Vᵀ ĝ (ĝ = Xᵀy/N) and q = Vᵀ x_q: what K layers of GD or GD++
    depend on (:func:`spectral_predict`)."""

    lam: torch.Tensor   # (n, d)
    V: torch.Tensor     # (n, d, d)
    h: torch.Tensor     # (n, d)
    q: torch.Tensor     # (n, d)


def spectral(E: torch.Tensor) -> Spectral:
    """The eigendata of every sequence of tokens E (n, N+1, d+1) (float64)."""
    x, y, x_q = icl.split(E.to(F64))
    N = x.shape[-2]
    lam, V = torch.linalg.eigh(x.transpose(-1, -2) @ x / N)
    h = (V.transpose(-1, -2) @ (x.transpose(-1, -2) @ y.unsqueeze(-1) / N)).squeeze(-1)
    q = (V.transpose(-1, -2) @ x_q.unsqueeze(-1)).squeeze(-1)
    return Spectral(lam, V, h, q)


def spectral_predict(sp: Spectral, eta: float, gamma: float, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K GD++ layers (γ = 0: K GD steps from W₀ = 0) in Σ̂'s eigenbasis, O(n d K): (ŷ (n,), z (n, d)) with
    ŷ = Σ_k q_k z_k, so ∂ŷ/∂x_q = V z. Every Σ̂_l of the transformed inputs is a polynomial in Σ̂, so each
    eigen-coordinate k evolves alone: its input scale c (c₀ = 1) and the residual's component u (u₀ = h_k) obey

        ŷ += η q_k c² u,   u ← u (1 − η λ_k c²),   c ← c (1 − γ λ_k c²)

    (the y update and the x update of a layer both read the layer's input; docs/reproductions/icl-gd.md#gd-plus-plus)."""
    c = torch.ones_like(sp.lam)
    u = sp.h.clone()
    z = torch.zeros_like(sp.lam)
    for _ in range(steps):
        c2 = c * c
        z = z + eta * c2 * u
        u = u * (1 - eta * sp.lam * c2)
        c = c * (1 - gamma * sp.lam * c2)
    return (sp.q * z).sum(-1), z


@functools.lru_cache(maxsize=32)
def optimal_gdpp(steps: int, d: int, N: int, x_max: float = 1.0, w_scale: float = 1.0, noise: float = 0.0,
                 n: int = 1 << 17, seed: int = 1) -> tuple[float, float, MCLoss]:
    """(η, γ) of K GD++ layers minimising the Monte Carlo loss on ``n`` sequences (Nelder–Mead from plain GD's
    η*_K and γ = 0, on one fixed sample), and the loss there with its standard error (on that sample: an
    in-sample fit of two numbers, optimistic by O(1/n) relative)."""
    from scipy.optimize import minimize

    parts = [(spectral(E), y) for E, y in mc_sample(n, d, N, seed, x_max=x_max, w_scale=w_scale, noise=noise)]
    eta0 = optimal_eta(steps, d, N, x_max, w_scale, noise)[0]

    def losses(eta, gamma):
        return torch.cat([0.5 * (spectral_predict(sp, eta, gamma, steps)[0] - y) ** 2 for sp, y in parts])

    def loss(p):
        v = float(losses(p[0] * eta0, p[1] * eta0).mean())
        return v if math.isfinite(v) else 1e30

    res = minimize(loss, [1.0, 0.0], method="Nelder-Mead", options={"xatol": 1e-6, "fatol": 1e-12, "maxiter": 1000})
    eta, gamma = float(res.x[0] * eta0), float(res.x[1] * eta0)
    ls = losses(eta, gamma)
    return eta, gamma, MCLoss(float(ls.mean()), float(stats.se_along(ls, 0)), len(ls))


# ---------------------------------------------------------------- weight match
def effective_map(W_K: torch.Tensor, W_Q: torch.Tensor, W_V: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """T (..., D, D, d): the layer's map from (C, x_q) to the query's prediction change, Δŷ = Σ_{a,b,k} T_abk C_ab x_qk
    with C = Σ_i e_i e_iᵀ: T_abk = −(P W_V)_{y,a} (W_Kᵀ W_Q)_{b,k}, symmetrised in (a, b) (C is symmetric, so only
    the symmetric part acts). The weights enter only through P W_V and W_Kᵀ W_Q, so T is unchanged by the layer's
    invariances (W_K → A W_K with W_Q → A⁻ᵀ W_Q; W_V → B W_V with P → P B⁻¹), and T scales with (c P W_V, W_Kᵀ W_Q)
    as c: compared up to scale, it tests the construction's function on the query, not one factor."""
    u = -(P @ W_V)[..., -1, :]                       # (..., D)
    Q = (W_K.transpose(-1, -2) @ W_Q)[..., :, :-1]   # (..., D, d)
    T = u[..., :, None, None] * Q[..., None, :, :]
    return 0.5 * (T + T.transpose(-3, -2))


def construction_map(d: int, dtype=F64) -> torch.Tensor:
    """U with effective_map(construction(d, η, N)) = (η/N) U: U_abk = ½(δ_{a,y} δ_{b,k} + δ_{b,y} δ_{a,k})."""
    D = d + 1
    U = torch.zeros(D, D, d, dtype=dtype)
    for k in range(d):
        U[d, k, k] += 0.5
        U[k, d, k] += 0.5
    return U


def weight_match(W_K, W_Q, W_V, P, N: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, η_eff) of layers (..., D, D): the cosine between the effective map and the construction's
    (1: the same up to scale) and the step size η_eff = N ⟨T, U⟩/⟨U, U⟩ that the layer implements along it."""
    T = effective_map(W_K.to(F64), W_Q.to(F64), W_V.to(F64), P.to(F64))
    U = construction_map(T.shape[-1])
    dot = (T * U).sum((-1, -2, -3))
    cos = dot / (T.flatten(-3).norm(dim=-1) * U.norm()).clamp_min(1e-300)
    return cos, N * dot / (U * U).sum()
