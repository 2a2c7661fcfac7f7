"""topic/stage2 (E3, docs/reproductions/topic.md#variants-e1-to-e6, docs/reproductions/topic.md#stage-2-attention,
docs/reproductions/topic.md#topicstage2): with W_V frozen to the block matrix, W_K and W_Q learn same-topic
attention; and its ablation topic/no-unchanged-mask (p_c = 0: the effect should vanish,
docs/reproductions/topic.md#stage-2-attention)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tdyn import runs, stats
from tdyn.data.lda import NUM_SPECIAL
from tdyn.reproduce.common import claim, decide
from tdyn.papers.topic import quotes as quotes
from tdyn.reproduce.registry import ReproduceContext, register
from tdyn.papers.topic.analysis import (E3, GAP_DEF, final, member_model, metrics_table,
                                           stage_config, train_runs, with_stage_probe)
from tdyn.probes.topic_stages import model_scores, topic_block_score
from tdyn.report import style
from tdyn.runs import write_csv


def stage2_config(seed: int = 0, quick: bool = False, mask_correct_prob: float = 0.1) -> dict:
    return with_stage_probe(stage_config(E3, seed, quick, data={"mask_correct_prob": mask_correct_prob}))


def _attention_rows(dirs: list[Path], label: str) -> list[dict]:
    rows = []
    for d in dirs:
        m = metrics_table(d)
        rows.append({"variant": label, "run": d.name, "seed": runs.read_meta(d)["seed"],
                     "same_token": final(m, "topic.attention/same_token"),
                     "same_topic": final(m, "topic.attention/same_topic"),
                     "diff_topic": final(m, "topic.attention/diff_topic"),
                     "gap": final(m, "topic.attention/gap"), "gap_doc": final(m, "topic.attention/gap_doc"),
                     "gap_se": final(m, "topic.stages/gap_se"),
                     "kappa": final(m, "topic.stages/kappa"), "kappa_se": final(m, "topic.stages/kappa_se"),
                     "kq_contrast": final(m, "topic.blocks/KtQ_contrast"),
                     "dev_loss_probe": final(m, "topic.dev_loss/dev_loss")})
    return rows


ATTN_COLS = ["variant", "run", "seed", "same_token", "same_topic", "diff_topic", "gap", "gap_doc", "gap_se",
             "kappa", "kappa_se", "kq_contrast", "dev_loss_probe"]
KAPPA_DEF = ("topic-block score κ of the effective scores S[a,b] = (W_Q e_a + b_Q)·(W_K e_b + b_K)/√d (query a, "
             "key b, biases included): word ids only, each query row centred over word keys, same-topic "
             "off-diagonal mean − different-topic mean (0 for query-only, key-only and START/END-only "
             "changes); noise = std of the per-topic values/√T")


def _attention_figure(path: Path, runs_by_label: dict[str, Path], v: int, title: str) -> None:
    """Heat maps of W_Kᵀ W_Q (final) per variant and the attention class averages against step."""
    import matplotlib.pyplot as plt

    style.apply()
    n = len(runs_by_label)
    fig, axes = plt.subplots(1, n + 1, figsize=(4.6 * (n + 1), 4), squeeze=False, layout="constrained")
    for ax, (label, d) in zip(axes[0], runs_by_label.items()):
        model, _ = member_model(d)
        M = (model.W_K[0].T @ model.W_Q[0]).detach().numpy()
        lim = np.abs(M[NUM_SPECIAL:, NUM_SPECIAL:]).max() or 1.0
        im = ax.imshow(M, cmap="RdBu_r", vmin=-lim, vmax=lim)
        ax.set_title(f"W_Kᵀ W_Q ({label})")
        ax.set_xlabel("query id")
        ax.set_ylabel("key id")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    ax = axes[0][n]
    for (label, d), col in zip(runs_by_label.items(), style.PALETTE):
        m = metrics_table(d)
        ax.plot(m["step"], m["topic.attention/same_topic"], color=col, label=f"same topic ({label})")
        ax.plot(m["step"], m["topic.attention/diff_topic"], color=col, ls="--", label=f"diff topic ({label})")
    ax.set_xlabel("step")
    ax.set_ylabel("attention / uniform")
    ax.legend(fontsize=7)
    fig.suptitle(title)
    style.save(fig, path)


@register("topic/stage2", "E3: with W_V frozen to the block matrix, W_K, W_Q learn same-topic attention",
          default_config=stage2_config, configs=lambda ctx: {"e3": stage2_config(ctx.seed, ctx.quick)})
def reproduce_stage2(ctx: ReproduceContext) -> dict:
    cfg, dirs = train_runs(ctx, "e3", stage2_config(ctx.seed, ctx.quick))
    v = cfg.typed_data().words_per_topic
    rows = _attention_rows(dirs, "E3")
    write_csv(ctx.out / "stage2.csv", rows, ATTN_COLS)
    _attention_figure(ctx.out / "stage2.png", {"E3": dirs[0]}, v, f"E3: W_V = B, {cfg.optim.steps} steps")
    per_topic = []
    for d in dirs:
        model, _ = member_model(d)
        with torch.no_grad():
            per_topic.append(topic_block_score(model_scores(model), v, NUM_SPECIAL)["kappa_per_topic"][0].tolist())
    gap_held, gap_why = stats.all_seeds([decide(r["gap_doc"], r["gap_se"]) for r in rows])
    kq_held, kq_why = stats.all_seeds([decide(r["kappa"], r["kappa_se"]) for r in rows])
    claims = [
        claim("e3-attention", "Corrected same-topic attention exceeds different-topic attention, every seed "
              "(docs/reproductions/topic.md#topicstage2)", gap_held, reason=gap_why,
              source="paper", quote=quotes.SIMILARITY,
              paper=f"{quotes.SIMILARITY_WHERE}; with W_V fixed to the block solution (tdyn's E3, the stage-2 setting "
              "of docs/reproductions/topic.md#stage-2-attention, docs/reproductions/topic.md#topicstage2)",
              definition=GAP_DEF, measured="final attention gap ± SE over probe documents, per seed",
              expected="gap > 2·SE for every seed", gap=[r["gap_doc"] for r in rows], se=[r["gap_se"] for r in rows],
              same_topic=[r["same_topic"] for r in rows], diff_topic=[r["diff_topic"] for r in rows]),
        claim("e3-kq-blocks", "The scores W_K, W_Q learn have a topic block: same-topic keys score higher "
              "than different-topic keys, every seed (docs/reproductions/topic.md#stage-2-attention)", kq_held, reason=kq_why,
              source="paper", quote=quotes.SIMILARITY,
              paper=f"{quotes.SIMILARITY_WHERE}: read on the scores W_K, W_Q produce (the topic-block score κ), with "
              "W_V fixed to the block solution (docs/reproductions/topic.md#stage-2-attention)",
              definition=KAPPA_DEF, measured="final topic-block score κ ± SE over topics, per seed",
              expected="κ > 2·SE for every seed", kappa=[r["kappa"] for r in rows], se=[r["kappa_se"] for r in rows],
              min_topic_kappa=[min(p) for p in per_topic],
              kq_weight_contrast=[r["kq_contrast"] for r in rows]),
    ]
    return {"experiment": "topic/stage2", "config": cfg.model_dump(mode="json"), "runs": rows,
            "attention_gap": float(np.mean([r["gap"] for r in rows])), "kappa_per_topic": per_topic,
            "claims": claims, "files": ["stage2.csv", "stage2.png"]}


# ---------------------------------------------------------------- ablation: p_c = 0


@register("topic/no-unchanged-mask", "Ablation p_c = 0: the same-topic attention effect of E3 should vanish (docs/reproductions/topic.md#stage-2-attention)",
          configs=lambda ctx: {"pc0.1": stage2_config(ctx.seed, ctx.quick, 0.1),
                               "pc0": stage2_config(ctx.seed, ctx.quick, 0.0)})
def reproduce_no_unchanged(ctx: ReproduceContext) -> dict:
    cfg_a, dirs_a = train_runs(ctx, "pc0.1", stage2_config(ctx.seed, ctx.quick, 0.1))
    cfg_b, dirs_b = train_runs(ctx, "pc0", stage2_config(ctx.seed, ctx.quick, 0.0))
    v = cfg_a.typed_data().words_per_topic
    rows = _attention_rows(dirs_a, "p_c=0.1") + _attention_rows(dirs_b, "p_c=0")
    write_csv(ctx.out / "no_unchanged_mask.csv", rows, ATTN_COLS)
    _attention_figure(ctx.out / "no_unchanged_mask.png", {"p_c=0.1": dirs_a[0], "p_c=0": dirs_b[0]}, v,
                      f"E3 with and without unchanged selected tokens, {cfg_a.optim.steps} steps")
    r1 = [r for r in rows if r["variant"] == "p_c=0.1"]
    r0 = [r for r in rows if r["variant"] == "p_c=0"]
    (g1, se1), (g0, se0) = (stats.mean_se([r["gap_doc"] for r in rs]) for rs in (r1, r0))
    # the shrink margin per seed: 0.25·gap(p_c = 0.1) − |gap(p_c = 0)|, paired over seeds (the same seed's init
    # and data stream at both p_c), its seed standard error the noise (one seed: NaN, inconclusive)
    shrink, shrink_se = stats.paired([0.25 * r["gap_doc"] for r in r1], [abs(r["gap_doc"]) for r in r0])
    effect = decide(g1, se1)
    if len(r1) < 2 or len(r0) < 2:
        held, why = None, "one seed: no seed noise band (the single-seed rule, tdyn.stats)"
    elif effect is not True:
        held, why = None, ("no same-topic attention effect above the seed noise at p_c = 0.1, so nothing to vanish"
                           if effect is None else "the attention gap at p_c = 0.1 is negative")
    else:
        held = decide(shrink, shrink_se)
        why = None if held is not None else "0.25·gap(0.1) − |gap(0)| within 2 seed standard errors of 0"
    return {"experiment": "topic/no-unchanged-mask", "gap_pc_0.1": g1, "gap_pc_0": g0, "runs": rows,
            "claims": [claim("pc0-vanishes", "At p_c = 0 the same- minus different-topic attention gap shrinks "
                             "toward 0: |gap(p_c=0)| ≤ 0.25·gap(p_c=0.1) (docs/reproductions/topic.md#stage-2-attention, docs/reproductions/topic.md#topicstage2)", held, reason=why,
                             source="derived", derived="tdyn's derivation from the authors' masking "
                             "(docs/reproductions/topic.md#stage-2-attention): a [MASK] or random query carries no topic "
                             "information, so only unchanged selected queries (fraction p_c) reward topic-selective "
                             "attention and the effect should vanish at p_c = 0; an ablation the paper does not report, "
                             "with tdyn's 0.25 threshold",
                             paper=f"{quotes.SIMILARITY_WHERE} (“{quotes.SIMILARITY}”), under the authors' masking "
                             "(docs/reproductions/topic.md#stage-2-attention)",
                             definition=GAP_DEF + "; seed mean at each p_c, noise = seed standard error (tdyn.stats)",
                             measured="seed-mean final attention gap ± seed SE at p_c = 0 and p_c = 0.1; the "
                             "paired shrink margin 0.25·gap(0.1) − |gap(0)| ± seed SE",
                             expected="gap(0.1) > 2·SE and 0.25·gap(0.1) − |gap(0)| > 2·SE", gap_pc_01=g1, gap_pc_0=g0,
                             se_pc_01=se1, se_pc_0=se0, shrink_margin=shrink, shrink_margin_se=shrink_se,
                             gap_pc_01_per_seed=[r["gap_doc"] for r in r1], gap_pc_0_per_seed=[r["gap_doc"] for r in r0],
                             doc_se_pc_01_per_seed=[r["gap_se"] for r in r1], doc_se_pc_0_per_seed=[r["gap_se"] for r in r0])],
            "files": ["no_unchanged_mask.csv", "no_unchanged_mask.png"]}
