"""Topic structure (Li, Li & Risteski, ICML 2023), synthetic part: the ``lda_mlm`` task and the
reproductions E1–E6 of spec topic_structure.md §3.4 plus the p_c = 0 ablation.

Stage times (spec §6), from the ``topic.norms`` probe logged every ``probes.every`` steps, with T
the last logged step:

* ``t_value_half`` = first logged step t with ‖W_V(t) − W_V(0)‖_F ≥ 0.5·‖W_V(T) − W_V(0)‖_F;
* ``t_kq_5pct``    = first logged step t with ‖W_Kᵀ W_Q(t)‖_F ≥ 0.05·‖W_Kᵀ W_Q(T)‖_F;
* ``t_attn_gap_5pct`` = first logged step where the corrected same- minus different-topic attention
  gap reaches 5% of its final value (a functional, not parameter-norm, view of stage 2; reported only);
* ``ratio`` = t_kq_5pct / t_value_half. Two stages means t_value_half < t_kq_5pct, counted only
  when stage 2 happened (corrected same- minus different-topic attention at T > 0) and
  ‖W_Kᵀ W_Q(T)‖ ≥ 100·‖W_Kᵀ W_Q(0)‖ (the guards of spec §6).
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
from tdyn.experiments.common import claim, configure, train_into, write_csv
from tdyn.experiments.registry import ReproduceContext, register
from tdyn.models.topic import TopicModelConfig, TopicTransformer
from tdyn.probes.topic import attention_classes, block_contrast, embedding_gram
from tdyn.theory.topic import bag_of_words, fit_softmax_regression, softmax_regression_loss
from tdyn.train.seeding import generator
from tdyn.train.task import Member, Task, register_task


# ---------------------------------------------------------------- the task


@functools.lru_cache(maxsize=2)
def _dataset(data_json: str) -> LdaDataset:
    return LdaDataset(LdaDataConfig.model_validate_json(data_json))


def dataset(cfg: LdaDataConfig) -> LdaDataset:
    """The documents and static masks of ``cfg`` (cached: a reproduction and its runs share them)."""
    return _dataset(cfg.model_dump_json())


def build_model(data_cfg: LdaDataConfig, model_cfg: TopicModelConfig, S: int = 1) -> TopicTransformer:
    return TopicTransformer(model_cfg, data_cfg.vocab_size, data_cfg.words_per_topic, NUM_SPECIAL, S=S)


class LdaMlmTask(Task):
    def __init__(self, cfg, members: list[Member]):
        self.data_cfg = LdaDataConfig.model_validate(cfg.data)
        self.ds = dataset(self.data_cfg)
        self.model = build_model(self.data_cfg, TopicModelConfig.model_validate(cfg.model), len(members))
        self.model.reset_parameters([generator(m.seed, "init") for m in members], [m.init_scale for m in members])
        W_V = self.model.W_V if self.model.cfg.n_layers == 1 else self.model.W_V[:, 0]
        self.facts = {"W_V0": W_V.detach().clone(), "words_per_topic": self.data_cfg.words_per_topic,
                      "num_special": NUM_SPECIAL}

    def sample(self, gen):
        return self.ds.sample(gen)

    def loss(self, batch):
        return self.model.loss(batch["tokens"], batch["labels"], batch["keys"])

    def probe_batch(self, gen):
        return self.ds.probe_batch()


@register_task("lda_mlm", LdaDataConfig, TopicModelConfig, "masked LM on LDA documents with the one-layer model")
def _build(cfg, members):
    return LdaMlmTask(cfg, members)


# ---------------------------------------------------------------- configs

QUICK_DATA = {"num_train": 2000, "num_dev": 500, "num_test": 10, "probe_docs": 100}
PROBES = ["topic.norms", "topic.attention", "topic.blocks", "topic.dev_loss"]


def param_names(model: dict) -> list[str]:
    m = build_model(LdaDataConfig(num_train=1, num_dev=1, num_test=1), TopicModelConfig.model_validate(model))
    return [n for n, _ in m.named_parameters()]


def lda_config(model: dict, *, data: dict | None = None, steps: int = 3000, optimizer: str = "adam",
               lr: float = 0.01, seeds=(0, 1, 2), every: int = 50, quick: bool = False) -> dict:
    """A run config: the authors' defaults (Adam lr 0.01, batch 40, spec §4.1), one parameter group."""
    group = {"params": param_names(model), "optimizer": optimizer, "lr": lr}
    return {"task": "lda_mlm", "data": (QUICK_DATA if quick else {}) | (data or {}), "model": dict(model),
            "seeds": list(seeds), "optim": {"steps": steps, "groups": {"all": group}},
            "probes": {"names": PROBES, "every": every}, "checkpoint": {"schedule": "log", "num": 8}}


E1 = {"embedding": "trained", "emb_init": "small_uniform", "init_eps": 0.01, "attention": "uniform",
      "value": "identity", "decoder": "identity"}
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


def stage_times(m: dict[str, np.ndarray]) -> dict[str, Any]:
    """t_value_half, t_kq_5pct, ratio and the guards (module docstring) from ``metrics_table``."""
    steps, dV, KQ = m["step"], m["topic.norms/dV"], m["topic.norms/KQ"]
    t_v = float(steps[np.argmax(dV >= 0.5 * dV[-1])])
    t_kq = float(steps[np.argmax(KQ >= 0.05 * KQ[-1])])
    gaps = m["topic.attention/gap"]
    gap = float(gaps[-1])
    t_attn = float(steps[np.argmax(gaps >= 0.05 * gap)]) if gap > 0 else None
    growth = float(KQ[-1] / max(KQ[0], 1e-30))
    return {"t_value_half": t_v, "t_kq_5pct": t_kq, "ratio": t_kq / t_v if t_v > 0 else math.inf,
            "t_attn_gap_5pct": t_attn,
            "final_attention_gap": gap, "kq_growth": growth, "stage2_happened": gap > 0 and growth >= 100,
            "two_stage": t_v < t_kq and gap > 0 and growth >= 100}


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


@register("topic/embeddings", "E1: trained embeddings alone learn the topic blocks (uniform attention, W_V = I, W_dec = I)",
          default_config=embeddings_config)
def reproduce_embeddings(ctx: ReproduceContext) -> dict:
    cfg, dirs = _train(ctx, "e1", embeddings_config(ctx.seed, ctx.quick))
    v = cfg.typed_data().words_per_topic
    rows, per_topic = [], []
    for d in dirs:
        model, _ = member_model(d)
        g = embedding_gram(model.embed_table()[:1].detach(), v, NUM_SPECIAL)
        per_topic.append(g["dot_per_topic"][0])
        rows.append({"run": d.name, "seed": runs.read_meta(d)["seed"]}
                    | {k: float(g[k]) for k in ("dot_same", "dot_diff", "dot_contrast", "cos_same", "cos_diff")}
                    | {"min_topic_contrast": float(g["dot_per_topic"].min()),
                     "train_loss": _final(metrics_table(d), "loss")})
    write_csv(ctx.out / "embeddings.csv", rows, list(rows[0]))
    model, _ = member_model(dirs[0])
    E = model.embed_table()[0].detach()
    _heatmaps(ctx.out / "embeddings.png", {"W_E W_Eᵀ": E @ E.T, "W_E": E}, v, f"E1 after {cfg.optim.steps} steps")
    held = all(r["min_topic_contrast"] > 0 for r in rows)
    return {"experiment": "topic/embeddings", "config": cfg.model_dump(mode="json"), "runs": rows,
            "per_topic_contrast": [p.tolist() for p in per_topic],
            "claims": [claim("e1-blocks", "Same-topic W_E W_Eᵀ off-diagonal mean exceeds the different-topic "
                             "mean for every topic, every seed (spec §9b)", held,
                             measured="min per-topic W_E W_Eᵀ block contrast, per seed",
                             expected="> 0 for every topic and seed",
                             min_topic_contrast=[r["min_topic_contrast"] for r in rows])],
            "files": ["embeddings.csv", "embeddings.png"]}


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


def _all_or_none(verdicts: list[bool | None]) -> bool | None:
    """True if every verdict is True, False if any is False, else None."""
    return False if any(x is False for x in verdicts) else True if all(x is True for x in verdicts) else None


@register("topic/stage1", "E2: W_V alone learns the topic blocks (one-hot, attention frozen uniform; presets "
          "clean (default) and authors via --set preset=authors)", default_config=stage1_config)
def reproduce_stage1(ctx: ReproduceContext) -> dict:
    """E2 (spec §3.4, §4.3, §5.3, §9a; issue 12 items 4–5), in one of two presets (``--set preset=NAME``;
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

    preset, overrides = s1.take_preset(ctx.overrides)
    raw = apply_overrides(stage1_config(ctx.seed, ctx.quick, preset), overrides)
    cfg = validate_config(raw)
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
              _all_or_none(blocks), reason="a seed's smallest per-topic contrast is within 2× its relabelling noise",
              paper="spec §9a, §5.3: W_V learns the topic blocks (same-topic > different-topic entries)",
              definition=contrast_def, measured="min per-topic W_V block contrast and its relabelling noise, per seed",
              expected="> 2 × noise for every topic and seed",
              min_topic_contrast=[r["wv_contrast_min_topic"] for r in unreg],
              contrast_noise=[r["wv_contrast_noise"] for r in unreg]),
        claim("e2-blocks-l2", f"With ℓ2 (λ = {lam:g}), W_V block contrast > 0 for all topics, every seed",
              _all_or_none(blocks_l2), reason="a seed's smallest per-topic contrast is within 2× its relabelling noise",
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


def stage2_config(seed: int = 0, quick: bool = False, mask_correct_prob: float = 0.1) -> dict:
    return _stage_config(E3, seed, quick, data={"mask_correct_prob": mask_correct_prob})


def _attention_rows(dirs: list[Path], label: str) -> list[dict]:
    rows = []
    for d in dirs:
        m = metrics_table(d)
        rows.append({"variant": label, "run": d.name, "seed": runs.read_meta(d)["seed"],
                     "same_token": _final(m, "topic.attention/same_token"),
                     "same_topic": _final(m, "topic.attention/same_topic"),
                     "diff_topic": _final(m, "topic.attention/diff_topic"),
                     "gap": _final(m, "topic.attention/gap"), "gap_doc": _final(m, "topic.attention/gap_doc"),
                     "kq_contrast": _final(m, "topic.blocks/KtQ_contrast"),
                     "dev_loss_probe": _final(m, "topic.dev_loss/dev_loss")})
    return rows


ATTN_COLS = ["variant", "run", "seed", "same_token", "same_topic", "diff_topic", "gap", "gap_doc", "kq_contrast",
             "dev_loss_probe"]


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
          default_config=stage2_config)
def reproduce_stage2(ctx: ReproduceContext) -> dict:
    cfg, dirs = _train(ctx, "e3", stage2_config(ctx.seed, ctx.quick))
    v = cfg.typed_data().words_per_topic
    rows = _attention_rows(dirs, "E3")
    write_csv(ctx.out / "stage2.csv", rows, ATTN_COLS)
    _attention_figure(ctx.out / "stage2.png", {"E3": dirs[0]}, v, f"E3: W_V = B, {cfg.optim.steps} steps")
    per_topic = []
    for d in dirs:
        model, _ = member_model(d)
        per_topic.append(block_contrast((model.W_K[0].T @ model.W_Q[0])[None].detach(), v, NUM_SPECIAL)["per_topic"][0].tolist())
    claims = [
        claim("e3-attention", "Corrected same-topic attention exceeds different-topic attention, every seed "
              "(spec §9c)", all(r["gap"] > 0 for r in rows),
              measured="final attention gap (same- minus different-topic), per seed",
              expected="> 0 for every seed", gap=[r["gap"] for r in rows],
              same_topic=[r["same_topic"] for r in rows], diff_topic=[r["diff_topic"] for r in rows]),
        claim("e3-kq-blocks", "W_Kᵀ W_Q block contrast > 0 for all topics, every seed (spec §5.4)",
              all(min(p) > 0 for p in per_topic), measured="min per-topic W_Kᵀ W_Q block contrast, per seed",
              expected="> 0 for every topic and seed", min_topic_contrast=[min(p) for p in per_topic]),
    ]
    return {"experiment": "topic/stage2", "config": cfg.model_dump(mode="json"), "runs": rows,
            "attention_gap": float(np.mean([r["gap"] for r in rows])), "kq_block_contrast_per_topic": per_topic,
            "claims": claims, "files": ["stage2.csv", "stage2.png"]}


@register("topic/no-unchanged-mask", "Ablation p_c = 0: the same-topic attention effect of E3 should vanish (spec §5.4)")
def reproduce_no_unchanged(ctx: ReproduceContext) -> dict:
    cfg_a, dirs_a = _train(ctx, "pc0.1", stage2_config(ctx.seed, ctx.quick, 0.1))
    cfg_b, dirs_b = _train(ctx, "pc0", stage2_config(ctx.seed, ctx.quick, 0.0))
    v = cfg_a.typed_data().words_per_topic
    rows = _attention_rows(dirs_a, "p_c=0.1") + _attention_rows(dirs_b, "p_c=0")
    write_csv(ctx.out / "no_unchanged_mask.csv", rows, ATTN_COLS)
    _attention_figure(ctx.out / "no_unchanged_mask.png", {"p_c=0.1": dirs_a[0], "p_c=0": dirs_b[0]}, v,
                      f"E3 with and without unchanged selected tokens, {cfg_a.optim.steps} steps")
    g1 = float(np.mean([r["gap"] for r in rows if r["variant"] == "p_c=0.1"]))
    g0 = float(np.mean([r["gap"] for r in rows if r["variant"] == "p_c=0"]))
    return {"experiment": "topic/no-unchanged-mask", "gap_pc_0.1": g1, "gap_pc_0": g0, "runs": rows,
            "claims": [claim("pc0-vanishes", "At p_c = 0 the same- minus different-topic attention gap shrinks "
                             "toward 0: |gap(p_c=0)| ≤ 0.25·gap(p_c=0.1) (spec §5.4, §9c)",
                             g1 > 0 and abs(g0) <= 0.25 * g1,
                             measured="seed-mean final attention gap at p_c = 0 and p_c = 0.1",
                             expected="gap(0.1) > 0 and |gap(0)| ≤ 0.25·gap(0.1)", gap_pc_01=g1, gap_pc_0=g0)],
            "files": ["no_unchanged_mask.csv", "no_unchanged_mask.png"]}


# ---------------------------------------------------------------- E4: two stages


def two_stage_configs(seed: int = 0, quick: bool = False, model: dict | None = None) -> dict[str, dict]:
    """E4 jobs (spec §6): Adam lr 0.01 with ε ∈ {1e-3, 1e-2} (ε·U[0,1), ensemble over init scales),
    and SGD lr ∈ {0.1, 1.0} with ε = 1e-3 (ensemble over learning rates)."""
    steps, every = (200, 20) if quick else (10_000, 50)
    seeds = [seed] if quick else [seed, seed + 1, seed + 2]
    m = E4 | (model or {})
    adam = lda_config(m, steps=steps, every=every, seeds=seeds, quick=quick)
    adam["ensemble"] = {"init_scales": [1.0, 10.0]}
    sgd = lda_config(m, steps=steps, every=every, seeds=seeds[:1], optimizer="sgd", lr=1.0, quick=quick)
    sgd["ensemble"] = {"lrs": [{"all": 0.1}, {"all": 1.0}]}
    for c in (adam, sgd):
        c["checkpoint"] = {"schedule": "log", "num": 12}
    return {"adam": adam, "sgd": sgd}


def _variant_label(job: str, d: Path) -> tuple[str, dict]:
    meta = runs.read_meta(d)
    eps = runs.read_config(d)["model"]["init_eps"] * meta["init_scale"]
    lr = meta["lrs"]["all"]
    return f"{job} lr={lr:g} eps={eps:g}", {"optimizer": job, "lr": lr, "eps": eps, "seed": meta["seed"]}


def _two_stage_figure(path: Path, table: dict[str, dict[str, np.ndarray]], times: dict[str, dict], title: str) -> None:
    import matplotlib.pyplot as plt

    from tdyn.report import style

    style.apply()
    n = len(table)
    fig, axes = plt.subplots(2, n, figsize=(4.2 * n, 7), squeeze=False, layout="constrained")
    for j, (label, m) in enumerate(table.items()):
        ax = axes[0][j]
        s = np.maximum(m["step"], 1)
        for key, name in (("dV", "‖W_V − W_V(0)‖"), ("K", "‖W_K‖"), ("Q", "‖W_Q‖"), ("KQ", "‖W_Kᵀ W_Q‖")):
            ax.plot(s, m[f"topic.norms/{key}"], label=name)
        t = times[label]
        ax.axvline(max(t["t_value_half"], 1), color="k", ls="--", lw=0.8, label="t_value_half")
        ax.axvline(max(t["t_kq_5pct"], 1), color="k", ls=":", lw=0.8, label="t_kq_5pct")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step")
        if j == 0:
            ax.set_ylabel("Frobenius norm")
            ax.legend(fontsize=7)
        ax = axes[1][j]
        for key in ("same_token", "same_topic", "diff_topic"):
            ax.plot(s, m[f"topic.attention/{key}"], label=key.replace("_", " "))
        ax.set_xscale("log")
        ax.set_xlabel("step")
        if j == 0:
            ax.set_ylabel("attention / uniform")
            ax.legend(fontsize=7)
    fig.suptitle(title)
    style.save(fig, path)


def _stage_heatmaps(path: Path, job_dir: Path, v: int, seed: int) -> None:
    """W_V − W_V(0) and W_Kᵀ W_Q of the default member (Adam, ε = 1e-3) at the checkpoints nearest
    to t_value_half, t_kq_5pct and the end (spec §6 plots)."""
    import matplotlib.pyplot as plt

    from tdyn.report import style

    d = next(p for p in sorted(job_dir.iterdir()) if p.is_dir() and runs.is_run_dir(p)
             and runs.read_meta(p)["seed"] == seed and runs.read_meta(p)["init_scale"] == 1.0)
    t = stage_times(metrics_table(d))
    avail = runs.checkpoint_steps(d)
    picks = {name: min(avail, key=lambda s: abs(s - t[key])) for name, key in
             (("t_kq_5pct", "t_kq_5pct"), ("t_value_half", "t_value_half"))}
    W0 = runs.params_of(runs.load_checkpoint(d, 0))["W_V"]
    style.apply()
    fig, axes = plt.subplots(2, 3, figsize=(13, 8), layout="constrained")
    cols = [(f"≈{n} (step {s})", s) for n, s in sorted(picks.items(), key=lambda x: x[1])] + [("end", "final")]
    for j, (title, step) in enumerate(cols):
        p = runs.params_of(runs.load_checkpoint(d, step))
        for i, (name, M) in enumerate((("W_V − W_V(0)", p["W_V"] - W0), ("W_Kᵀ W_Q", p["W_K"].T @ p["W_Q"]))):
            ax = axes[i][j]
            M = M.double().numpy()
            lim = np.abs(M).max() or 1.0
            im = ax.imshow(M, cmap="RdBu_r", vmin=-lim, vmax=lim)
            ax.set_title(f"{name}, {title}", fontsize=9)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    fig.suptitle(f"E4 (Adam, ε = 1e-3, seed {seed}): each panel on its own colour scale")
    style.save(fig, path)


def run_two_stage(ctx: ReproduceContext, name: str, configs: dict[str, dict]) -> dict:
    """Train the E4 jobs, compute stage times per member, draw the figure; shared by E4 and E6."""
    table, times, rows = {}, {}, []
    v = None
    for job, base in configs.items():
        cfg, dirs = _train(ctx, f"{name}-{job}", base)
        v = cfg.typed_data().words_per_topic
        for d in dirs:
            label, info = _variant_label(job, d)
            m = metrics_table(d)
            t = stage_times(m)
            rows.append(info | {"run": f"{name}-{job}/{d.name}"} | t
                        | {"final_loss": _final(m, "loss"), "wv_contrast": _final(m, "topic.blocks/V_contrast"),
                           "kq_contrast": _final(m, "topic.blocks/KtQ_contrast")})
            if info["seed"] == ctx.seed:
                table[label], times[label] = m, t
    return {"rows": rows, "table": table, "times": times, "v": v}


def _summaries(rows: list[dict]) -> tuple[dict, list[dict]]:
    """The default variant (Adam, ε = 1e-3) pooled over seeds, and the other variants."""
    keys = ["t_value_half", "t_kq_5pct", "ratio", "final_attention_gap", "kq_growth"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["optimizer"], r["lr"], r["eps"]), []).append(r)
    out = []
    for (opt, lr, eps), rs in groups.items():
        s = {"optimizer": opt, "lr": lr, "eps": eps, "seeds": [r["seed"] for r in rs]}
        s |= {k: float(np.median([r[k] for r in rs])) for k in keys}
        s |= {"two_stage_all_seeds": all(r["two_stage"] for r in rs),
              "stage2_happened_all_seeds": all(r["stage2_happened"] for r in rs)}
        out.append(s)
    default = next(s for s in out if s["optimizer"] == "adam" and math.isclose(s["eps"], 1e-3))
    return default, [s for s in out if s is not default]


@register("topic/two-stage", "E4: from small init, W_V moves first and W_K, W_Q catch up much later (Adam and SGD)")
def reproduce_two_stage(ctx: ReproduceContext) -> dict:
    res = run_two_stage(ctx, "e4", two_stage_configs(ctx.seed, ctx.quick))
    cols = ["run", "optimizer", "lr", "eps", "seed", "t_value_half", "t_kq_5pct", "ratio", "t_attn_gap_5pct",
            "final_attention_gap",
            "kq_growth", "stage2_happened", "two_stage", "final_loss", "wv_contrast", "kq_contrast"]
    write_csv(ctx.out / "two_stage.csv", res["rows"], cols)
    _two_stage_figure(ctx.out / "two_stage.png", res["table"], res["times"],
                      "E4: stage norms (log-log) with t_value_half (--) and t_kq_5pct (:); attention by class")
    default, variants = _summaries(res["rows"])
    _stage_heatmaps(ctx.out / "two_stage_matrices.png", ctx.out / "runs" / "e4-adam", res["v"], ctx.seed)
    claims = [
        claim("e4-two-stage-adam-1e-3", "Adam, ε = 1e-3: t_value_half < t_kq_5pct with stage 2 completed "
              "(guards of spec §6), every seed (spec §9d)", default["two_stage_all_seeds"],
              measured="t_value_half, t_kq_5pct, attention gap, KQ growth, per seed",
              expected="t_value_half < t_kq_5pct, gap > 0, KQ growth ≥ 100",
              t_value_half=default["t_value_half"], t_kq_5pct=default["t_kq_5pct"], ratio=default["ratio"],
              final_attention_gap=default["final_attention_gap"], kq_growth=default["kq_growth"]),
    ] + [claim(f"e4-two-stage-{s['optimizer']}-lr{s['lr']:g}-eps{s['eps']:g}",
               f"{s['optimizer']} lr {s['lr']:g}, ε = {s['eps']:g}: two stages (t_value_half < t_kq_5pct, guards)",
               s["two_stage_all_seeds"],
               measured=f"t_value_half, t_kq_5pct, gap, KQ growth per seed ({s['optimizer']} lr {s['lr']:g})",
               expected="t_value_half < t_kq_5pct, gap > 0, KQ growth ≥ 100",
               t_value_half=s["t_value_half"], t_kq_5pct=s["t_kq_5pct"], ratio=s["ratio"],
               final_attention_gap=s["final_attention_gap"], kq_growth=s["kq_growth"]) for s in variants]
    t_attn = [r["t_attn_gap_5pct"] for r in res["rows"] if r["optimizer"] == "adam" and math.isclose(r["eps"], 1e-3)]
    return {"experiment": "topic/two-stage", "t_value_half": default["t_value_half"],
            "t_attn_gap_5pct": t_attn,
            "t_kq_5pct": default["t_kq_5pct"], "ratio": default["ratio"],
            "final_attention_gap": default["final_attention_gap"], "kq_growth": default["kq_growth"],
            "variants": variants, "runs": res["rows"], "claims": claims,
            "files": ["two_stage.csv", "two_stage.png", "two_stage_matrices.png"]}


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
    if "topic.norms/KQ" in m:
        t = stage_times(m)
        out |= {k: t[k] for k in ("t_value_half", "t_kq_5pct", "ratio", "kq_growth", "two_stage")}
    else:
        out |= {"t_value_half": None, "t_kq_5pct": None, "ratio": None, "kq_growth": None, "two_stage": None}
    return out


SUMMARY_COLS = ["variant", "seed", "final_loss", "dev_loss_probe", "wv_min_topic_contrast", "attention_gap",
                "t_value_half", "t_kq_5pct", "ratio", "kq_growth", "two_stage"]
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


def _claim_table(ctx: ReproduceContext, variants: dict[str, dict]) -> list[dict]:
    rows = []
    for i, (label, base) in enumerate(variants.items()):
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
        if r["t_value_half"] is not None:
            out.append(claim(f"{prefix}-{r['variant']}-attention", f"{r['variant']}: same-topic attention > different-topic",
                             r["attention_gap"] > 0,
                             measured="final attention gap (same- minus different-topic)", expected="> 0",
                             gap=r["attention_gap"]))
            out.append(claim(f"{prefix}-{r['variant']}-two-stage", f"{r['variant']}: two stages (t_value_half < "
                             "t_kq_5pct with the guards of spec §6)", bool(r["two_stage"]),
                             measured="t_value_half, t_kq_5pct, final attention gap, KQ growth",
                             expected="t_value_half < t_kq_5pct, gap > 0, KQ growth ≥ 100",
                             t_value_half=r["t_value_half"], t_kq_5pct=r["t_kq_5pct"], kq_growth=r["kq_growth"]))
    return out


@register("topic/robustness", "E5: do the value blocks, same-topic attention and two stages survive other "
          "optimizers, learning rates, heads, layers and the full BERT block?")
def reproduce_robustness(ctx: ReproduceContext) -> dict:
    rows = _claim_table(ctx, robustness_variants(ctx.seed, ctx.quick))
    write_csv(ctx.out / "robustness.csv", rows, SUMMARY_COLS)
    return {"experiment": "topic/robustness", "table": rows, "claims": _table_claims(rows, "e5"),
            "files": ["robustness.csv"]}


@register("topic/squared-loss", "E6: E2 and E4 with the squared loss instead of cross-entropy")
def reproduce_squared(ctx: ReproduceContext) -> dict:
    steps, every = (150, 25) if ctx.quick else (3000, 50)
    variants = {f"{name} {loss}": lda_config(model | {"loss": loss}, steps=steps, every=every, seeds=[ctx.seed],
                                             quick=ctx.quick)
                for name, model in (("E2", E2), ("E4", E4)) for loss in ("ce", "squared")}
    rows = _claim_table(ctx, variants)
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
