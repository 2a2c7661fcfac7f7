"""von Oswald et al. 2023 (docs/reproductions/icl-gd.md): what the reproductions share — the paper's words they
quote, typed grids with the user's options, a run's metrics as a curve, a trained run's outputs on its probe set,
and the figures' helpers. The reproductions: ``construction`` (no training), ``one_layer``, ``k_layers``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tdyn import runs
from tdyn.reproduce.common import (configure, grid_dict, optimizer_text, short_number,  # noqa: F401
                                   with_grid_options)  # re-exported: grid_dict, with_grid_options
from tdyn.papers.icl_gd import theory as th
from tdyn.papers.icl_gd.model import LSA

#: where the quoted words stand: the paper's abstract (its full text was not available to tdyn; the abstract was
#: read in the PMLR record and the proceedings text, docs/reproductions/icl-gd.md#paper-and-code)
PAPER = "von Oswald et al. 2023, abstract"
QUOTE_CONSTRUCTION = ("We start by providing a simple weight construction that shows the equivalence of data "
                      "transformations induced by 1) a single linear self-attention layer and by 2) gradient-descent "
                      "(GD) on a regression loss.")
QUOTE_SIMILAR = ("Motivated by that construction, we show empirically that when training self-attention-only "
                 "Transformers on simple regression tasks either the models learned by GD and Transformers show great "
                 "similarity or, remarkably, the weights found by optimization match the construction.")
QUOTE_MATCH = "remarkably, the weights found by optimization match the construction"
QUOTE_CURVATURE = ("Building on this insight, we furthermore identify how Transformers surpass the performance of "
                   "plain gradient descent by learning an iterative curvature correction")



def trained_setting(ctx, plan: dict[str, dict], *, authors: str | None = None) -> tuple[Any, str]:
    """The data section (batch, probe set) the plan's jobs train after the user's ``--set`` (the first job's; the
    runner refuses a ``--set`` on a key the jobs differ in) and their optimizer as a claim states it: ``authors``
    where every job's is the authors' (``plan``'s own, without ``--set``), else ``optimizer_text`` with what
    differs from the authors' (ε, weight decay, clipping)."""
    cfgs = [configure(raw, ctx.overrides) for raw in plan.values()]
    theirs = [configure(raw, []) for raw in plan.values()]
    g, t = cfgs[0].optim.groups["all"], theirs[0].optim.groups["all"]
    if authors is not None and all(c.optim == a.optim for c, a in zip(cfgs, theirs)):
        return cfgs[0].typed_data(), authors
    clip = cfgs[0].optim.grad_clip
    extras = ([f"ε = {short_number(g.eps)}"] if g.eps != t.eps else []) + \
        ([f"weight decay {short_number(g.weight_decay)}"] if g.weight_decay != t.weight_decay else []) + \
        ([f"gradients clipped at norm {short_number(clip)}" if clip else "gradients not clipped"]
         if clip != theirs[0].optim.grad_clip else [])
    return cfgs[0].typed_data(), optimizer_text(g, *extras)


#: the metrics of the ``icl_gd`` probes a curve holds (probe/key → column)
CURVE_KEYS = {"icl_gd.loss/loss": "loss", "icl_gd.loss/loss_gd": "loss_gd", "icl_gd.loss/loss_ratio": "loss_ratio",
              "icl_gd.loss/loss_zero": "loss_zero", "icl_gd.align/pred_diff": "pred_diff",
              "icl_gd.align/pred_diff_rel": "pred_diff_rel", "icl_gd.align/sens_cos": "sens_cos",
              "icl_gd.align/sens_diff": "sens_diff", "icl_gd.align/sens_diff_rel": "sens_diff_rel",
              "icl_gd.weights/cos": "weight_cos", "icl_gd.weights/eta_eff": "eta_eff",
              "icl_gd.weights/eta_ratio": "eta_ratio"}


def curve(run: runs.Run) -> dict[str, np.ndarray]:
    """A run's probe metrics as arrays (``step``, ``train_loss`` and the columns of :data:`CURVE_KEYS`; NaN where
    absent, e.g. the weight match of untied layers, which carries a layer suffix)."""
    a = run.arrays()
    nan = np.full(len(a["step"]), np.nan)
    return {"step": a["step"].astype(int), "train_loss": a.get("loss", nan)} | {
        col: a.get(key, nan) for key, col in CURVE_KEYS.items()}


def trained_model(run_dir: Path) -> tuple[LSA, Any]:
    """A finished run's final model (S = 1, float64) and its task (the probe set, the GD reference)."""
    run = runs.Run(run_dir)
    model, task = run.model(), run.task()
    return model.double(), task


def outputs(model: LSA, E: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ŷ (n,) and ∂ŷ/∂x_q (n, d) of a one-member model on tokens E (float64)."""
    with torch.no_grad():
        E = E.to(th.F64)
        pred, sens = model.outputs(E)
        return pred[0], sens[0]


# ---------------------------------------------------------------- figures
def figure_title(text: str, quick: bool) -> str:
    """A figure's title, marked when the run used the quick settings."""
    return text + ("\n[QUICK settings: a pipeline check, not the evidence]" if quick else "")


def band(ax, steps, values: np.ndarray, color, label: str, **kw) -> None:
    """values (seeds, steps): the seed mean as a line and the min–max over seeds as a band."""
    ax.plot(steps, values.mean(0), color=color, label=label, **kw)
    if values.shape[0] > 1:
        ax.fill_between(steps, values.min(0), values.max(0), color=color, alpha=0.2, lw=0)


def by_seed(rows: list[dict], key: str, **match) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values (seeds, steps)) of column ``key`` from curve rows that match ``match``."""
    sel = [r for r in rows if all(r[k] == v for k, v in match.items())]
    steps = np.array(sorted({r["step"] for r in sel}))
    seeds = sorted({r["seed"] for r in sel})
    val = {(r["seed"], r["step"]): r[key] for r in sel}
    return steps, np.array([[np.nan if val.get((s, t)) is None else val[(s, t)] for t in steps] for s in seeds],
                           dtype=float)
