"""LDA topics on a real corpus and word→topic assignment
(docs/reproductions/real-text.md#the-papers-wikipedia-pipeline,
docs/reproductions/real-text.md#realtopic-embeddings).

scikit-learn's ``LatentDirichletAllocation`` (batch variational Bayes, seeded) on bag-of-words counts of
the ``basic_english`` tokens; English stop words and tokens without a letter are dropped.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tdyn.papers.real_text.data import basic_english


@dataclasses.dataclass
class TopicModel:
    words: list[str]          # vocabulary of the bag of words
    topic_word: np.ndarray    # [K, V] normalised topic–word distributions


def fit_lda(docs: list[str], K: int, seed: int, *, max_features: int = 20000, max_df: float = 0.5,
            min_df: int = 5, max_iter: int = 10) -> TopicModel:
    """LDA with K topics on ``docs`` (seeded; documents are shuffled first,
    docs/reproductions/real-text.md#reading-the-files)."""
    from sklearn.decomposition import LatentDirichletAllocation
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, CountVectorizer

    order = np.random.default_rng(seed).permutation(len(docs))
    vec = CountVectorizer(tokenizer=basic_english, lowercase=False, token_pattern=None,
                          max_features=max_features, max_df=max_df, min_df=min(min_df, len(docs)))
    X = vec.fit_transform([docs[i] for i in order])
    words = vec.get_feature_names_out().tolist()
    keep = np.array([w not in ENGLISH_STOP_WORDS and any(c.isalpha() for c in w) for w in words])
    X = X[:, keep]
    words = [w for w, k in zip(words, keep) if k]
    lda = LatentDirichletAllocation(n_components=K, random_state=seed, max_iter=max_iter,
                                    learning_method="batch")
    lda.fit(X)
    tw = lda.components_ / lda.components_.sum(axis=1, keepdims=True)
    return TopicModel(words, tw)


def word_topics(tm: TopicModel, k: int = 1, tau: float = 0.0) -> dict[str, list[int]]:
    """Top-k topics of each word by normalised P(topic | word) ∝ P(word | topic), keeping those ≥ τ
    (docs/reproductions/real-text.md#the-papers-wikipedia-pipeline)."""
    p = tm.topic_word / tm.topic_word.sum(axis=0, keepdims=True)   # [K, V], columns sum to 1
    order = np.argsort(-p, axis=0)[:k]                               # [k, V]
    return {w: [int(t) for t in order[:, j] if p[t, j] >= tau] for j, w in enumerate(tm.words)}


def top_words(tm: TopicModel, n: int, allowed: set[str] | None = None) -> list[list[str]]:
    """The n most probable words of each topic, optionally restricted to ``allowed`` (e.g. single WordPieces)."""
    out = []
    for row in tm.topic_word:
        ws = [tm.words[j] for j in np.argsort(-row) if allowed is None or tm.words[j] in allowed]
        out.append(ws[:n])
    return out
