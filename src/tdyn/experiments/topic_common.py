"""Shared by the topic-structure reproductions (Li, Li & Risteski, ICML 2023), synthetic part (spec
docs/reproductions/topic.md): the model variants E1–E4 of docs/reproductions/topic.md#variants-e1-to-e6, training a
reproduction's named config and reading its runs back, the fitted stage-1 reference and the stage times, and the
heat-map figure.

One module per figure family uses them: ``topic_embeddings`` (E1), ``topic_stage1`` (E2),
``topic_stage2`` (E3 and the p_c = 0 ablation), ``topic_two_stage`` (E4), ``topic_robustness`` (E5, E6).

Stage times (issue 12 item 6; definitions and tests in ``tdyn.probes.topic_stages``), from the probes
logged every ``probes.every`` steps:

* ``t_v_structure`` / ``t_v_loss`` = first logged step where W_V is half-way to the fitted stage-1
  optimum (the convex optimum of the uniform-attention model class,
  docs/reproductions/topic.md#stage-1-reference-optimum): by block contrast / by probe loss. A fixed reference that
  does not move with the run length (‖ΔW_V‖ grows without bound under cross-entropy, so "half of its final value"
  did);
* ``t_kq_kappa`` = stage-2 onset: first logged step where the topic-block score κ of the key-centred
  effective scores reaches ln 1.05 (a same-topic key gets 5% more attention) above 2× its noise;
  ``t_kq_gap`` the same with the corrected same- minus different-topic attention gap ≥ 0.05. Query-only
  and START/END components of W_Kᵀ W_Q, which dominate ‖W_Kᵀ W_Q‖, do not count;
* two stages iff t_v < t_kq (four readings: structure|loss × κ|gap); delay factor t_kq / t_v;
  inconclusive when W_V never got half-way or K/Q never moved above noise. The old norm-based times are
  reported as ``t_value_half_norm`` and ``t_kq_5pct_norm``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tdyn import runs
from tdyn.data.lda import NUM_SPECIAL, LdaDataConfig, LdaDataset
from tdyn.experiments.common import configure, every_cell, reading, train_into
from tdyn.experiments.registry import ReproduceContext
from tdyn.models.topic import TopicModelConfig, TopicTransformer
from tdyn.probes import topic_stages as ts
from tdyn.probes.topic import block_contrast
from tdyn.report import style
from tdyn.tasks.lda_mlm import build_model, dataset, lda_config
from tdyn.theory.topic import bag_of_words, fit_softmax_regression, softmax_regression_loss


# ---------------------------------------------------------------- the variants
# (docs/reproductions/topic.md#variants-e1-to-e6)


# E1 with embeddings that are not the logit map (issue 12 item 7): with W_V = I, an identity decoder
# and d = |V|, W_E is the logit matrix of the input word, so E1 would be E2 transposed. Here d = 32 < |V|
# and the decoder is trained (untied): logits = W_dec W_Eᵀ h + b, and W_E W_Eᵀ is a separate object.
E1_D = 32
E1 = {"embedding": "trained", "emb_init": "small_uniform", "init_eps": 0.01, "attention": "uniform",
      "value": "identity", "decoder": "trained", "d": E1_D}
E2 = {"attention": "uniform", "value": "trained", "decoder": "identity"}
E3 = {"attention": "trained", "value": "block", "decoder": "identity"}
E4 = {"attention": "trained", "value": "trained", "decoder": "identity", "init": "small_uniform", "init_eps": 1e-3}


# ---------------------------------------------------------------- training, and reading runs back


def stage_config(model: dict, seed: int, quick: bool, data: dict | None = None) -> dict:
    """E1–E3 (docs/reproductions/topic.md#reproductions): 3000 steps over three seeds; quick: 300 steps, one seed."""
    return lda_config(model, data=data, steps=300 if quick else 3000,
                      seeds=[seed] if quick else [seed, seed + 1, seed + 2], quick=quick)


def with_stage_probe(cfg: dict) -> dict:
    """Add the ``topic.stages`` probe (topic-block score κ of the effective scores, attention gap with
    its standard error over documents; ``tdyn.probes.topic_stages``) to a run config."""
    cfg["probes"] = dict(cfg["probes"], names=list(cfg["probes"]["names"]) + ["topic.stages"])
    return cfg


def train_runs(ctx: ReproduceContext, name: str, base: dict) -> tuple[Any, list[Path]]:
    """Train the raw config ``base`` with the user's ``--set`` overrides into ``runs/<name>``: (the
    validated config, one run directory per member)."""
    cfg = configure(base, ctx.overrides)
    return cfg, train_into(ctx, name, cfg)


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


def metrics_table(run_dir: Path) -> dict[str, np.ndarray]:
    """Metrics of a run as arrays keyed by metric name (NaN where absent)."""
    recs = [r for r in runs.read_metrics(run_dir) if r.get("loss") is not None]
    keys = sorted({k for r in recs for k in r})
    return {k: np.array([r.get(k, np.nan) if r.get(k) is not None else np.nan for r in recs], dtype=float)
            for k in keys}


def final(m: dict[str, np.ndarray], key: str) -> float:
    """The last logged value of metric ``key`` of a ``metrics_table``."""
    return float(m[key][-1])


def all_seeds(votes: list[bool | None]) -> tuple[bool | None, str | None]:
    """A per-seed claim (``every_cell`` over seeds): holds if every seed holds, fails if some seed fails
    beyond its noise, else inconclusive."""
    return every_cell({f"seed {i}": v for i, v in enumerate(votes)})


# ---------------------------------------------------------------- stage times


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
    """The fitted stage-1 optimum (docs/reproductions/topic.md#stage-1-reference-optimum: the uniform-attention
    model class is a convex regression on the visible bag of words), fitted on train with the static masks: its W
    block contrast and its loss on the probe documents. Cross-entropy: unregularised L-BFGS (300 iterations; the
    contrast of the unregularised fit creeps up slowly with more iterations, its loss does not); squared loss:
    least squares."""
    return _stage1_reference(LdaDataConfig.model_validate(data).model_dump_json(), loss)


def fit_least_squares(h: torch.Tensor, C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """argmin_{W,b} Σ_d Σ_y C[d,y]‖W h_d + b − e_y‖²: weighted least squares of the label frequencies."""
    n = C.sum(1)
    X = torch.cat([h, torch.ones(h.shape[0], 1, dtype=h.dtype)], 1) * n.sqrt()[:, None]
    Y = C / n.clamp(min=1)[:, None] * n.sqrt()[:, None]
    beta = torch.linalg.lstsq(X, Y, driver="gelsd").solution
    return beta[:-1].T.contiguous(), beta[-1]


def squared_regression_loss(W: torch.Tensor, b: torch.Tensor, h: torch.Tensor, C: torch.Tensor) -> float:
    """Mean over labelled positions of ‖W h + b − e_y‖²/|V| (the model's squared loss, docs/reproductions/topic.md#loss)."""
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

    The old norm-based times (docs/reproductions/topic.md#two-stage-measurement: ‖ΔW_V‖ half of its final value,
    ‖W_Kᵀ W_Q‖ 5% of its final value) are kept for comparison as ``t_value_half_norm`` and ``t_kq_5pct_norm``.
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


PER_READING = [f"{k}_{tv}_{kq}" for tv, kq in READINGS for k in ("two_stage", "delay")]
GAP_DEF = ("corrected attention classes (docs/reproductions/topic.md#corrected-attention-classes, word pairs only, specials excluded): per probe document the "
           "mean same-topic (different ids) minus different-topic attention, relative to uniform; mean over "
           "documents, noise = its standard error over documents")
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


def stage_readings(r: dict) -> list[dict]:
    """The four readings (t_V: structure | loss) × (t_KQ: κ | gap) of a run or a grid cell."""
    return [reading(f"{READING_NAMES[tv]}; {READING_NAMES[kq]}", r[f"held_{tv}_{kq}"] if f"held_{tv}_{kq}" in r
                    else r[f"two_stage_{tv}_{kq}"], reason=r[f"reason_{tv}_{kq}"], t_v=r[f"t_v_{tv}"],
                    t_kq=r[f"t_kq_{kq}"], delay=r[f"delay_{tv}_{kq}"]) for tv, kq in READINGS]


# ---------------------------------------------------------------- figures


def heatmaps(path: Path, mats: dict[str, torch.Tensor], v: int, suptitle: str) -> None:
    import matplotlib.pyplot as plt

    style.apply()
    fig, axes = plt.subplots(1, len(mats), figsize=(4.6 * len(mats), 4), squeeze=False, layout="constrained")
    for ax, (title, M) in zip(axes[0], mats.items()):
        M = M.detach().double().numpy()
        # centred for display: minus the median word-word entry (the background, off the topic blocks), so
        # the blocks stand on a zero background instead of a common offset
        background = float(np.median(M[NUM_SPECIAL:, NUM_SPECIAL:])) if M.shape[0] > NUM_SPECIAL else 0.0
        M = M - background
        title = f"{title}\n(centred: minus the median word-word entry {background:.3g})"
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
