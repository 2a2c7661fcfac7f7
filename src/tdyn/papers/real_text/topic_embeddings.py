"""real/topic-embeddings: Li et al.'s real-data check on pretrained MiniLMs: input embeddings (cosine, dot) and
attention are larger between words of one LDA topic than across topics, on the offline corpora
(docs/reproductions/real-text.md#realtopic-embeddings). Nothing is trained: measure fits LDA, reads the
pretrained models and writes the statistics; judge and draw read the tables."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from tdyn import stats
from tdyn.papers.real_text import data as corpora
from tdyn.papers.real_text import minilm
from tdyn.papers.real_text.analysis import CORPORA
from tdyn.papers.real_text.topics import fit_lda, top_words, word_topics
from tdyn.papers.topic.similarity import attention_topic_stats, embedding_topic_stats, permutation_null
from tdyn.report import style
from tdyn.reproduce.common import claim, decide, margin, with_options
from tdyn.reproduce.phases import Phases, register_phases
from tdyn.reproduce.registry import ReproduceContext
from tdyn.schema import Strict

CLASSES = ("same_token", "same_topic", "different_topic")
KINDS = ("cosine", "dot")


@dataclasses.dataclass(frozen=True)
class Grid:
    """LDA topics and top words per topic; documents for LDA (None: all) and its iterations; documents and
    tokens for the attention; permutations of the null; word→topic rule (top k topics above τ)."""

    K: int
    n_top: int
    lda_docs: int | None
    lda_max_iter: int
    attention_docs: int
    max_len: int
    n_perm: int
    k: int = 1
    tau: float = 0.0

    def settings(self, models: list[str]) -> dict:
        """results.json's ``settings``."""
        return {"K": self.K, "n_top": self.n_top, "lda_docs": self.lda_docs, "lda_max_iter": self.lda_max_iter,
                "attention_docs": self.attention_docs, "max_len": self.max_len, "k": self.k, "tau": self.tau,
                "models": models}


FULL = Grid(K=12, n_top=30, lda_docs=None, lda_max_iter=10, attention_docs=200, max_len=128, n_perm=200)
QUICK = Grid(K=12, n_top=30, lda_docs=600, lda_max_iter=5, attention_docs=10, max_len=64, n_perm=50)


class TopicEmbeddingsOptions(Strict):
    """Which pretrained models to check (None: all of them)."""

    models: list[Literal[minilm.MODELS]] | None = Field(
        None, min_length=1, description=f"pretrained models, from {', '.join(minilm.MODELS)} (tdyn.papers.real_text.minilm)")


def _models(ctx: ReproduceContext) -> list[str]:
    """The models checked, in order, each once."""
    return list(dict.fromkeys(with_options({"models": list(minilm.MODELS)}, ctx.options)["models"]))


#: Li et al.'s words (the paper text, §1), quoted by the real/topic-embeddings claims
LI_QUOTE_EMB = ("if we fit topics to a real-life corpus like Wikipedia using a Latent Dirichlet Allocation (LDA) model "
                "[6], we find a pretrained BERT model produces token embeddings that are more similar (in terms of "
                "inner product or cosine similarity) if they belong to the same topic, and more different if they "
                "belong to different topics (§1)")
LI_QUOTE_ATT = ("Through theoretical analysis and experiments, we show that between same-topic words, the embeddings "
                "should be more similar, and the average pairwise attention should be larger (§1)")
TOPIC_DEPARTURES = ("Departures (docs/reproductions/real-text.md#realtopic-embeddings): a pretrained MiniLM instead of "
                    "BERT, the offline wiki lead sections / BBC News instead of a Wikipedia dump, K = 12 LDA topics "
                    "instead of 100, the LDA topic words instead of all vocabulary pairs")

#: the tables: similarity statistics, permutation nulls, attention per (layer, head), the topic words drawn,
#: the models' shapes and the corpora's provenance
COLUMNS = {
    "embedding_stats": ["model", "corpus", "statistic", "class", "mean", "std", "count"],
    "embedding_null": ["model", "corpus", "statistic", "mean", "std", "n_perm"],
    "attention": ["model", "corpus", "class", "layer", "head", "weight"],
    "topic_words": ["model", "corpus", "position", "word", "token_id", "topic"],
    "models": ["model", "layers", "heads", "width"],
    "corpora": ["corpus", "package", "version", "sha256"],
}


# ---------------------------------------------------------------------------------------------- measure

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


def _measure_pair(ctx, grid: Grid, tm, att_docs, name: str, model, corpus: str) -> dict[str, list[dict]]:
    """One (model, corpus): the similarity statistics and their nulls, the attention per (layer, head), the
    topic words (in drawn order, each under its first topic)."""
    key = {"model": name, "corpus": corpus}
    words, T = _topic_words(tm, model, grid.n_top)
    ids = [model.index[w] for w in words]
    E = model.E[ids].double()
    st = embedding_topic_stats(E, T)
    out = {"embedding_stats": [], "embedding_null": [], "attention": []}
    for kind in KINDS:
        out["embedding_stats"] += [key | {"statistic": kind, "class": c, **st[kind][c]} for c in CLASSES]
    first = T.float().argmax(1).tolist()
    out["topic_words"] = [key | {"position": i, "word": w, "token_id": t, "topic": k}
                          for i, (w, t, k) in enumerate(zip(words, ids, first))]
    att = _attention_stats(model, att_docs, word_topics(tm, grid.k, grid.tau), grid.K, grid.max_len)
    out["attention"] = [key | {"class": c, "layer": layer, "head": head, "weight": float(a[layer, head])}
                        for c, a in att.items() for layer in range(a.shape[0]) for head in range(a.shape[1])]
    out["embedding_null"] = [key | {"statistic": kind} | permutation_null(E, T, kind, n_perm=grid.n_perm, seed=ctx.seed)
                             for kind in KINDS]
    return out


def measure(ctx: ReproduceContext, trained: dict) -> dict[str, list[dict]]:
    """Per corpus an LDA fit, then per model the tables of :data:`COLUMNS` (nothing trained: ``trained`` is empty)."""
    grid = QUICK if ctx.quick else FULL
    models = {n: minilm.MiniLM(n) for n in _models(ctx)}
    tables: dict[str, list[dict]] = {t: [] for t in COLUMNS}
    tables["models"] = [{"model": n, "layers": m.cfg["num_hidden_layers"], "heads": m.cfg["num_attention_heads"],
                         "width": m.cfg["hidden_size"]} for n, m in models.items()]
    for corpus in CORPORA:
        docs, _ = corpora.read_corpus(corpus)
        tables["corpora"].append(corpora.provenance(corpus, docs))
        tm = fit_lda(_sample_docs(docs, grid.lda_docs, ctx.seed), K=grid.K, seed=ctx.seed, max_iter=grid.lda_max_iter)
        att_docs = _sample_docs(docs, grid.attention_docs, ctx.seed + 1)
        for name, model in models.items():
            for t, rows in _measure_pair(ctx, grid, tm, att_docs, name, model, corpus).items():
                tables[t] += rows
    return tables


# ---------------------------------------------------------------------------------------------- judge

def _rows(table: list[dict], **key) -> list[dict]:
    return [r for r in table if all(r[k] == v for k, v in key.items())]


def _attention_arrays(tables: dict, name: str, corpus: str) -> dict[str, np.ndarray]:
    """The mean attention [layers, heads] per class, in float32 as measured."""
    out = {}
    for r in _rows(tables["attention"], model=name, corpus=corpus):
        out.setdefault(r["class"], []).append(r)
    return {c: np.array([[r["weight"] for r in rows if r["layer"] == layer]
                         for layer in sorted({r["layer"] for r in rows})], dtype=np.float32)
            for c, rows in out.items()}


def _embedding_claim(grid: Grid, name: str, tag: str, corpus: str, kind: str, st: dict, null: dict) -> dict:
    s, d = st[kind]["same_topic"]["mean"], st[kind]["different_topic"]["mean"]
    return claim(
        f"embedding_{kind}_{corpus}_{tag}",
        f"{kind} of pretrained input embeddings is higher within an LDA topic than across topics ({name}, {corpus})",
        decide(s - d - null["mean"], null["std"]),
        reason="same- minus different-topic difference within 2σ of the shuffled-topic null",
        source="paper", quote=LI_QUOTE_EMB,
        paper="Li et al. §1 (and docs/reproductions/real-text.md#the-papers-wikipedia-pipeline): pretrained BERT embeddings are more similar within an "
              "LDA topic than across topics",
        definition=f"mean pairwise {kind} of the {name} input embeddings of the {grid.n_top} top words of "
                   f"each of K = {grid.K} LDA topics; same topic = distinct words sharing a topic, different "
                   "topic = words sharing none; noise = std of the difference when topics are shuffled "
                   "among the words (permutation null). " + TOPIC_DEPARTURES,
        measured=f"mean {kind} of LDA topic-word input embeddings ({name})",
        expected="same-topic − different-topic above the permutation null by 2σ",
        model=name, same_topic=s, different_topic=d, difference=s - d,
        margin=margin(s - d - null["mean"], null["std"], noise_source="shuffled-topic permutation null"),
        null=null)


def _attention_claim(name: str, tag: str, corpus: str, att: dict[str, np.ndarray]) -> dict:
    diff_lh = (att["same_topic"] - att["different_topic"]).ravel()
    s, d = att["same_topic"].mean(), att["different_topic"].mean()
    se = stats.se(diff_lh)      # over layers × heads (NaN, hence inconclusive, for a single head)
    return claim(
        f"attention_{corpus}_{tag}", f"attention between same-topic words exceeds attention between "
        f"different-topic words, mean over layers and heads ({name}, {corpus})",
        decide(float(s - d), se),
        reason="same- minus different-topic attention within 2 standard errors over layers × heads",
        source="paper", quote=LI_QUOTE_ATT,
        paper=f"Li et al. §1 and §6 (attention learns topic structure), checked on pretrained {name}; the paper's attention "
              "check on pretrained BERT and Wikipedia is described in "
              "docs/reproductions/real-text.md#the-papers-wikipedia-pipeline (its code was removed from the release)",
        definition="mean attention weight from a topic-word query to a topic-word key of another word sharing "
                   "(same topic) / not sharing (different topic) an LDA topic, pooled over documents, then "
                   "averaged over layers and heads; noise = standard error of the per-(layer, head) difference. "
                   + TOPIC_DEPARTURES,
        measured=f"{name} attention between topic words, mean over layers/heads",
        expected="same-topic > different-topic by 2 standard errors",
        model=name, same_topic=float(s), different_topic=float(d),
        margin=margin(float(s - d), se, noise_source="standard error over layers × heads"),
        layers_holding=int((att["same_topic"].mean(1) > att["different_topic"].mean(1)).sum()),
        layers=int(att["same_topic"].shape[0]))


def _embedding_stats(tables: dict, name: str, corpus: str) -> dict:
    """{'cosine'|'dot': {class: {mean, std, count}}}, as :func:`embedding_topic_stats` gave it."""
    return {kind: {r["class"]: {"mean": r["mean"], "std": r["std"], "count": r["count"]}
                   for r in _rows(tables["embedding_stats"], model=name, corpus=corpus, statistic=kind)}
            for kind in ("dot", "cosine")}


def _provenance(row: dict) -> dict:
    """A corpora row; the package, version and hash as text whatever they look like."""
    return {k: (str(v) if v is not None and k != "corpus" else v) for k, v in row.items()}


def judge(ctx: ReproduceContext, tables: dict) -> dict[str, Any]:
    """Per corpus and model: the two embedding claims against their permutation nulls, the attention claim
    against the standard error over (layer, head)."""
    grid = QUICK if ctx.quick else FULL
    shapes = {r["model"]: r for r in tables["models"]}
    names = _models(ctx)
    res = {"experiment": "real/topic-embeddings", "models": {},
           "provenance": {r["corpus"]: _provenance(r) for r in tables["corpora"]}, "claims": [],
           "settings": grid.settings(names)}
    for name in names:
        res["models"][name] = {"layers": shapes[name]["layers"], "heads": shapes[name]["heads"],
                               "width": shapes[name]["width"], "cosine": {}, "dot": {}, "attention": {},
                               "embedding_stats": {}}
    for corpus in CORPORA:
        for name in names:
            out, tag = res["models"][name], f"L{shapes[name]['layers']}"
            st = out["embedding_stats"][corpus] = _embedding_stats(tables, name, corpus)
            for kind in KINDS:
                out[kind][corpus] = {c: st[kind][c]["mean"] for c in CLASSES}
            att = _attention_arrays(tables, name, corpus)
            out["attention"][corpus] = {c: {"per_layer_head": a.tolist(), "mean": float(a.mean())} for c, a in att.items()}
            for kind in KINDS:
                (null,) = [{k: r[k] for k in ("mean", "std", "n_perm")}
                           for r in _rows(tables["embedding_null"], model=name, corpus=corpus, statistic=kind)]
                res["claims"].append(_embedding_claim(grid, name, tag, corpus, kind, st, null))
            res["claims"].append(_attention_claim(name, tag, corpus, att))
    return res


# ---------------------------------------------------------------------------------------------- draw

def _gram_figure(E: torch.Tensor, first: np.ndarray, path, title: str, model_name: str) -> None:
    """Cosine Gram of the topic words, rows and columns grouped by LDA topic (a word under its first topic,
    in LDA rank order within it), topic blocks outlined and labelled, diagonal hidden, symmetric colour scale
    at the 99th percentile of |cosine| with its colourbar."""
    import matplotlib.pyplot as plt

    style.apply()
    M = E / E.norm(dim=1, keepdim=True)
    G = (M @ M.T).numpy()
    np.fill_diagonal(G, np.nan)  # same-token cosine is 1; hide it so the off-diagonal blocks are visible
    v = np.nanquantile(np.abs(G), 0.99)
    fig, ax = plt.subplots(figsize=(5.5, 5))
    im = ax.imshow(G, cmap="RdBu_r", vmin=-v, vmax=v)
    for b in np.flatnonzero(np.diff(first)) + 0.5:
        ax.axhline(b, color="k", lw=0.5)
        ax.axvline(b, color="k", lw=0.5)
    topics = np.unique(first)
    centres = [float(np.flatnonzero(first == k).mean()) for k in topics]
    ax.set_xticks(centres, [str(k) for k in topics], fontsize=8)
    ax.set_yticks(centres, [str(k) for k in topics], fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("topic word, grouped by LDA topic (tick: topic index)")
    ax.set_ylabel("topic word")
    fig.colorbar(im, ax=ax, label=f"cosine of {model_name} input embeddings")
    style.save(fig, path)


def draw(ctx: ReproduceContext, tables: dict, results: dict) -> list[str]:
    """gram_<corpus>_L<layers>.png per corpus and model, from topic_words.csv and the model's pretrained input
    embeddings of those tokens (a fixed input, like the corpora: n_words² cosines are too many for a table)."""
    grid = QUICK if ctx.quick else FULL
    layers = {r["model"]: r["layers"] for r in tables["models"]}
    files = []
    for name in _models(ctx):
        model = minilm.MiniLM(name)
        for corpus in CORPORA:
            words = sorted(_rows(tables["topic_words"], model=name, corpus=corpus), key=lambda r: r["position"])
            E = model.E[[r["token_id"] for r in words]]
            file = f"gram_{corpus}_L{layers[name]}.png"
            _gram_figure(E.float(), np.array([r["topic"] for r in words]), ctx.out / file,
                         f"{name}\n{corpus}: {len(words)} LDA topic words, K = {grid.K}", name)
            files.append(file)
    return files


PHASES = Phases(measure=measure, judge=judge, draw=draw, tables=tuple(COLUMNS), columns=COLUMNS)
register_phases("real/topic-embeddings", PHASES, options=TopicEmbeddingsOptions)
