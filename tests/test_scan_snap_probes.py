"""Scan and Snap probes on hand-made Z (docs/reproductions/scan-snap.md#measured-quantities,
docs/reproductions/scan-snap.md#attention-dynamics)."""

import math

import numpy as np
import pytest
import torch

from tdyn.papers.scan_snap import probes as pr


def syn_small_facts():
    """Syn-Small by hand: 10 commons (weight 1), classes 0/1 own tokens 10–19 / 20–29 with weights
    0.1..1.0, queries 30/31, next tokens 32/33 (docs/reproductions/scan-snap.md#syn-small-and-syn-medium)."""
    M, K = 34, 2
    w = torch.zeros(K, M, dtype=torch.float64)
    w[:, :10] = 1.0
    distinct = torch.zeros(K, M, dtype=torch.bool)
    for k in range(K):
        w[k, 10 + 10 * k: 20 + 10 * k] = torch.linspace(0.1, 1.0, 10, dtype=torch.float64)
        distinct[k, 10 + 10 * k: 20 + 10 * k] = True
    common = torch.zeros(M, dtype=torch.bool)
    common[:10] = True
    return dict(table=w / w.sum(1, keepdim=True), query=torch.tensor([30, 31]), next_token=torch.tensor([32, 33]),
                distinct=distinct, common=common, M=M)


def test_c_n_matches_eqn5_by_hand():
    f = syn_small_facts()
    Z = torch.zeros(2, 34, 34, dtype=torch.float64)
    Z[1, 30, 19] = 2.0
    c = pr.c_n(Z, f["table"], f["query"])
    assert c.shape == (2, 2, 34)
    np.testing.assert_allclose(c[0].numpy(), f["table"].numpy(), atol=1e-15)   # Z = 0: c_n = P(·|n)
    num = f["table"][0] * torch.exp(Z[1, 30])
    np.testing.assert_allclose(c[1, 0].numpy(), (num / num.sum()).numpy(), rtol=1e-12)
    assert c[1, 0, 20:].sum() == 0                                               # off-support tokens get 0


def test_entropy_at_zero_and_maximum():
    f = syn_small_facts()
    Z = torch.zeros(3, 34, 34, dtype=torch.float64)
    Z[1, 30, 10:20] = -torch.log(torch.arange(1, 11, dtype=torch.float64))    # flattens class 0: H = ln 10
    Z[1, 31, 20:30] = -torch.log(torch.arange(1, 11, dtype=torch.float64))
    Z[2, 30, 19] = 50.0                                                         # class 0 one-hot: H = 0
    H = pr.distinct_entropy(Z, f["table"], f["query"], f["distinct"])
    j = np.arange(1, 11) / 55
    assert H[0] == pytest.approx(-(j * np.log(j)).sum(), abs=1e-12)
    assert H[0] == pytest.approx(2.1513, abs=1e-4)
    assert H[1] == pytest.approx(math.log(10), abs=1e-12)
    Hn = pr.class_entropy(Z, f["table"], f["query"], f["distinct"])
    assert Hn[2, 0] == pytest.approx(0.0, abs=1e-12) and Hn[2, 1] == pytest.approx(float(H[0]))
    # commons play no part: shifting their logits leaves the metric unchanged
    Z[0, 30, :10] = 3.0
    assert pr.distinct_entropy(Z, f["table"], f["query"], f["distinct"])[0] == pytest.approx(float(H[0]), abs=1e-12)


def test_recall_by_hand():
    # one query (id 4) owning classes 0, 1 with distinct tokens {0, 1} and {2}; token 3 common
    M = 6
    distinct = torch.zeros(2, M, dtype=torch.bool)
    distinct[0, :2] = True
    distinct[1, 2] = True
    query = torch.tensor([4, 4])
    Z = torch.zeros(1, M, M, dtype=torch.float64)
    Z[0, 4, :] = torch.log(torch.tensor([4.0, 1.0, 2.0, 1.0, 1.0, 1.0]))     # attention 0.4, .1, .2, .1, .1, .1
    r = pr.recall(Z, query, distinct, torch.tensor([0.05, 0.15, 0.3, 0.5]))
    np.testing.assert_allclose(r[0].numpy(), [1.0, 2 / 3, 1 / 3, 0.0])
    # two queries are averaged: the second query's single class is never tagged
    distinct2 = torch.zeros(3, M, dtype=torch.bool)
    distinct2[:2] = distinct
    distinct2[2, 3] = True
    Z[0, 5, 3] = -10.0
    r2 = pr.recall(Z, torch.tensor([4, 4, 5]), distinct2, torch.tensor([0.15]))
    assert r2[0, 0] == pytest.approx((2 / 3 + 0) / 2)


def test_thm3_invariant_constant_on_theory_solution():
    f = syn_small_facts()
    table, query, distinct = f["table"], f["query"], f["distinct"]
    c = 150.0                                   # (1 − e^{−2z})/P² = c  ⇔  z = −½ ln(1 − cP²)
    Z = torch.zeros(2, 34, 34, dtype=torch.float64)
    for k in range(2):
        P = table[k, distinct[k]]
        Z[:, query[k], distinct[k]] = -0.5 * torch.log(1 - c * P ** 2)
    Z[1, 30, 12] += 0.3
    inv = pr.thm3_invariant(Z, table, query, distinct)
    assert torch.isnan(inv[:, :, :10]).all()
    np.testing.assert_allclose(inv[0][distinct].numpy(), c, rtol=1e-10)
    cv = pr.thm3_cv(Z, table, query, distinct)
    assert cv[0].abs().max() < 1e-10
    x = inv[1, 0][distinct[0]].numpy()
    assert cv[1, 0] == pytest.approx(x.std() / abs(x.mean()), rel=1e-10)
    assert cv[1, 1] < 1e-10
    # a uniform Z0 = 1: the invariant is e^{−2}·(the zero-start invariant of Z)
    assert torch.allclose(pr.thm3_invariant(Z + 1.0, table, query, distinct, Z0=torch.ones(1, 34, 34, dtype=Z.dtype)),
                          math.exp(-2) * inv, equal_nan=True)


def _old_invariant(Z, table, query, distinct, Z0):
    """The formula before the e^{−2z(0)} factor: (1 − e^{−2(z − z(0))})/P²."""
    z = Z[..., query, :] - Z0[..., query, :]
    inv = -torch.expm1(-2 * z) / table ** 2
    return torch.where(distinct, inv, torch.full_like(inv, float("nan")))


def test_thm3_invariant_from_non_uniform_z0():
    """The theory's solution from a non-uniform Z(0): e^{−2z_l(t)} = e^{−2z_l(0)} − c·P(l|n)² (ż_l ∝ P²e^{2z_l}
    with a factor common to the class). The invariant e^{−2z(0)}(1 − e^{−2(z − z(0))})/P² equals c on every
    distinct token; the formula without e^{−2z(0)} equals c·e^{2z(0)}, which is not constant."""
    f = syn_small_facts()
    table, query, distinct = f["table"], f["query"], f["distinct"]
    g = torch.Generator().manual_seed(0)
    Z0 = (torch.rand(1, 34, 34, generator=g, dtype=torch.float64) - 0.5)         # non-uniform, in [−½, ½]
    c = 60.0
    Z = Z0.clone()
    for k in range(2):
        P, z0 = table[k, distinct[k]], Z0[0, query[k], distinct[k]]
        assert (torch.exp(-2 * z0) - c * P ** 2 > 0).all()
        Z[0, query[k], distinct[k]] = -0.5 * torch.log(torch.exp(-2 * z0) - c * P ** 2)
    inv = pr.thm3_invariant(Z, table, query, distinct, Z0=Z0)
    np.testing.assert_allclose(inv[0][distinct].numpy(), c, rtol=1e-10)
    assert pr.thm3_cv(Z, table, query, distinct, Z0=Z0).max() < 1e-10
    old = _old_invariant(Z, table, query, distinct, Z0)
    assert not np.allclose(old[0][distinct].numpy(), c, rtol=1e-2)               # the old formula fails here
    x = old[0, 0][distinct[0]].numpy()
    assert x.std() / abs(x.mean()) > 0.1                                           # its CV is far from 0


def test_logit_signs_and_top_logit():
    f = syn_small_facts()
    Z = torch.zeros(2, 34, 34, dtype=torch.float64)
    Z[0, 30:32, :10] = -1.0
    Z[0, 30, 10:20] = torch.linspace(0.1, 1.0, 10, dtype=torch.float64)
    Z[0, 31, 20:30] = torch.linspace(0.1, 1.0, 10, dtype=torch.float64)
    Z[0, 31, 20] = -0.2
    Z[1, 30, 5] = 0.5
    s = pr.logit_signs(Z, f["table"], f["query"], f["distinct"], f["common"])
    assert s["common_negative"][0] == 1.0 and s["distinct_positive"][0] == pytest.approx(19 / 20)
    assert s["min_distinct"][0] == pytest.approx(-0.2) and s["max_common"][0] == -1.0
    assert s["common_negative"][1] == 0.0 and s["max_common"][1] == 0.5
    assert s["mean_common"][0] == -1.0 and s["mean_common"][1] == pytest.approx(0.5 / 20)
    top = pr.top_distinct_logit(Z, f["table"], f["query"], f["distinct"])
    np.testing.assert_allclose(top[0].numpy(), [1.0, 1.0])


def test_p_correct_by_hand():
    M = 3
    Y = torch.zeros(1, M, M, dtype=torch.float64)
    Y[0, 0, 1] = math.log(2.0)                  # u = e_0 → logits (0, ln 2, 0) → p = (¼, ½, ¼)
    u = torch.tensor([[[1.0, 0, 0], [0, 1.0, 0]]], dtype=torch.float64)
    p = pr.p_correct(Y, u, torch.tensor([1, 2]))
    np.testing.assert_allclose(p.numpy(), [[0.5, 1 / 3]])
    # zero decoder: 1/M whatever the attention
    f = syn_small_facts()
    p0 = pr.p_correct(torch.zeros(2, 34, 34, dtype=torch.float64),
                      pr.f_n(torch.zeros(2, 34, 34, dtype=torch.float64), f["table"], f["query"]), f["next_token"])
    np.testing.assert_allclose(p0.numpy(), 1 / 34)


def test_facts_agree_with_data_module():
    """The hand-made Syn-Small facts equal the generator's (so the probes see the same layout)."""
    from tdyn.papers.scan_snap.data import SYN_SMALL, ScanSnapDataConfig, build

    d = build(ScanSnapDataConfig(**SYN_SMALL))
    f = syn_small_facts()
    assert torch.allclose(d.table, f["table"]) and torch.equal(d.query, f["query"])
    assert torch.equal(d.distinct, f["distinct"]) and torch.equal(d.common, f["common"])


def test_registered_probes_in_training(tmp_path):
    from tdyn import runs
    from tdyn.papers.scan_snap.data import SYN_SMALL
    from tdyn.papers.scan_snap.fig4_fig5 import yz_config
    from tdyn.train.trainer import train

    cfg = yz_config(SYN_SMALL | {"batch_size": 8, "seq_len": 16}, steps=3, seeds=[0, 1])
    cfg["probes"] = {"names": ["scan_snap.attention", "scan_snap.decoder"], "every": 1}
    cfg["checkpoint"] = {"schedule": "none", "steps": [0]}
    d = train(cfg, tmp_path / "r", progress=False)[0]
    rec = runs.read_metrics(d)
    assert [r["step"] for r in rec] == [0, 1, 2, 3]
    assert rec[0]["scan_snap.attention/entropy"] == pytest.approx(2.1513, abs=1e-4)
    assert rec[0]["scan_snap.decoder/p_correct"] == pytest.approx(1 / 34)
    assert rec[0]["scan_snap.decoder/p_correct_limit"] == pytest.approx(1 / 34)
    assert rec[-1]["scan_snap.attention/entropy"] != rec[0]["scan_snap.attention/entropy"]
    assert runs.load_checkpoint(d, 0)["probe/scan_snap.attention/z_rows"].shape == (2, 34)


def test_descent_rate_on_known_curves():
    """A straight recall line with slope −40 has descent rate 40 under both fits; a sparser map's curve
    (few tokens near the threshold axis) descends more slowly than a dense map's."""
    thr = np.linspace(0.028, 0.038, 11)
    line = np.stack([0.9 - 40 * (thr - 0.028), 0.7 - 10 * (thr - 0.028)])
    np.testing.assert_allclose(pr.descent_rate(thr, line, "lsq"), [40.0, 10.0], rtol=1e-12)
    np.testing.assert_allclose(pr.descent_rate(thr, line, "secant"), [40.0, 10.0], rtol=1e-12)
    # a curved (concave) curve: secant and least squares differ, each as computed by hand
    curve = 1 - ((thr - 0.028) / 0.01) ** 2
    assert pr.descent_rate(thr, curve, "secant") == pytest.approx(100.0)
    assert pr.descent_rate(thr, curve, "lsq") == pytest.approx(-np.polyfit(thr, curve, 1)[0], rel=1e-10)
    with pytest.raises(ValueError):
        pr.descent_rate(thr, curve, "spline")
    # recall of hand-made attention: one query, 20 distinct tokens (2 classes of 10), M = 33.
    M = 33
    distinct = torch.zeros(2, M, dtype=torch.bool)
    distinct[0, 10:20] = True
    distinct[1, 20:30] = True
    query = torch.tensor([30, 30])
    Z = torch.zeros(2, M, M, dtype=torch.float64)
    spread = torch.linspace(-0.3, 0.3, 20, dtype=torch.float64)
    Z[0, 30, 10:30] = spread                   # dense: every distinct token's attention near 1/M
    Z[1, 30, 10:30] = 8 * spread               # sparse: the same order, attention far from 1/M
    r = pr.recall(Z, query, distinct, torch.tensor(thr)).numpy()
    rate = pr.descent_rate(thr, r, "lsq")
    assert rate[1] < rate[0]
