"""Scan and Snap closed forms (docs/reproductions/scan-snap.md#theory,
docs/reproductions/scan-snap.md#theory-simulations): Lemma 6/7, Γ, B_n, t₀."""

import numpy as np
import pytest
from scipy.integrate import quad, solve_ivp

from tdyn.papers.scan_snap import theory as th

FIG8 = [(50, e) for e in (0.1, 0.2, 0.5, 1, 2)] + [(1000, e) for e in (0.2, 0.5, 1, 2, 4)]


def test_h_solves_lemma6():
    s = np.array([0.0, 0.3, 1, 10, 1e3, 1e6])
    for M, eta in [(50, 0.5), (1000, 4)]:
        h = th.h_continuous(s, M, eta)
        np.testing.assert_allclose(np.exp(M * h) + (M - 1) * M * h, M * eta * s + 1, rtol=1e-12)


@pytest.mark.parametrize("M,eta_y", FIG8)
def test_lemma7_gap_between_recursion_and_ode(M, eta_y):
    s = np.arange(3001)
    gap = th.h_star(3000, M, eta_y) - th.h_continuous(s, M, eta_y)
    assert gap.min() >= -1e-12
    assert gap.max() <= 2 * eta_y / M
    assert gap[-1] < 0.1 * gap.max()            # the gap closes (Fig 8)


def test_h_star_matches_lemma5_first_steps():
    M, eta = 50, 0.5
    h = th.h_star(2, M, eta)
    assert h[1] == pytest.approx(eta / M)
    assert h[2] == pytest.approx(eta / M + eta / (M - 1 + np.exp(M * eta / M)))


def test_t0_fig3():
    got = [th.t0(10, 1000, e) for e in (0.5, 1, 2, 5)]
    np.testing.assert_allclose(got, [276.3, 138.2, 69.1, 27.6], atol=0.05)
    assert th.t0_prime(10, 1000, 1.0) == pytest.approx(got[1] / 2)


@pytest.mark.parametrize("K,M,eta_y,eta_z", [(10, 1000, 0.5, 0.5), (1, 100, 10, 1), (3, 50, 2, 0.3)])
def test_Gamma_closed_form_equals_quadrature(K, M, eta_y, eta_z):
    for t in (0.5 * th.t0_prime(K, M, eta_y), th.t0(K, M, eta_y), 5 * th.t0(K, M, eta_y)):
        q, _ = quad(lambda u: th.gamma(u, K, M, eta_y), 0, t, limit=200, epsabs=0, epsrel=1e-10)
        assert th.Gamma(t, K, M, eta_y, eta_z) == pytest.approx(eta_z * q, rel=1e-7)


@pytest.mark.parametrize("C0", [0.01, 1.0])
def test_common_logit_solves_ode(C0):
    K, M, eta_y, eta_z = 10, 1000, 1.0, 0.5
    T = 3 * th.t0(K, M, eta_y)
    sol = solve_ivp(lambda t, z: -eta_z / C0 * th.gamma(t, K, M, eta_y) * np.exp(4 * z), (0, T), [0.0],
                    rtol=1e-10, atol=1e-12, dense_output=True)
    ts = np.linspace(0, T, 50)
    np.testing.assert_allclose(sol.sol(ts)[0], th.common_logit(ts, K, M, eta_y, eta_z, C0), atol=1e-6)


def test_B_n_exact_is_integral_of_xi():
    K, M, eta_y, eta_z, C0 = 10, 1000, 1.0, 0.5, 0.1
    t = 2 * th.t0(K, M, eta_y)
    xi = lambda u: th.gamma(u, K, M, eta_y) / (C0 + 4 * th.Gamma(u, K, M, eta_y, eta_z))  # noqa: E731
    q, _ = quad(xi, 0, t, limit=200, epsabs=0, epsrel=1e-10)
    assert th.B_n(t, K, M, eta_y, eta_z, C0) == pytest.approx(eta_z * q, rel=1e-7)
    assert th.B_n(0.0, K, M, eta_y, eta_z, C0) == 0.0


def test_B_n_asymptotic_forms():
    K, M, eta_y, eta_z, C0 = 10, 10000, 1.0, 0.1, 1.0
    t_small = 0.02 * th.t0_prime(K, M, eta_y)
    assert th.B_n_scan(t_small, K, M, eta_y, eta_z, C0) == pytest.approx(th.B_n(t_small, K, M, eta_y, eta_z, C0),
                                                                         rel=0.02)
    t_big = 1e4 * th.t0(K, M, eta_y)
    exact = th.B_n(t_big, K, M, eta_y, eta_z, C0)
    assert th.B_n_snap(t_big, K, M, eta_y, eta_z, C0) == pytest.approx(exact, rel=0.02)
    assert th.B_n_large_t(t_big, K, M, eta_y, eta_z, C0) == pytest.approx(exact, rel=0.02)
    # O(ln ln t) after the snap: a tenfold longer run barely moves B_n
    later = th.B_n(10 * t_big, K, M, eta_y, eta_z, C0)
    x = M * eta_y * t_big / K
    assert later - exact == pytest.approx(0.5 * np.log(np.log(10 * x) / np.log(x)), rel=0.05)


@pytest.mark.parametrize("nu,M,etas_z", [(10, 100, (0.5, 1, 2, 4, 8)), (1, 10000, (0.5, 1, 2, 4, 8))])
def test_B_at_t0_independent_of_eta_z_at_fixed_nu(nu, M, etas_z):
    K = 1
    for C0 in (0.1, 1.0):
        B = [th.B_n(th.t0(K, M, nu * ez), K, M, nu * ez, ez, C0) for ez in etas_z]
        np.testing.assert_allclose(B, B[0], rtol=1e-10)
        B_late = [th.B_n(5.0, K, M, nu * ez, ez, C0) for ez in etas_z]   # at a fixed t they differ
        assert np.ptp(B_late) > 0.01


def test_chi_bounds_order_and_fig3_claim():
    K, M, eta_z, C0 = 10, 1000, 0.5, 0.1
    t = 700.0
    chi = [th.chi_upper(t, K, M, ey, eta_z, C0) for ey in (0.5, 1, 2, 5)]
    assert np.all(np.diff(chi) < 0)            # smaller η_Y → larger χ at the end of Fig 3
    lo, hi = th.chi_bounds(th.B_n(t, K, M, 1.0, eta_z, C0), f0=0.5)
    assert 1 <= lo <= hi
    assert hi == pytest.approx(np.sqrt(1 + 4 * th.Gamma(t, K, M, 1.0, eta_z) / C0))


def test_p_correct_half_at_scan_end():
    # Lemma 9: e^{Mh} ≤ M − 1 (p ≤ ½) up to t'₀; the decoder is past ½ by t₀
    K, M, eta = 10, 1000, 1.0
    h = th.h_continuous(np.array([th.t0_prime(K, M, eta), th.t0(K, M, eta)]) / K, M, eta)
    p = th.p_correct(h, M)
    assert p[0] <= 0.5 < p[1]


@pytest.mark.parametrize("name", ["scan-snap/fig3", "scan-snap/fig8", "scan-snap/fig9"])
def test_theory_reproductions(tmp_path, name):
    from tdyn.reproduce.registry import ReproduceContext, get

    res = get(name).reproduce(ReproduceContext(out=tmp_path, quick=True, progress=False))
    assert res["claims"] and all(c["held"] for c in res["claims"])
    for c in res["claims"]:     # provenance: the paper's words and where, or what tdyn adds
        assert c["source"] in ("paper", "derived") and c.get("paper"), c["id"]
        assert len(c.get("quote" if c["source"] == "paper" else "derived", "")) > 20, c["id"]
    assert {c["id"] for c in res["claims"] if c["source"] == "derived"} == (
        {"t0-values"} if name == "scan-snap/fig3" else set())
    for f in res["files"]:
        assert (tmp_path / f).stat().st_size > 0
