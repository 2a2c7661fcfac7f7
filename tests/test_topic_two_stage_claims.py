"""The two paper claims of topic/two-stage (issue 32): persistent onsets, the literal weight-change claim, the
functional order with a not-applicable reading, and the probes' vocabulary form against the per-position
statistic (tdyn.papers.topic.probes, tdyn.papers.topic.stages, tdyn.papers.topic.analysis)."""

import numpy as np
import pytest
import torch

from tdyn.papers.topic.data import NUM_SPECIAL
from tdyn.papers.topic.analysis import stage_times, two_stage_claims
from tdyn.papers.topic import probes as tp
from tdyn.papers.topic import stages as ts

V, v = 104, 10
REF = {"contrast": 5.76, "probe_loss": 3.4}


def test_a_transient_crossing_is_no_onset():
    steps = np.array([0, 20, 40, 60, 66, 80, 100, 150, 200, 300, 400, 500], float)
    gap = np.array([0, 0.01, 0.02, 0.05, 0.056, 0.03, 0.01, 0.02, 0.06, 0.2, 0.4, 0.5])   # 60–66 then back
    se = np.full_like(steps, 0.005)
    assert ts.onset_time(steps, gap, se, ts.GAP_ONSET, persist=False) == 60.0           # the first crossing
    assert ts.onset_time(steps, gap, se, ts.GAP_ONSET) == 200.0                         # the persistent onset
    assert ts.onset_time(steps[:6], gap[:6], se[:6], ts.GAP_ONSET) is None              # fell back: none yet
    late = np.where(steps >= 500, 0.3, 0.0)                                             # only the last step
    assert ts.onset_time(steps, late, se, ts.GAP_ONSET) is None                         # < 3 logged steps


def test_onset_persists_in_level_while_its_noise_grows_later():
    steps = np.arange(0, 10001, 500.0)
    kappa = np.where(steps >= 3500, 0.18, 0.0)
    se = np.where(steps >= 5000, 0.4, 0.05)                  # topics diverge late: SE over topics grows
    assert ts.onset_time(steps, kappa, se, ts.KAPPA_ONSET) == 3500.0
    dip = kappa.copy()
    dip[(steps >= 4500) & (steps <= 6000)] = 0.0              # falls back inside [3500, 7000]: not yet an onset
    assert ts.onset_time(steps, dip, np.full_like(steps, 0.05), ts.KAPPA_ONSET) == 6500.0


def test_stage1_plateau_is_the_end_of_the_fast_rise():
    steps = np.array([0, 1, 2, 5, 10, 20, 50, 100, 150, 200, 400, 1000, 3000], float)
    x = np.minimum(steps / 100, 1.0) + 0.1 * np.log1p(np.maximum(steps - 100, 0) / 100)   # rise, then a creep
    p = ts.stage1_plateau(steps, x)
    assert p["t_plateau"] == 100.0 and p["plateau"] == pytest.approx(1.0)
    assert ts.stage1_plateau(steps, steps / 10) is None                                  # never slows


def _table(kind: str, steps=None):
    """A synthetic metrics table: ``adam`` (K, Q move with V; stage 2 at 150), ``sgd`` (K, Q still at step 500;
    stage 2 at 2000); the value contrast rises to a stage-1 plateau of 1.0 by step 100, far below half of the
    fitted optimum's 5.76."""
    s = np.unique(np.r_[np.round(np.logspace(0, 3, 30)), np.arange(0, 5001, 50)]).astype(float)
    s = s if steps is None else steps
    cv = np.minimum(s / 100, 1.0) + 0.05 * np.log1p(np.maximum(s - 100, 0) / 100)
    loss = 4.6 - 1.2 * (1 - np.exp(-s / 60))                                           # half-way (4.0) at ≈ 42
    t2 = 150.0 if kind == "adam" else 2000.0
    kappa = np.where(s >= t2, 0.3, 0.0)
    gap = np.where(s >= t2, 0.5, 0.0)
    dV = 0.5 * s
    dK = (0.6 if kind == "adam" else 1e-3) * dV + np.where(s >= t2, s - t2, 0)
    dQ = (0.7 if kind == "adam" else 5e-4) * dV + np.where(s >= t2, s - t2, 0)
    return {"step": s, "topic.stages/value_contrast": cv, "topic.dev_loss/dev_loss": loss,
            "topic.stages/kappa": kappa, "topic.stages/kappa_se": np.full_like(s, 0.01),
            "topic.stages/gap_doc": gap, "topic.stages/gap_se": np.full_like(s, 0.01),
            "topic.norms/dV": dV, "topic.norms/dK": dK, "topic.norms/dQ": dQ,
            "topic.norms/KQ": 1e-3 + dK * dQ}


def _rows(kind, n=3):
    rows = []
    for i in range(n):
        m = _table(kind)
        m["topic.norms/dK"] = m["topic.norms/dK"] * (1 + 0.01 * i)          # a little seed-to-seed spread
        rows.append(stage_times(m, REF) | {"seed": i})
    return rows


def test_literal_claim_on_weight_change_norms():
    lit, _ = two_stage_claims(_rows("adam"), id="x", label="adam")
    assert lit["verdict"] == "fails" and lit["source"] == "paper" and "only the value matrix" in lit["quote"]
    assert all(r["verdict"] == "fails" for r in lit["readings"])
    assert lit["numbers"]["ratio_s1_end"][0] == pytest.approx(0.7)            # max(0.6, 0.7) before stage 2
    assert "not in any text reachable offline" in lit["definition"]
    lit, _ = two_stage_claims(_rows("sgd"), id="x", label="sgd")
    assert lit["verdict"] == "holds"
    lit, _ = two_stage_claims(_rows("sgd", n=1), id="x", label="sgd")     # one seed: no noise band
    assert lit["verdict"] == "inconclusive"


def test_unreachable_reference_is_not_applicable_not_a_veto():
    rows = _rows("adam")
    assert rows[0]["applicable_structure"] is False and "cannot reach" in rows[0]["na_structure"]
    assert rows[0]["t_v_structure"] is None                                   # 5.76/2 never reached
    _, order = two_stage_claims(rows, id="x", label="adam")
    words = {r["name"]: r["verdict"] for r in order["readings"]}
    assert sum(w == "not applicable" for w in words.values()) == 2            # structure × (κ, gap)
    assert order["verdict"] == "holds"                                         # plateau and loss readings hold
    assert "not in any text reachable offline" in order["definition"]
    reach = stage_times(_table("adam"), {"contrast": 1.5, "probe_loss": 3.4})  # a reachable reference: judged
    assert reach["applicable_structure"] is True and reach["t_v_structure"] is not None


def test_order_fails_when_attention_comes_first():
    rows = []
    for i in range(3):
        m = _table("adam")
        s = m["step"]
        m["topic.stages/kappa"] = np.where(s >= 10, 0.3, 0.0)               # persistent κ from step 10
        m["topic.stages/gap_doc"] = np.where(s >= 10, 0.5, 0.0)
        rows.append(stage_times(m, REF) | {"seed": i})
    _, order = two_stage_claims(rows, id="x", label="adam")
    assert order["verdict"] == "fails"


def _model(**kw):
    from tdyn.papers.topic.model import TopicModelConfig, TopicTransformer

    m = TopicTransformer(TopicModelConfig(init="default", **kw), V, v, NUM_SPECIAL, S=2)
    m.reset_parameters([torch.Generator().manual_seed(s) for s in (0, 1)], [3.0, 3.0])
    return m


@pytest.mark.parametrize("kw", [{}, {"n_heads": 2}, {"emb_layernorm": True}, {"attention": "uniform"}])
def test_vocabulary_form_equals_per_position_statistics(kw):
    m = _model(**kw)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, V, (1, 5, 40), generator=g).expand(2, 5, 40).clone()   # one probe batch, shared
    tokens[:, :, :2] = 2                                                     # START keys
    tokens[:, 1, 30:] = 0                                                    # PAD tail
    keys = (tokens != 0) & (torch.rand(tokens.shape, generator=g) > 0.2)     # some word keys hidden
    A = m.attention(tokens, keys).mean(2)
    ref = tp.attention_classes(A, tokens, keys, v, NUM_SPECIAL)
    sums, counts, words = tp.clean_class_sums(m, {"clean_tokens": tokens, "clean_keys": keys}, v, NUM_SPECIAL)
    new = tp.classes_from_sums(sums, counts, words)
    for k in ref:
        torch.testing.assert_close(new[k].float(), ref[k], rtol=1e-6, atol=1e-6)
    masks = tp.pair_classes(tokens, v, NUM_SPECIAL)
    for c in tp.CLASSES:                                                     # pair counts from the ids alone
        assert torch.equal(counts[c], masks[c].sum((-1, -2)).double())
    torch.testing.assert_close(ts.gap_per_document(sums, counts)["gap_doc"].float(),
                               ts.attention_gap_docs(A, tokens, keys, v, NUM_SPECIAL)["gap_doc"], rtol=1e-6, atol=1e-6)


def test_effective_value_is_the_uniform_models_map():
    from tdyn.papers.topic.value import effective_value_map

    m = _model(attention="uniform", emb_layernorm=True)
    W, _ = effective_value_map(m)
    torch.testing.assert_close(ts.effective_value(m)[0].double(), W, rtol=1e-5, atol=1e-5)
    clean = _model()
    torch.testing.assert_close(ts.effective_value(clean), clean.W_V.detach())      # W_V in the clean setting
