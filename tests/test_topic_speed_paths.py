"""The topic speed paths (issue 35) against the code they replace, bit for bit: the probes' statistics
computed once per evaluation (``ProbeContext.once``) and shared by ``topic.attention`` and ``topic.stages``,
the class sums and the attention per id without repeated passes (``tdyn.papers.topic.probes``)."""

import math

import pytest
import torch

from tdyn.papers.topic import kernels
from tdyn.papers.topic import probes as tp
from tdyn.papers.topic import stages as ts
from tdyn.papers.topic.data import NUM_SPECIAL
from tdyn.papers.topic.model import Input, TopicModelConfig, TopicTransformer
from tdyn.probes import ProbeContext

V, v = 104, 10


def _model(S=2, **kw):
    m = TopicTransformer(TopicModelConfig(**({"init": "default"} | kw)), V, v, NUM_SPECIAL, S=S)
    m.reset_parameters([torch.Generator().manual_seed(s) for s in range(S)], [3.0] * S)
    return m


def _clean_batch(S=2, B=5, L=40, seed=7):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (1, B, L), generator=g).expand(S, B, L).clone()
    tokens[:, :, 0] = 2                                                        # START
    tokens[:, 1, 30:] = 0                                                      # PAD tail
    return {"clean_tokens": tokens, "clean_keys": tokens != 0}


class _Task:
    facts = {"words_per_topic": v, "num_special": NUM_SPECIAL}


# ---------------------------------------------------------------- the code these paths replace


def _old_attention_by_ids(model, tokens, keys):
    """attention_by_ids as it was: the heads' mean taken also of one head."""
    if model.cfg.n_layers != 1 or model.cfg.block != "attention":
        return None
    table = model.embed_table()
    E = Input(table, tokens, identity="W_E" in model.identities)
    c = E.multiplicity(keys, table.dtype)
    S, V_, h = table.shape[0], table.shape[1], model.cfg.n_heads
    w = model.layer_weights(0)
    Q, K = E.table(w.W_Q, w.b_Q), E.table(w.W_K, w.b_K)
    d_h = Q.shape[-1] // h
    scores = torch.einsum("suhc,svhc->shuv", Q.view(S, V_, h, d_h), K.view(S, V_, h, d_h)) / math.sqrt(d_h)
    M = torch.where(c > 0, c.log(), torch.finfo(scores.dtype).min)
    return torch.softmax(scores[:, None] + M[:, :, None, None, :], dim=-1).mean(2)


def _old_class_sums_by_ids(P, n, c):
    """class_sums_by_ids as it was: one three-operand einsum per class mask."""
    ids = torch.arange(P.shape[-1])
    t = tp.topic_of(ids, v, NUM_SPECIAL)
    word = t >= 0
    same_t = (t[:, None] == t[None, :]) & word[:, None] & word[None, :]
    M = {"same_topic": (same_t & (ids[:, None] != ids[None, :])).to(P.dtype),
         "diff_topic": (~same_t & word[:, None] & word[None, :]).to(P.dtype)}
    nP = n.to(P.dtype)
    vis = c.sum(-1).to(P.dtype)
    diag = torch.diagonal(P, dim1=-2, dim2=-1)
    out = {"self": (diag * ((c > 0) & word).to(P.dtype)).sum(-1)}
    out["same_token"] = (nP * diag).sum(-1) - out["self"]
    for k, m in M.items():
        out[k] = torch.einsum("sbu,sbuv,uv->sb", nP, P, m)
    out = {k: x * vis for k, x in out.items()}
    out["start"] = (nP * P[..., 2]).sum(-1)
    return out


def _old_attention_classes(A, tokens, keys):
    """attention_classes as it was: the class sums inside the loop over the masks."""
    n = keys.sum(-1).to(A.dtype)
    R = A * n[..., None, None]
    out = {}
    for c, m in tp.pair_classes(tokens, v, NUM_SPECIAL).items():
        s, k = (R * m).sum((-1, -2)), m.sum((-1, -2)).to(A.dtype)
        out[c] = s.sum(1) / k.sum(1)
        out[f"{c}_doc"] = torch.nanmean(s / k, dim=1)
    out["gap"] = out["same_topic"] - out["diff_topic"]
    out["gap_doc"] = out["same_topic_doc"] - out["diff_topic_doc"]
    word_q = tp.topic_of(tokens, v, NUM_SPECIAL) >= 0
    mass = (A * (tokens == 2)[..., None, :]).sum(-1)
    out["start_mass"] = (mass * word_q).sum((1, 2)) / word_q.sum((1, 2))
    return out


def _old_probes(model, b):
    """topic.attention's and topic.stages' attention outputs as each probe computed them on its own."""
    tokens, keys = b["clean_tokens"], b["clean_keys"]
    if model.cfg.n_layers == 1 and model.cfg.block == "attention":
        P = _old_attention_by_ids(model, tokens, keys)
        counts, n, c = tp.pair_counts(tokens, keys, V, v, NUM_SPECIAL)
        sums = _old_class_sums_by_ids(P, n, c)
        att = {k: x.float() for k, x in tp.classes_from_sums(sums, counts, n.sum(-1)).items()}
        return att, {k: x.float() for k, x in ts.gap_per_document(sums, counts).items()}
    A = model.attention(tokens, keys).mean(2)
    return _old_attention_classes(A, tokens, keys), ts.attention_gap_docs(A, tokens, keys, v, NUM_SPECIAL)


# ---------------------------------------------------------------- tests


def test_once_computes_once_per_shared_dict():
    calls = []
    shared = {}
    a = ProbeContext(None, None, None, 0, shared=shared)
    b = ProbeContext(None, None, None, 0, shared=shared)
    assert a.once("k", lambda: calls.append(1) or 5) == 5
    assert b.once("k", lambda: calls.append(1) or 6) == 5               # the first probe's value
    assert ProbeContext(None, None, None, 0).once("k", lambda: calls.append(1) or 7) == 7   # a new evaluation
    assert len(calls) == 2


@pytest.mark.parametrize("kw", [{}, {"n_heads": 2}, {"emb_layernorm": True}, {"n_layers": 2},
                                {"block": "bert", "decoder": "trained"}])
def test_shared_attention_probes_equal_each_computed_alone(kw, monkeypatch):
    model, b = _model(**kw), _clean_batch()
    with torch.no_grad():
        ref_att, ref_gap = _old_probes(model, b)
        calls = []
        for name in ("clean_class_sums", "position_class_sums"):
            fn = getattr(tp, name)
            monkeypatch.setattr(tp, name, lambda *a, _fn=fn, _n=name: calls.append(_n) or _fn(*a))
        shared = {}
        att = tp._attention(ProbeContext(model, _Task(), b, 0, shared=shared))
        st = ts._stages(ProbeContext(model, _Task(), b, 0, shared=shared))
    assert calls.count("clean_class_sums") == 1                              # computed once, for both
    assert calls.count("position_class_sums") == (model.cfg.n_layers > 1 or model.cfg.block == "bert")
    assert att.keys() == ref_att.keys()
    for k in ref_att:
        assert torch.equal(att[k], ref_att[k]), k
    for k in ref_gap:
        assert torch.equal(st[k], ref_gap[k]), k


@pytest.mark.parametrize("h", [1, 2])
def test_attention_by_ids_and_class_sums_equal_the_old_passes(h):
    model, b = _model(S=3, n_heads=h), _clean_batch(S=3, B=6, L=60, seed=3)
    tokens, keys = b["clean_tokens"], b["clean_keys"]
    with torch.no_grad():
        P = tp.attention_by_ids(model, tokens, keys)
        assert torch.equal(P, _old_attention_by_ids(model, tokens, keys))
    _, n, c = tp.pair_counts(tokens, keys, V, v, NUM_SPECIAL)
    new, old = tp.class_sums_by_ids(P, n, c, v, NUM_SPECIAL), _old_class_sums_by_ids(P, n, c)
    assert new.keys() == old.keys()
    for k in old:
        assert torch.equal(new[k], old[k]), k


def test_position_class_sums_are_attention_classes_sums():
    model, b = _model(n_layers=2), _clean_batch()
    tokens, keys = b["clean_tokens"], b["clean_keys"]
    A = model.attention(tokens, keys).mean(2)
    new, old = tp.attention_classes(A, tokens, keys, v, NUM_SPECIAL), _old_attention_classes(A, tokens, keys)
    for k in old:
        assert torch.equal(new[k], old[k]), k


def test_log_multiplicity_is_the_old_mask_term():
    from tdyn.papers.topic.model import log_multiplicity

    g = torch.Generator().manual_seed(0)
    c = torch.randint(0, 160, (3, 7, V), generator=g).float() * (torch.rand(3, 7, V, generator=g) < 0.4)
    for dtype in (torch.float32, torch.float64):
        x = c.to(dtype)
        assert torch.equal(log_multiplicity(x, dtype), torch.where(x > 0, x.log(), torch.finfo(dtype).min))


@pytest.mark.parametrize("kw", [{}, {"n_heads": 2}, {"emb_layernorm": True}, {"n_layers": 2}, {"n_layers": 3},
                                {"block": "bert", "decoder": "trained"},
                                {"block": "bert", "decoder": "trained", "n_layers": 2}, {"attention": "uniform"}])
def test_attention_of_a_layer_is_the_forwards(kw):
    model, b = _model(**kw), _clean_batch()
    tokens, keys = b["clean_tokens"], b["clean_keys"]
    keys = keys & (torch.rand(keys.shape, generator=torch.Generator().manual_seed(1)) > 0.2)   # some keys hidden
    with torch.no_grad():
        ref = model(tokens, keys, return_attention=True)[1]
    for layer in range(-len(ref), len(ref)):
        assert torch.equal(model.attention(tokens, keys, layer), ref[layer]), layer
    with pytest.raises(IndexError):
        model.attention(tokens, keys, len(ref))


def _mlm_batch(S=3, B=40, L=152, seed=5):
    """Per-member documents (members differ in their selected counts), PAD tails, a document with no selected
    position, selected keys hidden; the two-stage batch's size (V's gradient sums over ~1000 rows: dropping
    the unselected rows there changes its last bits)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(NUM_SPECIAL, V, (S, B, L), generator=g)
    tokens[:, :, 0] = 2
    tokens[:, 1, 100:] = 0
    sel = (torch.rand(S, B, L, generator=g) < torch.tensor([0.15, 0.1, 0.2])[:S, None, None]) & (tokens > 3)
    sel[:, 2] = False
    labels = torch.where(sel, tokens, -100)
    tokens = torch.where(sel & (torch.rand(S, B, L, generator=g) < 0.8), 1, tokens)   # MASK
    return tokens, labels, (tokens != 0) & ~sel


@pytest.mark.parametrize("kw", [{}, {"emb_layernorm": True}, {"bias": False}, {"embedding": "trained", "d": V},
                                {"value": "block"}, {"value": "identity"}, {"value": "identity", "bias": False},
                                {"init": "small_uniform", "init_eps": 1e-3}])
@pytest.mark.parametrize("data", ["mlm", "lda"])
def test_selected_rows_loss_and_gradients_equal_the_padded_rows(kw, data, monkeypatch):
    """The selected rows' kernel (its attention and log-probabilities once per distinct (document, id), the
    backward on the rows) against the padded rows' per-row forward (``_per_row_paths``)."""
    model = _model(S=3, **kw)
    assert model.selected_rows
    tokens, labels, keys = _mlm_batch() if data == "mlm" else _lda_batch()
    out = {}
    for fast in (False, True):
        _per_row_paths(monkeypatch, not fast)
        model.selected_rows = fast
        model.zero_grad()
        loss = model.data_loss(tokens, labels, keys)
        loss.sum().backward()
        out[fast] = [loss.detach()] + [p.grad.clone() for p in model.parameters()]
    for a, b in zip(out[False], out[True]):
        assert torch.equal(a, b)


def _per_row_paths(monkeypatch, on: bool = True):
    """``on``: the model computes every query row and position itself (no ``kernels.distinct_rows_mix`` at layer 0,
    no ``kernels.distinct_rows_affine`` in later layers): the code those paths replace; off: as shipped."""
    from tdyn.papers.topic import model as tm
    if on:
        monkeypatch.setattr(tm, "distinct_rows", lambda *a: False)
        monkeypatch.setattr(tm.TopicTransformer, "_later_rows", lambda *a: None)
    else:
        monkeypatch.undo()


def test_selected_rows_only_where_the_model_allows():
    assert not any(_model(**kw).selected_rows for kw in ({"n_heads": 2}, {"n_layers": 2}, {"attention": "uniform"},
                                                          {"decoder": "trained"}, {"loss": "squared"},
                                                          {"block": "bert", "decoder": "trained"}))


def test_selected_rows_loss_under_autocast_is_the_padded_paths():
    model = _model(S=3)
    tokens, labels, keys = _mlm_batch(B=8)
    out = {}
    for fast in (False, True):
        model.selected_rows = fast
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model.data_loss(tokens, labels, keys)
        loss.sum().backward()
        out[fast] = [loss.detach()] + [p.grad.clone() for p in model.parameters()]
    for a, b in zip(out[False], out[True]):
        assert torch.equal(a, b)


# ---------------------------------------------------------------- topic/robustness's measure phase (issue 35)


def _old_contrast_noise(W, v, num_special, n_perm=200, seed=0):
    """``value.contrast_noise`` as it was: one permutation drawn and applied at a time."""
    from tdyn import stats
    n = W.shape[-1] - num_special
    g = torch.Generator().manual_seed(seed)
    Ww = W[num_special:, num_special:].double()
    mats = []
    for _ in range(n_perm):
        p = torch.randperm(n, generator=g)
        mats.append(Ww[p][:, p])
    return stats.sd(tp.block_contrast(torch.stack(mats), v, 0)["per_topic"].flatten().tolist())


@pytest.mark.parametrize("seed", [0, 3])
def test_contrast_noise_with_drawn_relabellings_is_the_old_loop(seed):
    """The relabellings drawn once (``value.relabellings``) and applied all at once: the same float as the loop,
    for a block matrix plus noise and a pure-noise matrix, twice (the second call reads the cache)."""
    from tdyn.papers.topic.value import contrast_noise
    g = torch.Generator().manual_seed(seed)
    B = TopicTransformer.block_matrix(V, v, NUM_SPECIAL)
    for W in (B + 0.3 * torch.randn(V, V, generator=g), torch.randn(V, V, generator=g)):
        for _ in range(2):
            assert contrast_noise(W, v, NUM_SPECIAL, seed=seed) == _old_contrast_noise(W, v, NUM_SPECIAL, seed=seed)
    assert contrast_noise(W, v, NUM_SPECIAL, n_perm=50, seed=seed) == _old_contrast_noise(W, v, NUM_SPECIAL, 50, seed)


def test_attention_gap_with_classes_made_once_is_the_gap():
    """``attention_gap_docs`` keeps the pair classes of the documents it last read (``probes.counted_pair_classes``)
    for two attentions on the same documents: gap and SE bit-equal to the classes made anew for each call (two
    members, a PAD tail)."""
    b = _clean_batch(S=2, B=6, L=40)
    tokens, keys = b["clean_tokens"], b["clean_keys"]
    n = keys.sum(-1)

    def anew(A):
        m, R = tp.pair_classes(tokens, v, NUM_SPECIAL), A * n.to(A.dtype)[..., None, None]
        cls = ("same_topic", "diff_topic")
        return ts.gap_per_document({c: (R * m[c]).sum((-1, -2)) for c in cls},
                                   {c: m[c].sum((-1, -2)).to(A.dtype) for c in cls})

    for kw in ({}, {"n_layers": 2}):
        m = _model(**kw)
        for layer in range(m.cfg.n_layers):
            A = m.attention(tokens, keys, layer).mean(2)
            got, want = ts.attention_gap_docs(A, tokens, keys, v, NUM_SPECIAL), anew(A)
            assert torch.equal(got["gap_doc"], want["gap_doc"]) and torch.equal(got["gap_se"], want["gap_se"])
    assert tp._COUNTED[0][0]() is tokens        # made once for the three attentions


def _query_rows_by_all_positions(E, W, b, pos):
    """The code ``kernels.query_rows_affine`` replaces: the product on every position, then the query rows."""
    from tdyn.papers.topic.model import affine, at_positions
    return at_positions(affine(E, W, b), pos)


@pytest.mark.parametrize("kw", [{"n_layers": 2}, {"n_layers": 2, "n_heads": 2}, {"n_layers": 3, "bias": False},
                                {"n_layers": 2, "block": "bert", "decoder": "trained"}])
def test_query_rows_of_later_layers_equal_every_positions_product(kw, monkeypatch):
    """Layers after the first compute Q on the query rows only (``kernels.query_rows_affine``): the loss, every
    parameter's gradient and the attention of the last layer (all positions, the probes' path) bit-equal to Q
    computed at every position and then looked up, at the full-setting batch (3 members, 40 documents of
    152 positions, |V| = 104)."""
    from tdyn.papers.topic import kernels
    model = _model(S=3, **kw)
    tokens, labels, keys = _mlm_batch(S=3, B=40, L=152)
    out = {}
    for fast in (False, True):
        if not fast:
            monkeypatch.setattr(kernels, "query_rows_affine", _query_rows_by_all_positions)
        else:
            monkeypatch.undo()
        model.zero_grad()
        loss = model.data_loss(tokens, labels, keys)
        loss.sum().backward()
        A = model.attention(tokens, keys, model.cfg.n_layers - 1)
        out[fast] = [loss.detach(), A] + [p.grad.clone() for p in model.parameters()]
    assert all(g is not None for g in out[True][2:])
    for a, b in zip(out[False], out[True]):
        assert torch.equal(a, b)


def test_position_class_sums_with_masks_kept_per_tokens_tensor():
    """``probes.counted_pair_classes`` keeps the masks of the last tokens tensor (a run's probe batch): the
    class sums and counts of a second evaluation on the same tensor bit-equal to masks made anew, another
    tensor (equal values, or other documents) gets its own, and the masks are dropped when their tensor is."""
    b = _clean_batch(S=2, B=6, L=40)
    tokens, keys = b["clean_tokens"], b["clean_keys"]
    m = _model(n_layers=2)
    A = m.attention(tokens, keys, 1).mean(2)
    fresh = lambda t: (lambda ms: ({c: (A * keys.sum(-1).to(A.dtype)[..., None, None] * x).sum((-1, -2))  # noqa: E731
                                    for c, x in ms.items()}, {c: x.sum((-1, -2)).to(A.dtype) for c, x in ms.items()}))(
        tp.pair_classes(t, v, NUM_SPECIAL))
    for t in (tokens, tokens, tokens.clone(), _clean_batch(S=2, B=6, L=40, seed=8)["clean_tokens"], tokens):
        got, want = tp.position_class_sums(A, t, keys, v, NUM_SPECIAL), fresh(t)
        for a, w in zip(got, want):
            assert a.keys() == w.keys() and all(torch.equal(a[c], w[c]) for c in a)
    assert tp.counted_pair_classes(tokens, v, NUM_SPECIAL)[0] is tp.counted_pair_classes(tokens, v, NUM_SPECIAL)[0]
    other = tokens.clone()          # the masks go with their tokens tensor (a run's end), not with the process
    tp.counted_pair_classes(other, v, NUM_SPECIAL)
    assert tp._COUNTED
    del other
    assert not tp._COUNTED


# ---------------------------------------------------------------- distinct (document, id) rows (issue 35)


def test_distinct_rows_are_the_pairs_of_the_rows():
    g = torch.Generator().manual_seed(0)
    S, B, R, n_ids = 3, 4, 50, 7
    docs, ids = torch.randint(0, B, (S, R), generator=g), torch.randint(0, n_ids, (S, R), generator=g)
    ids[2] = 0                                                       # a member with fewer pairs than the others
    r = kernels.distinct_rows(docs, ids, B, n_ids)
    for s in range(S):
        pairs = sorted({(int(d), int(i)) for d, i in zip(docs[s], ids[s])})
        got = list(zip(r.docs[s].tolist(), r.ids[s].tolist()))
        assert got[:len(pairs)] == pairs                             # ascending; the rest repeat pairs of no row
        for row in range(R):
            assert got[int(r.row_of[s, row])] == (int(docs[s, row]), int(ids[s, row]))
        for u, (d, i) in enumerate(pairs):
            assert int(r.first[s, u]) == min(row for row in range(R) if (docs[s, row], ids[s, row]) == (d, i))


def _lda_batch(S=3, seed=0):
    """Three members' training batches of the LDA data (static masks, 40 documents of ≤ 152 positions): the
    (document, id) rows repeat as in the runs (≈ 4× at layer 0's every position)."""
    from tdyn.papers.topic.data import LdaDataConfig
    from tdyn.papers.topic.task import dataset
    ds = dataset(LdaDataConfig(num_train=200, num_dev=20, num_test=10, probe_docs=20))
    bs = [ds.sample(torch.Generator().manual_seed(seed * 10 + s)) for s in range(S)]
    return tuple(torch.stack([b[k] for b in bs]) for k in ("tokens", "labels", "keys"))


@pytest.mark.parametrize("kw", [{"n_layers": 2}, {"n_layers": 2, "init": "small_uniform", "init_eps": 1e-3},
                                {"n_layers": 3, "bias": False}, {"n_layers": 2, "emb_layernorm": True},
                                {"n_layers": 2, "embedding": "trained", "d": V}, {"block": "bert", "decoder": "trained"},
                                {"n_layers": 2, "block": "bert", "decoder": "trained"}, {"n_layers": 2, "n_heads": 2},
                                {"loss": "squared"}])
@pytest.mark.parametrize("data", ["mlm", "lda"])
def test_distinct_rows_equal_every_rows_forward(kw, data, monkeypatch):
    """Layer 0's attention and A V once per distinct (document, id) of its queries (``kernels.distinct_rows_mix``)
    and the later layers' keys and values once per distinct row (``kernels.distinct_rows_affine``): the loss,
    every parameter's gradient, the loss without gradients (the dev-loss probe), the logits and every layer's
    attention (the probes' path) bit-equal to every row computed, at the full-setting batch (3 members, 40
    documents of 152 positions, |V| = 104)."""
    model = _model(S=3, **kw)
    tokens, labels, keys = _mlm_batch() if data == "mlm" else _lda_batch()
    calls = []
    out = {}
    for fast in (False, True):
        _per_row_paths(monkeypatch, not fast)
        if fast:
            for name in ("distinct_rows_mix", "distinct_rows_affine"):
                monkeypatch.setattr(kernels, name,
                                    lambda *a, _f=getattr(kernels, name), _n=name: calls.append(_n) or _f(*a))
        model.zero_grad()
        loss = model.data_loss(tokens, labels, keys)
        loss.sum().backward()
        with torch.no_grad():
            rest = [model.data_loss(tokens, labels, keys), model(tokens, keys)]
            rest += [model.attention(tokens, keys, layer) for layer in range(model.cfg.n_layers)]
        out[fast] = [loss.detach()] + [p.grad.clone() for p in model.parameters()] + rest
    assert ("distinct_rows_mix" in calls) == (model.cfg.n_heads == 1)
    assert ("distinct_rows_affine" in calls) == (model.cfg.n_layers > 1)
    for a, b in zip(out[False], out[True]):
        assert torch.equal(a, b)
