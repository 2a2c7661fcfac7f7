"""Scan and Snap data layout, sampler statistics and the Y/Z forward pass."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from tdyn.papers.scan_snap import data as ss
from tdyn.papers.scan_snap.model import YZConfig, YZModel


def _dist(**kw):
    return ss.build(ss.ScanSnapDataConfig(**kw))


def test_syn_small_layout():
    d = _dist(**ss.SYN_SMALL)
    assert (d.M, d.K) == (34, 2)
    assert d.query.tolist() == [30, 31] and d.next_token.tolist() == [32, 33]
    for k in range(2):
        assert torch.allclose(d.table[k, :10], torch.full((10,), 1 / 15.5, dtype=torch.float64))
        j = torch.arange(10, dtype=torch.float64)
        assert torch.allclose(d.table[k, 10 + 10 * k: 20 + 10 * k], 0.1 * (j + 1) / 15.5)
        assert d.distinct[k].nonzero().flatten().tolist() == list(range(10 + 10 * k, 20 + 10 * k))
    assert d.common.nonzero().flatten().tolist() == list(range(10))
    assert torch.allclose(d.table.sum(1), torch.ones(2, dtype=torch.float64))


@pytest.mark.parametrize("num_last, M", [(1, 33), (3, 79), (5, 125), (10, 240)])
def test_syn_medium_sizes(num_last, M):
    d = _dist(**ss.syn_medium(num_last))
    assert d.M == M and d.K == 2 * num_last
    assert d.query.tolist() == [d.num_contextual + k // 2 for k in range(d.K)]


def test_per_query_commons_layout():
    d = _dist(num_last=2, num_next_per_last=2, num_common_per_last=5)
    # commons 0-9, group commons 10-14 (query 0) and 15-19 (query 1), distinct from 20
    assert d.common.nonzero().flatten().tolist() == list(range(20))
    assert (d.table[0, 10:15] > 0).all() and (d.table[0, 15:20] == 0).all()
    assert (d.table[3, 15:20] > 0).all()


def test_sampler_matches_table():
    """χ² goodness of fit of sampled context tokens to P(l|n), per class (α = 1e-3)."""
    d = _dist(**ss.SYN_SMALL)
    x, y = d.sample(4000, 64, torch.Generator().manual_seed(0))
    assert x.shape == (4000, 64) and y.shape == (4000,)
    cls = y - 32
    assert (x[:, -1] == d.query[cls]).all()
    assert abs(cls.float().mean().item() - 0.5) < 0.03     # classes uniform (±4.2σ)
    for k in range(2):
        ctx = x[cls == k, :-1].flatten()
        counts = torch.bincount(ctx, minlength=d.M).numpy()
        support = d.table[k].numpy() > 0
        assert counts[~support].sum() == 0
        expected = d.table[k].numpy()[support] * counts.sum()
        assert chisquare(counts[support], expected).pvalue > 1e-3


def test_sampler_is_seeded():
    d = _dist(**ss.SYN_SMALL)
    a = d.sample(8, 16, torch.Generator().manual_seed(5))
    b = d.sample(8, 16, torch.Generator().manual_seed(5))
    assert all(torch.equal(u, v) for u, v in zip(a, b))


def _reference_draw(d, cls, u):
    """The sampler's definition: inverse CDF by binary search (the implementation before InverseCDF)."""
    return torch.searchsorted(d.cdf[cls], u, right=True).clamp_(max=d.M - 1)


def _hostile_tables():
    """CDFs an O(1) lookup could get wrong: zero-probability gaps, tiny masses, many steps inside one
    bucket of [0, 1), a last cumulative sum just below 1, a row whose only mass is its last token."""
    g = torch.Generator().manual_seed(3)
    w = torch.rand(6, 40, generator=g, dtype=torch.float64)
    w[w < 0.4] = 0.0
    w[1] = 0.0
    w[1, 5:25] = 1e-6                     # 20 steps inside the first bucket
    w[1, 30] = 1.0
    w[2] = 0.0
    w[2, -1] = 1.0                        # all mass on token M−1
    w[3, 0] = 0.0
    w[3, 1] = 1e-300                      # a step of 1e-300 (cdf 0 → 1e-300)
    w[4] = 1.0 / 3                        # sums to 13.333..., cumsum ends just off 1 after dividing
    w[5, :] = 0.0
    w[5, 7] = 0.5
    w[5, 8] = 0.5
    return w / w.sum(1, keepdim=True)


def _classes(table):
    K, M = table.shape
    z = torch.zeros(K, dtype=torch.long)
    return ss.SequenceClasses(M=M, K=K, table=table, query=z, next_token=z, group=z,
                              distinct=torch.zeros(K, M, dtype=torch.bool), common=torch.zeros(M, dtype=torch.bool),
                              num_contextual=M)


@pytest.mark.parametrize("which", ["syn_small", "medium_10", "group_commons", "hostile"])
def test_inverse_cdf_is_searchsorted(which):
    """InverseCDF gives exactly searchsorted(cdf[k], u, right=True) clamped to M−1: on random uniforms,
    on every CDF value itself, on its neighbours one ulp either side, on bucket edges, 0 and 1 − 2⁻⁵³."""
    d = {"syn_small": lambda: _dist(**ss.SYN_SMALL), "medium_10": lambda: _dist(**ss.syn_medium(10)),
         "group_commons": lambda: _dist(num_last=2, num_next_per_last=2, num_common_per_last=5),
         "hostile": lambda: _classes(_hostile_tables())}[which]()
    g = torch.Generator().manual_seed(0)
    vals = d.cdf.flatten()
    special = torch.cat([vals, torch.nextafter(vals, torch.tensor(0.0, dtype=torch.float64)),
                         torch.nextafter(vals, torch.tensor(2.0, dtype=torch.float64)),
                         torch.arange(1024, dtype=torch.float64) / 1024, torch.tensor([0.0, 1 - 2.0 ** -53])])
    special = special[(special >= 0) & (special < 1)]
    if which == "hostile":      # 20 steps within 2e-5: finer buckets, and still several values in one
        assert d.inverse_cdf.buckets == 1 << 16 and d.inverse_cdf.window > 1
    for u in (torch.rand(d.K * 50, 300, generator=g, dtype=torch.float64), special.expand(d.K, -1).contiguous()):
        cls = torch.arange(u.shape[0]) % d.K
        assert torch.equal(d.inverse_cdf.tokens.take(d.inverse_cdf.lookup(cls, u)), _reference_draw(d, cls, u))


@pytest.mark.parametrize("which", ["syn_small", "medium_3", "medium_10", "group_commons", "hostile"])
def test_sampler_counts_pack_to_key_support(which):
    """sample_counts draws what sample draws (with ``context=False``: the same, x only its query column),
    and its counts packed (pack_support, as the task does) are
    key_support(x) exactly (tokens, counts, order, padding), at the task's width; a narrower width is
    refused the same way."""
    from tdyn.papers.scan_snap.kernels import key_support, pack_support

    d = {"syn_small": lambda: _dist(**ss.SYN_SMALL), "medium_3": lambda: _dist(**ss.syn_medium(3)),
         "medium_10": lambda: _dist(**ss.syn_medium(10)),
         "group_commons": lambda: _dist(num_last=2, num_next_per_last=2, num_common_per_last=5),
         "hostile": lambda: _classes(_hostile_tables())}[which]()
    width = int((d.table > 0).sum(1).max())
    for seed, (B, L) in enumerate([(128, 128), (7, 3), (64, 40)]):
        x, y = d.sample(B, L, torch.Generator().manual_seed(seed))
        x2, y2, tokens, counts = d.sample_counts(B, L, torch.Generator().manual_seed(seed))
        idx, count = pack_support(counts, tokens, min(width, L - 1))
        assert torch.equal(x, x2) and torch.equal(y, y2)
        xq, yq, tq, cq = d.sample_counts(B, L, torch.Generator().manual_seed(seed), context=False)
        assert torch.equal(xq, x[:, -1:]) and torch.equal(yq, y) and torch.equal(tq, tokens) and torch.equal(cq, counts)
        ref = key_support(x, d.M, min(width, L - 1))
        assert torch.equal(idx, ref[0]) and torch.equal(count, ref[1]) and count.dtype == ref[1].dtype
        g = torch.Generator().manual_seed(seed)     # the draws are the reference sampler's
        c = torch.randint(d.K, (B,), generator=g)
        u = torch.rand(B, L - 1, generator=g, dtype=torch.float64)
        assert torch.equal(x[:, :-1], _reference_draw(d, c, u)) and torch.equal(y, d.next_token[c])
    _, _, tokens, counts = d.sample_counts(16, 64, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="distinct keys, more than width 2"):
        pack_support(counts, tokens, 2)
    for context in (True, False):    # several generators at once: each one's batch, stacked, bit for bit
        one = [d.sample_counts(64, 40, torch.Generator().manual_seed(s), context) for s in (3, 4, 5)]
        many = d.sample_counts(64, 40, [torch.Generator().manual_seed(s) for s in (3, 4, 5)], context)
        assert all(torch.equal(torch.stack([o[i] for o in one]), many[i]) for i in range(4))


def test_yz_forward_hand_computed():
    """Keys exclude the query; Xᵀb is ℓ2-normalised; logits = Yᵀ LN(Xᵀb) (Eqn 1–2)."""
    M = 4
    m = YZModel(YZConfig(M=M), S=1)
    with torch.no_grad():
        m.Z[0, 3] = torch.tensor([0.0, math.log(3.0), 0.0, 5.0])   # query 3's logits on keys
        m.Y[0] = torch.arange(16.0).view(4, 4)
    x = torch.tensor([[[0, 1, 1, 3]]])                           # keys 0,1,1; query 3
    b = torch.tensor([1.0, 3.0, 3.0]) / 7.0
    Xb = torch.tensor([b[0], b[1] + b[2], 0.0, 0.0])
    u = Xb / Xb.norm()
    expected = u @ torch.arange(16.0).view(4, 4)
    torch.testing.assert_close(m(x)[0, 0], expected)
    # with the query as a key, its logit 5 enters the softmax
    m.cfg.include_query_key = True
    b2 = torch.softmax(torch.tensor([0.0, math.log(3.0), math.log(3.0), 5.0]), 0)
    Xb2 = torch.tensor([b2[0], b2[1] + b2[2], 0.0, b2[3]])
    torch.testing.assert_close(m(x)[0, 0], (Xb2 / Xb2.norm()) @ torch.arange(16.0).view(4, 4))


def test_embedding_parameterisation_equals_yz():
    """Z = U W_Q W_Kᵀ Uᵀ/√d and Y = U W_Vᵀ Uᵀ give the same outputs as the Y/Z model with those matrices."""
    g = torch.Generator().manual_seed(0)
    M, d = 6, 4
    emb = YZModel(YZConfig(M=M, parameterization="embedding", d=d), S=2)
    with torch.no_grad():
        for p in emb.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    yz = YZModel(YZConfig(M=M), S=2)
    Z, Y = emb.logits_matrices()
    with torch.no_grad():
        yz.Z.copy_(Z)
        yz.Y.copy_(Y)
    x = torch.randint(M, (2, 5, 7), generator=g)
    torch.testing.assert_close(emb(x), yz(x))


def test_torch_default_init_bounds_and_seeding():
    M = 34
    m = YZModel(YZConfig(M=M, init="torch_default"), S=2)
    gens = [torch.Generator().manual_seed(s) for s in (1, 1)]
    m.reset_parameters(gens, [1.0, 0.5])
    assert m.Z.abs().max() <= 1 / math.sqrt(M)
    torch.testing.assert_close(m.Z[1], 0.5 * m.Z[0])


def test_no_draw_lands_on_a_token_of_probability_zero():
    """A class whose cumulative sum ends an ulp below 1 before the last token (ten masses of 0.1: 1 − 2⁻⁵³):
    the largest uniform below 1 still draws one of its tokens, not the last token (probability 0), in
    the lookup and in the CDF it follows; every other draw is unchanged."""
    table = torch.zeros(2, 16, dtype=torch.float64)
    table[0, :10] = 0.1
    table[1, 3:9] = 1 / 6
    assert float(table[0].cumsum(0)[9]) < 1.0          # the case: the sum falls short of 1
    d = _classes(table)
    u = torch.tensor([[1 - 2.0 ** -53, 0.5, 0.0]], dtype=torch.float64).expand(2, 3).contiguous()
    tokens = d.inverse_cdf.tokens.take(d.inverse_cdf.lookup(torch.arange(2), u))
    assert torch.equal(tokens, _reference_draw(d, torch.arange(2), u))
    assert bool((table.gather(1, tokens) > 0).all()), tokens
    assert tokens[0].tolist() == [9, 5, 0] and tokens[1].tolist() == [8, 6, 3]
