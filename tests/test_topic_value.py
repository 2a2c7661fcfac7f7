"""Issue 12 items 4–5: each definition of topic/stage1 on hand-made cases with a known answer
(value structure: form R², gauge fix, relabelling noise, effective map; held-out references:
ℓ2-tuned fit, dev-fit floor, paired gap; the authors' best-dev rule and the presets)."""

import pytest
import torch

from tdyn.papers.topic.data import NUM_SPECIAL
from tdyn.papers.topic.stage1 import Stage1Options, best_dev_step, stage1_config
from tdyn.papers.topic.model import TopicModelConfig, TopicTransformer
from tdyn.papers.topic.value import (contrast_noise, effective_value_map, fit_aIbBc11, gauge_fix, r2_aIbBc11,
                                     value_structure)
from tdyn.papers.topic.theory import (bag_of_words, doc_losses, fit_softmax_regression, l2_path, paired_gap,
                               softmax_regression_loss)

T, v = 10, 10
n, V = T * v, T * v + NUM_SPECIAL


def _form(a, b, c, n=n, v=v):
    ids = torch.arange(n)
    B = (ids[:, None] // v == ids[None, :] // v).double()
    return a * torch.eye(n, dtype=torch.float64) + b * B + c * torch.ones(n, n, dtype=torch.float64)


def _full(word_block):
    W = torch.zeros(V, V, dtype=torch.float64)
    W[NUM_SPECIAL:, NUM_SPECIAL:] = word_block
    return W


def test_exact_form_has_r2_one_and_recovers_coefficients():
    coef, r2 = fit_aIbBc11(_form(2.0, 0.7, -0.3), v)
    assert r2 == pytest.approx(1.0, abs=1e-12)
    assert coef == pytest.approx({"a": 2.0, "b": 0.7, "c": -0.3}, abs=1e-10)


def test_r2_of_noise_is_near_zero_and_of_noisy_form_in_between():
    g = torch.Generator().manual_seed(0)
    E = torch.randn(n, n, generator=g, dtype=torch.float64)
    assert r2_aIbBc11(E, v) < 0.02
    mid = r2_aIbBc11(_form(1.0, 1.0, 0.0) + 0.3 * E, v)
    assert 0.2 < mid < 0.99


def test_gauge_fix_removes_row_and_column_shifts():
    """W + u1ᵀ + 1wᵀ gives the same logits up to a per-document constant; the gauge-fixed R² of a
    shifted exact form is 1 again, while the raw R² is not."""
    g = torch.Generator().manual_seed(1)
    W = _full(_form(1.5, 0.8, 0.1))
    u, w = torch.randn(V, 1, generator=g, dtype=torch.float64), torch.randn(1, V, generator=g, dtype=torch.float64)
    Ws = W + u + w
    assert r2_aIbBc11(Ws[NUM_SPECIAL:, NUM_SPECIAL:], v) < 0.9
    assert r2_aIbBc11(gauge_fix(Ws)[NUM_SPECIAL:, NUM_SPECIAL:], v) == pytest.approx(1.0, abs=1e-10)
    torch.testing.assert_close(gauge_fix(Ws), gauge_fix(W))
    # logits W h + b: the gauge changes them by the same amount for every label
    h = torch.softmax(torch.randn(5, V, generator=g, dtype=torch.float64), 1)
    d = h @ Ws.T - h @ W.T
    torch.testing.assert_close(torch.log_softmax(h @ Ws.T - u.T, 1), torch.log_softmax(h @ W.T, 1))
    assert d.shape == (5, V)


def test_contrast_noise_of_iid_entries_matches_the_analytic_std():
    """Per-topic contrast = mean of v(v−1) same-topic entries − mean of v(n−v) others: for iid N(0,1)
    entries its std is √(1/90 + 1/900) ≈ 0.110."""
    g = torch.Generator().manual_seed(2)
    W = torch.randn(V, V, generator=g, dtype=torch.float64)
    assert contrast_noise(W, v, NUM_SPECIAL, n_perm=400) == pytest.approx((1 / 90 + 1 / 900) ** 0.5, rel=0.15)


def test_value_structure_of_a_block_matrix():
    vs = value_structure(_full(_form(1.0, 0.5, 0.0)), v, NUM_SPECIAL)
    assert vs["per_topic_contrast"] == pytest.approx([0.5] * T)
    assert vs["min_topic_contrast"] > 4 * vs["contrast_noise"]
    assert vs["r2"] == pytest.approx(1.0) and vs["r2_gauge_fixed"] == pytest.approx(1.0)


def _batch(n_docs=12, L=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(NUM_SPECIAL, V, (1, n_docs, L), generator=g)
    tokens[..., 0] = 2
    sel = torch.rand(1, n_docs, L, generator=g) < 0.3
    sel[..., 0] = False
    sel[..., 1] = True
    labels = torch.where(sel, tokens, -100)
    tokens = torch.where(sel, 1, tokens)
    return tokens, labels, ~sel


@pytest.mark.parametrize("layernorm", [False, True])
def test_effective_map_is_the_models_point_in_the_convex_class(layernorm):
    cfg = TopicModelConfig(attention="uniform", value="trained", decoder="identity", emb_layernorm=layernorm)
    m = TopicTransformer(cfg, V, v, NUM_SPECIAL)
    m.reset_parameters([torch.Generator().manual_seed(3)], [1.0])
    tokens, labels, keys = _batch()
    W, b = effective_value_map(m)
    h, C = bag_of_words(tokens[0], keys[0], labels[0], V)
    assert float(softmax_regression_loss(W, b, h, C)) == pytest.approx(float(m.data_loss(tokens, labels, keys)[0].detach()),
                                                                       rel=1e-5)
    if not layernorm:
        torch.testing.assert_close(W, m.W_V[0].double())


def _toy(seed, n_docs, F=12, K=5):
    """Softmax-regression data: few documents, many features — an unregularised fit overfits."""
    g = torch.Generator().manual_seed(seed)
    W_true = 2 * torch.randn(K, F, generator=g, dtype=torch.float64)
    h = torch.softmax(3 * torch.randn(n_docs, F, generator=g, dtype=torch.float64), 1)
    p = torch.softmax(h @ W_true.T, 1)
    C = torch.stack([torch.bincount(torch.multinomial(p[i], 4, replacement=True, generator=g), minlength=K)
                     for i in range(n_docs)]).double()
    return h, C


def test_l2_tuned_fit_is_never_worse_held_out_than_the_unregularised_fit():
    h, C = _toy(0, 15)
    hd, Cd = _toy(1, 400)
    path = l2_path(h, C, hd, Cd, [1e-1, 1e-2, 1e-3, 0.0], max_iter=2000)
    unreg = next(r for r in path if r["l2"] == 0.0)
    best = min(path, key=lambda r: r["dev_loss"])
    assert best["dev_loss"] <= unreg["dev_loss"]
    assert best["l2"] > 0 and best["dev_loss"] < unreg["dev_loss"] - 0.05       # it overfits here


def test_dev_fit_floor_is_below_every_fit_on_dev():
    h, C = _toy(2, 40)
    hd, Cd = _toy(3, 60)
    Wf, bf, floor = fit_softmax_regression(hd, Cd, max_iter=3000)
    others = [r["dev_loss"] for r in l2_path(h, C, hd, Cd, [1.0, 1e-2, 1e-4, 0.0], max_iter=2000)]
    g = torch.Generator().manual_seed(4)
    others += [float(softmax_regression_loss(torch.randn(5, 12, generator=g, dtype=torch.float64),
                                             torch.zeros(5, dtype=torch.float64), hd, Cd)) for _ in range(5)]
    assert all(floor <= o + 1e-9 for o in others)


def test_paired_gap_of_a_constant_per_token_difference():
    counts = torch.tensor([3.0, 5.0, 2.0])
    b = torch.tensor([1.0, 4.0, 0.5])
    gap, se = paired_gap(b + 0.25 * counts, b, counts)
    assert gap == pytest.approx(0.25) and se == pytest.approx(0.0, abs=1e-12)
    gap, se = paired_gap(torch.tensor([1.0, 0.0]), torch.zeros(2), torch.ones(2))
    assert gap == pytest.approx(0.5) and se == pytest.approx(0.5)
    h, C = _toy(5, 10)
    W = torch.randn(5, 12, dtype=torch.float64)
    assert float(doc_losses(W, torch.zeros(5), h, C).sum() / C.sum()) == pytest.approx(
        float(softmax_regression_loss(W, torch.zeros(5), h, C)))


def test_best_dev_step_follows_the_authors_early_stop():
    evals = [(1, 5.0), (1001, 4.0), (2001, 4.5), (3001, 4.6), (4001, 3.0)]
    assert best_dev_step(evals) == (1001, 3001)                  # two non-improving in a row: stop
    assert best_dev_step([(1, 5.0), (1001, 4.0), (2001, 4.5), (3001, 3.9), (4001, 3.8)]) == (4001, 4001)


def test_presets():
    assert Stage1Options().preset == "clean"
    assert Stage1Options(preset="authors").preset == "authors"
    with pytest.raises(ValueError):
        Stage1Options(preset="nope")
    a, c = stage1_config(preset="authors"), stage1_config()
    assert a["model"]["emb_layernorm"] and not c["model"].get("emb_layernorm", False)
    assert a["optim"]["steps"] == 5000 and a["checkpoint"]["steps"] == [1, 1001, 2001, 3001, 4001]
    assert c["optim"]["steps"] == 3000
    assert stage1_config(l2=1e-5)["model"]["l2"] == 1e-5
