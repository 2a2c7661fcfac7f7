"""Topic structure (Li, Li & Risteski, ICML 2023), synthetic part: the ``lda_mlm`` task and the
reproductions E1–E6 of spec topic_structure.md §3.4 plus the p_c = 0 ablation.

Stage times (issue 12 item 6; definitions and tests in ``tdyn.probes.topic_stages``), from the probes
logged every ``probes.every`` steps:

* ``t_v_structure`` / ``t_v_loss`` = first logged step where W_V is half-way to the fitted stage-1
  optimum (the convex optimum of the uniform-attention model class, spec §4.3): by block contrast / by
  probe loss. A fixed reference that does not move with the run length (‖ΔW_V‖ grows without bound
  under cross-entropy, so "half of its final value" did);
* ``t_kq_kappa`` = stage-2 onset: first logged step where the topic-block score κ of the key-centred
  effective scores reaches ln 1.05 (a same-topic key gets 5% more attention) above 2× its noise;
  ``t_kq_gap`` the same with the corrected same- minus different-topic attention gap ≥ 0.05. Query-only
  and START/END components of W_Kᵀ W_Q, which dominate ‖W_Kᵀ W_Q‖, do not count;
* two stages iff t_v < t_kq (four readings: structure|loss × κ|gap); delay factor t_kq / t_v;
  inconclusive when W_V never got half-way or K/Q never moved above noise. The old norm-based times are reported as ``t_value_half_norm`` and
  ``t_kq_5pct_norm``.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tdyn import runs
from tdyn.bench import register_bench
from tdyn.data.lda import NUM_SPECIAL, LdaDataConfig, LdaDataset
from tdyn.experiments.common import claim, configure, decide, every_cell, reading, train_into
from tdyn.experiments.registry import ReproduceContext, register
from tdyn.experiments.topic_stage1 import Stage1Options
from tdyn.models.topic import TopicModelConfig, TopicTransformer
from tdyn.probes import topic_stages as ts
from tdyn.probes.topic import attention_classes, block_contrast, embedding_gram
from tdyn.probes.topic_stages import model_scores, topic_block_score
from tdyn.runs import write_csv
from tdyn.tasks.lda_mlm import build_model, dataset, lda_config
from tdyn.theory.topic import bag_of_words, fit_softmax_regression, softmax_regression_loss


# E1 with embeddings that are not the logit map (issue 12 item 7): with W_V = I, an identity decoder
# and d = |V|, W_E is the logit matrix of the input word, so E1 would be E2 transposed. Here d = 32 < |V|
# and the decoder is trained (untied): logits = W_dec W_Eᵀ h + b, and W_E W_Eᵀ is a separate object.
E1_D = 32
E1 = {"embedding": "trained", "emb_init": "small_uniform", "init_eps": 0.01, "attention": "uniform",
      "value": "identity", "decoder": "trained", "d": E1_D}
E2 = {"attention": "uniform", "value": "trained", "decoder": "identity"}
E3 = {"attention": "trained", "value": "block", "decoder": "identity"}
E4 = {"attention": "trained", "value": "trained", "decoder": "identity", "init": "small_uniform", "init_eps": 1e-3}


# ---------------------------------------------------------------- reading runs back


def member_model(run_dir: Path, step: int | str = "final") -> tuple[TopicTransformer, LdaDataConfig]:
    """A one-member model with the parameters of ``run_dir`` at ``step``."""
    rc = runs.read_config(run_dir)
    dc = LdaDataConfig.model_validate(rc["data"])
    model = build_model(dc, TopicModelConfig.model_validate(rc["model"]))
    params = runs.params_of(runs.load_checkpoint(run_dir, step))
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[n][None])
    return model, dc


@torch.no_grad()
def split_loss(model: TopicTransformer, ds: LdaDataset, split: str = "dev", chunk: int = 500) -> float:
    """Per-token mean loss over every selected position of ``split`` (static masks)."""
    m = ds.masked[split]
    tot, cnt = 0.0, 0
    for i in range(0, m.tokens.shape[0], chunk):
        t, y, k = (x[i:i + chunk][None] for x in (m.tokens, m.labels, m.keys))
        n = int((y >= 0).sum())
        tot += float(model.data_loss(t, y, k)[0]) * n
        cnt += n
    return tot / cnt


def convex_optimum(ds: LdaDataset, max_iter: int = 500) -> dict[str, float]:
    """Stage-1 reference (spec §4.3): softmax regression on the visible bag of words, fitted on
    train by L-BFGS and scored on dev with the same static masks."""
    V = ds.cfg.vocab_size
    h, C = bag_of_words(ds.masked["train"].tokens, ds.masked["train"].keys, ds.masked["train"].labels, V)
    W, b, train_loss = fit_softmax_regression(h, C, max_iter=max_iter)
    hd, Cd = bag_of_words(ds.masked["dev"].tokens, ds.masked["dev"].keys, ds.masked["dev"].labels, V)
    return {"train_loss": train_loss, "dev_loss": float(softmax_regression_loss(W, b, hd, Cd))}


def metrics_table(run_dir: Path) -> dict[str, np.ndarray]:
    """Metrics of a run as arrays keyed by metric name (NaN where absent)."""
    recs = [r for r in runs.read_metrics(run_dir) if r.get("loss") is not None]
    keys = sorted({k for r in recs for k in r})
    return {k: np.array([r.get(k, np.nan) if r.get(k) is not None else np.nan for r in recs], dtype=float)
            for k in keys}


TV_READINGS = ("structure", "loss")     # W_V half-way: block contrast / probe loss against the fitted stage-1 optimum
KQ_READINGS = ("kappa", "gap")          # stage-2 onset: topic-block score κ / attention gap
READINGS = [(tv, kq) for tv in TV_READINGS for kq in KQ_READINGS]
READING_NAMES = {"structure": "W_V block contrast half-way to the fitted stage-1 optimum's",
                 "loss": "probe loss half-way to the fitted stage-1 optimum's",
                 "kappa": "stage-2 onset by the topic-block score κ", "gap": "stage-2 onset by the attention gap"}


@functools.lru_cache(maxsize=4)
def _stage1_reference(data_json: str, loss: str, max_iter: int = 300) -> dict[str, float]:
    dc = LdaDataConfig.model_validate_json(data_json)
    ds, V = dataset(dc), dc.vocab_size
    m = ds.masked["train"]
    h, C = bag_of_words(m.tokens, m.keys, m.labels, V)
    pb = ds.probe_batch()
    hp, Cp = bag_of_words(pb["tokens"], pb["keys"], pb["labels"], V)
    if loss == "ce":
        W, b, train_loss = fit_softmax_regression(h, C, max_iter=max_iter)
        probe_loss = float(softmax_regression_loss(W, b, hp, Cp))
    else:
        W, b = fit_least_squares(h, C)
        train_loss, probe_loss = squared_regression_loss(W, b, h, C), squared_regression_loss(W, b, hp, Cp)
    bc = block_contrast(W[None].float(), dc.words_per_topic, NUM_SPECIAL)
    return {"contrast": float(bc["contrast"]), "probe_loss": probe_loss, "train_loss": float(train_loss),
            "loss": loss, "max_iter": max_iter}


def stage1_reference(data: dict, loss: str = "ce") -> dict[str, float]:
    """The fitted stage-1 optimum (spec §4.3: the uniform-attention model class is a convex regression
    on the visible bag of words), fitted on train with the static masks: its W block contrast and its
    loss on the probe documents. Cross-entropy: unregularised L-BFGS (300 iterations; the contrast of the
    unregularised fit creeps up slowly with more iterations, its loss does not); squared loss: least squares."""
    return _stage1_reference(LdaDataConfig.model_validate(data).model_dump_json(), loss)


def fit_least_squares(h: torch.Tensor, C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """argmin_{W,b} Σ_d Σ_y C[d,y]‖W h_d + b − e_y‖²: weighted least squares of the label frequencies."""
    n = C.sum(1)
    X = torch.cat([h, torch.ones(h.shape[0], 1, dtype=h.dtype)], 1) * n.sqrt()[:, None]
    Y = C / n.clamp(min=1)[:, None] * n.sqrt()[:, None]
    beta = torch.linalg.lstsq(X, Y, driver="gelsd").solution
    return beta[:-1].T.contiguous(), beta[-1]


def squared_regression_loss(W: torch.Tensor, b: torch.Tensor, h: torch.Tensor, C: torch.Tensor) -> float:
    """Mean over labelled positions of ‖W h + b − e_y‖²/|V| (the model's squared loss, spec §2.6)."""
    z = h @ W.T + b
    V = z.shape[1]
    per = (z ** 2).sum(1, keepdim=True) - 2 * z + 1                     # ‖z − e_y‖² for every y
    return float((C * per).sum() / C.sum() / V)


def stage_times(m: dict[str, np.ndarray], ref: dict[str, float] | None = None) -> dict[str, Any]:
    """Stage times of one run from ``metrics_table`` (issue 12 item 6; definitions in
    ``tdyn.probes.topic_stages``); ``ref`` = ``stage1_reference`` of the run's data and loss.

    * ``t_v_structure`` / ``t_v_loss``: W_V half-way to the fitted stage-1 optimum, by block contrast / by
      probe loss (fixed references: a longer run does not move them); ``t_v_plateau``: half of the
      contrast's own plateau (reported only; None when the contrast creeps on without a plateau);
    * ``t_kq_kappa`` / ``t_kq_gap``: stage-2 onset, the topic-block score κ ≥ ln 1.05 / the attention gap
      ≥ 0.05, each above 2× its noise; None when K/Q never moved above noise;
    * ``two_stage_<tv>_<kq>``: t_v < t_kq (True/False), None with ``reason_<tv>_<kq>`` when undefined;
      ``delay_<tv>_<kq>`` = t_kq / t_v.

    The old norm-based times (spec §6: ‖ΔW_V‖ half of its final value, ‖W_Kᵀ W_Q‖ 5% of its final value)
    are kept for comparison as ``t_value_half_norm`` and ``t_kq_5pct_norm``.
    """
    steps = m["step"]
    out: dict[str, Any] = {}
    cv = m["topic.blocks/V_contrast"]
    ref = ref or {}
    out["t_v_structure"] = ts.half_way_time(steps, cv, ref["contrast"]) if "contrast" in ref else None
    out["t_v_loss"] = (ts.half_way_time(steps, m["topic.dev_loss/dev_loss"], ref["probe_loss"])
                       if "probe_loss" in ref and "topic.dev_loss/dev_loss" in m else None)
    f = ts.fraction_of_plateau_time(steps, cv - cv[0], 0.5)
    out |= {"t_v_plateau": f and f["t"], "v_plateau": f and f["plateau"]}
    onsets = {"gap": ts.onset_time(steps, m["topic.stages/gap_doc"], m["topic.stages/gap_se"], ts.GAP_ONSET)}
    if "topic.stages/kappa" in m:
        onsets["kappa"] = ts.onset_time(steps, m["topic.stages/kappa"], m["topic.stages/kappa_se"], ts.KAPPA_ONSET)
    out |= {"t_kq_kappa": onsets.get("kappa"), "t_kq_gap": onsets["gap"]}
    for tv, kq in READINGS:
        o = ts.ordering(out[f"t_v_{tv}"], onsets[kq]) if kq in onsets else {"held": None, "reason": "no K/Q", "delay": None}
        out |= {f"two_stage_{tv}_{kq}": o["held"], f"reason_{tv}_{kq}": o["reason"], f"delay_{tv}_{kq}": o["delay"]}
    for key, col, se in (("kappa", "topic.stages/kappa", "topic.stages/kappa_se"),
                         ("gap", "topic.stages/gap_doc", "topic.stages/gap_se")):
        have = col in m
        out[f"final_{key}"] = float(m[col][-1]) if have else None
        out[f"final_{key}_se"] = float(m[se][-1]) if have else None
        for tv in TV_READINGS:
            t = out[f"t_v_{tv}"]
            out[f"{key}_at_t_v_{tv}"] = float(m[col][int(np.searchsorted(steps, t))]) if have and t is not None else None
    if "topic.norms/KQ" in m:
        dV, KQ = m["topic.norms/dV"], m["topic.norms/KQ"]
        out["t_value_half_norm"] = float(steps[np.argmax(dV >= 0.5 * dV[-1])])
        out["t_kq_5pct_norm"] = float(steps[np.argmax(KQ >= 0.05 * KQ[-1])])
    return out


def run_reference(d: Path) -> dict[str, float]:
    """``stage1_reference`` for the data and loss of run ``d``."""
    rc = runs.read_config(d)
    return stage1_reference(rc["data"], rc["model"].get("loss", "ce"))


def project_aIbB(W: torch.Tensor, v: int) -> float:
    """R² of the least-squares fit W ≈ a·I + b·B + c·11ᵀ on the word block (spec §5.3); see
    ``tdyn.probes.topic_value.r2_aIbBc11``."""
    from tdyn.probes.topic_value import r2_aIbBc11

    return r2_aIbBc11(W, v)


# ---------------------------------------------------------------- figures


def _heatmaps(path: Path, mats: dict[str, torch.Tensor], v: int, suptitle: str) -> None:
    import matplotlib.pyplot as plt

    from tdyn.report import style

    style.apply()
    fig, axes = plt.subplots(1, len(mats), figsize=(4.6 * len(mats), 4), squeeze=False, layout="constrained")
    for ax, (title, M) in zip(axes[0], mats.items()):
        M = M.detach().double().numpy()
        lim = np.abs(M).max() or 1.0
        im = ax.imshow(M, cmap="RdBu_r", vmin=-lim, vmax=lim)
        for x in np.arange(NUM_SPECIAL, M.shape[0], v) - 0.5:
            ax.axhline(x, color="k", lw=0.2)
            ax.axvline(x, color="k", lw=0.2)
        ax.set_title(title)
        ax.set_xlabel("id (0–3 special, then words by topic)")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    fig.suptitle(suptitle)
    style.save(fig, path)


def _train(ctx: ReproduceContext, name: str, base: dict) -> tuple[Any, list[Path]]:
    cfg = configure(base, ctx.overrides)
    return cfg, train_into(ctx, name, cfg)


def _final(m: dict[str, np.ndarray], key: str) -> float:
    return float(m[key][-1])


# ---------------------------------------------------------------- E1: embeddings


def _stage_config(model: dict, seed: int, quick: bool, data: dict | None = None) -> dict:
    """E1–E3 (spec §9): 3000 steps over three seeds; quick: 300 steps, one seed."""
    return lda_config(model, data=data, steps=300 if quick else 3000,
                      seeds=[seed] if quick else [seed, seed + 1, seed + 2], quick=quick)


def embeddings_config(seed: int = 0, quick: bool = False) -> dict:
    return _stage_config(E1, seed, quick)


@register("topic/embeddings", "E1: trained embeddings alone learn the topic blocks (uniform attention, W_V = I, "
          f"d = {E1_D} below the vocabulary size with a trained, untied decoder)", default_config=embeddings_config,
          configs=lambda ctx: {"e1": embeddings_config(ctx.seed, ctx.quick)})
def reproduce_embeddings(ctx: ReproduceContext) -> dict:
    cfg, dirs = _train(ctx, "e1", embeddings_config(ctx.seed, ctx.quick))
    v = cfg.typed_data().words_per_topic
    rows, per_topic = [], []
    for d in dirs:
        model, _ = member_model(d)
        rows.append({"run": d.name, "seed": runs.read_meta(d)["seed"]} | e1_measures(model, v)
                    | {"train_loss": _final(metrics_table(d), "loss")})
        per_topic.append(rows[-1].pop("dot_per_topic"))
    cols = list(rows[0])
    write_csv(ctx.out / "embeddings.csv", rows, cols)
    model, _ = member_model(dirs[0])
    E = model.embed_table()[0].detach()
    _heatmaps(ctx.out / "embeddings.png", {"W_E W_Eᵀ": E @ E.T, "logit map W_dec W_Eᵀ": _logit_map(model)}, v,
              f"E1 (d = {model.d}, trained decoder) after {cfg.optim.steps} steps")

    def seeds_verdict(key: str, se_key: str) -> tuple[bool | None, str | None]:
        votes = [decide(r[key], r[se_key]) if r[f"min_{key}"] > 0 else False for r in rows]
        return _all_seeds(votes)

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
                             "different-topic ones, for every topic and seed (spec §9b), with embeddings separate "
                             "from the output map", paper="Abstract and §4 (embedding layer encodes topic structure: "
                             "higher average inner product of embeddings between same-topic words); spec §5.2, §9b",
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
    T = g["dot_per_topic"].shape[-1]
    G, M = (E[0] @ E[0].T), _logit_map(model)
    out = {"d": model.d, "decoder": model.cfg.decoder}
    for k in ("dot", "cos"):
        out |= {f"{k}_same": float(g[f"{k}_same"]), f"{k}_diff": float(g[f"{k}_diff"]),
                f"{k}_contrast": float(g[f"{k}_contrast"]),
                f"{k}_se": float(g[f"{k}_per_topic"].std() / math.sqrt(T)),
                f"min_{k}_contrast": float(g[f"{k}_per_topic"].min())}
    out["gram_vs_logit_rel_diff"] = float((G - M).norm() / M.norm().clamp(min=1e-30))
    out["dot_per_topic"] = g["dot_per_topic"][0].tolist()
    return out


def _all_seeds(votes: list[bool | None]) -> tuple[bool | None, str | None]:
    """A per-seed claim (``every_cell`` over seeds): holds if every seed holds, fails if some seed fails
    beyond its noise, else inconclusive."""
    return every_cell({f"seed {i}": v for i, v in enumerate(votes)})


# ---------------------------------------------------------------- E2: stage 1


def stage1_config(seed: int = 0, quick: bool = False, preset: str = "clean", l2: float = 0.0) -> dict:
    """E2 run config of ``preset`` (``topic_stage1.PRESETS``); ``l2`` > 0: the real (λ/2)‖θ‖² term.

    clean: 3000 steps, three seeds, 16 log-spaced checkpoints (quick: 300 steps, one seed);
    authors: 5000 steps with checkpoints at their evaluations 1, 1001, …, 4001 (quick: 500, every 100)."""
    from tdyn.experiments.topic_stage1 import PRESETS, authors_schedule

    if preset not in PRESETS:
        raise ValueError(f"unknown topic/stage1 preset {preset!r}")
    model = E2 | ({"emb_layernorm": True} if preset == "authors" else {}) | ({"l2": l2} if l2 else {})
    cfg = _stage_config(model, seed, quick)
    cfg["checkpoint"] = {"schedule": "log", "num": 16}
    if preset == "authors":
        steps, evals = authors_schedule(quick)
        cfg["optim"]["steps"] = steps
        cfg["checkpoint"]["steps"] = evals
    return cfg


def _stage1_preset(ctx: ReproduceContext) -> str:
    return (ctx.options or Stage1Options()).preset


@register("topic/stage1", "E2: W_V alone learns the topic blocks (one-hot, attention frozen uniform; presets "
          "clean (default) and authors via --preset authors)", default_config=stage1_config, options=Stage1Options,
          configs=lambda ctx: {"e2": stage1_config(ctx.seed, ctx.quick, _stage1_preset(ctx))})
def reproduce_stage1(ctx: ReproduceContext) -> dict:
    """E2 (spec §3.4, §4.3, §5.3, §9a; issue 12 items 4–5), in one of two presets (``--preset NAME``;
    results.json ``setting``; details in ``tdyn.experiments.topic_stage1``):

    * ``clean`` (default): the paper's W_V-only model — one-hot embeddings, uniform attention, W_dec = I,
      no embedding LayerNorm / token-type vector; 3000 steps; final state.
    * ``authors``: the authors' demo config — plus embedding LayerNorm and trained token-type vector;
      5000 steps (20 epochs × 250); best-dev checkpoint of dev evaluations after updates 1, 1001, …

    Besides the unregularised runs (three seeds), an ℓ2 run (same seeds, the real (λ/2)‖θ‖² at the
    held-out-tuned λ of the convex fit) gives the unique regularised optimum the symmetry argument
    (spec §5.3) needs. Compared: train loss with the fitted train minimum of the convex class; dev loss
    with the ℓ2-tuned held-out loss and the dev-fit floor (the unregularised fit's held-out loss, the
    old "convex optimum", overfits and is reported only); W_V's per-topic block contrast against its
    relabelling noise; the R² of W_V ≈ aI + bB + c11ᵀ over training (unregularised: drift) and for the
    ℓ2 run and the ℓ2 optimum.
    """
    import copy as _copy

    from tdyn.config import apply_overrides, validate_config
    from tdyn.experiments import topic_stage1 as s1
    from tdyn.experiments.common import decide, margin, reading

    preset = _stage1_preset(ctx)
    base = stage1_config(ctx.seed, ctx.quick, preset)
    raw = apply_overrides(base, list(ctx.overrides))
    cfg = configure(base, ctx.overrides)
    dc = cfg.typed_data()
    v, ds = dc.words_per_topic, dataset(dc)
    refs = s1.stage1_references(ds)
    lam = refs["tuned"]["l2"]
    raw_l2 = _copy.deepcopy(raw)
    raw_l2["model"]["l2"] = lam
    cfg_l2 = validate_config(raw_l2)
    dirs = train_into(ctx, "e2", cfg)
    dirs_l2 = train_into(ctx, "e2-l2", cfg_l2)
    eval_steps = cfg.checkpoint.steps if preset == "authors" else []

    rows, traj, members = [], {}, {}
    for kind, ds_dirs in (("unregularised", dirs), ("l2", dirs_l2)):
        for d in ds_dirs:
            seed = runs.read_meta(d)["seed"]
            best = s1.authors_best_step(d, ds, eval_steps) if preset == "authors" else None
            a = s1.analyse_member(d, ds, refs, v, best["best_step"] if best else "final")
            t = s1.r2_over_training(d, v)
            label = f"{kind} seed {seed}"
            traj[label], members[label] = t, a
            rows.append({"run": f"{'e2' if kind == 'unregularised' else 'e2-l2'}/{d.name}", "kind": kind,
                         "l2": 0.0 if kind == "unregularised" else lam, "seed": seed, "step": a["step"]}
                        | {k: a[k] for k in ("train_loss", "dev_loss", "train_minus_fitted_min",
                                             "train_minus_fitted_min_se", "dev_minus_l2_tuned",
                                             "dev_minus_l2_tuned_se", "dev_minus_floor")}
                        | {"wv_contrast_min_topic": a["value"]["min_topic_contrast"],
                           "wv_contrast_noise": a["value"]["contrast_noise"], "wv_r2_aI_bB_c11": a["value"]["r2"],
                           "wv_r2_gauge_fixed": a["value"]["r2_gauge_fixed"], "raw_wv_r2": a["value_raw_wv"]["r2"]}
                        | s1.drift_summary(t) | ({"best_dev_step": best["best_step"], "stopped_at": best["stopped_at"]}
                                                 if best else {"best_dev_step": None, "stopped_at": None}))
    unreg = [r for r in rows if r["kind"] == "unregularised"]
    l2rows = [r for r in rows if r["kind"] == "l2"]
    write_csv(ctx.out / "stage1.csv", rows, list(rows[0]))
    write_csv(ctx.out / "stage1_r2.csv", [{"run": k, **r} for k, t in traj.items() for r in t],
              ["run", "step", "r2", "r2_gauge_fixed", "r2_raw_wv"])
    path_table = s1.path_rows(refs, v)
    write_csv(ctx.out / "stage1_l2_path.csv", path_table, list(path_table[0]))
    from tdyn.probes.topic_value import value_structure
    opt_vs = value_structure(refs["tuned"]["W"], v, NUM_SPECIAL)

    first, first_l2 = members[f"unregularised seed {unreg[0]['seed']}"], members[f"l2 seed {l2rows[0]['seed']}"]
    W, Wl = first["W_eff"], first_l2["W_eff"]
    _heatmaps(ctx.out / "stage1_value.png", {"W_V (unregularised)": W, "W_Vᵀ W_V (column Gram)": W.T @ W,
                                              f"W_V (ℓ2, λ = {lam:g})": Wl}, v,
              f"E2 ({preset}) after {cfg.optim.steps} steps (seed {unreg[0]['seed']})"
              + (", effective map W_V Ẽᵀ" if preset == "authors" else ""))
    dev = float(np.mean([r["dev_loss"] for r in unreg]))
    s1.r2_figure(ctx.out / "stage1_r2.png", traj, path_table, opt_vs["r2"], lam,
                 {"E2 dev loss (seed mean)": dev, "unregularised fit (train)": refs["unregularised"]["dev_loss"],
                  "dev-fit floor": refs["floor"]["dev_loss"]},
                 f"E2 ({preset}): R² of W_V ≈ aI + bB + c11ᵀ and the held-out references")

    # ---- item 4: losses against the references of the convex class
    tol = 0.02
    gaps_tr = [r["train_minus_fitted_min"] for r in unreg]
    se_tr = max(r["train_minus_fitted_min_se"] for r in unreg)
    if min(gaps_tr) < -1e-3:
        train_held, train_reason = None, "the fitted train minimum is above a trained model's train loss: fit not converged"
    else:
        train_held, train_reason = decide(tol - max(gaps_tr), se_tr), "within the document-resampling noise of the 0.02 band edge"
    gap_dev = float(np.mean([r["dev_minus_l2_tuned"] for r in unreg]))
    noise_dev = math.sqrt(max(r["dev_minus_l2_tuned_se"] for r in unreg) ** 2
                          + s1.seed_se([r["dev_loss"] for r in unreg]) ** 2)
    floor_ok = min(r["dev_minus_floor"] for r in rows) >= -1e-3
    dev_held = decide(tol - gap_dev, noise_dev) if floor_ok else None
    dev_reason = ("a model's dev loss is below the dev-fit floor: floor fit not converged" if not floor_ok
                  else "within the noise of the 0.02 band edge")
    setting_note = f"preset {preset}" + (", best-dev checkpoint" if preset == "authors" else ", final state")

    # ---- item 5: value structure
    blocks = [decide(r["wv_contrast_min_topic"], r["wv_contrast_noise"]) for r in unreg]
    blocks_l2 = [decide(r["wv_contrast_min_topic"], r["wv_contrast_noise"]) for r in l2rows]
    r2_l2 = [r["wv_r2_aI_bB_c11"] for r in l2rows]
    contrast_def = ("per topic t: mean same-topic off-diagonal entry of W_V (rows of t, word ids) minus the mean "
                    "entry in other topics' columns; noise = std of that contrast over 200 random word "
                    "relabellings of the same matrix (k = 2)" + (" — W_V read as the effective map "
                                                                 "W_V Ẽᵀ (LN'd embeddings)" if preset == "authors" else ""))
    form_def = ("R² = 1 − RSS/TSS of the least-squares fit W ≈ a·I + b·B + c·11ᵀ on the 100×100 word block "
                "(B_ij = 1 iff same topic)" + ("; W = effective map W_V Ẽᵀ" if preset == "authors" else ""))
    claims = [
        claim("e2-train-bound", "Train cross-entropy of E2 lies within 0.02 nats above the fitted train minimum of "
              "its convex model class, every seed", train_held, reason=train_reason,
              paper="spec §4.3 (stage-1 class = softmax regression on the visible bag of words); the stage-1 "
                    "W_V reaches the optimum of its class",
              definition="train CE (per selected token, static masks) minus the train loss of the unregularised "
                         "L-BFGS fit on train (the class's minimum train loss); noise = document-resampling SE "
                         f"of the paired difference; {setting_note}",
              measured="train CE − fitted train minimum (nats), per seed",
              expected="in [0, 0.02] for every seed", **margin(tol - max(gaps_tr), se_tr),
              train_minus_fitted_min=gaps_tr, train_loss=[r["train_loss"] for r in unreg],
              fitted_train_minimum=refs["unregularised"]["train_loss"]),
        claim("e2-convex", "Dev cross-entropy of E2 is within 0.02 nats of the best held-out loss of its model class "
              "(the ℓ2-tuned fit); the dev-fit floor lies below both", dev_held, reason=dev_reason,
              paper="spec §9a (dev CE close to the optimum of the stage-1 class), with the held-out optimum read "
                    "as the best achievable held-out loss (issue 12 item 4): the unregularised fit has about one "
                    "document per parameter and overfits, so its held-out loss is no lower bound",
              definition="seed-mean dev CE minus the dev CE of the softmax-regression fit on train with "
                         "(λ/2)‖W‖², λ on a grid 1e-7…1e-3 chosen on dev (optimistic); noise = √(document-"
                         f"resampling SE² + seed SE²); floor = unregularised fit on dev itself; {setting_note}",
              measured="seed-mean dev CE − ℓ2-tuned held-out CE (nats)", expected="≤ 0.02 (below is fine)",
              **margin(tol - gap_dev, noise_dev), dev_loss=dev, l2_tuned_dev_loss=refs["tuned"]["dev_loss"],
              l2_tuned_lambda=lam, dev_minus_l2_tuned=gap_dev, dev_fit_floor=refs["floor"]["dev_loss"],
              dev_minus_floor=[r["dev_minus_floor"] for r in unreg],
              unregularised_fit_dev_loss=refs["unregularised"]["dev_loss"]),
        claim("e2-blocks", "W_V block contrast > 0 for all topics, every seed (unregularised runs)",
              _all_seeds(blocks)[0], reason="a seed's smallest per-topic contrast is within 2× its relabelling noise",
              paper="spec §9a, §5.3: W_V learns the topic blocks (same-topic > different-topic entries)",
              definition=contrast_def, measured="min per-topic W_V block contrast and its relabelling noise, per seed",
              expected="> 2 × noise for every topic and seed",
              min_topic_contrast=[r["wv_contrast_min_topic"] for r in unreg],
              contrast_noise=[r["wv_contrast_noise"] for r in unreg]),
        claim("e2-blocks-l2", f"With ℓ2 (λ = {lam:g}), W_V block contrast > 0 for all topics, every seed",
              _all_seeds(blocks_l2)[0], reason="a seed's smallest per-topic contrast is within 2× its relabelling noise",
              paper="spec §5.3 (the unique regularised optimum is block-structured)", definition=contrast_def,
              measured="min per-topic W_V block contrast and its relabelling noise, per seed (ℓ2 run)",
              expected="> 2 × noise for every topic and seed",
              min_topic_contrast=[r["wv_contrast_min_topic"] for r in l2rows],
              contrast_noise=[r["wv_contrast_noise"] for r in l2rows]),
        claim("e2-form", f"With ℓ2 (λ = {lam:g}, the held-out-tuned strength), W_V ≈ a·I + b·B + c·11ᵀ on the "
              "words: R² ≥ 0.9", None,
              paper="spec §5.3 (derivation: the data law is invariant under topic and within-topic word "
                    "permutations, so a unique — e.g. ℓ2-regularised — optimum has the form aI + bB + c11ᵀ)",
              definition=form_def, measured="R² of the ℓ2 run (min over seeds) and of the ℓ2 optimum itself",
              expected="R² ≥ 0.9",
              readings=[reading("trained ℓ2 run, final W_V, min over seeds",
                                decide(min(r2_l2) - 0.9, s1.seed_se(r2_l2)), r2=r2_l2),
                        reading("the ℓ2 optimum (L-BFGS fit at λ)", decide(opt_vs["r2"] - 0.9, 0.0),
                                r2=opt_vs["r2"], form=opt_vs["form"])]),
        claim("e2-form-unregularised", "Without ℓ2, W_V ≈ a·I + b·B + c·11ᵀ (R² ≥ 0.9)", None,
              reason="outside the symmetry argument's hypotheses: without ℓ2 the optimum is not unique (logits "
                     "diverge, spec §5.5), so this R² measures drift, not structure; see e2-form and "
                     "r2_over_training",
              paper="spec §5.3", definition=form_def + "; at the analysed state and over training",
              measured="R² (raw and gauge-fixed) at the end, and its peak over training, per seed",
              expected="not decided (no unique optimum)",
              r2_final=[r["r2_final"] for r in unreg], r2_peak=[r["r2_peak"] for r in unreg],
              r2_peak_step=[r["r2_peak_step"] for r in unreg],
              r2_gauge_fixed_final=[r["r2_gauge_fixed_final"] for r in unreg],
              r2_analysed=[r["wv_r2_aI_bB_c11"] for r in unreg]),
    ]
    tuned = {k: refs["tuned"][k] for k in ("l2", "train_loss", "dev_loss")}
    return {"experiment": "topic/stage1", "setting": {"preset": preset, "description": s1.PRESETS[preset],
                                                      "analysed_state": "best-dev checkpoint" if preset == "authors" else "final"},
            "config": cfg.model_dump(mode="json"), "config_l2": cfg_l2.model_dump(mode="json"),
            "dev_loss": dev, "dev_loss_per_seed": [r["dev_loss"] for r in unreg],
            "convex_optimum_dev_loss": refs["unregularised"]["dev_loss"],
            "convex_optimum_train_loss": refs["unregularised"]["train_loss"],
            "train_vs_fitted_minimum": {"fitted_train_minimum": refs["unregularised"]["train_loss"],
                                        "train_loss": [r["train_loss"] for r in unreg],
                                        "difference": gaps_tr, "difference_se": [r["train_minus_fitted_min_se"] for r in unreg]},
            "dev_vs_heldout": {"dev_loss": dev, "l2_tuned": tuned, "dev_fit_floor": refs["floor"]["dev_loss"],
                               "unregularised_fit_dev_loss": refs["unregularised"]["dev_loss"],
                               "dev_minus_l2_tuned": [r["dev_minus_l2_tuned"] for r in unreg],
                               "dev_minus_l2_tuned_se": [r["dev_minus_l2_tuned_se"] for r in unreg],
                               "dev_minus_floor": [r["dev_minus_floor"] for r in unreg], "l2_path": path_table},
            "r2_over_training": {k: [[r["step"], r["r2"], r["r2_gauge_fixed"]] for r in t] for k, t in traj.items()},
            "l2_run": {"lambda": lam, "r2": r2_l2, "r2_gauge_fixed": [r["wv_r2_gauge_fixed"] for r in l2rows],
                       "block_contrast_per_topic": [members[f"l2 seed {r['seed']}"]["value"]["per_topic_contrast"]
                                                    for r in l2rows],
                       "min_topic_contrast": [r["wv_contrast_min_topic"] for r in l2rows],
                       "contrast_noise": [r["wv_contrast_noise"] for r in l2rows],
                       "dev_loss": [r["dev_loss"] for r in l2rows], "optimum_value_structure": opt_vs},
            "wv_block_contrast_per_topic": [members[f"unregularised seed {r['seed']}"]["value"]["per_topic_contrast"]
                                            for r in unreg],
            "runs": rows, "claims": claims,
            "files": ["stage1.csv", "stage1_r2.csv", "stage1_l2_path.csv", "stage1_value.png", "stage1_r2.png"]}


# ---------------------------------------------------------------- E3 / ablation: stage 2


def with_stage_probe(cfg: dict) -> dict:
    """Add the ``topic.stages`` probe (topic-block score κ of the effective scores, attention gap with
    its standard error over documents; ``tdyn.probes.topic_stages``) to a run config."""
    cfg["probes"] = dict(cfg["probes"], names=list(cfg["probes"]["names"]) + ["topic.stages"])
    return cfg


def stage2_config(seed: int = 0, quick: bool = False, mask_correct_prob: float = 0.1) -> dict:
    return with_stage_probe(_stage_config(E3, seed, quick, data={"mask_correct_prob": mask_correct_prob}))


def _attention_rows(dirs: list[Path], label: str) -> list[dict]:
    rows = []
    for d in dirs:
        m = metrics_table(d)
        rows.append({"variant": label, "run": d.name, "seed": runs.read_meta(d)["seed"],
                     "same_token": _final(m, "topic.attention/same_token"),
                     "same_topic": _final(m, "topic.attention/same_topic"),
                     "diff_topic": _final(m, "topic.attention/diff_topic"),
                     "gap": _final(m, "topic.attention/gap"), "gap_doc": _final(m, "topic.attention/gap_doc"),
                     "gap_se": _final(m, "topic.stages/gap_se"),
                     "kappa": _final(m, "topic.stages/kappa"), "kappa_se": _final(m, "topic.stages/kappa_se"),
                     "kq_contrast": _final(m, "topic.blocks/KtQ_contrast"),
                     "dev_loss_probe": _final(m, "topic.dev_loss/dev_loss")})
    return rows


ATTN_COLS = ["variant", "run", "seed", "same_token", "same_topic", "diff_topic", "gap", "gap_doc", "gap_se",
             "kappa", "kappa_se", "kq_contrast", "dev_loss_probe"]

GAP_DEF = ("corrected attention classes (spec §7.2, word pairs only, specials excluded): per probe document the "
           "mean same-topic (different ids) minus different-topic attention, relative to uniform; mean over "
           "documents, noise = its standard error over documents")
KAPPA_DEF = ("topic-block score κ of the effective scores S[a,b] = (W_Q e_a + b_Q)·(W_K e_b + b_K)/√d (query a, "
             "key b, biases included): word ids only, each query row centred over word keys, same-topic "
             "off-diagonal mean − different-topic mean (0 for query-only, key-only and START/END-only "
             "changes); noise = std of the per-topic values/√T")


def _attention_figure(path: Path, runs_by_label: dict[str, Path], v: int, title: str) -> None:
    """Heat maps of W_Kᵀ W_Q (final) per variant and the attention class averages against step."""
    import matplotlib.pyplot as plt

    from tdyn.report import style

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
    cfg, dirs = _train(ctx, "e3", stage2_config(ctx.seed, ctx.quick))
    v = cfg.typed_data().words_per_topic
    rows = _attention_rows(dirs, "E3")
    write_csv(ctx.out / "stage2.csv", rows, ATTN_COLS)
    _attention_figure(ctx.out / "stage2.png", {"E3": dirs[0]}, v, f"E3: W_V = B, {cfg.optim.steps} steps")
    per_topic = []
    for d in dirs:
        model, _ = member_model(d)
        with torch.no_grad():
            per_topic.append(topic_block_score(model_scores(model), v, NUM_SPECIAL)["kappa_per_topic"][0].tolist())
    gap_held, gap_why = _all_seeds([decide(r["gap_doc"], r["gap_se"]) for r in rows])
    kq_held, kq_why = _all_seeds([decide(r["kappa"], r["kappa_se"]) for r in rows])
    claims = [
        claim("e3-attention", "Corrected same-topic attention exceeds different-topic attention, every seed "
              "(spec §9c)", gap_held, reason=gap_why,
              paper="Abstract and §5 (self-attention encodes topic structure: higher average pairwise attention "
              "between same-topic words), with W_V fixed to the block solution; spec §5.4, §9c",
              definition=GAP_DEF, measured="final attention gap ± SE over probe documents, per seed",
              expected="gap > 2·SE for every seed", gap=[r["gap_doc"] for r in rows], se=[r["gap_se"] for r in rows],
              same_topic=[r["same_topic"] for r in rows], diff_topic=[r["diff_topic"] for r in rows]),
        claim("e3-kq-blocks", "The scores W_K, W_Q learn have a topic block: same-topic keys score higher "
              "than different-topic keys, every seed (spec §5.4)", kq_held, reason=kq_why,
              paper="§5 (stage 2: with W_V block-structured, key/query learn same-topic attention); spec §5.4",
              definition=KAPPA_DEF, measured="final topic-block score κ ± SE over topics, per seed",
              expected="κ > 2·SE for every seed", kappa=[r["kappa"] for r in rows], se=[r["kappa_se"] for r in rows],
              min_topic_kappa=[min(p) for p in per_topic],
              kq_weight_contrast=[r["kq_contrast"] for r in rows]),
    ]
    return {"experiment": "topic/stage2", "config": cfg.model_dump(mode="json"), "runs": rows,
            "attention_gap": float(np.mean([r["gap"] for r in rows])), "kappa_per_topic": per_topic,
            "claims": claims, "files": ["stage2.csv", "stage2.png"]}


@register("topic/no-unchanged-mask", "Ablation p_c = 0: the same-topic attention effect of E3 should vanish (spec §5.4)",
          configs=lambda ctx: {"pc0.1": stage2_config(ctx.seed, ctx.quick, 0.1),
                               "pc0": stage2_config(ctx.seed, ctx.quick, 0.0)})
def reproduce_no_unchanged(ctx: ReproduceContext) -> dict:
    cfg_a, dirs_a = _train(ctx, "pc0.1", stage2_config(ctx.seed, ctx.quick, 0.1))
    cfg_b, dirs_b = _train(ctx, "pc0", stage2_config(ctx.seed, ctx.quick, 0.0))
    v = cfg_a.typed_data().words_per_topic
    rows = _attention_rows(dirs_a, "p_c=0.1") + _attention_rows(dirs_b, "p_c=0")
    write_csv(ctx.out / "no_unchanged_mask.csv", rows, ATTN_COLS)
    _attention_figure(ctx.out / "no_unchanged_mask.png", {"p_c=0.1": dirs_a[0], "p_c=0": dirs_b[0]}, v,
                      f"E3 with and without unchanged selected tokens, {cfg_a.optim.steps} steps")
    r1 = [r for r in rows if r["variant"] == "p_c=0.1"]
    r0 = [r for r in rows if r["variant"] == "p_c=0"]
    g1, g0 = (float(np.mean([r["gap_doc"] for r in rs])) for rs in (r1, r0))
    se1, se0 = (float(np.sqrt(np.sum([r["gap_se"] ** 2 for r in rs])) / len(rs)) for rs in (r1, r0))
    effect = decide(g1, se1)
    if effect is not True:
        held, why = None, "no same-topic attention effect above noise at p_c = 0.1, so nothing to vanish"
    else:
        held, why = abs(g0) <= 0.25 * g1, None
    return {"experiment": "topic/no-unchanged-mask", "gap_pc_0.1": g1, "gap_pc_0": g0, "runs": rows,
            "claims": [claim("pc0-vanishes", "At p_c = 0 the same- minus different-topic attention gap shrinks "
                             "toward 0: |gap(p_c=0)| ≤ 0.25·gap(p_c=0.1) (spec §5.4, §9c)", held, reason=why,
                             paper="spec §5.4 derivation (the paper's masking: only unchanged selected queries "
                             "carry topic information to the loss), checked against the §5 attention result",
                             definition=GAP_DEF + "; seed-mean at each p_c",
                             measured="seed-mean final attention gap ± SE at p_c = 0 and p_c = 0.1",
                             expected="gap(0.1) > 2·SE and |gap(0)| ≤ 0.25·gap(0.1)", gap_pc_01=g1, gap_pc_0=g0,
                             se_pc_01=se1, se_pc_0=se0)],
            "files": ["no_unchanged_mask.csv", "no_unchanged_mask.png"]}


# ---------------------------------------------------------------- E4: two stages


E4_GRID = {"adam": {"lrs": [0.001, 0.01], "init_scales": [1.0, 10.0]},
           "sgd": {"lrs": [1.0, 10.0], "init_scales": [1.0, 10.0]}}


def two_stage_configs(seed: int = 0, quick: bool = False, model: dict | None = None) -> dict[str, dict]:
    """E4 jobs (spec §6, issue 12 item 6): the grid optimizer × init scale × learning rate. Each
    optimizer is one ensemble over its learning rates and init scales ε ∈ {1e-3, 1e-2} (ε·U[0,1)):
    10k steps and 3 seeds (the spec asks 20k–50k steps and ≥ 3 seeds; at ≈ 30 ms per member-step the
    full grid is ≈ 4 CPU-hours here; `--set optim.steps=3000 --set seeds=0` is the shortened run whose
    results are in docs/results/topic__two-stage); quick: 200 steps, one seed."""
    steps, every = (200, 20) if quick else (10_000, 50)
    seeds = [seed] if quick else [seed, seed + 1, seed + 2]
    m = E4 | (model or {})
    out = {}
    for opt, g in E4_GRID.items():
        c = with_stage_probe(lda_config(m, steps=steps, every=every, seeds=seeds, optimizer=opt, lr=g["lrs"][-1],
                                        quick=quick))
        c["ensemble"] = {"lrs": [{"all": lr} for lr in g["lrs"]], "init_scales": g["init_scales"]}
        c["checkpoint"] = {"schedule": "log", "num": 12}
        out[opt] = c
    return out


def _variant_label(job: str, d: Path) -> tuple[str, dict]:
    meta = runs.read_meta(d)
    eps = runs.read_config(d)["model"]["init_eps"] * meta["init_scale"]
    lr = meta["lrs"]["all"]
    return f"{job} lr={lr:g} ε={eps:g}", {"optimizer": job, "lr": lr, "eps": eps, "seed": meta["seed"]}


def _band(ax, s, y, se, color, label):
    ax.plot(s, y, color=color, label=label)
    ax.fill_between(s, y - 2 * se, y + 2 * se, color=color, alpha=0.2, lw=0)


def _two_stage_figure(path: Path, table: dict[str, dict[str, np.ndarray]], times: dict[str, dict],
                      ref: dict[str, float], title: str) -> None:
    """Per grid cell: the W_V block contrast and the probe loss with their half-way lines to the fitted
    stage-1 optimum (t_V); the topic-block score κ and the attention gap (± 2·noise) with their onset
    thresholds (t_KQ); stage markers on every panel."""
    import matplotlib.pyplot as plt

    from tdyn.report import style

    style.apply()
    n = len(table)
    fig, axes = plt.subplots(4, n, figsize=(3.3 * n, 11), squeeze=False, layout="constrained", sharex="col")
    marks = (("t_v_structure", "--", "C0", "t_V (structure)"), ("t_v_loss", "--", "C3", "t_V (loss)"),
             ("t_kq_kappa", "-.", "C1", "t_KQ (κ)"), ("t_kq_gap", "-.", "C2", "t_KQ (gap)"))
    for j, (label, m) in enumerate(table.items()):
        t = times[label]
        s = np.maximum(m["step"], 1)
        cv, L = m["topic.blocks/V_contrast"], m["topic.dev_loss/dev_loss"]
        axes[0][j].plot(s, cv, color="C0", label="W_V block contrast")
        axes[0][j].axhline(cv[0] + 0.5 * (ref["contrast"] - cv[0]), color="C0", ls=":", lw=0.8,
                           label="half-way to the fitted optimum's")
        axes[1][j].plot(s, L, color="C3", label="probe dev loss")
        axes[1][j].axhline(L[0] + 0.5 * (ref["probe_loss"] - L[0]), color="C3", ls=":", lw=0.8,
                           label="half-way to the fitted optimum's")
        _band(axes[2][j], s, m["topic.stages/kappa"], m["topic.stages/kappa_se"], "C1", "topic-block score κ")
        axes[2][j].axhline(ts.KAPPA_ONSET, color="C1", ls=":", lw=0.8, label="onset: ln 1.05")
        _band(axes[3][j], s, m["topic.stages/gap_doc"], m["topic.stages/gap_se"], "C2", "attention gap")
        axes[3][j].axhline(ts.GAP_ONSET, color="C2", ls=":", lw=0.8, label="onset: 0.05")
        for ax in axes[:, j]:
            for key, ls, col, name in marks:
                if t[key] is not None:
                    ax.axvline(max(t[key], 1), color=col, ls=ls, lw=0.9, label=name)
            ax.set_xscale("log")
        word = {True: "2 stages", False: "not", None: "?"}
        axes[0][j].set_title(label + "\n" + ", ".join(f"{tv[0]}/{kq[0]}: {word[t[f'two_stage_{tv}_{kq}']]}"
                                                     for tv, kq in READINGS), fontsize=7)
        axes[3][j].set_xlabel("step")
        if j == 0:
            for ax, name in zip(axes[:, j], ("W_V block contrast", "probe dev loss", "κ (logits)",
                                             "same − diff topic attention / uniform")):
                ax.set_ylabel(name)
                ax.legend(fontsize=6)
    fig.suptitle(title)
    style.save(fig, path)


def _stage_heatmaps(path: Path, d: Path, v: int) -> None:
    """W_V − W_V(0) and the key-centred word scores of one run at the checkpoints nearest to t_V,
    t_KQ (κ) and the end (spec §6 plots)."""
    import matplotlib.pyplot as plt

    from tdyn.report import style

    t = stage_times(metrics_table(d), run_reference(d))
    avail = runs.checkpoint_steps(d)
    picks = [(f"≈{name} (step {min(avail, key=lambda s: abs(s - t[key]))})", min(avail, key=lambda s: abs(s - t[key])))
             for name, key in (("t_V", "t_v_loss"), ("t_KQ", "t_kq_kappa")) if t[key] is not None]
    cols = sorted(picks, key=lambda x: x[1]) + [("end", "final")]
    W0 = runs.params_of(runs.load_checkpoint(d, 0))["W_V"]
    style.apply()
    fig, axes = plt.subplots(2, len(cols), figsize=(4.4 * len(cols), 8), squeeze=False, layout="constrained")
    for j, (title, step) in enumerate(cols):
        model, _ = member_model(d, step)
        with torch.no_grad():
            mats = (("W_V − W_V(0)", model.W_V[0] - W0),
                    ("key-centred scores (words; rows: query)", ts.key_centred_words(model_scores(model), NUM_SPECIAL)[0]))
        for i, (name, M) in enumerate(mats):
            ax = axes[i][j]
            M = M.detach().double().numpy()
            lim = np.abs(M).max() or 1.0
            im = ax.imshow(M, cmap="RdBu_r", vmin=-lim, vmax=lim)
            ax.set_title(f"{name}, {title}", fontsize=8)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    fig.suptitle(f"E4 {d.parent.name}/{d.name}: each panel on its own colour scale")
    style.save(fig, path)


def run_two_stage(ctx: ReproduceContext, name: str, configs: dict[str, dict]) -> dict:
    """Train the E4 jobs, compute stage times per member; the table of the members of seed ``ctx.seed``."""
    table, times, rows, dirs_of = {}, {}, [], {}
    v = None
    for job, base in configs.items():
        cfg, dirs = _train(ctx, f"{name}-{job}", base)
        v = cfg.typed_data().words_per_topic
        for d in dirs:
            label, info = _variant_label(job, d)
            m = metrics_table(d)
            t = stage_times(m, run_reference(d))
            rows.append(info | {"run": f"{name}-{job}/{d.name}"} | t
                        | {"final_loss": _final(m, "loss"), "wv_contrast": _final(m, "topic.blocks/V_contrast")})
            if info["seed"] == ctx.seed:
                table[label], times[label], dirs_of[label] = m, t, d
    return {"rows": rows, "table": table, "times": times, "v": v, "dirs": dirs_of, "ref": run_reference(d)}


_PER_READING = [f"{k}_{tv}_{kq}" for tv, kq in READINGS for k in ("two_stage", "delay")]
RUN_COLS = ["run", "optimizer", "lr", "eps", "seed", "t_v_structure", "t_v_loss", "t_v_plateau", "t_kq_kappa",
            "t_kq_gap", *_PER_READING, "kappa_at_t_v_loss", "gap_at_t_v_loss", "final_kappa", "final_kappa_se",
            "final_gap", "final_gap_se", "t_value_half_norm", "t_kq_5pct_norm", "final_loss", "wv_contrast"]
GRID_COLS = ["optimizer", "lr", "eps", "seeds", "t_v_structure", "t_v_loss", "t_kq_kappa", "t_kq_gap",
             *[f"{k}_{tv}_{kq}" for tv, kq in READINGS for k in ("delay", "ordering", "verdict")],
             "kappa_at_t_v_loss", "gap_at_t_v_loss", "final_kappa", "final_gap", "t_v_plateau",
             "t_value_half_norm", "t_kq_5pct_norm"]


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.median(xs)) if xs else None


def _cell_verdict(rs: list[dict], name: str) -> tuple[bool | None, str | None]:
    held, why = _all_seeds([r[f"two_stage_{name}"] for r in rs])
    if held is None:
        why = "; ".join(sorted({r[f"reason_{name}"] for r in rs if r[f"reason_{name}"]})) or why
    return held, why


def _summaries(rows: list[dict]) -> list[dict]:
    """One row per grid cell (optimizer, lr, ε): medians over seeds, the ordering counts and verdicts
    per reading."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["optimizer"], r["lr"], r["eps"]), []).append(r)
    out = []
    for (opt, lr, eps), rs in sorted(groups.items()):
        c = {"optimizer": opt, "lr": lr, "eps": eps, "seeds": [r["seed"] for r in rs]}
        for k in ("t_v_structure", "t_v_loss", "t_v_plateau", "t_kq_kappa", "t_kq_gap", "kappa_at_t_v_loss",
                  "gap_at_t_v_loss", "final_kappa", "final_gap", "t_value_half_norm", "t_kq_5pct_norm",
                  *[f"delay_{tv}_{kq}" for tv, kq in READINGS]):
            c[k] = _median([r.get(k) for r in rs])
        for tv, kq in READINGS:
            name = f"{tv}_{kq}"
            held, why = _cell_verdict(rs, name)
            c[f"ordering_{name}"] = (f"{sum(r[f'two_stage_{name}'] is True for r in rs)} two-stage, "
                                     f"{sum(r[f'two_stage_{name}'] is False for r in rs)} not, "
                                     f"{sum(r[f'two_stage_{name}'] is None for r in rs)} undefined")
            c[f"verdict_{name}"] = {True: "holds", False: "fails", None: "inconclusive"}[held]
            c[f"held_{name}"], c[f"reason_{name}"] = held, why
        out.append(c)
    return out


def init_scale_effect(cells: list[dict]) -> list[dict]:
    """Per optimizer and lr: stage-2 onset (κ) and W_V half-way (loss) at ε = 1e-3 over ε = 1e-2. Under
    SGD the K/Q gradient is O(ε·‖W_V‖), so a smaller ε delays K/Q; Adam normalises each coordinate's step
    (≈ lr whatever the gradient's size), so it does not (spec §5.6 note)."""
    out = []
    for c in cells:
        big = next((x for x in cells if x["optimizer"] == c["optimizer"] and x["lr"] == c["lr"]
                    and x["eps"] > c["eps"] * 1.5), None)
        if big is None:
            continue
        ratio = lambda k: (c[k] / big[k]) if c[k] and big[k] else None  # noqa: E731
        out.append({"optimizer": c["optimizer"], "lr": c["lr"], "eps_small": c["eps"], "eps_large": big["eps"],
                    "t_kq_kappa_small": c["t_kq_kappa"], "t_kq_kappa_large": big["t_kq_kappa"],
                    "t_kq_ratio_small_over_large": ratio("t_kq_kappa"),
                    "t_v_loss_small": c["t_v_loss"], "t_v_loss_large": big["t_v_loss"],
                    "final_kappa_small": c["final_kappa"], "final_kappa_large": big["final_kappa"]})
    return out


ADAM_NOTE = ("Under Adam the init scale does not slow W_K, W_Q: Adam normalises each coordinate's step (≈ lr whatever "
             "the gradient's size), so the O(ε·‖W_V‖) smallness of the key/query gradient at a small init, which "
             "delays K/Q under SGD, is divided out. The two-stage separation under Adam therefore rests only on "
             "the key/query gradient having no consistent topic-block direction until W_V is structured. "
             "See init_scale_effect (t_KQ at ε = 1e-3 over ε = 1e-2, per optimizer and lr).")

TWO_STAGE_DEF = ("t_V = first logged step where W_V is half-way to the fitted stage-1 optimum (the convex "
                 "optimum of the uniform-attention model class on the same static masks, a fixed reference that "
                 "does not move with the run length): its block contrast has covered half of the way to the "
                 "optimum's (structure reading) or the probe dev loss half of the way to the optimum's loss (loss "
                 "reading); stage-2 onset t_KQ = first logged step where the topic-block score κ of the "
                 "key-centred effective scores ≥ ln 1.05 (κ reading) or the corrected same- minus "
                 "different-topic attention gap ≥ 0.05 (gap reading), each > 2× its noise (SE over topics / over "
                 "probe documents); two stages iff t_V < t_KQ; delay factor t_KQ/t_V; undefined (inconclusive) "
                 "when W_V never got half-way or K/Q never moved above noise. Logged every 50 steps, so a time of "
                 "50 means 'by the first log'")


def _stage_readings(r: dict) -> list[dict]:
    """The four readings (t_V: structure | loss) × (t_KQ: κ | gap) of a run or a grid cell."""
    return [reading(f"{READING_NAMES[tv]}; {READING_NAMES[kq]}", r[f"held_{tv}_{kq}"] if f"held_{tv}_{kq}" in r
                    else r[f"two_stage_{tv}_{kq}"], reason=r[f"reason_{tv}_{kq}"], t_v=r[f"t_v_{tv}"],
                    t_kq=r[f"t_kq_{kq}"], delay=r[f"delay_{tv}_{kq}"]) for tv, kq in READINGS]


@register("topic/two-stage", "E4: from small init, W_V moves first and W_K, W_Q catch up much later "
          "(Adam and SGD over init scales and learning rates)",
          configs=lambda ctx: two_stage_configs(ctx.seed, ctx.quick))
def reproduce_two_stage(ctx: ReproduceContext) -> dict:
    res = run_two_stage(ctx, "e4", two_stage_configs(ctx.seed, ctx.quick))
    write_csv(ctx.out / "two_stage.csv", res["rows"], RUN_COLS)
    cells = _summaries(res["rows"])
    write_csv(ctx.out / "two_stage_grid.csv", cells, GRID_COLS)
    _two_stage_figure(ctx.out / "two_stage.png", res["table"], res["times"], res["ref"],
                      "E4: stage 1 (W_V block contrast, probe loss; half-way lines to the fitted stage-1 optimum) and "
                      "stage 2 (topic-block score κ, attention gap; onset lines); seed " + str(ctx.seed))
    default = next(lbl for lbl in res["dirs"] if lbl.startswith("adam lr=0.01 ε=0.001"))
    _stage_heatmaps(ctx.out / "two_stage_matrices.png", res["dirs"][default], res["v"])
    claims = []
    for c in cells:
        rd = _stage_readings(c)
        claims.append(claim(
            f"e4-two-stage-{c['optimizer']}-lr{c['lr']:g}-eps{c['eps']:g}",
            f"{c['optimizer']} lr {c['lr']:g}, ε = {c['eps']:g}: W_V is half-way to the stage-1 optimum before "
            "W_K, W_Q start to give same-topic attention (two stages), every seed",
            paper="Introduction / project page: 'in stage 1, only the value matrix changes significantly; in stage 2, "
                  "the key and query matrices catch up much later', from small init, SGD or Adam; spec §5.6, §6, §9d",
            definition=TWO_STAGE_DEF, measured="t_V (structure, loss), t_KQ (κ, gap), delay factor t_KQ/t_V, per seed",
            expected="t_V < t_KQ for every seed under every reading", readings=rd,
            t_v_structure=c["t_v_structure"], t_v_loss=c["t_v_loss"], t_kq_kappa=c["t_kq_kappa"],
            t_kq_gap=c["t_kq_gap"], kappa_at_t_v_loss=c["kappa_at_t_v_loss"], gap_at_t_v_loss=c["gap_at_t_v_loss"]))
    return {"experiment": "topic/two-stage", "stage1_reference": res["ref"], "grid": cells,
            "init_scale_effect": init_scale_effect(cells), "adam_init_scale_note": ADAM_NOTE,
            "definition": TWO_STAGE_DEF, "runs": res["rows"], "claims": claims,
            "files": ["two_stage.csv", "two_stage_grid.csv", "two_stage.png", "two_stage_matrices.png"]}


# ---------------------------------------------------------------- E5 / E6: does each claim still hold?


def summarise_run(d: Path) -> dict[str, Any]:
    """Final loss, W_V block contrast (min over topics, layer 0), attention gap and, when W_K, W_Q
    are trained, the stage times with their guards."""
    m = metrics_table(d)
    model, dc = member_model(d)
    W_V = model.W_V[0] if model.cfg.n_layers == 1 else model.W_V[0, 0]
    out = {"final_loss": _final(m, "loss"), "dev_loss_probe": _final(m, "topic.dev_loss/dev_loss"),
           "attention_gap": _final(m, "topic.attention/gap")}
    out |= _value_columns(W_V, dc.words_per_topic)
    out |= stage_summary(m, run_reference(d) if "topic.stages/kappa" in m else None)
    return out


STAGE_KEYS = ["attention_gap_doc", "attention_gap_se", "t_v_structure", "t_v_loss", "t_kq_kappa", "t_kq_gap",
              *_PER_READING, *[f"reason_{tv}_{kq}" for tv, kq in READINGS]]


def stage_summary(m: dict[str, np.ndarray], ref: dict[str, float] | None = None) -> dict[str, Any]:
    """The attention gap with its noise and, when W_K, W_Q are trained, the stage times of ``stage_times``."""
    out = dict.fromkeys(STAGE_KEYS) | {"kq_trained": "topic.stages/kappa" in m}
    if "topic.stages/gap_doc" in m:
        out |= {"attention_gap_doc": _final(m, "topic.stages/gap_doc"), "attention_gap_se": _final(m, "topic.stages/gap_se")}
    if out["kq_trained"]:
        t = stage_times(m, ref)
        out |= {k: t[k] for k in STAGE_KEYS[2:]}
    return out


SUMMARY_COLS = ["variant", "seed", "final_loss", "dev_loss_probe", "wv_min_topic_contrast", "attention_gap",
                *STAGE_KEYS[:-len(READINGS)]]
SUMMARY_COLS += ["wv_contrast_noise", "wv_r2_aI_bB_c11"]     # value structure (issue 12 item 5)


def _value_columns(W_V: torch.Tensor, v: int) -> dict[str, float]:
    """Final W_V (layer 0): min per-topic block contrast, its relabelling noise and the form R²
    (``tdyn.probes.topic_value``; the R² of an unregularised run is reported, not judged)."""
    from tdyn.probes.topic_value import value_structure

    vs = value_structure(W_V.detach(), v, NUM_SPECIAL)
    return {"wv_min_topic_contrast": vs["min_topic_contrast"], "wv_contrast_noise": vs["contrast_noise"],
            "wv_r2_aI_bB_c11": vs["r2"]}


def _value_verdict(row: dict) -> bool | None:
    """Block contrast above its relabelling noise (k = 2): True / False / None (inside the band)."""
    from tdyn.experiments.common import decide

    return decide(row["wv_min_topic_contrast"], row["wv_contrast_noise"])


def robustness_variants(seed: int = 0, quick: bool = False) -> dict[str, dict]:
    """E5 (spec §3.4): the E4 setting under other optimizers, learning rates, heads, layers, the full
    BERT block, standard dynamic masking and the authors' embedding LayerNorm."""
    steps, every = (150, 25) if quick else (3000, 50)

    def cfg(model=None, data=None, optimizer="adam", lr=0.01):
        return lda_config(E4 | (model or {}), data=data, steps=steps, every=every, seeds=[seed],
                          optimizer=optimizer, lr=lr, quick=quick)

    return {
        "adam lr 0.01 (E4)": cfg(),
        "adam lr 0.001": cfg(lr=0.001),
        "sgd lr 1": cfg(optimizer="sgd", lr=1.0),
        "sgd lr 10": cfg(optimizer="sgd", lr=10.0),
        "2 heads": cfg({"n_heads": 2}),
        "2 layers": cfg({"n_layers": 2}),
        "bert block (default init, trained decoder)": cfg({"block": "bert", "decoder": "trained", "init": "default"}),
        "dynamic masking, selected keys visible": cfg(data={"masking": "dynamic", "attend_to_selected": True}),
        "embedding LayerNorm + token type": cfg({"emb_layernorm": True}),
    }


def _variant_configs(variants: dict[str, dict]) -> dict[str, dict]:
    """The run configs ``_claim_table`` trains for ``variants`` (the ``topic.stages`` probe where W_K, W_Q train)."""
    return {label: with_stage_probe(copy.deepcopy(base)) if base["model"].get("attention", "trained") == "trained"
            else base for label, base in variants.items()}


def _claim_table(ctx: ReproduceContext, variants: dict[str, dict]) -> list[dict]:
    rows = []
    for i, (label, base) in enumerate(variants.items()):
        if base["model"].get("attention", "trained") == "trained":
            base = with_stage_probe(copy.deepcopy(base))
        _, dirs = _train(ctx, f"v{i}", base)
        rows += [{"variant": label, "seed": runs.read_meta(d)["seed"]} | summarise_run(d) for d in dirs]
    return rows


def _table_claims(rows: list[dict], prefix: str) -> list[dict]:
    out = []
    for r in rows:
        out.append(claim(f"{prefix}-{r['variant']}-value-blocks", f"{r['variant']}: W_V block contrast > 0 for every topic",
                         _value_verdict(r),
                         reason="the smallest per-topic contrast is within 2× its relabelling noise",
                         paper="spec §5.3, §9a: W_V learns the topic blocks (same-topic > different-topic entries)",
                         definition="per topic t: mean same-topic off-diagonal entry of the final W_V (layer 0; rows "
                                    "of t, word ids) minus the mean entry in other topics' columns; noise = std of "
                                    "that contrast over 200 random word relabellings of the same matrix (k = 2)",
                         measured="min per-topic W_V block contrast (layer 0), final, and its relabelling noise",
                         expected="> 2 × noise for every topic", min_topic_contrast=r["wv_min_topic_contrast"],
                         contrast_noise=r["wv_contrast_noise"], r2_aI_bB_c11_unjudged=r["wv_r2_aI_bB_c11"]))
        if r["kq_trained"]:
            gap_held = decide(r["attention_gap_doc"], r["attention_gap_se"])
            out.append(claim(f"{prefix}-{r['variant']}-attention", f"{r['variant']}: same-topic attention > different-topic",
                             gap_held, reason=None if gap_held is not None else "attention gap inside its noise band "
                             "(K/Q did not move enough to show)",
                             paper="Abstract and §5 (self-attention encodes topic structure), robustness discussion; "
                             "spec §3.4 E5/E6", definition=GAP_DEF,
                             measured="final attention gap ± SE over probe documents", expected="gap > 2·SE",
                             gap=r["attention_gap_doc"], se=r["attention_gap_se"]))
            rd = _stage_readings(r)
            out.append(claim(f"{prefix}-{r['variant']}-two-stage", f"{r['variant']}: two stages (W_V half-way to its "
                             "stage-1 optimum before W_K, W_Q give same-topic attention)",
                             paper="Introduction / project page: two stages for 'a wide variety of optimizers and "
                             "hyperparameters'; spec §5.6, §6", definition=TWO_STAGE_DEF,
                             measured="t_V (structure, loss), t_KQ (κ, gap), delay factor t_KQ/t_V",
                             expected="t_V < t_KQ under every reading", readings=rd,
                             t_v_structure=r["t_v_structure"], t_v_loss=r["t_v_loss"], t_kq_kappa=r["t_kq_kappa"],
                             t_kq_gap=r["t_kq_gap"]))
    return out


@register("topic/robustness", "E5: do the value blocks, same-topic attention and two stages survive other "
          "optimizers, learning rates, heads, layers and the full BERT block?",
          configs=lambda ctx: _variant_configs(robustness_variants(ctx.seed, ctx.quick)))
def reproduce_robustness(ctx: ReproduceContext) -> dict:
    rows = _claim_table(ctx, robustness_variants(ctx.seed, ctx.quick))
    write_csv(ctx.out / "robustness.csv", rows, SUMMARY_COLS)
    return {"experiment": "topic/robustness", "table": rows, "claims": _table_claims(rows, "e5"),
            "files": ["robustness.csv"]}


def squared_variants(seed: int = 0, quick: bool = False) -> dict[str, dict]:
    """E6: E2 and E4 under cross-entropy and the squared loss."""
    steps, every = (150, 25) if quick else (3000, 50)
    return {f"{name} {loss}": lda_config(model | {"loss": loss}, steps=steps, every=every, seeds=[seed], quick=quick)
            for name, model in (("E2", E2), ("E4", E4)) for loss in ("ce", "squared")}


@register("topic/squared-loss", "E6: E2 and E4 with the squared loss instead of cross-entropy",
          configs=lambda ctx: _variant_configs(squared_variants(ctx.seed, ctx.quick)))
def reproduce_squared(ctx: ReproduceContext) -> dict:
    rows = _claim_table(ctx, squared_variants(ctx.seed, ctx.quick))
    write_csv(ctx.out / "squared_loss.csv", rows, SUMMARY_COLS)
    model, _ = member_model(ctx.out / "runs" / "v1")
    W = model.W_V[0].detach()
    _heatmaps(ctx.out / "squared_loss_value.png", {"W_V (E2, squared loss)": W, "W_Vᵀ W_V": W.T @ W},
              10, "E6: stage 1 with the squared loss")
    return {"experiment": "topic/squared-loss", "table": rows, "claims": _table_claims(rows, "e6"),
            "files": ["squared_loss.csv", "squared_loss_value.png"]}


# ---------------------------------------------------------------- speed


@register_bench("topic")
def _bench(quick: bool) -> dict[str, float]:
    """``tdyn bench``: steps/s of the topic/stage1 and topic/two-stage settings."""
    return {f"{k}_steps_per_s": v for k, v in bench(20 if quick else 100).items()}


def bench(steps: int = 50) -> dict[str, float]:
    """Training steps per second (one member, probes off) for the topic/stage1 and topic/two-stage
    settings; the dataset is built before timing."""
    from tdyn.train.trainer import train

    out = {}
    for name, model in (("topic/stage1", E2), ("topic/two-stage", E4)):
        cfg = lda_config(model, steps=steps, seeds=[0])
        cfg["probes"] = {"names": [], "every": steps}
        cfg["checkpoint"] = {"schedule": "none"}
        dataset(LdaDataConfig.model_validate(cfg["data"]))
        with tempfile.TemporaryDirectory() as tmp:
            train(cfg, Path(tmp) / "b", progress=False)                       # warm-up (build, allocator)
            t0 = time.perf_counter()
            train(cfg, Path(tmp) / "c", progress=False)
            out[name] = steps / (time.perf_counter() - t0)
    return out
