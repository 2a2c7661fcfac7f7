"""Tutorial causal LM: ensemble members equal single models, causality, attention entropy."""

import math

import pytest
import torch

from tdyn.models.lm import CausalLM, LMConfig, attention_entropy


def test_uniform_causal_attention_entropy_is_mean_log_i():
    T = 35
    A = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    expect = sum(math.log(i) for i in range(1, T + 1)) / T
    assert attention_entropy(A[None].double()).item() == pytest.approx(expect, abs=1e-6)
    assert expect == pytest.approx(2.632, abs=1e-3)


def _model(S, L=2, H=2):
    m = CausalLM(LMConfig(V=30, d=8, d_hid=12, n_layers=L, n_heads=H, dropout=0.0), S)
    m.reset_parameters([torch.Generator().manual_seed(i) for i in range(S)])
    return m


def test_ensemble_members_match_single_models_and_reference_layer():
    ens = _model(3)
    x = torch.randint(0, 30, (3, 4, 7), generator=torch.Generator().manual_seed(0))
    logits, attn = ens(x)
    single = _model(1)
    single.load_state_dict({k: v[:1] for k, v in ens.state_dict().items()})
    l1, a1 = single(x[:1])
    torch.testing.assert_close(l1[0], logits[0], rtol=1e-5, atol=1e-5)
    # member 0, layer 0 against torch's TransformerEncoderLayer (post-LN, ReLU) with the same weights
    layer = torch.nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=True)
    m = ens.layers[0]
    sd = {"self_attn.in_proj_weight": m.in_W[0], "self_attn.in_proj_bias": m.in_b[0],
          "self_attn.out_proj.weight": m.out_W[0], "self_attn.out_proj.bias": m.out_b[0],
          "linear1.weight": m.W1[0], "linear1.bias": m.b1[0], "linear2.weight": m.W2[0], "linear2.bias": m.b2[0],
          "norm1.weight": m.ln1_g[0], "norm1.bias": m.ln1_b[0], "norm2.weight": m.ln2_g[0], "norm2.bias": m.ln2_b[0]}
    layer.load_state_dict({k: v.detach() for k, v in sd.items()})
    layer.eval()
    X0 = ens.emb[0][x[0]] * math.sqrt(8) + ens.pe[:7]
    mask = torch.nn.Transformer.generate_square_subsequent_mask(7)
    _, w = layer.self_attn(X0, X0, X0, attn_mask=mask, need_weights=True)
    torch.testing.assert_close(attn[0][0], w, rtol=1e-5, atol=1e-6)
    ens1 = CausalLM(LMConfig(V=30, d=8, d_hid=12, n_layers=1, n_heads=2, dropout=0.0), 3)
    ens1.load_state_dict({k: v for k, v in ens.state_dict().items() if not k.startswith("layers.1.")})
    ref = layer(X0, src_mask=mask, is_causal=True)
    out = ens1(x)[0][0] - ens1.dec_b[0]
    torch.testing.assert_close(out, ref @ ens1.dec_W[0].T, rtol=1e-4, atol=1e-4)


def test_causal_and_rows_sum_to_one():
    m = _model(2)
    x = torch.randint(0, 30, (2, 3, 6), generator=torch.Generator().manual_seed(1))
    logits, attn = m(x)
    x2 = x.clone()
    x2[..., -1] = (x2[..., -1] + 1) % 30
    torch.testing.assert_close(m(x2)[0][..., :-1, :], logits[..., :-1, :])
    for A in attn:
        torch.testing.assert_close(A.sum(-1), torch.ones_like(A.sum(-1)))
        assert (A.triu(1) == 0).all()
