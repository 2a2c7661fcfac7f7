"""LDA / theory generators and MLM corruption (docs/reproductions/topic.md#generator-tests,
docs/reproductions/topic.md#masked-lm-corruption)."""

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import gammaln

from tdyn.papers.topic.data import (END, IGNORE, MASK, PAD, START, LdaDataConfig, LdaDataset, corrupt, generate_documents,
                           read_documents, to_sequences, write_documents)
from tdyn.errors import ConfigError


def _docs(n=4000, seed=0, **kw):
    cfg = LdaDataConfig(**kw)
    return cfg, *generate_documents(cfg, n, np.random.default_rng(seed))


def _distinct_topics(words, lengths, v):
    z = np.where(words >= 0, words // v, -1)
    return np.array([len(set(z[i, :lengths[i]].tolist())) for i in range(len(lengths))])


def test_lengths_uniform_inclusive():
    cfg, words, lengths = _docs(n=20000)
    assert lengths.min() == 100 and lengths.max() == 150
    counts = np.bincount(lengths - 100, minlength=51)
    assert stats.chisquare(counts).pvalue > 1e-3
    assert abs(lengths.mean() - 125) < 4 * lengths.std() / np.sqrt(len(lengths))
    assert ((words >= 0).sum(1) == lengths).all() and (words[words >= 0] < 100).all()


def test_distinct_topics_match_dirichlet_formula():
    """E[#distinct | N] = T[1 − Γ(Tα)Γ((T−1)α+N)/(Γ((T−1)α)Γ(Tα+N))], averaged over N ~ U{100..150}."""
    T, a = 10, 0.1
    N = np.arange(100, 151)
    expect = np.mean(T * (1 - np.exp(gammaln(T * a) + gammaln((T - 1) * a + N) - gammaln((T - 1) * a) - gammaln(T * a + N))))
    cfg, words, lengths = _docs(n=6000)
    k = _distinct_topics(words, lengths, 10)
    assert abs(k.mean() - expect) < 4 * k.std() / np.sqrt(len(k)), (k.mean(), expect)


def test_topic_count_distribution_matches_independent_monte_carlo():
    """Distinct topics and topics holding >= 5% of the words, vs Dirichlet then Multinomial (χ², p > 1e-3)."""
    cfg, words, lengths = _docs(n=6000, seed=1)
    z = np.where(words >= 0, words // 10, -1)
    counts_g = np.stack([(z == t).sum(1) for t in range(10)], 1)
    rng = np.random.default_rng(123)
    theta = rng.dirichlet(np.full(10, 0.1), size=6000)
    n = rng.integers(100, 151, size=6000)
    counts_m = np.stack([rng.multinomial(n[i], theta[i]) for i in range(6000)])
    for stat in (lambda c: (c > 0).sum(1), lambda c: (c >= 0.05 * c.sum(1, keepdims=True)).sum(1)):
        a, b = stat(counts_g), stat(counts_m)
        bins = np.arange(1, 12)
        ha, hb = np.histogram(a, bins)[0], np.histogram(b, bins)[0]
        keep = (ha + hb) > 10
        assert stats.chi2_contingency(np.stack([ha[keep], hb[keep]])).pvalue > 1e-3
    share_g = counts_g.max(1) / counts_g.sum(1)
    share_m = counts_m.max(1) / counts_m.sum(1)
    assert stats.ks_2samp(share_g, share_m).pvalue > 1e-3


def test_words_uniform_within_topic():
    cfg, words, lengths = _docs(n=3000)
    w = words[words >= 0]
    for t in range(10):
        c = np.bincount(w[(w // 10) == t] % 10, minlength=10)
        assert stats.chisquare(c).pvalue > 1e-4


def test_theory_generator_topics_at_most_tau():
    cfg, words, lengths = _docs(n=3000, generator="theory", tau_max=3)
    k = _distinct_topics(words, lengths, 10)
    assert k.max() <= 3 and set(np.unique(k)) == {1, 2, 3}
    # τ is uniform on {1,2,3}; with ~125 words every drawn topic appears, so k = τ
    assert stats.chisquare(np.bincount(k)[1:]).pvalue > 1e-3


def test_sequences_and_file_round_trip(tmp_path):
    cfg, words, lengths = _docs(n=50)
    ids = to_sequences(words, lengths, cfg.seq_len)
    assert (ids[:, 0] == START).all()
    assert (ids[torch.arange(50), torch.from_numpy(lengths) + 1] == END).all()
    assert ((ids != PAD).sum(1) == torch.from_numpy(lengths) + 2).all()
    write_documents(tmp_path / "x.train", words, lengths)
    assert (tmp_path / "x.train").read_text().splitlines()[0].endswith(" END")
    w2, l2 = read_documents(tmp_path / "x.train")
    assert (l2 == lengths).all() and (w2 == words[:, :w2.shape[1]]).all()


def test_generation_is_seeded_and_30k_documents_build():
    cfg = LdaDataConfig()
    a = LdaDataset(cfg)
    b = LdaDataset(cfg)
    assert torch.equal(a.splits["dev"], b.splits["dev"]) and torch.equal(a.masked["train"].tokens, b.masked["train"].tokens)
    assert not torch.equal(LdaDataset(cfg.model_copy(update={"data_seed": 1})).splits["train"], a.splits["train"])
    assert a.splits["train"].shape == (10_000, 152)


def _corrupted(n=4000, seed=0, **kw):
    cfg = LdaDataConfig(**kw)
    _, words, lengths = _docs(n=n, seed=seed)
    ids = to_sequences(words, lengths, cfg.seq_len)
    return cfg, ids, corrupt(ids, cfg, torch.Generator().manual_seed(seed), cfg.vocab_size)


def test_mask_rates_and_split():
    cfg, ids, m = _corrupted()
    sel = m.labels != IGNORE
    words = ids >= 4
    n_words = int(words.sum())
    rate = sel.sum().item() / n_words
    assert abs(rate - 0.15) < 4 * np.sqrt(0.15 * 0.85 / n_words) + 1e-3          # rows with none are redrawn: tiny bias
    assert not (sel & ~words).any()                                                # specials never selected
    assert sel.any(1).all()                                                        # at least one per document
    assert torch.equal(m.labels[sel], ids[sel])
    tok = m.tokens[sel]
    n = sel.sum().item()
    is_mask = (tok == MASK).double().mean().item()
    kept = (tok == ids[sel]).double().mean().item()
    # kept = p_c + p_r/|V| (a random id can equal the original); mask = 0.8 + p_r·(1/|V|)
    assert abs(is_mask - (0.8 + 0.1 / 104)) < 4 * np.sqrt(0.16 / n)
    assert abs(kept - (0.1 + 0.1 / 104)) < 4 * np.sqrt(0.09 / n)
    assert (m.tokens[~sel] == ids[~sel]).all()
    # random replacements cover all ids, specials included
    rnd = tok[(tok != MASK) & (tok != ids[sel])]
    assert (rnd < 4).any()


def test_keys_faithful_and_attend_to_selected():
    cfg, ids, m = _corrupted(n=200)
    sel = m.labels != IGNORE
    assert torch.equal(m.keys, (ids != PAD) & ~sel)
    cfg2, _, m2 = _corrupted(n=200, attend_to_selected=True)
    assert torch.equal(m2.keys, ids != PAD)


def test_all_mask_when_no_correct_or_random():
    cfg, ids, m = _corrupted(n=300, mask_correct_prob=0.0, mask_random_prob=0.0)
    assert (m.tokens[m.labels != IGNORE] == MASK).all()


def test_static_masks_fixed_dynamic_redrawn():
    """Static: a batch is the build-time corruption of the drawn documents, whatever the step.
    Dynamic: the same documents drawn twice get different masks."""
    kw = dict(num_train=100, num_dev=20, num_test=5, batch_size=100)
    ds = LdaDataset(LdaDataConfig(**kw))
    for seed in (0, 1):
        idx = torch.randperm(100, generator=torch.Generator().manual_seed(seed))
        b = ds.sample(torch.Generator().manual_seed(seed))
        assert torch.equal(b["labels"], ds.masked["train"].labels[idx])
        assert torch.equal(b["keys"], ds.masked["train"].keys[idx])
    one = dict(num_train=1, num_dev=1, num_test=1, batch_size=1)
    g = torch.Generator().manual_seed(0)
    stat = LdaDataset(LdaDataConfig(**one))
    assert torch.equal(stat.sample(g)["labels"], stat.sample(g)["labels"])
    dyn = LdaDataset(LdaDataConfig(masking="dynamic", **one))
    draws = [dyn.sample(g)["labels"] for _ in range(3)]
    assert not (torch.equal(draws[0], draws[1]) and torch.equal(draws[1], draws[2]))
    doc = dyn.splits["train"]
    for y in draws:
        assert torch.equal(y[y >= 0], doc[y >= 0])


def test_config_errors():
    with pytest.raises(ConfigError, match="max_len"):
        LdaDataConfig(min_len=10, max_len=5)
    with pytest.raises(ConfigError, match="tau_max"):
        LdaDataConfig(generator="theory", tau_max=11)
