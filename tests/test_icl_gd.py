"""von Oswald et al. 2023 (docs/reproductions/icl-gd.md#tests): analytic answers for the data, the LSA model, the GD
construction, the optimal step and K-step GD / GD++; each test can fail."""

import math

import pytest
import torch

from tdyn.papers.icl_gd import data as icl
from tdyn.papers.icl_gd import kernels
from tdyn.papers.icl_gd import theory as th
from tdyn.papers.icl_gd.model import LSA, LSAConfig
from tdyn.papers.icl_gd.probes import alignment

F64 = torch.float64


def _batch(n=64, d=10, N=10, seed=0, **kw):
    return icl.sample(n, d, N, torch.Generator().manual_seed(seed), dtype=F64, **kw)


def _model(K=1, tied=True, S=3, seed=0, std=0.3, D=11):
    m = LSA(LSAConfig(D, layers=K, tied=tied, dtype=F64), S=S)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(std * torch.randn(p.shape, generator=g, dtype=F64))
    return m


def _set(m: LSA, layers):
    """Put the weight sets ``layers`` [(W_K, W_Q, W_V, P), …] into every member of ``m``."""
    with torch.no_grad():
        for w, mats in enumerate(layers):
            for name, M in zip(("W_K", "W_Q", "W_V", "P"), mats):
                getattr(m, name)[:, w] = M


# ---------------------------------------------------------------- data
def test_tokens_are_linear_regressions():
    E, y = _batch(n=32, d=4, N=6, x_max=0.5, w_scale=2.0)
    x, yc, x_q = icl.split(E)
    assert E.shape == (32, 7, 5) and float(E[:, -1, -1].abs().max()) == 0.0
    assert float(x.abs().max()) <= 0.5 and float(x_q.abs().max()) <= 0.5
    # one w per sequence explains the context labels and the target exactly (no noise)
    X = torch.cat([x, x_q.unsqueeze(1)], 1)
    Y = torch.cat([yc, y.unsqueeze(1)], 1)
    w = torch.linalg.lstsq(X, Y.unsqueeze(-1)).solution
    assert float((X @ w - Y.unsqueeze(-1)).abs().max()) < 1e-12
    assert torch.equal(icl.tokens(x, yc, x_q), E)


def test_data_moments_and_seeding():
    E, y = icl.sample(1 << 15, 3, 2, torch.Generator().manual_seed(1), dtype=F64, x_max=1.0, noise=0.5)
    x, _, _ = icl.split(E)
    assert abs(float((x * x).mean()) - 1 / 3) < 4 * math.sqrt(4 / 45 / x.numel())     # Var(x²) = 1/5 − 1/9
    assert abs(float((y * y).mean()) - (3 / 3 + 0.25)) < 0.05
    a = icl.sample(8, 10, 10, torch.Generator().manual_seed(3))
    b = icl.sample(8, 10, 10, torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---------------------------------------------------------------- the construction = GD
@pytest.mark.parametrize("d,N", [(10, 10), (3, 7), (5, 1)])
def test_construction_is_one_gd_step_from_any_W0(d, N):
    E, _ = _batch(n=128, d=d, N=N, seed=2)
    x, y, x_q = icl.split(E)
    W0 = torch.randn(d, generator=torch.Generator().manual_seed(5), dtype=F64)
    eta = 0.7
    E_in = E.clone()
    E_in[:, -1, -1] = -(x_q @ W0)
    out, _ = th.lsa(E_in, [th.construction(d, eta, N, W0)])
    # one GD step by hand: W1 = W0 − η ∇L(W0), L = 1/(2N) Σ (W x_i − y_i)²
    grad = ((x @ W0 - y).unsqueeze(-1) * x).sum(1) / N
    W1 = W0 - eta * grad
    assert float((-out[:, -1, -1] - (x_q * W1).sum(-1)).abs().max()) < 1e-13
    assert float((out[..., :-1] - E[..., :-1]).abs().max()) == 0.0      # the x entries are left as they are


def test_k_construction_layers_are_k_gd_steps_and_the_model_computes_them():
    E, y = _batch(n=64, seed=3)
    eta = th.one_step(10, 10).eta_star
    for K in (1, 2, 4):
        out, _ = th.lsa(E, [th.construction(10, eta, 10)] * K)
        pred, W = th.gd_steps(E, eta, K)
        x, yc, _ = icl.split(E)
        assert float((-out[:, -1, -1] - pred).abs().max()) < 1e-12
        assert float((out[:, :-1, -1] - (yc - (x * W.unsqueeze(1)).sum(-1))).abs().max()) < 1e-12   # residuals
        m = _model(K=K, tied=True, S=2)
        _set(m, [th.construction(10, eta, 10)])
        with torch.no_grad():
            assert float((m.predict(E) - pred).abs().max()) < 1e-12
            assert float((kernels.predict(m, E) - pred).abs().max()) < 1e-12
            assert float((m.sensitivity(E) - W).abs().max()) < 1e-12          # ∂ŷ/∂x_q of K GD steps is W_K


def test_a_wrong_sign_breaks_the_construction():
    """The test above can fail: the value's −1 turned into +1 no longer gives GD."""
    E, _ = _batch(n=16)
    W_K, W_Q, W_V, P = th.construction(10, 1.0, 10)
    W_V[-1, -1] = 1.0
    out, _ = th.lsa(E, [(W_K, W_Q, W_V, P)])
    assert float((-out[:, -1, -1] - th.gd_steps(E, 1.0)[0]).abs().max()) > 1e-2


# ---------------------------------------------------------------- the model
@pytest.mark.parametrize("K,tied", [(1, True), (2, True), (2, False), (3, False)])
def test_model_update_is_the_paper_equation(K, tied):
    """forward = e_j + P Σ_i (W_V e_i)(W_K e_i)ᵀ(W_Q e_j), keys/values from the context, written as a loop."""
    m = _model(K, tied, S=2, std=0.2).requires_grad_(False)
    E, _ = _batch(n=5, d=10, N=10, seed=4)
    got = m(E)
    for s in range(2):
        for b in range(5):
            e = E[b].clone()
            for layer in range(K):
                W_K, W_Q, W_V, P = (w[s] for w in m.weights(layer))
                new = e.clone()
                for j in range(e.shape[0]):
                    acc = torch.zeros(11, dtype=F64)
                    for i in range(e.shape[0] - 1):
                        acc += (W_V @ e[i]) * float((W_K @ e[i]) @ (W_Q @ e[j]))
                    new[j] = e[j] + P @ acc
                e = new
            assert torch.allclose(got[s, b], e, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("K,tied", [(1, True), (2, True), (3, False)])
def test_kernel_equals_model(K, tied):
    m = _model(K, tied, S=3, std=0.15)
    E, y = _batch(n=40, seed=6)
    assert torch.allclose(kernels.predict(m, E), m.predict(E), atol=1e-11, rtol=1e-11)
    Es = torch.stack([E, E.flip(0), E * 0.5])            # per-member batches
    assert torch.allclose(kernels.predict(m, Es), m.predict(Es), atol=1e-11, rtol=1e-11)
    # and their gradients
    g1 = torch.autograd.grad(((kernels.predict(m, E) - y) ** 2).mean(), list(m.parameters()))
    g2 = torch.autograd.grad(((m.predict(E) - y) ** 2).mean(), list(m.parameters()))
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("K,tied", [(1, True), (2, False), (3, True)])
def test_sensitivity_is_the_exact_gradient(K, tied):
    """∂ŷ/∂x_q from the query map against autograd; ŷ is linear in x_q (the query is no key)."""
    m = _model(K, tied, S=2, std=0.25)
    E, _ = _batch(n=6, seed=7)
    Eg = E.clone().requires_grad_(True)
    pred = m.predict(Eg)
    for s in range(2):
        (g,) = torch.autograd.grad(pred[s].sum(), Eg, retain_graph=True)
        assert torch.allclose(m.sensitivity(E)[s], g[:, -1, :-1], atol=1e-12, rtol=1e-10)
    x_q = E[:, -1, :-1]
    E2 = E.clone()
    E2[:, -1, :-1] = 2 * x_q
    assert torch.allclose(m.predict(E2), 2 * m.predict(E), atol=1e-12, rtol=1e-10)


def test_init_is_the_authors_truncated_normal():
    from tdyn.config import validate_config
    from tdyn.papers.icl_gd.task import icl_gd_config
    from tdyn.tasks import build_task
    from tdyn.train.trainer import expand_members

    cfg = validate_config(icl_gd_config(layers=2, seeds=[0, 1], steps=1, probe_size=16))
    task = build_task(cfg, expand_members(cfg))
    sigma = math.sqrt(0.002 / 2 / 11) / 0.87962566103423978        # Haiku: N(0, σ²) truncated to ±2σ ...
    w = torch.cat([p.detach().flatten() for p in task.model.parameters()]).double()
    assert float(w.abs().max()) <= 2 * sigma + 1e-9
    assert abs(float(w.std()) / math.sqrt(0.002 / 2 / 11) - 1) < 0.1   # ... whose std is √(scale/fan_in), ±10 %
    assert not torch.equal(task.model.W_K[0], task.model.W_K[1])    # members differ


# ---------------------------------------------------------------- the optimal step
@pytest.mark.parametrize("d,N,a,sigma", [(10, 10, 1.0, 0.0), (4, 3, 0.5, 0.3), (2, 20, 2.0, 0.0)])
def test_one_step_closed_form_against_monte_carlo(d, N, a, sigma):
    os_ = th.one_step(d, N, a, 1.0, sigma)
    E, y = icl.sample(1 << 17, d, N, torch.Generator().manual_seed(11), dtype=F64, x_max=a, noise=sigma)
    b = th.gd_poly(E, 1)[:, 0]
    for mc, exact in (((y * b), os_.E_yb), ((b * b), os_.E_bb), ((y * y), os_.E_yy),
                      (0.5 * (y - os_.eta_star * b) ** 2, os_.loss_star)):
        se = float(mc.std()) / math.sqrt(len(mc))
        assert abs(float(mc.mean()) - exact) < 4 * se, (float(mc.mean()), exact, se)


def test_eta_star_minimises_the_loss_and_scales_with_the_input_range():
    os_ = th.one_step(10, 10)
    assert os_.loss(os_.eta_star) < min(os_.loss(os_.eta_star * 0.99), os_.loss(os_.eta_star * 1.01))
    assert math.isclose(os_.eta_star, (10 / 9) / (0.4 + 1 / 3), rel_tol=1e-14)        # by hand at d = N = 10
    half = th.one_step(10, 10, 0.5)
    assert math.isclose(half.eta_star, 4 * os_.eta_star, rel_tol=1e-12)              # η* ∝ 1/a²
    assert math.isclose(half.loss_star, os_.loss_star / 4, rel_tol=1e-12)            # loss ∝ a²


def test_k_step_loss_polynomial_and_optimum():
    E, y = _batch(n=256, seed=12)
    for K in (1, 2, 3):
        a = th.gd_poly(E, K)
        for eta in (0.3, 1.1):
            pred = a @ torch.tensor([eta ** j for j in range(1, K + 1)], dtype=F64)
            assert float((pred - th.gd_steps(E, eta, K)[0]).abs().max()) < 1e-12
    eta2, mc2 = th.optimal_eta(2, 10, 10, n=1 << 14, seed=3)
    for e in (eta2 * 0.98, eta2 * 1.02):
        assert th.gd_loss_mc(2, e, 10, 10, n=1 << 14, seed=3).loss > th.gd_loss_mc(2, eta2, 10, 10, n=1 << 14, seed=3).loss
    assert mc2.loss < th.one_step(10, 10).loss_star                         # two steps beat one


def test_gdpp_spectral_equals_the_lsa_construction_and_gd():
    E, _ = _batch(n=48, seed=13)
    sp = th.spectral(E)
    for eta, gamma, K in ((1.5, 0.0, 3), (1.2, 0.4, 2), (2.0, 0.3, 4)):
        p1, s1 = th.gdpp_predict(E, eta, gamma, K)
        p2, z = th.spectral_predict(sp, eta, gamma, K)
        assert float((p1 - p2).abs().max()) < 1e-11
        assert float((s1 - (sp.V @ z.unsqueeze(-1)).squeeze(-1)).abs().max()) < 1e-11
        if gamma == 0:
            assert float((p2 - th.gd_steps(E, eta, K)[0]).abs().max()) < 1e-11


# ---------------------------------------------------------------- weight match and alignment
def test_weight_match_is_invariant_and_finds_eta():
    W_K, W_Q, W_V, P = th.construction(10, 1.3, 10)
    cos, eta = th.weight_match(W_K, W_Q, W_V, P, 10)
    assert abs(float(cos) - 1) < 1e-14 and abs(float(eta) - 1.3) < 1e-13
    A = torch.linalg.qr(torch.randn(11, 11, generator=torch.Generator().manual_seed(0), dtype=F64))[0] * 3
    B = torch.randn(11, 11, generator=torch.Generator().manual_seed(1), dtype=F64) + 5 * torch.eye(11, dtype=F64)
    same = (A @ W_K, torch.linalg.inv(A).T @ W_Q, B @ W_V, P @ torch.linalg.inv(B))
    cos2, eta2 = th.weight_match(*same, 10)
    assert abs(float(cos2) - 1) < 1e-12 and abs(float(eta2) - 1.3) < 1e-12
    E, _ = _batch(n=8)
    assert torch.allclose(th.lsa(E, [same])[0][:, -1, -1], th.lsa(E, [(W_K, W_Q, W_V, P)])[0][:, -1, -1], atol=1e-12)
    W_Q2 = W_Q.clone()
    W_Q2[0, 0] = -1.0                                                    # one coordinate's sign flipped
    assert float(th.weight_match(W_K, W_Q2, W_V, P, 10)[0]) < 0.9


def test_alignment_measures():
    pred_ref = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    sens_ref = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=F64)
    a = alignment(pred_ref[None] * 1.1, sens_ref[None] * 1.1, pred_ref, sens_ref)
    assert abs(float(a["sens_cos"][0]) - 1) < 1e-15
    assert abs(float(a["pred_diff_rel"][0]) - 0.1) < 1e-12 and abs(float(a["sens_diff_rel"][0]) - 0.1) < 1e-12
    rot = torch.stack([sens_ref[:, 1], -sens_ref[:, 0]], -1)              # orthogonal sensitivities
    assert abs(float(alignment(pred_ref[None], rot[None], pred_ref, sens_ref)["sens_cos"][0])) < 1e-15
