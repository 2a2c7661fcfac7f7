"""Issue 32, the right object: the value path W_dec · Π (W_O) W_V · Ẽᵀ of every architecture (exact for plain
attention layers, the linear part of the BERT block), the robustness helpers (persistent stage-2 onset, end of
stage 1), the provenance of the variants, and the single-seed rule where topic reproductions use a seed SE."""

import math

import pytest
import torch

from tdyn import stats
from tdyn.papers.topic.data import NUM_SPECIAL
from tdyn.papers.topic.robustness import (DERIVED, _table_claims, end_of_stage1, persistent_onset,
                                               robustness_variants, squared_variants, variant_source)
from tdyn.papers.topic.stage1 import seed_se
from tdyn.papers.topic.model import TopicModelConfig, TopicTransformer
from tdyn.papers.topic.value import effective_value_map, value_path, value_structure
from tdyn.seeding import generator

T, v = 10, 10
V = T * v + NUM_SPECIAL


def _model(V=24, v=5, **kw):
    m = TopicTransformer(TopicModelConfig(**kw), V, v, NUM_SPECIAL, S=1)
    m.reset_parameters([generator(0, "init")], [1.0])
    return m.double()


def _attended_bag(m, tokens, keys):
    """logits and the attention-weighted bag of input words A_L ⋯ A_1 X (one head)."""
    logits, attns = m(tokens, keys, return_attention=True)
    A = None
    for a in attns:
        a = a[:, :, 0]
        A = a if A is None else a @ A
    X = torch.nn.functional.one_hot(tokens, m.V).double()
    return logits, A @ X


@pytest.mark.parametrize("kw", [{}, {"n_layers": 2}, {"n_layers": 3}, {"emb_layernorm": True},
                                {"emb_layernorm": True, "n_layers": 2}, {"attention": "uniform"},
                                {"decoder": "trained"}])
def test_value_path_is_exact_for_plain_attention_layers(kw):
    """Attention rows sum to one over the visible keys, so logits = W_eff (A_L ⋯ A_1 X) + b_eff exactly."""
    m = _model(**kw)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(NUM_SPECIAL, m.V, (1, 4, 11), generator=g)
    keys = torch.rand(1, 4, 11, generator=g) > 0.3
    keys[..., 0] = True
    with torch.no_grad():
        logits, bag = _attended_bag(m, tokens, keys)
    W, b = value_path(m)
    torch.testing.assert_close(bag @ W.T + b, logits, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("kw", [{"attention": "uniform"}, {"attention": "uniform", "emb_layernorm": True}])
def test_value_path_is_the_effective_map_under_uniform_attention(kw):
    m = _model(**kw)
    for a, b in zip(value_path(m), effective_value_map(m)):
        torch.testing.assert_close(a, b, atol=1e-14, rtol=0)


def _orthogonal(n, seed):
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q


def _block(V, v):
    return TopicTransformer.block_matrix(V, v, NUM_SPECIAL).double()


def test_two_layers_structure_in_the_product_not_in_layer_0():
    """A hand-built two-layer model: W_V⁽¹⁾ = R (a random rotation), W_V⁽²⁾ = (I + 3B) Rᵀ. Layer 0's W_V has
    no topic block (within its relabelling noise); the value path W_V⁽²⁾ W_V⁽¹⁾ = I + 3B has it."""
    m = _model(V, v, n_layers=2)
    R, B = _orthogonal(V, 3), _block(V, v)
    with torch.no_grad():
        m.W_V[0, 0] = R
        m.W_V[0, 1] = (torch.eye(V, dtype=torch.float64) + 3 * B) @ R.T
    W, _ = value_path(m)
    torch.testing.assert_close(W, torch.eye(V, dtype=torch.float64) + 3 * B, atol=1e-12, rtol=0)
    path, layer0 = value_structure(W, v, NUM_SPECIAL), value_structure(m.W_V[0, 0], v, NUM_SPECIAL)
    assert path["min_topic_contrast"] == pytest.approx(3.0, abs=1e-12)
    assert path["min_topic_contrast"] > 2 * path["contrast_noise"]
    assert not layer0["min_topic_contrast"] > 2 * layer0["contrast_noise"]


def test_bert_block_value_path_is_w_dec_w_o_w_v():
    """The BERT block: W_dec W_O W_V Ẽᵀ, biases carried (W_dec (W_O b_V + b_O) + b_dec); the LayerNorms,
    the residual and the FFN are not in it."""
    d = 24
    m = _model(d, 5, block="bert", decoder="trained", embedding="trained", d=16)
    g = torch.Generator().manual_seed(4)
    mats = {n: torch.randn(getattr(m, n).shape[1:], generator=g, dtype=torch.float64)
            for n in ("W_V", "W_O", "W_dec", "b_V", "b_O", "b_dec", "W_1", "W_2")}
    with torch.no_grad():
        for n, x in mats.items():
            getattr(m, n)[0] = x
    W, b = value_path(m)
    E = m.W_E[0]
    torch.testing.assert_close(W, mats["W_dec"] @ mats["W_O"] @ mats["W_V"] @ E.T, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(b, mats["W_dec"] @ (mats["W_O"] @ mats["b_V"] + mats["b_O"]) + mats["b_dec"],
                               atol=1e-10, rtol=1e-10)
    with torch.no_grad():                       # the FFN is not on the path
        m.W_1[0] *= 7
    torch.testing.assert_close(value_path(m)[0], W)


def test_layernorm_value_path_is_the_effective_value_map():
    """With the embedding LayerNorm: (Ẽ W_Vᵀ + b_V)ᵀ up to the bias column (block contrast is blind to it)."""
    m = _model(V, v, emb_layernorm=True)
    W, b = value_path(m)
    Et = m.embed_table()[0]
    torch.testing.assert_close(W, (Et @ m.W_V[0].T).T, atol=1e-12, rtol=0)
    torch.testing.assert_close(b, m.b_V[0])
    shifted = (Et @ m.W_V[0].T + m.b_V[0]).T
    a, c = value_structure(W, v, NUM_SPECIAL), value_structure(shifted, v, NUM_SPECIAL)
    assert a["per_topic_contrast"] == pytest.approx(c["per_topic_contrast"], abs=1e-10)


# ---------------------------------------------------------------- robustness helpers


def _traj(gaps, se=0.01):
    return [{"step": s, "gap_layer0": g, "gap_se_layer0": se, "value_min_topic_contrast": 1.0,
             "value_contrast_noise": 0.1} for s, g in zip((0, 10, 20, 40, 80, 160), gaps)]


def test_persistent_onset_ignores_a_transient_crossing():
    t = _traj([0.0, 0.08, 0.01, 0.02, 0.07, 0.09])
    assert persistent_onset(t, 1) == 80
    assert end_of_stage1(t, 80)["step"] == 40
    assert persistent_onset(_traj([0.0, 0.08, 0.01, 0.02, 0.03, 0.04]), 1) is None
    assert end_of_stage1(t, None)["step"] == 160                      # stage 2 never began: the last checkpoint
    assert persistent_onset(_traj([0.0, 0.0, 0.06, 0.06, 0.06, 0.06], se=0.05), 1) is None   # not above 2 SE


def test_persistent_onset_reads_every_layer():
    t = _traj([0.0] * 6)
    for r, g in zip(t, (0.0, 0.0, 0.0, 0.2, 0.3, 0.3)):
        r |= {"gap_layer1": g, "gap_se_layer1": 0.01}
    assert persistent_onset(t, 1) is None and persistent_onset(t, 2) == 40


def test_variant_provenance():
    """The paper's own setting (one layer, one head, SGD or Adam, its masking and loss) gives paper claims; the
    two-layer, two-head, BERT-block, dynamic-masking, embedding-LayerNorm and squared-loss variants are derived."""
    paper = {"adam lr 0.01 (E4)", "adam lr 0.001", "sgd lr 1", "sgd lr 10", "E2 ce", "E4 ce"}
    labels = set(robustness_variants()) | set(squared_variants())
    assert {lab for lab in labels if variant_source(lab) is None} == paper
    assert all(variant_source(lab) in DERIVED.values() for lab in labels - paper)


def test_several_seeds_per_variant():
    assert all(len(c["seeds"]) == 3 for c in robustness_variants().values())
    assert all(len(c["seeds"]) == 3 for c in squared_variants().values())
    assert all(len(c["seeds"]) == 1 for c in robustness_variants(quick=True).values())


def _row(label, seed, n_layers=1, onset=120.0, gap=0.3):
    r = {"variant": label, "seed": seed, "n_layers": n_layers, "kq_trained": True, "steps": 3000,
         "value_min_topic_contrast": 1.0, "value_contrast_noise": 0.1, "value_r2_aI_bB_c11": 0.5,
         "wv_layer0_min_topic_contrast": 0.0, "wv_layer0_contrast_noise": 0.1, "stage2_onset": onset,
         "stage1_end_step": 100, "stage1_value_min_topic_contrast": 0.5, "stage1_value_contrast_noise": 0.1}
    for layer in range(n_layers):
        r |= {f"gap_layer{layer}": gap, f"gap_se_layer{layer}": 0.01}
    st = {"seed": seed, "stage2_began": onset is not None, "ratio_s1_end": 0.05, "ratio_t_v": 0.04,
          "t_s1_end": 100.0}
    for tv in ("structure", "plateau", "loss"):
        st[f"t_v_{tv}"] = 50.0
        for kq in ("kappa", "gap"):
            st |= {f"two_stage_{tv}_{kq}": True if onset else None, f"delay_{tv}_{kq}": 3.0, f"t_kq_{kq}": onset,
                   f"reason_{tv}_{kq}": None if onset else "K/Q never moved above noise (stage-2 onset never reached)"}
    return r | {"stage": st}


def test_table_claims_provenance_layers_and_too_short():
    rows = [_row("sgd lr 1", s, onset=None, gap=0.001) for s in range(3)]
    rows += [_row("2 layers", s, n_layers=2) for s in range(3)]
    claims = {c["id"]: c for c in _table_claims(rows, "e5", 24)}
    assert {c["source"] for i, c in claims.items() if i.startswith("e5-sgd")} == {"paper"}
    assert {c["source"] for i, c in claims.items() if i.startswith("e5-2 layers")} == {"derived"}
    assert "e5-2 layers-attention-layer0" in claims and "e5-2 layers-attention-layer1" in claims
    att = claims["e5-sgd lr 1-attention"]
    assert att["verdict"] == "inconclusive" and "run too short to reach stage 2" in att["reason"]
    assert claims["e5-2 layers-value-blocks"]["verdict"] == "holds"
    assert claims["e5-2 layers-value-blocks-stage1"]["numbers"]["stage1_end_step"] == [100] * 3
    assert "the last checkpoint (24 log-spaced)" in claims["e5-2 layers-value-blocks-stage1"]["definition"]
    for c in claims.values():
        assert c.get("quote") if c["source"] == "paper" else c.get("derived")
    # the two-stage claims of topic_common (literal, order): derived for the extrapolations, labelled too short
    assert claims["e5-2 layers-two-stage-order"]["source"] == "derived"
    assert claims["e5-2 layers-two-stage-order"]["verdict"] == "holds"
    assert claims["e5-2 layers-two-stage-literal"]["verdict"] == "holds"
    assert claims["e5-sgd lr 1-two-stage-order"]["source"] == "paper"
    assert "run too short to reach stage 2" in claims["e5-sgd lr 1-two-stage-order"]["reason"]
    # attention that moved away from same-topic keys is not "too short"
    rows = [_row("2 layers", s, n_layers=2, onset=None, gap=-0.3) for s in range(3)]
    claims = {c["id"]: c for c in _table_claims(rows, "e5", 8)}
    assert claims["e5-2 layers-attention-layer1"]["verdict"] == "fails"
    assert "not a run too short" in claims["e5-2 layers-value-blocks-stage1"]["definition"]
    assert "attention moved away" in claims["e5-2 layers-two-stage-order"]["reason"]


# ---------------------------------------------------------------- the single-seed rule


def test_one_seed_gives_no_noise_band():
    assert math.isnan(seed_se([0.7]))
    assert stats.decide(0.5, seed_se([0.7])) is None
    assert seed_se([1.0, 2.0, 3.0]) == pytest.approx(1 / math.sqrt(3))
