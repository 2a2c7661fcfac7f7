"""topic/embeddings (E1; docs/reproductions/topic.md#embedding-result, docs/reproductions/topic.md#topicembeddings):
trained embeddings alone learn the topic blocks, with uniform attention, W_V = I and d = 32 below the vocabulary
size with a trained, untied decoder (so the embedding Gram is not the logit map)."""

from __future__ import annotations

from typing import Any

import torch

from tdyn import stats
from tdyn.papers.topic import quotes as quotes
from tdyn.papers.topic.analysis import (E1, MATRIX_COLS, as_run, final, heatmaps, matrices_of, matrix_rows,
                                        member_model, metrics_table, stage_config)
from tdyn.papers.topic.data import NUM_SPECIAL
from tdyn.papers.topic.model import TopicTransformer
from tdyn.papers.topic.probes import embedding_gram
from tdyn.reproduce.common import claim, configure, decide, reading
from tdyn.reproduce.phases import Phases, register_phases
from tdyn.reproduce.registry import ReproduceContext


def embeddings_config(seed: int = 0, quick: bool = False) -> dict:
    return stage_config(E1, seed, quick)


def plan(ctx: ReproduceContext) -> dict[str, dict]:
    return {"e1": embeddings_config(ctx.seed, ctx.quick)}


def _config(ctx: ReproduceContext):
    return configure(plan(ctx)["e1"], ctx.overrides)


def measure(ctx: ReproduceContext, trained: dict) -> dict[str, list[dict]]:
    """Per seed: E1's numbers (``e1_measures``) and the final train loss; the per-topic dot contrasts; the
    embedding Gram and the logit map of the first seed."""
    rows, per_topic, mats = [], [], {}
    for d in trained["e1"]:
        run = as_run(d)
        seed = run.seed
        model, dc = member_model(run)
        rows.append({"run": d.name, "seed": seed} | e1_measures(model, dc.words_per_topic)
                    | {"train_loss": final(metrics_table(run), "loss")})
        per_topic += [{"run": d.name, "seed": seed, "topic": t, "dot_contrast": x}
                      for t, x in enumerate(rows[-1].pop("dot_per_topic"))]
        if not mats:
            E = model.embed_table()[0].detach()
            mats = {"W_E W_Eᵀ": E @ E.T, "logit map W_dec W_Eᵀ": _logit_map(model)}
    return {"embeddings": rows, "embeddings_per_topic": per_topic, "embeddings_matrices": matrix_rows(mats)}


def _setting(d: int, V: int, eps: float) -> str:
    return (f"d = {d} < |V| = {V}, trained untied decoder W_dec [|V|×d], W_V = I_d, uniform attention, "
            f"W_E from ε·U[0,1) with ε = {eps:g}: the embedding Gram W_E W_Eᵀ is not the logit map W_dec W_Eᵀ")


def judge(ctx: ReproduceContext, tables: dict) -> dict[str, Any]:
    """E1's claim from the per-seed table: the Gram block contrast above 2 SE and every topic's above 0, every seed."""
    cfg = _config(ctx)
    rows = tables["embeddings"]
    per_topic = [[r["dot_contrast"] for r in tables["embeddings_per_topic"] if r["run"] == row["run"]] for row in rows]

    def seeds_verdict(key: str, se_key: str) -> tuple[bool | None, str | None]:
        votes = [decide(r[key], r[se_key]) if r[f"min_{key}"] > 0 else False for r in rows]
        return stats.all_seeds(votes)

    readings = []
    for kind, what in (("dot", "inner product"), ("cos", "cosine")):
        held, why = seeds_verdict(f"{kind}_contrast", f"{kind}_se")
        readings.append(reading(f"{what}: same-topic off-diagonal mean of the embedding Gram minus different-topic "
                                f"mean > 2× its standard error over the {cfg.typed_data().num_topics} topics, and > 0 for every "
                                "topic, every seed",
                                held, reason=why, contrast=[r[f"{kind}_contrast"] for r in rows],
                                se=[r[f"{kind}_se"] for r in rows],
                                min_topic_contrast=[r[f"min_{kind}_contrast"] for r in rows]))
    setting = _setting(rows[0]["d"], cfg.typed_data().vocab_size, cfg.typed_model().init_eps)
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
                             gram_vs_logit_rel_diff=[r["gram_vs_logit_rel_diff"] for r in rows])]}


def draw(ctx: ReproduceContext, tables: dict, results: dict) -> list[str]:
    """The embedding Gram beside the logit map (the first seed)."""
    cfg = _config(ctx)
    heatmaps(ctx.out / "embeddings.png", matrices_of(tables["embeddings_matrices"]), cfg.typed_data().words_per_topic,
             f"E1 (d = {tables['embeddings'][0]['d']}, trained decoder) after {cfg.optim.steps} steps")
    return ["embeddings.png"]


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


register_phases("topic/embeddings", Phases(plan=plan, measure=measure, judge=judge, draw=draw,
                                           tables=("embeddings", "embeddings_per_topic", "embeddings_matrices"),
                                           columns={"embeddings_matrices": MATRIX_COLS}),
                default_config=embeddings_config)
