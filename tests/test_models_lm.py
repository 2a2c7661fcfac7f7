"""Tutorial causal LM: ensemble members equal single models, causality, attention entropy."""

import math

import pytest
import torch

from tdyn.papers.real_text.model import CausalLM, LMConfig, attention_entropy


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


# ---------------------------------------------------------------- the fused decoder + cross-entropy (issue 18)

def _dense_ce(X, W, b, y):
    V = W.shape[1]
    logits = X @ W.transpose(1, 2) + b[:, None]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1), reduction="none").view(y.shape).mean(1)


@pytest.mark.parametrize("chunk,group", [(7, None), (128, 1), (1000, 2), (None, None)])
def test_linear_cross_entropy_equals_the_dense_path_in_float64(chunk, group):
    """Loss and the gradients of X, W, b (weighted per member, as the trainer's sum of member losses is
    not) equal the dense logits + F.cross_entropy to float64 rounding, for chunks that do and do not
    divide V, with targets in every chunk, and for member groups that do and do not divide S."""
    from tdyn.papers.real_text.model import linear_cross_entropy

    g = torch.Generator().manual_seed(0)
    S, N, d, V = 3, 70, 16, 1000
    X = torch.randn(S, N, d, dtype=torch.float64, generator=g, requires_grad=True)
    W = torch.randn(S, V, d, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(S, V, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randint(0, V, (S, N), generator=g)
    w = torch.randn(S, dtype=torch.float64, generator=g)
    ref = _dense_ce(X, W, b, y)
    out = linear_cross_entropy(X, W, b, y, chunk, group)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for a, r in zip(torch.autograd.grad((out * w).sum(), (X, W, b)), torch.autograd.grad((ref * w).sum(), (X, W, b))):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-12)
    with torch.no_grad():   # no gradient wanted: only the loss (pass 1)
        torch.testing.assert_close(linear_cross_entropy(X, W, b, y, chunk, group), ref.detach(), rtol=0, atol=1e-12)


def test_bf16_autocast_loss_uses_the_fused_path_and_stays_close(monkeypatch):
    """Under bf16 autocast CausalLM.loss runs the fused path (and only there), and its loss and gradients
    are as close to float32 as torch's own autocast of the dense path: each gradient's distance to the
    float32 one at most 1.1× the dense autocast's (+1e-4 relative), the loss within 1e-3 of float32 (bf16
    keeps 8 bits, so its gradients here differ from float32 by 0.01%–5% relative, either way)."""
    from tdyn.papers.real_text import model as lm

    calls = []
    fused = lm.linear_cross_entropy
    monkeypatch.setattr(lm, "linear_cross_entropy", lambda *a, **k: calls.append(1) or fused(*a, **k))
    m = CausalLM(LMConfig(V=3000, d=32, d_hid=32, n_layers=1, n_heads=1, dropout=0.0, max_len=12), 2)
    m.reset_parameters([torch.Generator().manual_seed(i) for i in range(2)])
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 3000, (2, 5, 12), generator=g), torch.randint(0, 3000, (2, 5, 12), generator=g)
    params = list(m.parameters())
    ref = m.loss(x, y)
    gref = torch.autograd.grad(ref.sum(), params)
    assert not calls
    with torch.autocast("cpu", dtype=torch.bfloat16):
        X, _ = m.hidden(x)
        logits = lm._bmm_linear(X, m.dec_W, m.dec_b)
        dense = torch.nn.functional.cross_entropy(logits.flatten(0, 2).float(), y.flatten(), reduction="none")
        dense = dense.view(2, -1).mean(1)
        assert not calls
        out = m.loss(x, y)
        assert out.dtype == torch.float32 and calls == [1]
    gdense = torch.autograd.grad(dense.sum(), params)
    gout = torch.autograd.grad(out.sum(), params)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-3)
    for a, d, r in zip(gout, gdense, gref):
        assert a.dtype == torch.float32
        assert (a - r).norm() <= 1.1 * (d - r).norm() + 1e-4 * r.norm(), ((a - r).norm(), (d - r).norm(), r.norm())


def test_autocast_config_trains_in_bf16_with_a_float32_master_copy(tmp_path):
    from tdyn import runs
    from tdyn.config import validate_config
    from tdyn.errors import ConfigError
    from tdyn.train.trainer import train

    NAMES = ["emb", "dec_W", "dec_b"] + [f"layers.0.{n}" for n in ("in_W", "in_b", "out_W", "out_b", "ln1_g", "ln1_b",
                                                                   "ln2_g", "ln2_b", "W1", "b1", "W2", "b2")]
    cfg = {"task": "corpus_lm", "data": {"corpus": "fixture", "vocab_size": 200, "batch_size": 4, "bptt": 8},
           "model": {"d": 16, "d_hid": 16, "dropout": 0.0}, "seeds": [0, 1],
           "optim": {"steps": 3, "groups": {"all": {"params": NAMES, "lr": 1.0}}},
           "checkpoint": {"schedule": "none"}}
    train(validate_config(cfg), tmp_path / "fp32", progress=False)
    train(validate_config(cfg | {"autocast": "bfloat16"}), tmp_path / "bf16", progress=False)
    a = runs.read_checkpoint(runs.checkpoint_path(tmp_path / "fp32" / "seed=0", "final"))[0]
    b = runs.read_checkpoint(runs.checkpoint_path(tmp_path / "bf16" / "seed=0", "final"))[0]
    assert all(b[k].dtype == torch.float32 for k in b if k.startswith("param/"))
    moved = [k for k in a if k.startswith("param/") and not torch.equal(a[k], b[k])]
    assert moved and all(torch.allclose(a[k], b[k], atol=1e-2) for k in moved)   # bf16 rounding, not a new model
    with pytest.raises(ConfigError, match="autocast"):
        validate_config(cfg | {"autocast": "bfloat16", "dtype": "float64"})


def test_linear_cross_entropy_refuses_bad_targets_and_sizes():
    from tdyn.papers.real_text.model import linear_cross_entropy

    X, W, b = torch.zeros(1, 4, 3), torch.zeros(1, 10, 3), torch.zeros(1, 10)
    for y in (torch.tensor([[0, 1, 10, 2]]), torch.tensor([[0, -100, 1, 2]])):
        with pytest.raises(ValueError, match=r"targets must lie in \[0, 10\)"):
            linear_cross_entropy(X, W, b, y)
    with pytest.raises(ValueError, match="at least 1"):
        linear_cross_entropy(X, W, b, torch.zeros(1, 4, dtype=torch.long), chunk=0)


def test_bf16_member_computes_the_same_bits_in_ensembles_of_any_size():
    """Under bf16 autocast a member's loss and gradients do not depend on how many members train beside
    it (chunking and grouping do not depend on S; bf16's rounding would amplify any difference)."""
    cfg = LMConfig(V=3000, d=32, d_hid=32, n_layers=1, n_heads=2, dropout=0.0, max_len=12)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randint(0, 3000, (1, 5, 12), generator=g), torch.randint(0, 3000, (1, 5, 12), generator=g)
    out = []
    for S in (2, 3):
        m = CausalLM(cfg, S)
        m.reset_parameters([torch.Generator().manual_seed(7) for _ in range(S)])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m.loss(x.expand(S, -1, -1), y.expand(S, -1, -1))
        out.append((loss[0], [p[0] for p in torch.autograd.grad(loss.sum(), list(m.parameters()))]))
    assert torch.equal(out[0][0], out[1][0])
    assert all(torch.equal(a, b) for a, b in zip(out[0][1], out[1][1]))


# ---------------------------------------------------------------- the dense decoder + cross-entropy in fewer passes (issue 35)

def _dense_token_ce(X, W, b, y):
    """The autograd path CausalLM.loss took before decoder_cross_entropy: _bmm_linear's logits, F.cross_entropy."""
    from tdyn.papers.real_text.model import _bmm_linear

    logits = _bmm_linear(X, W, b)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)


@pytest.mark.parametrize("dtype,V", [(torch.float32, 1000), (torch.float32, 1001), (torch.float64, 333)])
def test_decoder_cross_entropy_is_bit_equal_to_the_dense_autograd_path(dtype, V):
    """Per-token losses and the gradients of X, W, b (weighted per token, repeated targets, a vocabulary
    that is and is not a multiple of the vector width) equal the dense autograd path bit for bit
    (torch.equal), twice in a row with the same scratch dict, whose zero buffer is zero again after each
    backward and reused; with no gradient wanted only the loss is formed."""
    from tdyn.papers.real_text.model import decoder_cross_entropy

    g = torch.Generator().manual_seed(0)
    S, N, d = 2, 70, 16
    X = (torch.randn(S, N, d, generator=g) * 2).to(dtype).requires_grad_()
    W = torch.randn(S, V, d, generator=g).to(dtype).requires_grad_()
    b = torch.randn(S, V, generator=g).to(dtype).requires_grad_()
    y = torch.randint(0, V, (S, N), generator=g)
    y[:, 1] = y[:, 0]
    w = torch.rand(S, N, generator=g).to(dtype)
    scratch = {}
    ref = _dense_token_ce(X, W, b, y)
    gref = torch.autograd.grad((ref * w).sum(), (X, W, b))
    for _ in range(2):
        out = decoder_cross_entropy(X, W, b, y, scratch)
        assert torch.equal(out, ref)
        for a, r in zip(torch.autograd.grad((out * w).sum(), (X, W, b)), gref):
            assert a.shape == r.shape and torch.equal(a, r)
        (zero,) = scratch.values()
        assert not zero.any()
    assert next(iter(scratch.values())) is zero
    with torch.no_grad():
        assert torch.equal(decoder_cross_entropy(X, W, b, y), ref.detach())


def test_causal_lm_loss_trains_bit_equal_to_the_dense_autograd_path():
    """Three SGD steps of a 2-member, 2-layer CausalLM with dropout: loss and every parameter's gradient
    of CausalLM.loss (decoder_cross_entropy) equal those of the dense path written out, bit for bit, at
    every step, and so do the parameters after."""
    cfg = LMConfig(V=500, d=16, d_hid=24, n_layers=2, n_heads=2, dropout=0.3, max_len=9)
    a, b = CausalLM(cfg, 2), CausalLM(cfg, 2)
    for m in (a, b):
        m.reset_parameters([torch.Generator().manual_seed(i) for i in range(2)])
    g = torch.Generator().manual_seed(5)
    for step in range(3):
        x, y = torch.randint(0, 500, (2, 4, 9), generator=g), torch.randint(0, 500, (2, 4, 9), generator=g)
        for i in range(2):
            a.dropout_gens[i].manual_seed(10 * step + i)
            b.dropout_gens[i].manual_seed(10 * step + i)
        la = a.loss(x, y)
        X, _ = b.hidden(x)
        lb = _dense_token_ce(X.reshape(2, -1, 16), b.dec_W, b.dec_b, y.reshape(2, -1)).mean(1)
        assert torch.equal(la, lb)
        ga = torch.autograd.grad(la.sum(), list(a.parameters()))
        gb = torch.autograd.grad(lb.sum(), list(b.parameters()))
        assert all(torch.equal(u, v) for u, v in zip(ga, gb))
        with torch.no_grad():
            for m, gr in ((a, ga), (b, gb)):
                for p, q in zip(m.parameters(), gr):
                    p.sub_(2.0 * q)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
