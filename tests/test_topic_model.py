"""The one-layer masked-LM model, the stage-1 convex optimum and the freeze flags
(docs/reproductions/topic.md#loss, docs/reproductions/topic.md#model-as-in-the-paper,
docs/reproductions/topic.md#stage-1-reference-optimum, docs/reproductions/topic.md#topicstage1,
docs/reproductions/topic.md#masked-lm-corruption, docs/reproductions/topic.md#model-flags)."""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from tdyn import runs
from tdyn.papers.topic.data import LdaDataConfig, LdaDataset
from tdyn.errors import ConfigError
from tdyn.papers.topic.analysis import E2, E3, E4
from tdyn.papers.topic.task import lda_config
from tdyn.papers.topic.model import TopicModelConfig, TopicTransformer
from tdyn.papers.topic.theory import bag_of_words, fit_softmax_regression, softmax_regression_loss

SMALL = {"num_train": 60, "num_dev": 20, "num_test": 2, "min_len": 10, "max_len": 20, "batch_size": 8,
         "probe_docs": 8}


def _model(S=2, seed=0, **flags):
    torch.manual_seed(0)
    m = TopicTransformer(TopicModelConfig(**flags), 104, 10, 4, S=S).double()
    m.reset_parameters([torch.Generator().manual_seed(seed + i) for i in range(S)], [1.0] * S)
    return m


def _batch(S=2, n=6, **kw):
    ds = LdaDataset(LdaDataConfig(**(SMALL | kw)))
    m = ds.masked["train"]
    return tuple(x[:n][None].expand(S, -1, -1) for x in (m.tokens, m.labels, m.keys))


@pytest.mark.parametrize("flags", [{}, {"n_heads": 2}, {"block": "bert", "decoder": "trained"},
                                   {"n_layers": 2, "embedding": "trained", "emb_layernorm": True},
                                   {"attention": "uniform"}])
def test_query_rows_equal_full_forward(flags):
    m = _model(**flags)
    tokens, labels, keys = _batch()
    full = m(tokens, keys)
    q = torch.tensor([[0, 3, 5], [2, 2, 7]])[None].expand(2, 2, 3)
    part = m(tokens[:, :2], keys[:, :2], queries=q)
    torch.testing.assert_close(part, torch.gather(full[:, :2], 2, q[..., None].expand(-1, -1, -1, 104)))


def test_forward_matches_explicit_formula_and_masks_selected_keys():
    m = _model(S=1, init="small_normal", init_eps=0.3)
    tokens, labels, keys = _batch(S=1, n=2)
    X = torch.nn.functional.one_hot(tokens[0, 0], 104).double()              # one document, one-hot rows
    Q, K = X @ m.W_Q[0].T + m.b_Q[0], X @ m.W_K[0].T + m.b_K[0]
    Vv = X @ m.W_V[0].T + m.b_V[0]
    s = (Q @ K.T / np.sqrt(104)).masked_fill(~keys[0, 0][None, :], -torch.inf)
    A = torch.softmax(s, -1)
    torch.testing.assert_close(m(tokens, keys)[0, 0], A @ Vv)                # W_dec = I
    At = m.attention(tokens, keys)[0, 0, 0]
    assert (At[:, ~keys[0, 0]] == 0).all()                                   # selected/PAD keys get no attention
    assert (~keys[0, 0] & (labels[0, 0] >= 0)).any()


def _dense_reference(m, tokens, keys):
    """The model's equations written out per member and document on all positions (module docstring of
    ``tdyn.papers.topic.model``): E = W_E X (LN'd with T₀); Q, K, V = E Wᵀ + b; A = softmax(Q Kᵀ/√d_h + M)
    per head; H = A V; the BERT tail; logits = H W_decᵀ + b_dec. Returns (logits, attention per layer)."""
    S, B, L = tokens.shape
    c, d = m.cfg, m.d
    h = c.n_heads
    dh = d // h
    F = torch.nn.functional

    def w(name, s, layer):
        p = getattr(m, name, None)
        if p is None:
            return None
        p = p[s]
        return p[layer] if c.n_layers > 1 and isinstance(getattr(m, name), torch.nn.Parameter) else p

    def lin(x, W, b):
        return x @ W.T + (b if b is not None else 0)

    def ln(x, g, b):
        mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-12) * g + b

    dt = m.W_dec.dtype
    logits, attns = torch.zeros(S, B, L, m.V, dtype=dt), [torch.zeros(S, B, h, L, L, dtype=dt) for _ in range(c.n_layers)]
    for s in range(S):
        for b in range(B):
            X = F.one_hot(tokens[s, b], m.V).to(dt)                            # X one-hot [L, V]
            E = X @ m.W_E[s]                                                   # (1)
            if c.emb_layernorm:
                E = ln(E + m.T_0[s], m.ln_gamma[s], m.ln_beta[s])
            for layer in range(c.n_layers):
                V = lin(E, w("W_V", s, layer), w("b_V", s, layer))            # (2)
                heads = []
                for j in range(h):
                    cols = slice(j * dh, (j + 1) * dh)
                    if c.attention == "uniform":
                        scores = torch.zeros(L, L, dtype=E.dtype)
                    else:
                        Q = lin(E, w("W_Q", s, layer), w("b_Q", s, layer))[:, cols]
                        K = lin(E, w("W_K", s, layer), w("b_K", s, layer))[:, cols]
                        scores = Q @ K.T / math.sqrt(dh)
                    A = torch.softmax(scores.masked_fill(~keys[s, b][None, :], -torch.inf), -1)   # (3)
                    attns[layer][s, b, j] = A
                    heads.append(A @ V[:, cols])                               # (4)
                H = torch.cat(heads, -1)
                if c.block == "bert":                                          # (4b)
                    x = ln(E + lin(H, w("W_O", s, layer), w("b_O", s, layer)), w("ln1_g", s, layer), w("ln1_b", s, layer))
                    ff = lin(F.gelu(lin(x, w("W_1", s, layer), w("b_1", s, layer))), w("W_2", s, layer), w("b_2", s, layer))
                    H = ln(x + ff, w("ln2_g", s, layer), w("ln2_b", s, layer))
                E = H
            logits[s, b] = lin(E, m.W_dec[s], m.b_dec[s] if hasattr(m, "b_dec") else None)   # (5)
    return logits, attns


FLAGS = [{}, {"n_heads": 2}, {"attention": "uniform"}, {"value": "block"}, {"value": "identity", "decoder": "trained"},
         {"embedding": "trained", "emb_layernorm": True}, {"block": "bert", "decoder": "trained"},
         {"n_layers": 2, "n_heads": 2, "embedding": "trained", "emb_layernorm": True, "block": "bert"},
         {"embedding": "trained", "d": 32, "value": "identity", "attention": "uniform", "decoder": "trained"},
         {"bias": False, "n_layers": 2, "init": "small_normal", "init_eps": 0.3},
         {"emb_layernorm": True, "n_heads": 4}, {"value": "identity", "n_heads": 2, "bias": False},
         {"attention": "uniform", "n_layers": 2, "n_heads": 2}]


@pytest.mark.parametrize("flags", FLAGS)
def test_forward_matches_dense_reference(flags):
    """Logits, attention and the loss equal a plain dense forward written from the equations."""
    m = _model(**flags)
    tokens, labels, keys = _batch(n=3)
    tokens, labels, keys = (torch.stack([x[0], x[1].flip(0)]) for x in (tokens, labels, keys))  # members differ
    with torch.no_grad():
        ref_logits, ref_attns = _dense_reference(m, tokens, keys)
        logits, attns = m(tokens, keys, return_attention=True)
        torch.testing.assert_close(logits, ref_logits)
        for a, r in zip(attns, ref_attns, strict=True):
            torch.testing.assert_close(a, r)
        sel = labels >= 0
        per = [torch.nn.functional.cross_entropy(ref_logits[s][sel[s]], labels[s][sel[s]]) for s in range(2)]
        torch.testing.assert_close(m.data_loss(tokens, labels, keys), torch.stack(per))


@pytest.mark.parametrize("flags", FLAGS)
def test_gradients_match_dense_reference(flags):
    """The gradient of the training loss (selected positions only, vocabulary-form attention, identity
    maps not multiplied) equals the gradient of the dense reference's loss, float64 (assert_close:
    rtol 1e-7, atol 1e-7)."""
    m = _model(**flags)
    tokens, labels, keys = _batch(n=3)
    tokens, labels, keys = (torch.stack([x[0], x[1].flip(0)]) for x in (tokens, labels, keys))
    sel = labels >= 0

    def grads(loss):
        m.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in m.named_parameters()}

    got = grads(m.data_loss(tokens, labels, keys).sum())
    ref_logits, _ = _dense_reference(m, tokens, keys)
    want = grads(sum(torch.nn.functional.cross_entropy(ref_logits[s][sel[s]], labels[s][sel[s]]) for s in range(2)))
    assert set(got) == set(want) and got
    for n in want:
        torch.testing.assert_close(got[n], want[n], msg=n)


def test_uniform_attention_model_is_the_convex_model_class():
    """E2 loss with W_V = W, b_V = b equals softmax regression on the visible bag of words (§4.3)."""
    m = _model(S=1, **E2)
    tokens, labels, keys = _batch(S=1, n=20)
    h, C = bag_of_words(tokens[0], keys[0], labels[0], 104)
    torch.testing.assert_close(m.data_loss(tokens, labels, keys)[0],
                               softmax_regression_loss(m.W_V[0], m.b_V[0], h, C))


def test_convex_solver_closed_form():
    """Features = one of 3 group indicators: the optimum predicts each group's empirical label
    frequencies, loss = conditional entropy of the counts."""
    C = torch.tensor([[5., 1., 0., 2.], [1., 1., 1., 1.], [0., 3., 7., 0.]]).repeat(2, 1)
    h = torch.eye(3).repeat(2, 1).double()
    W, b, loss = fit_softmax_regression(h, C.double(), max_iter=2000)
    P = C / C.sum(1, keepdim=True)
    expect = float(-(C * torch.where(P > 0, P.log(), torch.zeros_like(P))).sum() / C.sum())
    assert abs(loss - expect) < 1e-4
    fitted = torch.softmax(h @ W.T + b, 1)
    assert torch.allclose(fitted, P.double(), atol=2e-3)


def test_convex_solver_regularised_matches_scipy():
    g = torch.Generator().manual_seed(0)
    h = torch.rand(30, 5, generator=g, dtype=torch.float64)
    h = h / h.sum(1, keepdim=True)
    C = torch.randint(0, 4, (30, 4), generator=g).double()
    lam = 0.05
    W, b, _ = fit_softmax_regression(h, C, l2=lam)

    def f(x):
        x = torch.tensor(x, requires_grad=True)
        Wx, bx = x[:20].view(4, 5), x[20:]
        val = softmax_regression_loss(Wx, bx, h, C) + 0.5 * lam * (Wx ** 2).sum()
        val.backward()
        return float(val.detach()), x.grad.numpy()

    ref = minimize(f, np.zeros(24), jac=True, method="BFGS", options={"gtol": 1e-11})   # scipy's own solver
    assert abs(f(np.concatenate([W.flatten().numpy(), b.numpy()]))[0] - ref.fun) < 1e-9
    assert np.allclose(W.flatten().numpy(), ref.x[:20], atol=1e-3)


def test_squared_loss_and_l2():
    m = _model(S=1, init="small_normal", init_eps=0.1, loss="squared")
    tokens, labels, keys = _batch(S=1)
    out = m(tokens, keys)[0]
    sel = labels[0] >= 0
    target = torch.nn.functional.one_hot(labels[0][sel], 104).double()
    torch.testing.assert_close(m.data_loss(tokens, labels, keys)[0], ((out[sel] - target) ** 2).mean())
    m2 = _model(S=1, init="small_normal", init_eps=0.1, loss="squared", l2=0.3)
    pen = 0.5 * 0.3 * sum((p ** 2).sum() for p in m2.parameters())
    torch.testing.assert_close(m2.loss(tokens, labels, keys)[0], m2.data_loss(tokens, labels, keys)[0] + pen)


def test_inits():
    m = _model(S=2, init="small_uniform", init_eps=1e-3, embedding="trained", emb_init="small_normal")
    for n in ("W_Q", "W_K", "W_V"):
        p = getattr(m, n)
        assert (p >= 0).all() and (p < 1e-3).all() and p.mean() > 2e-4       # U[0, ε): not centred
    for n in ("b_Q", "b_K", "b_V"):
        assert (getattr(m, n) == 0).all()
    assert abs(float(m.W_E[:, 1:].detach().std()) - 1e-3) < 1e-4 and (m.W_E[:, 0] == 0).all()
    d = _model(S=2)
    assert d.W_Q.abs().max() <= 1 / np.sqrt(104) and not torch.equal(d.W_Q[0], d.W_Q[1])
    with pytest.raises(ConfigError, match="model.d"):
        TopicTransformer(TopicModelConfig(d=50), 104, 10, 4)


def test_block_value_matrix():
    B = TopicTransformer.block_matrix(104, 10, 4)
    assert B[:4].sum() == 0 and B[:, :4].sum() == 0 and B.sum() == 10 * 100
    assert B[4, 13] == 1 and B[13, 14] == 0 and B[14, 23] == 1


# ---------------------------------------------------------------- freeze flags, through the trainer


def _train(tmp_path, model, steps=6, **kw):
    from tdyn.train.trainer import train

    cfg = lda_config(model, data=SMALL, steps=steps, every=1, seeds=[0]) | kw
    cfg["checkpoint"] = {"schedule": "none", "steps": [3]}
    d = train(cfg, tmp_path / "run", progress=False)[0]
    return runs.params_of(runs.load_checkpoint(d, 0)), runs.params_of(runs.load_checkpoint(d, 3)), \
        runs.params_of(runs.load_checkpoint(d, "final")), d


def test_optim_freeze_keeps_parameters_bit_identical(tmp_path):
    cfg_freeze = {"W_V": {"always": True}, "W_K": {"until": 3}}
    p0, p3, pT, _ = _train(tmp_path, E4 | {"init": "default"},
                           optim={"steps": 6, "groups": {"all": {"params": ["W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V"],
                                                                  "optimizer": "adam", "lr": 0.01}},
                                  "freeze": cfg_freeze})
    assert torch.equal(p0["W_V"], pT["W_V"])
    assert torch.equal(p0["W_K"], p3["W_K"]) and not torch.equal(p3["W_K"], pT["W_K"])
    assert not torch.equal(p0["W_Q"], pT["W_Q"]) and not torch.equal(p0["b_V"], pT["b_V"])


def test_zero_init_attention_with_eps_zero_stays_zero(tmp_path):
    """docs/reproductions/topic.md#model-flags: with ε = 0 all keys and queries are 0, so W_K, W_Q never move."""
    p0, _, pT, _ = _train(tmp_path, E4 | {"init_eps": 0.0})
    for n in ("W_K", "W_Q", "b_K", "b_Q"):
        assert torch.equal(pT[n], torch.zeros_like(pT[n]))
    assert not torch.equal(p0["W_V"], pT["W_V"])


def test_fixed_components_are_not_parameters_and_stay_fixed(tmp_path):
    _, _, pT, d = _train(tmp_path, E3)
    assert set(pT) == {"W_Q", "b_Q", "W_K", "b_K"}
    m = TopicTransformer(TopicModelConfig(**E3), 104, 10, 4)
    assert torch.equal(m.W_V[0], TopicTransformer.block_matrix(104, 10, 4)) and torch.equal(m.W_dec[0], torch.eye(104))
    _, _, pT2, d2 = _train(tmp_path / "u", E2)
    assert set(pT2) == {"W_V", "b_V"}
    recs = runs.read_metrics(d2)
    for k in ("same_token", "same_topic", "diff_topic", "self"):                 # attention stays exactly uniform
        assert all(abs(r[f"topic.attention/{k}"] - 1) < 1e-5 for r in recs)


def test_ensemble_member_matches_solo_run(tmp_path):
    from tdyn.train.trainer import train

    cfg = lda_config(E4, data=SMALL, steps=4, every=2, seeds=[0, 1])
    cfg["checkpoint"] = {"schedule": "none"}
    dirs = train(cfg, tmp_path / "ens", progress=False)
    solo = train(cfg | {"seeds": [1]}, tmp_path / "solo", progress=False)[0]
    a = runs.params_of(runs.load_checkpoint(dirs[1], "final"))
    b = runs.params_of(runs.load_checkpoint(solo, "final"))
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-5, atol=1e-6)
