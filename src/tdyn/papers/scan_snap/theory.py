"""Scan and Snap's closed forms (Tian et al. 2023 §4–6, Lemmas 5–9, Thm 3–4; docs/reproductions/scan-snap.md#theory).

Time ``t`` counts training samples (batch-1 steps); class n has been seen ``s = t/K`` times
(uniform classes). ``h`` is the decoder's per-class progress, ``γ`` the speed-control coefficient,
``Γ = η_Z∫γ`` and ``B_n = η_Z∫ξ_n`` the attention's integrated drive in the one-common-token
setting of docs/reproductions/scan-snap.md#snap-phase-transition (normalisers constant, C0 := ρ₀⁴/K). All functions
are vectorised over ``t`` (numpy arrays or scalars, float64).

Convention (docs/reproductions/scan-snap.md#snap-phase-transition step 3): ``B_n(t) = ¼ ln((C0 + 4Γ)/C0)`` so that
B_n(0) = 0; the paper's Eqn 124 / Eqn 14 write ``¼ ln(C0 + 4Γ)``, i.e. ours minus the constant ¼ ln C0. The
asymptotic forms below use the same convention (the paper's value is ``... + 0.25*np.log(C0)``).
"""

from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------- decoder (Y): h*, h, γ


def h_star(s_max: int, M: int, eta_y: float) -> np.ndarray:
    """Lemma 5: h*(s) = h*(s−1) + η_Y/((M−1) + exp(M h*(s−1))), h*(0) = 0; returns s = 0..s_max."""
    h = np.zeros(s_max + 1)
    for s in range(1, s_max + 1):
        h[s] = h[s - 1] + eta_y / ((M - 1) + np.exp(M * h[s - 1]))
    return h


def h_continuous(s, M: int, eta_y: float, iters: int = 200) -> np.ndarray:
    """Lemma 6: the root h of exp(Mh) + (M−1)Mh = Mη_Y s + 1 (s = times class n was seen).

    Vectorised bisection on u = Mh ∈ [0, min(ln A, (A−1)/(M−1))] with A = Mη_Y s + 1 (the left
    side is increasing in u, and each of its two terms alone bounds u from above).
    """
    s = np.asarray(s, dtype=np.float64)
    A = M * eta_y * s + 1.0
    lo = np.zeros_like(A)
    hi = np.minimum(np.log(A), (A - 1.0) / (M - 1))
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        above = np.exp(mid) + (M - 1) * mid > A
        hi = np.where(above, mid, hi)
        lo = np.where(above, lo, mid)
    return 0.5 * (lo + hi) / M


def p_correct(h, M: int) -> np.ndarray:
    """Lemma 5: α_nn = e^{Mh}/((M−1) + e^{Mh}), the decoder's probability of the right next token."""
    u = np.asarray(h, dtype=np.float64) * M
    return 1.0 / (1.0 + (M - 1) * np.exp(-u))


def gamma(t, K: int, M: int, eta_y: float) -> np.ndarray:
    """Thm 1: γ(t) = (M−1)² h(t/K)/((M−1) + exp(M h(t/K)))."""
    h = h_continuous(np.asarray(t, dtype=np.float64) / K, M, eta_y)
    return (M - 1) ** 2 * h / ((M - 1) + np.exp(M * h))


def Gamma(t, K: int, M: int, eta_y: float, eta_z: float) -> np.ndarray:
    """docs/reproductions/scan-snap.md#snap-phase-transition: Γ(t) = η_Z∫_0^t γ = η_Z K (M−1)² h(t/K)²/(2η_Y) (from
    ḣ = η_Y/(e^{Mh} + M − 1))."""
    h = h_continuous(np.asarray(t, dtype=np.float64) / K, M, eta_y)
    return eta_z * K * (M - 1) ** 2 * h ** 2 / (2 * eta_y)


# ---------------------------------------------------------------- attention (Z): z, B_n, χ


def common_logit(t, K: int, M: int, eta_y: float, eta_z: float, C0: float) -> np.ndarray:
    """docs/reproductions/scan-snap.md#snap-phase-transition: the solution of ż = −C0⁻¹η_Z γ e^{4z}, z(0) = 0,
    namely e^{−4z} = 1 + 4Γ/C0."""
    return -0.25 * np.log1p(4 * Gamma(t, K, M, eta_y, eta_z) / C0)


def B_from_Gamma(G, C0: float) -> np.ndarray:
    """B_n = η_Z∫ξ_n with ξ_n = γ/(C0 + 4Γ): ¼ ln(1 + 4Γ/C0)."""
    return 0.25 * np.log1p(4 * np.asarray(G, dtype=np.float64) / C0)


def B_n(t, K: int, M: int, eta_y: float, eta_z: float, C0: float) -> np.ndarray:
    """Exact B_n(t) = ¼ ln(1 + 4Γ(t)/C0) (docs/reproductions/scan-snap.md#snap-phase-transition)."""
    return B_from_Gamma(Gamma(t, K, M, eta_y, eta_z), C0)


def B_n_scan(t, K: int, M: int, eta_y: float, eta_z: float, C0: float) -> np.ndarray:
    """Thm 4 scan phase (t < t'₀), Eqn 14: 4Γ ≈ 2(M−1)²/(KM²)·η_Yη_Z t² (h ≈ η_Y s/M)."""
    t = np.asarray(t, dtype=np.float64)
    return B_from_Gamma((M - 1) ** 2 / (2 * K * M ** 2) * eta_y * eta_z * t ** 2, C0)


def B_n_snap(t, K: int, M: int, eta_y: float, eta_z: float, C0: float) -> np.ndarray:
    """Thm 4 snap phase (t ≥ t₀), Eqn 14: 4Γ ≈ 2K(M−1)²/M²·(η_Z/η_Y)·ln²(Mη_Y t/K) (e^{Mh} ≈ Mη_Y s)."""
    t = np.asarray(t, dtype=np.float64)
    L = np.log(np.maximum(M * eta_y * t / K, 1.0))
    return B_from_Gamma(K * (M - 1) ** 2 / (2 * M ** 2) * (eta_z / eta_y) * L ** 2, C0)


def B_n_large_t(t, K: int, M: int, eta_y: float, eta_z: float, C0: float) -> np.ndarray:
    """Eqn 132–133: B_n ≈ ½ ln ln(Mη_Y t/K) + ¼ ln(2K(M−1)²M⁻²ν⁻¹) − ¼ ln C0 (our B_n(0)=0 convention)."""
    t = np.asarray(t, dtype=np.float64)
    nu = eta_y / eta_z
    return 0.5 * np.log(np.log(M * eta_y * t / K)) + 0.25 * np.log(2 * K * (M - 1) ** 2 / (M ** 2 * nu)) \
        - 0.25 * np.log(C0)


def chi_bounds(B, f0: float) -> tuple[np.ndarray, np.ndarray]:
    """Thm 3: e^{2 f_{nl₀}(0)² B_n} ≤ χ_{l₀} ≤ e^{2 B_n}; returns (lower, upper)."""
    B = np.asarray(B, dtype=np.float64)
    return np.exp(2 * f0 ** 2 * B), np.exp(2 * B)


def chi_upper(t, K: int, M: int, eta_y: float, eta_z: float, C0: float) -> np.ndarray:
    """The χ upper bound e^{2B_n} = sqrt(1 + 4Γ/C0) plotted in Fig 3 (docs/reproductions/scan-snap.md#theory-simulations)."""
    return np.exp(2 * B_n(t, K, M, eta_y, eta_z, C0))


# ---------------------------------------------------------------- times


def t0_prime(K: int, M: int, eta_y: float) -> float:
    """End of the scan phase, t'₀ = K ln M/η_Y (Thm 4; Lemma 9: p(correct) ≤ ½ before it)."""
    return K * np.log(M) / eta_y


def t0(K: int, M: int, eta_y: float) -> float:
    """Snap time t₀ = 2K ln M/η_Y (Thm 4, the (1 + o(1)) factor dropped)."""
    return 2 * K * np.log(M) / eta_y


def switch_time(K: int, M: int, eta_y: float) -> float:
    """The decoder's exact p(correct) = ½ time from Lemmas 5–6: α_nn = ½ ⇔ e^{Mh} = M − 1, and Lemma 6's
    e^{Mh} + (M−1)Mh = Mη_Y s + 1 then gives s = ((M−1)(1 + ln(M−1)) − 1)/(Mη_Y) per class, t = K s.
    Equals t'₀ = K ln M/η_Y up to the O(1) term dropped by Lemma 9: t/t'₀ → 1 + 1/ln M for large M."""
    return K * ((M - 1) * (1 + np.log(M - 1)) - 1) / (M * eta_y)


def stage_switch_bounds(K: int, M: int, eta_y: float, rho: float) -> tuple[float, float]:
    """docs/reproductions/scan-snap.md#theory-on-trained-models hypothesis for p(correct) = ½: between K ln M/η_Y
    and K ln M/((1−ρ)η_Y) (Remark 1: correlated classes, f_nᵀf_n' = ρ, train at the effective rate (1−ρ)η_Y)."""
    return t0_prime(K, M, eta_y), t0_prime(K, M, (1 - rho) * eta_y)
