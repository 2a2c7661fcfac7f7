"""Helpers of topic/stage1 (E2; issue 12 items 4 and 5): the two presets, the held-out references of
the convex stage-1 class, the authors' best-dev checkpoint rule, the value structure over training
and the figures. ``reproduce_stage1`` in ``tdyn.experiments.topic`` assembles them into claims.

Presets (``tdyn reproduce topic/stage1 --preset NAME``; results.json ``setting``):

* ``clean`` (default): the paper's W_V-only model (spec §3.1): one-hot embeddings, attention frozen
  uniform, W_dec = I, no embedding LayerNorm or token-type vector; 3000 Adam steps (lr 0.01, batch 40),
  three seeds; the final state is analysed.
* ``authors``: the authors' demo configuration (``lda_bert_demo.ipynb``, ``BertForMaskedLMCustom``
  ``_noMany``; spec §3.2, §4.1): as ``clean`` plus the always-on embedding LayerNorm LN(W_E x + T₀)
  with its trained token-type vector T₀, γ and β; their step count (max_epochs 20 × 250 steps = 5000);
  dev loss on the whole dev split after updates 1, 1001, 2001, …; the **best-dev checkpoint** is
  analysed, with their early stop (two non-improving evaluations in a row end the run).

Held-out references (spec §4.3; issue 12 item 4). The stage-1 class is softmax regression on the
visible bag of words, logits W h + b:

* **fitted train minimum**: the unregularised L-BFGS fit on train (zero init); its train loss is the
  class's minimum train loss (up to convergence), a lower bound on any model's train loss;
* **unregularised fit's held-out loss**: the same fit scored on dev (the old "convex optimum"). With
  about one document per parameter it overfits, so it is *not* a lower bound on dev loss;
* **ℓ2-tuned held-out loss**: fits on train with (λ/2)‖W‖² for λ on ``L2_GRID``, the best dev loss
  over the grid (λ chosen on dev: an optimistic reference for the best achievable held-out loss);
* **dev-fit floor**: the unregularised fit on dev itself, scored on dev: no predictor of the class
  has a lower dev loss.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from tdyn import runs
from tdyn.data.lda import NUM_SPECIAL, LdaDataset
from tdyn.schema import Strict
from tdyn.probes.topic_value import effective_value_map, r2_aIbBc11, gauge_fix, value_structure
from tdyn.theory.topic import (bag_of_words, doc_losses, fit_softmax_regression, l2_path, paired_gap,
                               softmax_regression_loss)

PRESETS = {
    "clean": "the paper's W_V-only model (spec §3.1): one-hot embeddings, attention frozen uniform, W_dec = I, "
             "no embedding LayerNorm or token-type vector; 3000 Adam steps (lr 0.01, batch 40); final state analysed",
    "authors": "the authors' demo config (lda_bert_demo.ipynb, BertForMaskedLMCustom _noMany; spec §3.2, §4.1): "
               "clean + embedding LayerNorm LN(W_E x + T₀) with a trained token-type vector T₀, γ, β; "
               "max_epochs 20 × 250 = 5000 Adam steps; dev loss after updates 1, 1001, 2001, …; best-dev "
               "checkpoint analysed, early stop after two non-improving evaluations",
}
DEFAULT_PRESET = "clean"
L2_GRID = [1e-3, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6, 3e-7, 1e-7]


class Stage1Options(Strict):
    """Options of topic/stage1 (``tdyn reproduce topic/stage1 --preset authors``)."""

    preset: Literal["clean", "authors"] = Field(
        DEFAULT_PRESET, description="clean: the paper's W_V-only model (default); authors: the authors' demo "
        "config (embedding LayerNorm + token-type vector, 5000 steps, best-dev checkpoint)")


def authors_schedule(quick: bool) -> tuple[int, list[int]]:
    """(steps, evaluation steps) of the authors' preset: 5000 steps, evaluations after updates
    1, 1001, …, 4001 (spec §4.1); quick: 500 steps, evaluations after 1, 101, …, 401."""
    steps, every = (500, 100) if quick else (5000, 1000)
    return steps, list(range(1, steps, every))


def best_dev_step(evals: list[tuple[int, float]], patience: int = 2) -> tuple[int, int]:
    """The authors' checkpoint rule (spec §4.1): keep the state at each dev improvement; stop at the
    ``patience``-th non-improving evaluation in a row. Returns (best step, last evaluated step)."""
    best, best_step, bad, last = math.inf, evals[0][0], 0, evals[0][0]
    for step, loss in evals:
        last = step
        if loss < best:
            best, best_step, bad = loss, step, 0
        else:
            bad += 1
            if bad >= patience:
                break
    return best_step, last


# ---------------------------------------------------------------- references


def stage1_references(ds: LdaDataset, lambdas: list[float] = L2_GRID, max_iter: int = 500) -> dict[str, Any]:
    """The fitted train minimum, the unregularised fit's held-out loss, the ℓ2 path with its tuned
    held-out loss, and the dev-fit floor (module docstring). Tensors under ``W``/``b`` keys."""
    V = ds.cfg.vocab_size
    h, C = bag_of_words(ds.masked["train"].tokens, ds.masked["train"].keys, ds.masked["train"].labels, V)
    hd, Cd = bag_of_words(ds.masked["dev"].tokens, ds.masked["dev"].keys, ds.masked["dev"].labels, V)
    W0, b0, tr0 = fit_softmax_regression(h, C, max_iter=max_iter)
    path = l2_path(h, C, hd, Cd, lambdas, max_iter=max_iter)
    best = min(path, key=lambda r: r["dev_loss"])
    Wf, bf, floor = fit_softmax_regression(hd, Cd, max_iter=max_iter)
    return {"h": h, "C": C, "h_dev": hd, "C_dev": Cd,
            "unregularised": {"W": W0, "b": b0, "train_loss": tr0,
                              "dev_loss": float(softmax_regression_loss(W0, b0, hd, Cd))},
            "path": path, "tuned": best, "floor": {"W": Wf, "b": bf, "dev_loss": floor}}


def path_rows(refs: dict, v: int) -> list[dict]:
    """The ℓ2 path as CSV rows: λ, train and dev loss, R² of W ≈ aI + bB + c11ᵀ on the words."""
    return [{"l2": r["l2"], "train_loss": r["train_loss"], "dev_loss": r["dev_loss"],
             "r2_aI_bB_c11": r2_aIbBc11(r["W"][NUM_SPECIAL:, NUM_SPECIAL:], v),
             "tuned": r is refs["tuned"]} for r in refs["path"]]


# ---------------------------------------------------------------- one trained member


def analyse_member(d: Path, ds: LdaDataset, refs: dict, v: int, step: int | str = "final") -> dict[str, Any]:
    """Losses of run ``d`` at ``step`` against the references (with document-resampling standard
    errors of the paired differences), and its value structure (effective map and raw W_V)."""
    from tdyn.experiments.topic import member_model, split_loss

    model, _ = member_model(d, step)
    W, b = effective_value_map(model)
    h, C, hd, Cd = refs["h"], refs["C"], refs["h_dev"], refs["C_dev"]
    lt, ld = doc_losses(W, b, h, C), doc_losses(W, b, hd, Cd)
    n, nd = C.sum(1), Cd.sum(1)
    u, t = refs["unregularised"], refs["tuned"]
    g_train, se_train = paired_gap(lt, doc_losses(u["W"], u["b"], h, C), n)
    g_tuned, se_tuned = paired_gap(ld, doc_losses(t["W"], t["b"], hd, Cd), nd)
    g_floor, se_floor = paired_gap(ld, doc_losses(refs["floor"]["W"], refs["floor"]["b"], hd, Cd), nd)
    vs = value_structure(W, v, NUM_SPECIAL)
    raw = value_structure(model.W_V[0].detach(), v, NUM_SPECIAL) if model.cfg.emb_layernorm else vs
    return {"step": step, "train_loss": split_loss(model, ds, "train"), "dev_loss": split_loss(model, ds),
            "train_loss_effective": float(lt.sum() / n.sum()), "dev_loss_effective": float(ld.sum() / nd.sum()),
            "train_minus_fitted_min": g_train, "train_minus_fitted_min_se": se_train,
            "dev_minus_l2_tuned": g_tuned, "dev_minus_l2_tuned_se": se_tuned,
            "dev_minus_floor": g_floor, "dev_minus_floor_se": se_floor,
            "value": vs, "value_raw_wv": raw, "W_eff": W}


def authors_best_step(d: Path, ds: LdaDataset, eval_steps: list[int]) -> dict[str, Any]:
    """The authors' best-dev checkpoint of run ``d``: full-dev loss at ``eval_steps``, the rule of
    :func:`best_dev_step`."""
    from tdyn.experiments.topic import member_model, split_loss

    evals = [(s, split_loss(member_model(d, s)[0], ds)) for s in eval_steps]
    best, last = best_dev_step(evals)
    return {"best_step": best, "stopped_at": last, "evals": evals}


def r2_over_training(d: Path, v: int) -> list[dict]:
    """Per checkpoint: R² of the effective map (= W_V in the clean preset), gauge-fixed R², and the
    raw W_V R² (differs only with the embedding LayerNorm)."""
    from tdyn.experiments.topic import member_model

    rows = []
    for s in runs.checkpoint_steps(d):
        model, _ = member_model(d, s)
        W, _ = effective_value_map(model)
        ns = NUM_SPECIAL
        rows.append({"step": s, "r2": r2_aIbBc11(W[ns:, ns:], v),
                     "r2_gauge_fixed": r2_aIbBc11(gauge_fix(W)[ns:, ns:], v),
                     "r2_raw_wv": r2_aIbBc11(model.W_V[0].detach()[ns:, ns:], v)})
    return rows


def drift_summary(traj: list[dict]) -> dict[str, float]:
    """Peak and final R² of a trajectory (steps > 0) and the drop from the peak."""
    rs = [r for r in traj if r["step"] > 0]
    peak = max(rs, key=lambda r: r["r2"])
    return {"r2_peak": peak["r2"], "r2_peak_step": peak["step"], "r2_final": rs[-1]["r2"],
            "r2_drop_from_peak": peak["r2"] - rs[-1]["r2"], "r2_gauge_fixed_final": rs[-1]["r2_gauge_fixed"]}


# ---------------------------------------------------------------- figure


def r2_figure(path: Path, traj: dict[str, list[dict]], path_table: list[dict], r2_opt: float, lam: float,
              losses: dict[str, float], title: str) -> None:
    """Left: R² of W_V ≈ aI + bB + c11ᵀ over training per run (solid: raw, dashed: gauge-fixed), the
    ℓ2 optimum's R² dotted. Right: the ℓ2 path — held-out loss and R² against λ."""
    import matplotlib.pyplot as plt

    from tdyn.report import style

    style.apply()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for (label, rows), col in zip(traj.items(), style.PALETTE * 3):
        s = np.array([max(r["step"], 1) for r in rows])
        ax.plot(s, [r["r2"] for r in rows], color=col, marker=".", label=label)
        ax.plot(s, [r["r2_gauge_fixed"] for r in rows], color=col, ls="--", lw=0.8)
    ax.axhline(r2_opt, color="k", ls=":", lw=0.8, label=f"ℓ2 optimum (λ = {lam:g})")
    ax.set_xscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("R² of W_V ≈ aI + bB + c11ᵀ (words)")
    ax.set_title("value structure over training (-- gauge-fixed)", fontsize=9)
    ax.legend(fontsize=7)
    lams = np.array([r["l2"] for r in path_table])
    bx.plot(lams, [r["dev_loss"] for r in path_table], marker="o", color=style.PALETTE[0], label="ℓ2 fit, dev loss")
    for (name, val), ls in zip(losses.items(), ("-", "--", ":", "-.")):
        bx.axhline(val, color="k", ls=ls, lw=0.8, label=name)
    bx.set_xscale("log")
    bx.set_xlabel("λ (ℓ2 on W)")
    bx.set_ylabel("dev cross-entropy (nats)")
    bx.legend(fontsize=7, loc="upper left")
    cx = bx.twinx()
    cx.plot(lams, [r["r2_aI_bB_c11"] for r in path_table], marker="s", color=style.PALETTE[1])
    cx.set_ylabel("R² of the ℓ2 fit's W", color=style.PALETTE[1])
    bx.set_title("held-out references of the stage-1 class", fontsize=9)
    fig.suptitle(title)
    style.save(fig, path)


def finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def seed_se(xs: list[float]) -> float:
    """Standard error of the seed mean (0 with one seed)."""
    return float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else 0.0

