"""Named activations (tdyn.models.activations, docs/activations.md): for each built-in model the cached tensors
equal the paper's equations written out here from the parameters (float64, small sizes, loops per member and
sequence), the output with a capture equals the output without bit for bit (the speed paths included), unknown
names are refused in one line, and probes written against the mechanism give the numbers of the shipped probes
that compute the same thing."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tdyn.errors import UserError
from tdyn.models import Stacked, activations
from tdyn.models.activations import capture, run_with_cache
from tdyn.papers.decision_list.model import DecisionListModel, DecisionListModelConfig
from tdyn.papers.real_text.model import CausalLM, LMConfig, attention_entropy
from tdyn.papers.scan_snap import kernels
from tdyn.papers.scan_snap.kernels import key_bags, key_support
from tdyn.papers.scan_snap.model import YZConfig, YZModel
from tdyn.papers.topic import probes as tp
from tdyn.papers.topic.data import NUM_SPECIAL
from tdyn.papers.topic.model import TopicModelConfig, TopicTransformer
from tdyn.probes import PROBES, ProbeContext, probe


def _gens(S, offset=0):
    return [torch.Generator().manual_seed(offset + i) for i in range(S)]


def _same(a, b):
    """Bit for bit, through tuples and lists (the LM returns (logits, attentions))."""
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


def _check_cache(cache, want, S):
    assert set(cache) == set(want), (sorted(cache), sorted(want))
    for k, v in want.items():
        assert cache[k].shape[0] == S and not cache[k].requires_grad, k
        torch.testing.assert_close(cache[k], v, msg=k)


# ---------------------------------------------------------------- Scan and Snap (Tian et al. 2023, Eqn 1-2)

M_SS, L_SS, S_SS = 40, 10, 3


def _yz(**cfg):
    m = YZModel(YZConfig(M=M_SS, init="torch_default", **cfg), S=S_SS).double()
    m.reset_parameters(_gens(S_SS), [3.0] * S_SS)
    if cfg.get("parameterization") == "embedding":
        with torch.no_grad():
            for p, g in zip(m.parameters(), _gens(4, 10)):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return m


def _yz_x(seed=1):
    return torch.randint(0, M_SS, (S_SS, 5, L_SS), generator=torch.Generator().manual_seed(seed))


def _yz_reference(m, x):
    """Eqn 1-2 per member and sequence: b_T = softmax_t z_{x_T x_t}, Xᵀb_T, LN, (§7's residual), logits Yᵀ·."""
    c, M = m.cfg, m.cfg.M
    out = {k: [] for k in ("scores", "attention", "context", "attended", "logits")}
    for s in range(x.shape[0]):
        if c.parameterization == "yz":
            Z, Y = m.Z[s], m.Y[s]
        else:   # Z = U W_Q W_Kᵀ Uᵀ/√d, Y = U W_Vᵀ Uᵀ
            U = m.U[s]
            Z = U @ m.W_Q[s] @ m.W_K[s].T @ U.T / math.sqrt(c.d)
            Y = U @ m.W_V[s].T @ U.T
        rows = {k: [] for k in out}
        for seq in x[s]:
            q = int(seq[-1])
            keys = seq if c.include_query_key else seq[:-1]
            z = torch.stack([Z[q, int(k)] for k in keys])
            b = torch.exp(z - z.max()) / torch.exp(z - z.max()).sum()
            ctx = torch.zeros(M, dtype=Z.dtype)
            for t, k in enumerate(keys):
                ctx[int(k)] += b[t]
            u = ctx / ctx.norm() if c.normalize else ctx
            if c.residual:
                u = u + F.one_hot(torch.tensor(q), M).to(u)
                u = u / u.norm() if c.normalize else u
            for k, v in zip(rows, (z, b, ctx, u, Y.T @ u)):
                rows[k].append(v)
        for k in out:
            out[k].append(torch.stack(rows[k]))
    return {k: torch.stack(v).detach() for k, v in out.items()}


@pytest.mark.parametrize("cfg", [{}, {"normalize": False}, {"residual": True}, {"include_query_key": True},
                                 {"parameterization": "embedding", "d": 6}])
def test_scan_snap_dense_path_equals_the_equations(cfg):
    m = _yz(**cfg)
    x = _yz_x()
    plain = m(x)
    out, cache = run_with_cache(m, x)
    assert torch.equal(out, plain)
    _check_cache(cache, _yz_reference(m, x), S_SS)
    assert set(activations.available(m)) == set(cache)


@pytest.mark.parametrize("cfg, decoder", [({}, True), ({}, False), ({"normalize": False}, True),
                                          ({"residual": True}, False)])
def test_scan_snap_support_paths_give_the_dense_tensors(cfg, decoder, monkeypatch):
    """The training path (attention on each sequence's distinct keys; with ``decoder`` the support decoder, which
    never forms the attended vector): the same output with a capture as without, bit for bit, and the cache holds
    the dense tensors of the equations (to rounding: the kernels sum in another order)."""
    m = _yz(**cfg)
    x = _yz_x()
    idx, count = key_support(x, M_SS)
    support = (idx, count.double().log()) + (key_bags(idx, M_SS) if decoder else ())
    calls = []
    monkeypatch.setattr(kernels, "support_decode", lambda *a, f=kernels.support_decode: calls.append(1) or f(*a))
    plain = m(x, support)
    out, cache = run_with_cache(m, x, support)
    assert torch.equal(out, plain) and len(calls) == (2 if decoder else 0)
    _check_cache(cache, _yz_reference(m, x), S_SS)


def test_scan_snap_training_batch_has_no_key_positions():
    """The training batch holds only the query column (the keys enter through the support): per-position tensors
    asked for by name are refused (never an empty or different tensor); ``names=None`` records the others."""
    m = _yz()
    x = _yz_x()
    idx, count = key_support(x, M_SS)
    support = (idx, count.double().log())
    with pytest.raises(UserError, match="query column") as e:
        run_with_cache(m, x[..., -1:], support, names=["attention"])
    assert "\n" not in str(e.value)
    _, cache = run_with_cache(m, x[..., -1:], support)
    ref = _yz_reference(m, x)
    assert set(cache) == {"context", "attended", "logits"}
    for k in cache:
        torch.testing.assert_close(cache[k], ref[k])


def test_scan_snap_only_what_is_asked_is_recorded():
    m = _yz()
    x = _yz_x()
    _, cache = run_with_cache(m, x, names=["attention"])
    assert list(cache) == ["attention"]
    _, cache = run_with_cache(m, x, names="*s")     # a pattern: scores, logits
    assert set(cache) == {"scores", "logits"}


# ---------------------------------------------------------------- topic model (Li, Li & Risteski 2023, (1)-(5))

V_T, v_T = 104, 10


def _topic(S=2, **flags):
    m = TopicTransformer(TopicModelConfig(**({"init": "default"} | flags)), V_T, v_T, NUM_SPECIAL, S=S).double()
    m.reset_parameters(_gens(S), [3.0] * S)
    return m


def _mlm_batch(S=2, B=3, L=24, seed=5):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(NUM_SPECIAL, V_T, (S, B, L), generator=g)
    tokens[:, :, 0] = 2                                                        # START
    tokens[:, 1, 18:] = 0                                                      # PAD tail
    tokens[:, 0, 5] = tokens[:, 0, 7]                                          # a repeated id
    sel = (torch.rand(S, B, L, generator=g) < 0.2) & (tokens > 3)
    labels = torch.where(sel, tokens, -100)
    tokens = torch.where(sel & (torch.rand(S, B, L, generator=g) < 0.8), 1, tokens)   # MASK
    return tokens, labels, (tokens != 0) & ~sel


def _topic_reference(m, tokens, keys, queries=None):
    """Equations (1)-(5) and (4b) per member and document on every position, written out."""
    S, B, L = tokens.shape
    c, d = m.cfg, m.d
    h = c.n_heads
    dh = d // h

    def w(name, s, layer):
        p = getattr(m, name, None)
        if p is None:
            return None
        p = p[s]
        return p[layer] if c.n_layers > 1 and isinstance(getattr(m, name), nn.Parameter) else p

    def lin(x, W, b):
        return x @ W.T + (b if b is not None else 0)

    def ln(x, g, b):
        mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-12) * g + b

    out = {}

    def put(name, s, b, value):
        out.setdefault(name, {})[(s, b)] = value

    for s in range(S):
        for b in range(B):
            X = F.one_hot(tokens[s, b], m.V).double()                          # X one-hot [L, |V|]
            E = X @ m.W_E[s]                                                   # (1)
            if c.emb_layernorm:
                E = ln(E + m.T_0[s], m.ln_gamma[s], m.ln_beta[s])
            put("embedding", s, b, E)
            for layer in range(c.n_layers):
                last = layer == c.n_layers - 1
                q = queries[s, b] if (queries is not None and last) else torch.arange(L)
                Vv = lin(E, w("W_V", s, layer), w("b_V", s, layer))           # (2)
                scores, attn, heads = [], [], []
                for j in range(h):
                    cols = slice(j * dh, (j + 1) * dh)
                    if c.attention == "uniform":
                        sc = torch.zeros(len(q), L, dtype=E.dtype)
                    else:
                        Q = lin(E, w("W_Q", s, layer), w("b_Q", s, layer))[q][:, cols]
                        K = lin(E, w("W_K", s, layer), w("b_K", s, layer))[:, cols]
                        sc = Q @ K.T / math.sqrt(dh)
                    A = torch.softmax(sc.masked_fill(~keys[s, b][None, :], -torch.inf), -1)   # (3)
                    scores.append(sc), attn.append(A), heads.append(A @ Vv[:, cols])           # (4)
                H = torch.cat(heads, -1)
                if c.attention != "uniform":
                    put(f"layer{layer}.scores", s, b, torch.stack(scores))
                put(f"layer{layer}.attention", s, b, torch.stack(attn))
                put(f"layer{layer}.values", s, b, Vv)
                put(f"layer{layer}.attended", s, b, H)
                if c.block == "bert":                                          # (4b)
                    x = ln(E[q] + lin(H, w("W_O", s, layer), w("b_O", s, layer)), w("ln1_g", s, layer), w("ln1_b", s, layer))
                    ff = lin(F.gelu(lin(x, w("W_1", s, layer), w("b_1", s, layer))), w("W_2", s, layer), w("b_2", s, layer))
                    H = ln(x + ff, w("ln2_g", s, layer), w("ln2_b", s, layer))
                    put(f"layer{layer}.out", s, b, H)
                E = H
            put("logits", s, b, lin(E, m.W_dec[s], m.b_dec[s] if hasattr(m, "b_dec") else None))   # (5)
    return {k: torch.stack([torch.stack([v[(s, b)] for b in range(B)]) for s in range(S)]).detach()
            for k, v in out.items()}


TOPIC_FLAGS = [{}, {"n_heads": 2}, {"attention": "uniform"}, {"value": "block"},
               {"embedding": "trained", "emb_layernorm": True, "decoder": "trained"},
               {"block": "bert", "decoder": "trained"},
               {"n_layers": 2, "n_heads": 2, "embedding": "trained", "emb_layernorm": True, "block": "bert"},
               {"bias": False, "n_layers": 2}]


@pytest.mark.parametrize("flags", TOPIC_FLAGS)
def test_topic_forward_equals_the_equations(flags):
    m = _topic(**flags)
    tokens, _, keys = _mlm_batch()
    with torch.no_grad():
        plain = m(tokens, keys)
        out, cache = run_with_cache(m, tokens, keys)
        assert torch.equal(out, plain)
        _check_cache(cache, _topic_reference(m, tokens, keys), 2)
        assert set(cache) == set(activations.available(m))
        q = torch.tensor([[0, 3, 5], [2, 2, 7], [1, 4, 6]])[None].expand(2, 3, 3)   # query positions
        out, cache = run_with_cache(m, tokens, keys, queries=q, names=["layer*.attention", "logits"])
        assert torch.equal(out, m(tokens, keys, queries=q))
        ref = _topic_reference(m, tokens, keys, q)
        _check_cache(cache, {k: ref[k] for k in cache}, 2)


@pytest.mark.parametrize("flags", [{}, {"value": "identity"}, {"n_heads": 2}])
def test_topic_loss_under_capture_is_the_same_loss(flags):
    """``data_loss`` takes the padded rows under a capture (the selected-rows kernel forms no logits): the loss
    is the kernel's bit for bit, and the logits are those of ``model(tokens, keys, queries)`` at the selected
    positions."""
    m = _topic(**flags)
    tokens, labels, keys = _mlm_batch()
    with torch.no_grad():
        plain = m.data_loss(tokens, labels, keys)
        loss, cache = run_with_cache(m.data_loss, tokens, labels, keys, names=["logits", "layer0.attention"])
    assert torch.equal(loss, plain)
    sel = labels >= 0
    q = torch.argsort((~sel).to(torch.uint8), dim=-1, stable=True)[..., :int(sel.sum(-1).max())]
    torch.testing.assert_close(cache["logits"], m(tokens, keys, queries=q).detach())


# ---------------------------------------------------------------- decision lists (Eqn 1)


def _decision_list(S=2, L=7):
    m = DecisionListModel(DecisionListModelConfig(L), S=S)
    with torch.no_grad():
        for p, g in zip((m.W, m.V), _gens(2, 3)):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


def test_decision_list_equals_the_equations():
    m = _decision_list()
    s = torch.randint(0, 7, (4, 5), generator=torch.Generator().manual_seed(0))
    plain = m(s)
    out, cache = run_with_cache(m, s)
    assert torch.equal(out, plain)
    want = {k: [] for k in ("scores", "attention", "values", "logits", "log_probs")}
    for i in range(2):
        rows = {k: [] for k in want}
        for seq in s:
            X = F.one_hot(seq, 7).double().T                                   # L × n, column j = e_{s_j}
            sc = X.T @ m.W[i] @ X                                              # XᵀWX
            A = torch.softmax(sc, dim=0)                                       # column-wise σ
            VX = m.V[i] @ X
            Zs = VX @ A                                                        # V X σ(XᵀWX)
            for k, v in zip(rows, (sc, A, VX, Zs, torch.log_softmax(Zs, dim=0))):
                rows[k].append(v)
        for k in want:
            want[k].append(torch.stack(rows[k]))
    _check_cache(cache, {k: torch.stack(v).detach() for k, v in want.items()}, 2)
    _, cache = run_with_cache(m.logits, s)             # a method: what it computes (no outer σ)
    assert set(cache) == {"scores", "attention", "values", "logits"}
    with pytest.raises(UserError, match="log_probs"):
        run_with_cache(m.logits, s, names=["log_probs"])


# ---------------------------------------------------------------- the real-text causal LM


def _lm(S=2, L=2, H=2, dropout=0.0):
    m = CausalLM(LMConfig(V=30, d=8, d_hid=12, n_layers=L, n_heads=H, dropout=dropout), S).double()
    m.reset_parameters(_gens(S))
    return m


def _lm_reference(m, x):
    """The tutorial LM per member, written out (post-LN layers, causal softmax attention per head)."""
    c = m.cfg
    dh = c.d // c.n_heads
    T = x.shape[-1]

    def ln(t, g, b):
        mu, var = t.mean(-1, keepdim=True), t.var(-1, unbiased=False, keepdim=True)
        return (t - mu) / torch.sqrt(var + 1e-5) * g + b

    causal = torch.full((T, T), -torch.inf, dtype=torch.float64).triu(1)
    out = {}
    for s in range(x.shape[0]):
        X = m.emb[s][x[s]] * math.sqrt(c.d) + m.pe[:T]
        out.setdefault("embed", []).append(X)
        for i, p in enumerate(m.layers):
            qkv = X @ p.in_W[s].T + p.in_b[s]
            Q, K, Vv = qkv[..., :c.d], qkv[..., c.d:2 * c.d], qkv[..., 2 * c.d:]
            sc, A, heads = [], [], []
            for j in range(c.n_heads):
                cols = slice(j * dh, (j + 1) * dh)
                sc.append(Q[..., cols] @ K[..., cols].transpose(-1, -2) / math.sqrt(dh))
                A.append(torch.softmax(sc[-1] + causal, -1))
                heads.append(A[-1] @ Vv[..., cols])
            O = torch.cat(heads, -1)
            P = O @ p.out_W[s].T + p.out_b[s]
            mid = ln(X + P, p.ln1_g[s], p.ln1_b[s])
            ff = torch.relu(mid @ p.W1[s].T + p.b1[s]) @ p.W2[s].T + p.b2[s]
            X = ln(mid + ff, p.ln2_g[s], p.ln2_b[s])
            for k, v in (("scores", torch.stack(sc, 1)), ("attention", torch.stack(A, 1)), ("attended", O),
                         ("attn_out", P), ("mid", mid), ("mlp_out", ff), ("out", X)):
                out.setdefault(f"layer{i}.{k}", []).append(v)
        out.setdefault("logits", []).append(X @ m.dec_W[s].T + m.dec_b[s])
    return {k: torch.stack(v).detach() for k, v in out.items()}


def test_lm_equals_the_equations():
    m = _lm().eval()
    x = torch.randint(0, 30, (2, 3, 6), generator=torch.Generator().manual_seed(0))
    plain = m(x)
    out, cache = run_with_cache(m, x)
    assert _same(out, plain)
    _check_cache(cache, _lm_reference(m, x), 2)
    assert set(cache) == set(activations.available(m))
    y = torch.randint(0, 30, (2, 3, 6), generator=torch.Generator().manual_seed(1))
    loss, cache = run_with_cache(m.loss, x, y, names=["logits"])
    assert torch.equal(loss, m.loss(x, y))
    torch.testing.assert_close(cache["logits"], plain[0].detach())


def test_lm_fused_loss_gives_the_logits_only_when_asked():
    """Under bf16 autocast ``loss`` fuses decoder and cross-entropy and never forms the logits: asked for, they
    are formed (the dense decoder under the same autocast), and the loss is the same."""
    m = CausalLM(LMConfig(V=30, d=8, d_hid=12, n_layers=1, n_heads=2, dropout=0.0), 2).eval()
    m.reset_parameters(_gens(2))
    x = torch.randint(0, 30, (2, 3, 6), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 30, (2, 3, 6), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = m.loss(x, y)
        loss, cache = run_with_cache(m.loss, x, y, names=["logits"])
        dense = m(x)[0]
    assert torch.equal(loss, plain)
    assert torch.equal(cache["logits"], dense.detach())


def test_lm_dropout_streams_are_untouched_by_a_capture():
    """In training mode (dropout) the captured forward draws the same masks: the next forward is unchanged."""
    a, b = _lm(dropout=0.3).train(), _lm(dropout=0.3).train()
    x = torch.randint(0, 30, (2, 3, 6), generator=torch.Generator().manual_seed(0))
    out_a = a(x)
    out_b, _ = run_with_cache(b, x)
    assert _same(out_a, out_b) and _same(a(x), b(x))


# ---------------------------------------------------------------- the mechanism


def test_unknown_names_are_one_line_listing_the_allowed():
    m = _yz()
    for bad in (["attn"], "layer*.attention", [3]):
        with pytest.raises(UserError) as e:
            run_with_cache(m, _yz_x(), names=bad)
        assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="allowed: scores, attention, context, attended, logits"):
        run_with_cache(m, _yz_x(), names=["attn"])
    with pytest.raises(UserError, match="layer2.attention.*allowed: embedding, layer0.scores"):
        run_with_cache(_topic(), *_mlm_batch()[::2], names=["layer2.attention"])
    with pytest.raises(UserError, match="declares no named activations"):
        run_with_cache(nn.Linear(2, 2), torch.ones(2))


def test_nothing_is_recorded_or_routed_without_a_capture():
    m = _yz()
    assert activations.recording(m) is None and not activations._ACTIVE
    with capture(m, ["logits"]) as cache:
        assert activations.recording(m) is cache
        with capture(m, ["attention"]) as inner:        # nested: the inner block records, the outer resumes
            m(_yz_x())
        m(_yz_x())
    assert set(inner) == {"attention"} and set(cache) == {"logits"}
    assert not activations._ACTIVE
    with pytest.raises(RuntimeError, match="boom"):
        with capture(m):
            raise RuntimeError("boom")
    assert not activations._ACTIVE and activations.recording(m) is None


def test_a_second_model_in_the_block_is_not_recorded():
    """Only the captured model records: another model of the same class run in the block leaves no tensor."""
    m, other = _yz(), _yz()
    x = _yz_x()
    with capture(m) as cache:
        other(x)
    assert cache == {}
    with pytest.raises(UserError, match="not produced by this call"):
        with capture(m, ["logits"]):
            other(x)


class _Tiny(nn.Module):
    """A plain module (one member) declaring its activations, as a user's PlainTask model would."""
    ACTIVATIONS = {"hidden": "tanh(W_1 x + b_1)", "out": "W_2 hidden + b_2"}

    def __init__(self, p=0.0):
        super().__init__()
        self.lin1, self.lin2, self.drop = nn.Linear(3, 4), nn.Linear(4, 2), nn.Dropout(p)

    def forward(self, x):
        h = self.drop(torch.tanh(self.lin1(x)))
        o = self.lin2(h)
        cache = activations.recording(self)
        if cache is not None:
            cache.put("hidden", h), cache.put("out", o)
        return o


@pytest.mark.parametrize("randomness", ["vmap", "loop"])
def test_stacked_plain_modules_record_per_member(randomness):
    torch.manual_seed(0)
    mods = [_Tiny() for _ in range(3)]
    st = Stacked(mods, _gens(3), randomness=randomness)
    x = torch.randn(3, 5, 3, generator=torch.Generator().manual_seed(1))
    plain = st(x)
    out, cache = run_with_cache(st, x)
    assert torch.equal(out, plain)
    assert set(activations.available(st)) == {"hidden", "out"} == set(cache)
    for i, mod in enumerate(mods):
        torch.testing.assert_close(cache["hidden"][i], torch.tanh(mod.lin1(x[i])).detach())
        torch.testing.assert_close(cache["out"][i], mod(x[i]).detach())
    _, cache = run_with_cache(st.map, lambda m, a: m(a).sum(), x, names=["hidden"])
    assert list(cache) == ["hidden"] and cache["hidden"].shape == (3, 5, 4)


# ---------------------------------------------------------------- probes written against the mechanism


@probe("tests.activations.lm_entropy", "corpus_lm.attention's entropy per layer, from the named activations")
def _lm_entropy(ctx):
    x, _ = ctx.batch
    with capture(ctx.model, ["layer*.attention"]) as cache:
        ctx.model(x)
    return {f"entropy_layer{i}": attention_entropy(cache[f"layer{i}.attention"].mean(2))
            for i in range(ctx.model.cfg.n_layers)}


@probe("tests.activations.topic_classes", "topic.attention's classes, from the per-position attention")
def _topic_classes(ctx):
    b, f = ctx.batch, ctx.task.facts
    tokens, keys = b["clean_tokens"], b["clean_keys"]
    _, cache = run_with_cache(ctx.model, tokens, keys, names=["layer0.attention"])
    return tp.attention_classes(cache["layer0.attention"].mean(2), tokens, keys, f["words_per_topic"],
                                f["num_special"])


@probe("tests.activations.p_correct", "scan_snap.decoder's p_correct, from the captured logits")
def _p_correct(ctx):
    x, y = ctx.batch[:2]
    _, cache = run_with_cache(ctx.model, x, names=["logits"])
    return {"p_correct": torch.softmax(cache["logits"].double(), -1).gather(-1, y[..., None]).squeeze(-1).mean(-1)}


def test_lm_entropy_probe_equals_corpus_lm_attention():
    m = _lm(L=2).float()
    x = torch.randint(0, 30, (2, 3, 6), generator=torch.Generator().manual_seed(0))
    ctx = ProbeContext(model=m, task=None, batch=(x, x), step=0)
    mine, shipped = PROBES.get("tests.activations.lm_entropy")(ctx), PROBES.get("corpus_lm.attention")(ctx)
    for k, v in mine.items():
        assert torch.equal(v, shipped[k]), k


@pytest.mark.parametrize("flags", [{}, {"n_heads": 2}, {"attention": "uniform"}])
def test_topic_classes_probe_equals_topic_attention(flags):
    """topic.attention computes the classes in vocabulary form; the same statistic from the captured
    per-position attention agrees to 1e-6 (as tests/test_topic_probes.py compares the two forms)."""
    m = _topic(**flags).float()
    tokens = torch.randint(NUM_SPECIAL, V_T, (2, 4, 30), generator=torch.Generator().manual_seed(3))
    tokens[:, :, 0] = 2                                                        # START
    tokens[:, 1, 22:] = 0                                                      # PAD tail
    tokens[:, 0, 9] = tokens[:, 0, 4]                                          # a repeated word
    batch = {"clean_tokens": tokens, "clean_keys": tokens != 0}

    class Task:
        facts = {"words_per_topic": v_T, "num_special": NUM_SPECIAL}

    ctx = ProbeContext(model=m, task=Task(), batch=batch, step=0)
    with torch.no_grad():
        mine, shipped = PROBES.get("tests.activations.topic_classes")(ctx), PROBES.get("topic.attention")(ctx)
    assert set(mine) == set(shipped)
    for k in shipped:
        torch.testing.assert_close(mine[k].double(), shipped[k].double(), rtol=1e-6, atol=1e-6, msg=k)


def _syn_small_task(S=2, **data):
    from tdyn.config import validate_config
    from tdyn.papers.scan_snap.data import SYN_SMALL
    from tdyn.papers.scan_snap.task import yz_config
    from tdyn.tasks import build_task
    from tdyn.train.trainer import expand_members

    cfg = validate_config(yz_config(SYN_SMALL | {"batch_size": 8, "seq_len": 16} | data, init="torch_default",
                                    seeds=range(S)))
    task = build_task(cfg, expand_members(cfg))
    batch = task.sample_streams(_gens(S, 7))
    return task, batch


def test_p_correct_probe_equals_scan_snap_decoder():
    task, batch = _syn_small_task()
    ctx = ProbeContext(model=task.model, task=task, batch=batch, step=0)
    with torch.no_grad():
        mine, shipped = PROBES.get("tests.activations.p_correct")(ctx), PROBES.get("scan_snap.decoder")(ctx)
    assert torch.equal(mine["p_correct"], shipped["p_correct"])


def test_attention_entropy_probe():
    """scan_snap.attention_entropy (shipped, written against the mechanism) equals the entropies computed from
    Z by Eqn 1 on the probe batch, on the task's support path, and in training."""
    task, _ = _syn_small_task()
    batch = task.full_sample(_gens(2, 7))                                     # the probe batch of two streams
    ctx = ProbeContext(model=task.model, task=task, batch=batch, step=0)
    with torch.no_grad():
        got = PROBES.get("scan_snap.attention_entropy")(ctx)
    x = batch[0]
    ref = _yz_reference(task.model.double(), x)
    task.model.float()
    for key, name in (("entropy", "attention"), ("token_entropy", "context")):
        p = ref[name]
        want = -(torch.where(p > 0, p * p.log(), 0.0)).sum(-1).mean(-1)
        torch.testing.assert_close(got[key], want, rtol=1e-5, atol=1e-6)
    assert (got["token_entropy"] <= got["entropy"] + 1e-6).all()


def test_attention_entropy_probe_in_training(tmp_path):
    from tdyn import runs
    from tdyn.papers.scan_snap.data import SYN_SMALL
    from tdyn.papers.scan_snap.task import yz_config
    from tdyn.train.trainer import train

    cfg = yz_config(SYN_SMALL | {"batch_size": 8, "seq_len": 16}, steps=3, seeds=[0, 1])
    cfg["probes"] = {"names": ["scan_snap.attention_entropy"], "every": 1}
    d = train(cfg, tmp_path / "r", progress=False)[0]
    rec = runs.read_metrics(d)
    # zero init: uniform attention over the 15 key positions, ln 15 nats
    assert rec[0]["scan_snap.attention_entropy/entropy"] == pytest.approx(math.log(15), rel=1e-6)
    assert rec[-1]["scan_snap.attention_entropy/entropy"] < rec[0]["scan_snap.attention_entropy/entropy"]
