"""Bietti et al. 2023 (docs/reproductions/birth.md): what the reproductions share — the words they quote, a run's
metrics as rows, the readings of "formed" (the step a curve first reaches a level), paired timing comparisons,
and the figures' helpers. The reproductions: ``memories``, ``induction``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from pydantic import Field

from tdyn import runs, stats
from tdyn.report import style
from tdyn.reproduce.common import (configure, grid_dict, optimizer_text, reading, short_number,  # noqa: F401
                                   with_grid_options)  # re-exported: grid_dict, reading, with_grid_options
from tdyn.papers.birth.task import birth_config
from tdyn.schema import Strict


# The runs every birth reproduction starts from (the memories' setting; the others change a few of its fields).
@dataclasses.dataclass(frozen=True)
class Settings:
    """The runs: seeds, SGD steps and rate, model width, sequence length, batch, probe cadence and set size."""
    seeds: list[int]
    steps: int
    lr: float
    d: int
    T: int
    batch_size: int
    probe_every: int
    probe_size: int


QUICK = Settings(seeds=[0, 1], steps=200, lr=0.2, d=64, T=64, batch_size=32, probe_every=10, probe_size=64)
FULL = Settings(seeds=[0, 1, 2], steps=600, lr=0.2, d=128, T=128, batch_size=64, probe_every=10, probe_size=128)


def run_config(st: Settings, **changes) -> dict:
    """The run config of the settings ``st`` (seeds, steps, rate, sizes, probes), with a reproduction's ``changes``."""
    return birth_config(seeds=st.seeds, steps=st.steps, lr=st.lr, d=st.d, T=st.T, batch_size=st.batch_size,
                        probe_every=st.probe_every, probe_size=st.probe_size, **changes)


def setting_text(ctx, plan: dict[str, dict], st: Settings, triggers: str, loss: str, probes: str | None = None) -> str:
    """A claim's setting, read from the run config ``plan``'s jobs train (after the user's ``--set``; the jobs
    differ only in the seed), so that an override the runner lets through (e.g. the momentum) is in the text:
    sizes, ``triggers`` (how the K triggers are drawn), bigrams, ``loss``, the optimizer, batch, steps, seeds and,
    unless ``probes`` is None, the probe cadence (``probes``: what follows "fixed sequences", e.g. " per set")."""
    cfg = configure(next(iter(plan.values())), ctx.overrides)
    data, (g,) = cfg.typed_data(), cfg.optim.groups.values()
    clip = cfg.optim.grad_clip
    opt = optimizer_text(g, f"weight decay {short_number(g.weight_decay)}",
                         *([f"gradients clipped at norm {short_number(clip)}"] if clip else []))
    bigrams = ("tiny Shakespeare bigrams" if data.bigrams == "tinyshakespeare" else
               f"Dirichlet(α = {data.dirichlet_alpha:g}) bigrams over {data.vocab} tokens")
    text = (f"d = {cfg.model['d']}, T = {data.T}, K = {data.k} {triggers}, {bigrams}, {loss}, {opt}, "
            f"batch {data.batch_size}, {cfg.optim.steps} steps, seeds {st.seeds}")
    return text + (f"; probes every {cfg.probes.every} steps on {data.probe_size} fixed sequences{probes}"
                   if probes is not None else "")


def per_seed(ctx, name: str, cfg: dict) -> dict[str, dict]:
    """A reproduction's plan: run config ``cfg`` as one job per seed (``NAME-seedS``), which the local pool trains
    on every core (``reproduce.phases.train_plan``); a member's bits do not depend on the ensemble it trains in
    (kernels.masked_loss computes each member's products alone; tests/test_birth_task.py), so the tables are those
    of one job of every seed. One job when the user's ``--set`` names the seeds."""
    if len(cfg["seeds"]) < 2 or any(o.split("=", 1)[0].strip() == "seeds" for o in ctx.overrides):
        return {name: cfg}
    return {f"{name}-seed{s}": cfg | {"seeds": [s]} for s in cfg["seeds"]}


def trained_rows(trained: dict) -> list[dict]:
    """Every trained member's rows (:func:`rows_of`) of a plan's jobs, sorted by seed and step."""
    rows = [r for dirs in trained.values() for d in dirs for r in rows_of(d)]
    return sorted(rows, key=lambda r: (r["seed"], r["step"]))


class Options(Strict):
    """The runs (None: the full or --quick setting)."""

    seeds: list[int] | None = Field(None, description="seeds (one ensemble)")
    steps: int | None = Field(None, ge=1, description="SGD steps")
    lr: float | None = Field(None, gt=0, description="SGD learning rate (the authors' README: 0.03 at batch 512)")
    d: int | None = Field(None, ge=2, description="embedding dimension (the paper: 256)")
    T: int | None = Field(None, ge=2, description="sequence length (the paper: 256)")
    batch_size: int | None = Field(None, ge=1, description="sequences per step (the paper: 512)")


#: where the quoted words stand: the paper's abstract and the first paragraphs of its introduction (its full text
#: was not available to tdyn; docs/reproductions/birth.md#paper-and-code)
PAPER = "Bietti et al. 2023"
QUOTE_BIGRAMS_FIRST = ("By a careful empirical analysis of the training process on a simplified two-layer "
                       "transformer, we illustrate the fast learning of global bigrams and the slower development "
                       "of an \u201cinduction head\u201d mechanism for the in-context bigrams.")
QUOTE_SUCCEED = ("While one-layer transformers fail to reliably predict the in-context bigrams, we find that "
                 "two-layer transformers succeed by developing an induction head mechanism")
QUOTE_MEMORIES = ("We highlight the role of weight matrices as associative memories, provide theoretical insights "
                  "on how gradients enable their learning during training")

#: the probe metrics a row holds (probe/key → column)
CURVE_KEYS = {"birth.memory/W_O2": "recall_W_O2", "birth.memory/W_K2": "recall_W_K2",
              "birth.memory/W_K1": "recall_W_K1", "birth.memory/W_K1_64": "recall_W_K1_64",
              "birth.memory/bigram_kl": "bigram_kl",
              "birth.icl/loss_out": "loss_out", "birth.icl/acc_out": "acc_out", "birth.icl/acc_first": "acc_first",
              "birth.icl/loss_bigram": "loss_bigram", "birth.icl/loss_all": "loss_all",
              "birth.icl/attn1_prev": "attn1_prev", "birth.icl/attn2_ind": "attn2_ind",
              "birth.icl/acc_out_ood": "acc_out_ood", "birth.icl/loss_out_ood": "loss_out_ood"}
COLUMNS = ["seed", "step", "train_loss"] + list(CURVE_KEYS.values())
#: with held-out triggers (birth/heldout-triggers): W_K²'s recall over them and the in-context measures on them
TRIGGER_KEYS = {"birth.memory/W_K2_ood": "recall_W_K2_ood", "birth.icl/acc_out_tood": "acc_out_tood",
                "birth.icl/loss_out_tood": "loss_out_tood", "birth.icl/attn2_ind_tood": "attn2_ind_tood"}
CURVE_KEYS |= TRIGGER_KEYS
COLUMNS_TRIGGERS = COLUMNS + list(TRIGGER_KEYS.values())


def rows_of(run_dir) -> list[dict]:
    """A run's probe metrics as table rows (NaN where a metric is absent, e.g. bigram_kl without W_F)."""
    run = runs.Run(run_dir)
    a = run.arrays()
    nan = np.full(len(a["step"]), np.nan)
    cols = {"train_loss": a.get("loss", nan)} | {c: a.get(k, nan) for k, c in CURVE_KEYS.items()}
    return [{"seed": run.seed, "step": int(s), **{c: float(v[i]) for c, v in cols.items()}}
            for i, s in enumerate(a["step"])]


def by_seed(rows: list[dict], key: str) -> tuple[np.ndarray, list[int], np.ndarray]:
    """(steps, seeds, values (seeds, steps)) of column ``key``."""
    steps = np.array(sorted({r["step"] for r in rows}))
    seeds = sorted({r["seed"] for r in rows})
    val = {(r["seed"], r["step"]): r[key] for r in rows}
    return steps, seeds, np.array([[val.get((s, t), np.nan) for t in steps] for s in seeds], dtype=float)


def first_step(steps: np.ndarray, values: np.ndarray, level: float, *, above: bool = True) -> float:
    """The first step at which ``values`` reaches ``level`` (≥ when ``above``, else ≤); NaN if never."""
    hit = values >= level if above else values <= level
    idx = np.flatnonzero(hit)
    return float(steps[idx[0]]) if idx.size else float("nan")


def formation_step(steps: np.ndarray, values: np.ndarray, reading_: str, *, above: bool = True) -> float:
    """The step a curve is "formed" under one reading: ``"abs:L"`` the first step it reaches the level L;
    ``"rel:f"`` the first step it has made the fraction f of its change from the first to the last value."""
    kind, x = reading_.split(":")
    x = float(x)
    if kind == "abs":
        return first_step(steps, values, x, above=above)
    v0, v1 = values[0], values[-1]
    if not (np.isfinite(v0) and np.isfinite(v1)) or (v1 <= v0 if above else v1 >= v0):
        return float("nan")       # the curve did not move the claimed way: no formation to time
    return first_step(steps, values, v0 + x * (v1 - v0), above=above)


def ordered(first: list[float], second: list[float], label: str, definition: str) -> dict:
    """A reading "``first`` forms before ``second``": paired over seeds, t_second − t_first > 0 by 2 SE
    (:func:`tdyn.stats.decide`); inconclusive with its reason where some seed never formed one of them."""
    a, b = np.asarray(first, float), np.asarray(second, float)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return reading(definition, None, name=label, reason="some seed never reached the level in this run",
                       t_first=list(a), t_second=list(b))
    m, se = stats.paired(b, a)
    return reading(definition, stats.decide(m, se), name=label, t_first=list(a), t_second=list(b), mean_gap=m,
                   se=se, **stats.margin(m, se))


def final(rows: list[dict], key: str) -> list[float]:
    """``key`` at each seed's last step, in seed order."""
    _, _, v = by_seed(rows, key)
    return [float(x) for x in v[:, -1]]


def initial(rows: list[dict], key: str) -> list[float]:
    _, _, v = by_seed(rows, key)
    return [float(x) for x in v[:, 0]]


# ---------------------------------------------------------------- figures
def figure_title(text: str, quick: bool) -> str:
    """A figure's title, marked when the run used the quick settings."""
    return text + ("\n[QUICK settings: a pipeline check, not the evidence]" if quick else "")


def band(ax, steps, values: np.ndarray, color, label: str, **kw) -> None:
    """values (seeds, steps): the seed mean as a line and the min–max over seeds as a band."""
    ax.plot(steps, np.nanmean(values, 0), color=color, label=label, **kw)
    if values.shape[0] > 1:
        ax.fill_between(steps, np.nanmin(values, 0), np.nanmax(values, 0), color=color, alpha=0.2, lw=0)


def curves(ax, rows: list[dict], series, color0: int = 0, **axes) -> None:
    """One panel: each (metric, label) of ``series`` over training as :func:`band` (colours from the palette's
    ``color0``-th on), the axes set by ``axes`` (xlabel, ylabel, ylim, title), and the legend under it (the
    curves rise through every corner of the panel)."""
    for i, (key, label) in enumerate(series):
        steps, _, v = by_seed(rows, key)
        band(ax, steps, v, style.PALETTE[color0 + i], label)
    ax.set(**axes)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=10, frameon=False)


UNIT = (-0.02, 1.02)   # the y range of a panel of fractions


def two_panels(ctx, rows: list[dict], left: tuple, right: tuple, title: str, name: str) -> list[str]:
    """Every birth reproduction's figure: two :func:`curves` panels side by side (``left`` and ``right`` are
    ``(series, color0, axes)``, over training steps), the title (marked when quick) and the file ``name`` in the
    output directory."""
    import matplotlib.pyplot as plt

    style.apply()
    fig, axs = plt.subplots(1, 2, figsize=(11, 6), layout="constrained")
    for ax, (series, color0, axes) in zip(axs, (left, right)):
        curves(ax, rows, series, color0, xlabel="training step", **axes)
    fig.suptitle(figure_title(title + " (lines: seed mean; bands: min–max)", ctx.quick))
    style.save(fig, Path(ctx.out) / name)
    return [name]
