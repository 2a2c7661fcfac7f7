"""Same-token / same-topic / different-topic statistics of embeddings and attention
(docs/reproductions/topic.md#embedding-similarity, docs/reproductions/real-text.md#the-papers-wikipedia-pipeline).

Vectorised over all ordered pairs (i ≠ j) of the given rows; a pair is *same-topic* when the two
words share at least one topic and *different-topic* otherwise. ``same_token`` is the diagonal
(‖E_i‖² for dot, 1 for cosine).
"""

from __future__ import annotations

import torch
from numpy import mean as np_mean

from tdyn import stats


def pair_classes(T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks [n, n] of same-topic and different-topic ordered pairs (i ≠ j) from a topic matrix T [n, K] (bool)."""
    Tf = T.to(torch.float32)
    share = (Tf @ Tf.T) > 0
    off = ~torch.eye(T.shape[0], dtype=torch.bool, device=T.device)
    return share & off, ~share & off


def _stats(x: torch.Tensor) -> dict:
    return {"mean": x.mean().item() if x.numel() else float("nan"),
            "std": x.std().item() if x.numel() > 1 else float("nan"), "count": int(x.numel())}   # a spread, not an SE


def embedding_topic_stats(E: torch.Tensor, T: torch.Tensor) -> dict[str, dict]:
    """{'dot'|'cosine': {'same_token'|'same_topic'|'different_topic': {mean, std, count}}} for rows E [n, d]."""
    same, diff = pair_classes(T)
    out = {}
    for kind, M in (("dot", E), ("cosine", E / E.norm(dim=1, keepdim=True))):
        G = M @ M.T
        out[kind] = {"same_token": _stats(G.diagonal()), "same_topic": _stats(G[same]),
                     "different_topic": _stats(G[diff])}
    return out


def attention_topic_stats(A: torch.Tensor, topics: torch.Tensor, T: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean attention per class for one document.

    A [L, H, n, n]: attention among the n positions that carry a topic word; topics [n]: row index into
    T [W, K] for each position. Classes of (query, key) pairs: same token (same word, incl. q = k),
    same topic (different word sharing a topic), different topic. Returns sums and counts [L, H] per class
    so that documents can be pooled.
    """
    same_word = topics[:, None] == topics[None, :]
    Tp = T[topics].to(A.dtype)
    share = (Tp @ Tp.T) > 0
    masks = {"same_token": same_word, "same_topic": share & ~same_word, "different_topic": ~share}
    return {k: ((A * m).sum((-1, -2)), m.sum().expand(A.shape[:2])) for k, m in masks.items()}


def permutation_null(E: torch.Tensor, T: torch.Tensor, kind: str = "cosine", n_perm: int = 200,
                     seed: int = 0) -> dict[str, float]:
    """Null distribution of (same-topic mean − different-topic mean) of ``kind`` similarity when the
    words' topic rows ``T`` are shuffled among the words (topic sizes kept): its mean and standard
    deviation, the noise against which the observed difference is judged."""
    M = E / E.norm(dim=1, keepdim=True) if kind == "cosine" else E
    G = M @ M.T
    g = torch.Generator().manual_seed(seed)
    diffs = []
    for _ in range(n_perm):
        same, diff = pair_classes(T[torch.randperm(T.shape[0], generator=g)])
        diffs.append(float(G[same].mean() - G[diff].mean()))
    return {"mean": float(np_mean(diffs)), "std": stats.sd(diffs), "n_perm": n_perm}
