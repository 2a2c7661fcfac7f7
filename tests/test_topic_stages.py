"""Stage measurements of issue 12 item 6 (tdyn.papers.topic.stages) on hand-made cases with known
answers, and E1's setting (item 7)."""

import math

import numpy as np
import pytest
import torch

from tdyn.papers.topic.data import NUM_SPECIAL
from tdyn.papers.topic import stages as ts
from tdyn.papers.topic.probes import attention_classes

V, v, T = 104, 10, 10
START, END = 2, 3


def _kappa(W_Q, W_K, b_Q=None, b_K=None):
    S = ts.effective_scores(torch.eye(V)[None], W_Q[None], W_K[None],
                            None if b_Q is None else b_Q[None], None if b_K is None else b_K[None])
    return ts.topic_block_score(S, v, NUM_SPECIAL), S


def test_query_only_change_gives_zero_topic_block_score():
    g = torch.Generator().manual_seed(0)
    W_Q = torch.randn(V, V, generator=g)
    k, S = _kappa(W_Q, torch.zeros(V, V), torch.randn(V, generator=g), b_K=torch.randn(V, generator=g))
    assert S.norm() > 1.0                                        # the scores moved ...
    assert abs(float(k["kappa"][0])) < 1e-5                      # ... but only per query: κ = 0
    assert float(k["kappa_per_topic"].abs().max()) < 1e-5


def test_start_end_only_change_gives_zero_topic_block_score():
    g = torch.Generator().manual_seed(1)
    W_K = torch.zeros(V, V)
    W_K[:, [START, END]] = -5 * torch.randn(V, 2, generator=g)   # suppress / boost START, END keys only
    W_Q = torch.randn(V, V, generator=g)
    k, _ = _kappa(W_Q, W_K)
    assert (W_K.T @ W_Q).norm() > 10.0                           # ‖W_Kᵀ W_Q‖ is large ...
    assert abs(float(k["kappa"][0])) < 1e-6                      # ... yet no topic block


def test_key_only_change_gives_zero_topic_block_score():
    g = torch.Generator().manual_seed(2)
    k, _ = _kappa(torch.zeros(V, V), torch.randn(V, V, generator=g), b_Q=torch.randn(V, generator=g))
    assert abs(float(k["kappa"][0])) < 1e-5


def test_topic_block_change_gives_its_size():
    B = torch.zeros(V, V)
    t = (torch.arange(V) - NUM_SPECIAL) // v
    word = torch.arange(V) >= NUM_SPECIAL
    B[(t[:, None] == t[None, :]) & word[:, None] & word[None, :]] = 1.0
    beta = 0.7
    # S = W_Qᵀ W_K/√d with W_Q = I, W_K = β√d·B (+ a query-only and a START/END term)
    W_K = beta * math.sqrt(V) * B
    W_K[:, START] = 3.0
    k, S = _kappa(torch.eye(V), W_K, b_K=torch.ones(V))
    assert float(k["kappa"][0]) == pytest.approx(beta, rel=1e-5)
    assert float(k["kappa_se"][0]) < 1e-5


def test_effective_scores_are_the_models_attention_logits():
    from tdyn.papers.topic.model import TopicModelConfig, TopicTransformer

    m = TopicTransformer(TopicModelConfig(init="default"), V, v, NUM_SPECIAL, S=2)
    m.reset_parameters([torch.Generator().manual_seed(s) for s in (0, 1)], [1.0, 1.0])
    tokens = torch.randint(0, V, (2, 3, 12), generator=torch.Generator().manual_seed(3))
    keys = torch.ones_like(tokens, dtype=torch.bool)
    A = m.attention(tokens, keys)[:, :, 0]                       # [S, B, L, L]
    S = ts.model_scores(m)
    ref = torch.softmax(torch.stack([S[s][tokens[s][:, :, None], tokens[s][:, None, :]] for s in range(2)]), -1)
    torch.testing.assert_close(A, ref, rtol=1e-5, atol=1e-6)


def test_attention_gap_docs_matches_class_statistic():
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(NUM_SPECIAL, V, (2, 6, 20), generator=g)
    keys = torch.ones_like(tokens, dtype=torch.bool)
    A = torch.softmax(torch.randn(2, 6, 20, 20, generator=g), -1)
    a = ts.attention_gap_docs(A, tokens, keys, v, NUM_SPECIAL)
    b = attention_classes(A, tokens, keys, v, NUM_SPECIAL)
    torch.testing.assert_close(a["gap_doc"], b["gap_doc"])
    per = []                                                     # SE over documents, by hand
    for d in range(6):
        c = attention_classes(A[:, d:d + 1], tokens[:, d:d + 1], keys[:, d:d + 1], v, NUM_SPECIAL)
        per.append(c["gap"])
    per = torch.stack(per, 1)
    torch.testing.assert_close(a["gap_se"], per.std(1) / math.sqrt(6))


def test_fraction_of_plateau_time_known_answer_and_run_length_independent():
    tau, P = 100.0, 2.0
    steps = np.arange(0, 5001, 1.0)
    x = P * (1 - np.exp(-steps / tau))
    # relative growth over a doubling is e^{-t/τ}: plateau at t_p = ⌈τ ln 20⌉ = 300, value P(1 − e^{−3});
    # half of it first at t ≥ −τ ln(1 − (1 − e^{−3})/2) = 64.45 → 65
    f = ts.fraction_of_plateau_time(steps, x, 0.5)
    assert f["t_plateau"] == 300.0 and f["plateau"] == pytest.approx(P * (1 - math.exp(-3)))
    assert f["t"] == 65.0
    assert ts.fraction_of_plateau_time(steps[:1001], x[:1001], 0.5) == f       # a shorter run: same answer
    y = x + 0.02 * np.log1p(steps)                               # a slow unbounded drift after the rise
    assert ts.fraction_of_plateau_time(steps, y, 0.5)["t"] == ts.fraction_of_plateau_time(steps[:2001], y[:2001], 0.5)["t"]
    assert ts.fraction_of_plateau_time(steps, np.log1p(steps), 0.5) is None     # no plateau: undefined


def test_constant_kq_is_inconclusive_and_ordering():
    steps = np.arange(0, 1001, 50.0)
    kappa = np.full_like(steps, 1e-4)                            # K/Q never move
    assert ts.onset_time(steps, kappa, np.full_like(steps, 1e-3), ts.KAPPA_ONSET) is None
    o = ts.ordering(200.0, None)
    assert o["held"] is None and "never moved" in o["reason"]
    assert ts.ordering(None, 300.0)["held"] is None
    assert ts.ordering(200.0, 700.0) == {"held": True, "reason": None, "delay": 3.5}
    assert ts.ordering(200.0, 100.0)["held"] is False
    big = np.where(steps >= 600, 0.5, 0.0)                       # above the threshold from step 600 ...
    assert ts.onset_time(steps, big, np.full_like(steps, 0.01), ts.KAPPA_ONSET) == 600.0
    assert ts.onset_time(steps, big, np.full_like(steps, 0.3), ts.KAPPA_ONSET) is None   # ... but inside noise


def test_half_way_time_to_a_fixed_reference():
    steps = np.arange(0, 1001, 50.0)
    x = np.minimum(steps / 100, 4.0)                             # rises to 4 then creeps nowhere
    assert ts.half_way_time(steps, x, 2.0) == 100.0              # half of the way to the reference 2 → 1 at 100
    assert ts.half_way_time(steps[:5], x[:5], 2.0) == 100.0      # a shorter run: the same time
    L = 4.6 - np.minimum(steps / 500, 1.0)                       # a falling loss, reference 3.6
    assert ts.half_way_time(steps, L, 3.6) == 250.0
    assert ts.half_way_time(steps, np.zeros_like(steps), 1.0) is None   # never moved: undefined


def test_stage_times_from_metrics():
    from tdyn.papers.topic.analysis import stage_times

    steps = np.arange(0, 5001, 50.0)
    cv = 2 * (1 - np.exp(-steps / 100))
    kappa = np.where(steps >= 700, 0.3, 0.0)
    m = {"step": steps, "topic.blocks/V_contrast": cv, "topic.dev_loss/dev_loss": 4.6 - (1 - np.exp(-steps / 400)),
         "topic.stages/kappa": kappa, "topic.stages/kappa_se": np.full_like(steps, 0.01),
         "topic.stages/gap_doc": np.where(steps >= 650, 0.2, 0.0), "topic.stages/gap_se": np.full_like(steps, 0.01),
         "topic.norms/dV": np.minimum(steps, 400.0), "topic.norms/KQ": 1e-3 + np.where(steps >= 600, (steps - 600) ** 2, 0.0)}
    ref = {"contrast": 5.0, "probe_loss": 3.6}                   # contrast half-way (2.5) never: the fit is sharper
    t = stage_times(m, ref)
    assert (t["t_v_structure"], t["t_v_loss"], t["t_kq_kappa"], t["t_kq_gap"]) == (None, 300.0, 700.0, 650.0)
    assert t["two_stage_loss_kappa"] and t["two_stage_loss_gap"] and t["delay_loss_kappa"] == 700 / 300
    assert t["two_stage_structure_kappa"] is None and "half-way" in t["reason_structure_kappa"]
    assert t["t_v_plateau"] == 100.0                             # plateau reading (reported only)
    t = stage_times(m, {"contrast": 1.0, "probe_loss": 3.6})
    assert t["t_v_structure"] == 50.0 and t["two_stage_structure_gap"] is True
    m["topic.stages/kappa"] = np.zeros_like(steps)               # K/Q never move: inconclusive, not "fails"
    t = stage_times(m, ref)
    assert t["two_stage_loss_kappa"] is None and "never moved" in t["reason_loss_kappa"]


def test_stage1_reference_least_squares_is_the_minimum():
    from tdyn.papers.topic.analysis import fit_least_squares, squared_regression_loss

    g = torch.Generator().manual_seed(5)
    h = torch.rand(40, 6, generator=g, dtype=torch.float64)
    h = h / h.sum(1, keepdim=True)
    C = torch.randint(0, 3, (40, 6), generator=g).double()
    W, b = fit_least_squares(h, C)
    L = squared_regression_loss(W, b, h, C)
    for _ in range(5):                                           # any perturbation is worse
        dW = 1e-3 * torch.randn(W.shape, generator=g, dtype=torch.float64)
        assert squared_regression_loss(W + dW, b, h, C) >= L - 1e-12


def test_e1_embeddings_are_not_the_logit_matrix():
    from tdyn.papers.topic.data import LdaDataConfig
    from tdyn.papers.topic.embeddings import e1_measures, embeddings_config
    from tdyn.papers.topic.task import build_model
    from tdyn.papers.topic.model import TopicModelConfig

    cfg = embeddings_config(0, quick=True)
    mc = TopicModelConfig.model_validate(cfg["model"])
    model = build_model(LdaDataConfig(num_train=1, num_dev=1, num_test=1), mc)
    model.reset_parameters([torch.Generator().manual_seed(0)], [1.0])
    assert mc.attention == "uniform" and mc.value == "identity"
    assert mc.decoder == "trained" and 0 < mc.d < V               # separate, lower-dimensional output map
    E = model.embed_table()[0]
    assert E.shape == (V, mc.d) and model.W_dec.shape[1:] == (V, mc.d)
    assert {n for n, _ in model.named_parameters()} == {"W_E", "W_dec", "b_dec"}
    r = e1_measures(model, v)
    assert r["gram_vs_logit_rel_diff"] > 0.5                     # W_E W_Eᵀ is not the logit map W_dec W_Eᵀ
