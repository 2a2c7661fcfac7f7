"""Real-text checks (issue 6): topic structure of pretrained embeddings (Li et al.) and attention
dynamics of a small causal LM on text (Tian et al. Figs 7, 10), on the offline corpora of corpora.md.
"""

from __future__ import annotations

import numpy as np
import torch

from tdyn.data import corpora
from tdyn.data.real_topics import fit_lda, top_words, word_topics
from tdyn.experiments.common import claim, write_csv
from tdyn.experiments.registry import ReproduceContext, register
from tdyn.probes.topic_similarity import attention_topic_stats, embedding_topic_stats
from tdyn.report import style

CORPORA = ("wiki", "bbc")
CLASSES = ("same_token", "same_topic", "different_topic")


def _sample_docs(docs: list[str], n: int | None, seed: int) -> list[str]:
    if n is None or n >= len(docs):
        return docs
    idx = np.random.default_rng(seed).choice(len(docs), size=n, replace=False)
    return [docs[i] for i in idx]


def _topic_words(tm, model, n_top: int) -> tuple[list[str], torch.Tensor]:
    """Top-n single-WordPiece words per topic and their topic-membership matrix T [n_words, K]."""
    tops = top_words(tm, n_top, allowed=set(model.index))
    words = list(dict.fromkeys(w for t in tops for w in t))  # grouped by first topic
    T = torch.zeros(len(words), len(tops), dtype=torch.bool)
    pos = {w: i for i, w in enumerate(words)}
    for k, t in enumerate(tops):
        T[[pos[w] for w in t], k] = True
    return words, T


def _attention_stats(model, docs, wt: dict[str, list[int]], K: int, max_len: int) -> dict[str, np.ndarray]:
    """Mean attention [L, H] per class over documents, on non-special unsplit tokens that carry a topic."""
    topic_of = {model.index[w]: t[0] for w, t in wt.items() if t and w in model.index}
    T = torch.eye(K, dtype=torch.bool)
    sums, counts = {}, {}
    cls, sep = model.index["[CLS]"], model.index["[SEP]"]
    for doc in docs:
        ids, owner = model.tokenize(doc)
        ids, owner = ids[: max_len - 2], owner[: max_len - 2]
        own = np.array(owner)
        single = (np.bincount(own, minlength=own.max() + 1)[own] == 1) if len(own) else own
        keep = [i for i, t in enumerate(ids) if single[i] and t in topic_of]
        if len(keep) < 2:
            continue
        A = model.attentions(torch.tensor([cls] + ids + [sep]))
        pos = torch.tensor(keep) + 1
        A = A[:, :, pos][:, :, :, pos]
        # a word's "class index" is its token id; same token = same id, topics looked up per token
        tok = torch.tensor([ids[i] for i in keep])
        uniq, inv = torch.unique(tok, return_inverse=True)
        Tw = T[torch.tensor([topic_of[int(u)] for u in uniq])]
        for c, (s, n) in attention_topic_stats(A, inv, Tw).items():
            sums[c] = sums.get(c, 0) + s
            counts[c] = counts.get(c, 0) + n
    return {c: (sums[c] / counts[c]).numpy() for c in sums}


def _gram_figure(E: torch.Tensor, T: torch.Tensor, path, title: str) -> None:
    import matplotlib.pyplot as plt

    style.apply()
    M = E / E.norm(dim=1, keepdim=True)
    G = (M @ M.T).numpy()
    np.fill_diagonal(G, np.nan)  # same-token cosine is 1; hide it so the off-diagonal blocks are visible
    v = np.nanquantile(np.abs(G), 0.99)
    first = T.float().argmax(1).numpy()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    im = ax.imshow(G, cmap="RdBu_r", vmin=-v, vmax=v)
    for b in np.flatnonzero(np.diff(first)) + 0.5:
        ax.axhline(b, color="k", lw=0.5)
        ax.axvline(b, color="k", lw=0.5)
    ax.set_title(title)
    ax.set_xlabel("topic word (grouped by LDA topic)")
    ax.set_ylabel("topic word")
    fig.colorbar(im, ax=ax, label="cosine of MiniLM input embeddings")
    style.save(fig, path)


@register("real/topic-embeddings",
          "Li et al. real-data check: same-topic vs different-topic similarity of MiniLM embeddings and attention")
def topic_embeddings(ctx: ReproduceContext) -> dict:
    from tdyn.models.minilm import MiniLM

    K, n_top = 12, 30
    n_lda_docs, lda_iter = (600, 5) if ctx.quick else (None, 10)
    n_att_docs, max_len = (10, 64) if ctx.quick else (200, 128)
    model = MiniLM()
    ctx.out.mkdir(parents=True, exist_ok=True)
    res = {"experiment": "real/topic-embeddings", "cosine": {}, "dot": {}, "attention": {},
           "embedding_stats": {}, "provenance": {}, "claims": [],
           "settings": {"K": K, "n_top": n_top, "lda_docs": n_lda_docs, "lda_max_iter": lda_iter,
                        "attention_docs": n_att_docs, "max_len": max_len, "k": 1, "tau": 0.0}}
    rows = []
    for name in CORPORA:
        docs, _ = corpora.read_corpus(name)
        res["provenance"][name] = corpora.provenance(name, docs)
        tm = fit_lda(_sample_docs(docs, n_lda_docs, ctx.seed), K=K, seed=ctx.seed, max_iter=lda_iter)
        words, T = _topic_words(tm, model, n_top)
        E = model.E[[model.index[w] for w in words]].double()
        st = embedding_topic_stats(E, T)
        res["embedding_stats"][name] = st
        for kind in ("cosine", "dot"):
            res[kind][name] = {c: st[kind][c]["mean"] for c in CLASSES}
            rows += [{"corpus": name, "statistic": kind, "class": c, **st[kind][c]} for c in CLASSES]
        _gram_figure(E.float(), T, ctx.out / f"gram_{name}.png",
                     f"{name}: {len(words)} LDA topic words, K = {K}")
        att = _attention_stats(model, _sample_docs(docs, n_att_docs, ctx.seed + 1), word_topics(tm, 1, 0.0),
                               K, max_len)
        res["attention"][name] = {c: {"per_layer_head": a.tolist(), "mean": float(a.mean())} for c, a in att.items()}
        for kind in ("cosine", "dot"):
            s, d = res[kind][name]["same_topic"], res[kind][name]["different_topic"]
            res["claims"].append(claim(f"embedding_{kind}_{name}",
                                       f"{kind} of pretrained input embeddings is higher within an LDA topic "
                                       f"than across topics ({name})", s > d, same_topic=s, different_topic=d,
                                       difference=s - d))
        s, d = att["same_topic"].mean(), att["different_topic"].mean()
        res["claims"].append(claim(f"attention_{name}", f"attention between same-topic words exceeds attention "
                                   f"between different-topic words, mean over layers and heads ({name})",
                                   bool(s > d), same_topic=float(s), different_topic=float(d),
                                   layers_holding=int((att["same_topic"].mean(1) > att["different_topic"].mean(1)).sum())))
    write_csv(ctx.out / "embedding_stats.csv", rows, ["corpus", "statistic", "class", "mean", "std", "count"])
    return res
