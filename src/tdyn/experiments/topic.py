"""Topic structure (Li, Li & Risteski, ICML 2023), synthetic part: the ``lda_mlm`` task and the
reproductions E1–E6 of spec topic_structure.md §3.4 plus the p_c = 0 ablation.

Stage times (spec §6), from the ``topic.norms`` probe logged every ``probes.every`` steps, with T
the last logged step:

* ``t_value_half`` = first logged step t with ‖W_V(t) − W_V(0)‖_F ≥ 0.5·‖W_V(T) − W_V(0)‖_F;
* ``t_kq_5pct``    = first logged step t with ‖W_Kᵀ W_Q(t)‖_F ≥ 0.05·‖W_Kᵀ W_Q(T)‖_F;
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
from tdyn.data.lda import NUM_SPECIAL, LdaDataConfig, LdaDataset
from tdyn.experiments.common import claim, configure, write_csv
from tdyn.experiments.registry import ReproduceContext, register
from tdyn.models.topic import TopicModelConfig, TopicTransformer
from tdyn.probes.topic import attention_classes, block_contrast
from tdyn.theory.topic import bag_of_words, fit_softmax_regression, softmax_regression_loss
from tdyn.train.seeding import generator
from tdyn.train.task import Member, Task, register_task


# ---------------------------------------------------------------- the task


@functools.lru_cache(maxsize=4)
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
    gap = float(m["topic.attention/gap"][-1])
    growth = float(KQ[-1] / max(KQ[0], 1e-30))
    return {"t_value_half": t_v, "t_kq_5pct": t_kq, "ratio": t_kq / t_v if t_v > 0 else math.inf,
            "final_attention_gap": gap, "kq_growth": growth, "stage2_happened": gap > 0 and growth >= 100,
            "two_stage": t_v < t_kq and gap > 0 and growth >= 100}


def project_aIbB(W: torch.Tensor, v: int) -> float:
    """R² of the least-squares fit W ≈ a·I + b·B + c·11ᵀ on the word block (spec §5.3)."""
    n = W.shape[0]
    B = (torch.arange(n)[:, None] // v == torch.arange(n)[None, :] // v).double()
    X = torch.stack([torch.eye(n, dtype=torch.float64).flatten(), B.flatten(), torch.ones(n * n, dtype=torch.float64)], 1)
    y = W.double().flatten()
    coef = torch.linalg.lstsq(X, y[:, None]).solution
    res = y - (X @ coef)[:, 0]
    return float(1 - res.pow(2).sum() / (y - y.mean()).pow(2).sum())


# ---------------------------------------------------------------- figures


def _heatmaps(path: Path, mats: dict[str, torch.Tensor], v: int, suptitle: str) -> None:
    import matplotlib.pyplot as plt

    from tdyn.report import style

    style.apply()
    fig, axes = plt.subplots(1, len(mats), figsize=(4.3 * len(mats), 4), squeeze=False)
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
    from tdyn.train.trainer import train

    cfg = configure(base, ctx.overrides)
    return cfg, train(cfg, ctx.out / "runs" / name, force=True, progress=ctx.progress)


def _seeds(ctx: ReproduceContext, quick_n: int = 1, full_n: int = 3) -> list[int]:
    return [ctx.seed + i for i in range(quick_n if ctx.quick else full_n)]


def _final(m: dict[str, np.ndarray], key: str) -> float:
    return float(m[key][-1])


# ---------------------------------------------------------------- E1: embeddings


def embeddings_config(seed: int = 0, quick: bool = False) -> dict:
    return lda_config(E1, steps=300 if quick else 3000, seeds=[seed] if quick else [seed, seed + 1, seed + 2],
                      quick=quick)


@register("topic/embeddings", "E1: trained embeddings alone learn the topic blocks (uniform attention, W_V = I, W_dec = I)",
          default_config=embeddings_config)
def reproduce_embeddings(ctx: ReproduceContext) -> dict:
    cfg, dirs = _train(ctx, "e1", embeddings_config(ctx.seed, ctx.quick))
    v = cfg.typed_data().words_per_topic
    rows, per_topic = [], []
    for d in dirs:
        model, _ = member_model(d)
        E = model.embed_table()[0].detach()
        bc = block_contrast((E @ E.T)[None], v, NUM_SPECIAL)
        En = E / E.norm(dim=1, keepdim=True).clamp(min=1e-12)
        bcos = block_contrast((En @ En.T)[None], v, NUM_SPECIAL)
        per_topic.append(bc["per_topic"][0])
        rows.append({"run": d.name, "seed": runs.read_meta(d)["seed"], "dot_same": float(bc["same"]),
                     "dot_diff": float(bc["diff"]), "dot_contrast": float(bc["contrast"]),
                     "cos_same": float(bcos["same"]), "cos_diff": float(bcos["diff"]),
                     "min_topic_contrast": float(bc["per_topic"].min()),
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
                             min_topic_contrast=[r["min_topic_contrast"] for r in rows])],
            "files": ["embeddings.csv", "embeddings.png"]}
