"""topic/embeddings (E1, docs/reproductions/topic.md#variants-e1-to-e6,
docs/reproductions/topic.md#embedding-result, docs/reproductions/topic.md#topicembeddings): trained embeddings
alone learn the topic blocks, with uniform attention, W_V = I and d = 32 below the vocabulary size with a trained,
untied decoder (so the embedding Gram is not the logit map)."""

from __future__ import annotations

from typing import Any

import torch

from tdyn import runs, stats
from tdyn.data.lda import NUM_SPECIAL
from tdyn.reproduce.common import claim, decide, reading
from tdyn.papers.topic import quotes as quotes
from tdyn.reproduce.registry import ReproduceContext, register
from tdyn.papers.topic.analysis import (E1, E1_D, final, heatmaps, member_model, metrics_table,
                                           stage_config, train_runs)
from tdyn.models.topic import TopicTransformer
from tdyn.probes.topic import embedding_gram
from tdyn.runs import write_csv


def embeddings_config(seed: int = 0, quick: bool = False) -> dict:
    return stage_config(E1, seed, quick)


@register("topic/embeddings", "E1: trained embeddings alone learn the topic blocks (uniform attention, W_V = I, "
          f"d = {E1_D} below the vocabulary size with a trained, untied decoder)", default_config=embeddings_config,
          configs=lambda ctx: {"e1": embeddings_config(ctx.seed, ctx.quick)})
def reproduce_embeddings(ctx: ReproduceContext) -> dict:
    cfg, dirs = train_runs(ctx, "e1", embeddings_config(ctx.seed, ctx.quick))
    v = cfg.typed_data().words_per_topic
    rows, per_topic = [], []
    for d in dirs:
        model, _ = member_model(d)
        rows.append({"run": d.name, "seed": runs.read_meta(d)["seed"]} | e1_measures(model, v)
                    | {"train_loss": final(metrics_table(d), "loss")})
        per_topic.append(rows[-1].pop("dot_per_topic"))
    cols = list(rows[0])
    write_csv(ctx.out / "embeddings.csv", rows, cols)
    model, _ = member_model(dirs[0])
    E = model.embed_table()[0].detach()
    heatmaps(ctx.out / "embeddings.png", {"W_E W_Eᵀ": E @ E.T, "logit map W_dec W_Eᵀ": _logit_map(model)}, v,
             f"E1 (d = {model.d}, trained decoder) after {cfg.optim.steps} steps")

    def seeds_verdict(key: str, se_key: str) -> tuple[bool | None, str | None]:
        votes = [decide(r[key], r[se_key]) if r[f"min_{key}"] > 0 else False for r in rows]
        return stats.all_seeds(votes)

    readings = []
    for kind, what in (("dot", "inner product"), ("cos", "cosine")):
        held, why = seeds_verdict(f"{kind}_contrast", f"{kind}_se")
        readings.append(reading(f"{what}: same-topic off-diagonal mean of the embedding Gram minus different-topic "
                                "mean > 2× its standard error over the 10 topics, and > 0 for every topic, every seed",
                                held, reason=why, contrast=[r[f"{kind}_contrast"] for r in rows],
                                se=[r[f"{kind}_se"] for r in rows],
                                min_topic_contrast=[r[f"min_{kind}_contrast"] for r in rows]))
    setting = (f"d = {model.d} < |V| = {model.V}, trained untied decoder W_dec [|V|×d], W_V = I_d, uniform attention, "
               "W_E from ε·U[0,1) with ε = 0.01: the embedding Gram W_E W_Eᵀ is not the logit map W_dec W_Eᵀ")
    return {"experiment": "topic/embeddings", "setting": setting, "config": cfg.model_dump(mode="json"), "runs": rows,
            "per_topic_contrast": per_topic,
            "claims": [claim("e1-blocks", "Same-topic embeddings have a larger inner product (and cosine) than "
                             "different-topic ones, for every topic and seed (docs/reproductions/topic.md#topicembeddings), with embeddings separate "
                             "from the output map", source="paper", quote=quotes.EMBEDDING,
                             paper=f"{quotes.SIMILARITY_WHERE}; docs/reproductions/topic.md#embedding-result, "
                             "docs/reproductions/topic.md#topicembeddings (the setting — d, the trained decoder, the "
                             "init — is tdyn's E1)",
                             definition="block contrast of W_E W_Eᵀ (dot) and of the cosine Gram on the word ids "
                             "(same-topic off-diagonal mean − different-topic mean; per topic: the rows of that "
                             "topic), noise = std over topics/√T; " + setting,
                             measured="Gram block contrast ± SE over topics, min per-topic contrast, per seed",
                             expected="> 2·SE and every topic > 0, every seed", readings=readings,
                             gram_vs_logit_rel_diff=[r["gram_vs_logit_rel_diff"] for r in rows])],
            "files": ["embeddings.csv", "embeddings.png"]}


def _logit_map(model: TopicTransformer) -> torch.Tensor:
    """M [V, V]: column w = the logits produced by a context of the single word w (W_dec W_V ẽ_w, no bias)."""
    E = model.embed_table()[0].detach()
    return model.W_dec[0].detach() @ model.W_V[0].detach() @ E.T


def e1_measures(model: TopicTransformer, v: int) -> dict[str, Any]:
    """E1's numbers for member 0 of ``model``: Gram block contrasts (dot, cosine) with SE over topics, and
    the distance between the embedding Gram and the logit map (0 iff E1 were E2 transposed)."""
    E = model.embed_table()[:1].detach()
    g = embedding_gram(E, v, NUM_SPECIAL)
    G, M = (E[0] @ E[0].T), _logit_map(model)
    out = {"d": model.d, "decoder": model.cfg.decoder}
    for k in ("dot", "cos"):
        out |= {f"{k}_same": float(g[f"{k}_same"]), f"{k}_diff": float(g[f"{k}_diff"]),
                f"{k}_contrast": float(g[f"{k}_contrast"]),
                f"{k}_se": stats.se(g[f"{k}_per_topic"][0].tolist()),      # SE over the T topics
                f"min_{k}_contrast": float(g[f"{k}_per_topic"].min())}
    out["gram_vs_logit_rel_diff"] = float((G - M).norm() / M.norm().clamp(min=1e-30))
    out["dot_per_topic"] = g["dot_per_topic"][0].tolist()
    return out
