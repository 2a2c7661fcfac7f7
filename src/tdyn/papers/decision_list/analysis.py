"""Decision lists (docs/reproductions/decision-lists.md): what the three reproductions share — typed grids with
the user's options, the jobs planned from them, the initial model of a run config, a run's metrics as a curve,
and the figures' layout and ticks. The reproductions: ``claim1`` (result (1), the reduced ODE), ``claim2``
(result (2), GD through the trainer), ``uniform_attention`` (claim (c)). Samplers, δ/γ and "perfect" are tdyn's
choices (docs/reproductions/decision-lists.md#samplers-delta-and-gamma,
docs/reproductions/decision-lists.md#perfect-classification); every output names the ones it uses.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from tdyn import runs
from tdyn.reproduce.common import grid_dict, with_grid_options  # noqa: F401  (the reproductions import them from here)
from tdyn.config import validate_config
from tdyn.papers.decision_list import theory as th
from tdyn.papers.decision_list.model import DecisionListModel
from tdyn.papers.decision_list.probes import lambda_max
from tdyn.reproduce.phases import Tables, read_table
from tdyn.tasks import build_task
from tdyn.sweep.executors import pool_map
from tdyn.threads import tune_allocator
from tdyn.train.trainer import expand_members

TIME_UNITS = "paper Eqn 2 normalisation: (1/n) sum_j per sequence, averaged over sequences"



class PlannedJobs:
    """A reproduction's jobs, fixed before training from its grid (the full or --quick one with the user's
    typed options in place) and computed once per (seed, grid): ``plan(ctx)`` → the jobs, ``plan.grid(ctx)``
    → the grid. ``build(seed, grid)`` returns the jobs (dicts with ``name`` and ``config``, and whatever
    measuring their runs needs)."""

    def __init__(self, grid: Callable[[bool], Any], build: Callable[[int, Any], list[dict]]):
        self._grid, self._build = grid, build
        self._cache: dict[tuple, tuple[dict, ...]] = {}

    def grid(self, ctx):
        return with_grid_options(self._grid(ctx.quick), ctx.options)

    def __call__(self, ctx) -> tuple[dict, ...]:
        g = self.grid(ctx)
        key = (ctx.seed, json.dumps(grid_dict(g)))
        if key not in self._cache:
            if len(self._cache) >= 4:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = tuple(self._build(ctx.seed, g))
        return self._cache[key]

    def configs(self, ctx) -> dict[str, dict]:
        """Every run config by job name (the reproduction's plan, printed by ``tdyn config``)."""
        return {j["name"]: j["config"] for j in self(ctx)}


def initial_model(cfg: dict, member: int = 0) -> tuple[DecisionListModel, object]:
    """Member ``member``'s model at step 0 as the trainer builds it from ``cfg`` (S = 1), and the task."""
    rc = validate_config(cfg)
    task = build_task(rc, [expand_members(rc)[member]])
    return task.model, task


def lambda_max0(cfg: dict) -> float:
    """λ_max of the population Hessian over (W, V) at the config's initial state (member 0): what η = f/λ_max(0)
    divides by, by the λ_max probe's method (:func:`probes.lambda_max`, at the model's own logits as before): the
    dense closed-form Hessian's top eigenvalue where 2L² ≤ ``DENSE_MAX``, the lower end of the per-query block
    bracket where it is within 1e-10 (claim 2's L = 40 at W = 0: 3e-11 wide, 0.23 s; the η check reads the upper
    end), else Lanczos to 1e-12 from the top block's eigenvector. It replaced a Lanczos from a random start: the
    same λ to 2.6e-14 relative over claim 2's jobs, at 30–40× the cost at L = 40 (the plan's 14 s of claim 2's 200)."""
    tune_allocator()
    model, task = initial_model(cfg)
    return lambda_max(model, task.dist, task.types)[0]


def lambda_max0_all(cfgs: list[dict]) -> list[float]:
    """:func:`lambda_max0` of every config in ``cfgs``, on the local pool (``pool_map``: the largest L first; the
    same numbers as one call after another)."""
    return pool_map(lambda_max0, [(c,) for c in cfgs], cost=[float(c["data"]["L"]) for c in cfgs])


def curve(run: runs.Run) -> dict[str, np.ndarray]:
    """A decision-list run's metrics as arrays: step, loss, err_sup, acc_pop, min_margin, perfect, cos_c,
    perm_recovery, norm_V, drift (max|V − V₀|), lambda_max and the upper end of its certified bracket
    lambda_max_upper (NaN where not measured; runs from before the bracket: lambda_max)."""
    a = run.arrays()
    nan = np.full(len(a["step"]), np.nan)
    return {"step": a["step"].astype(int), "loss": a["loss"],
            **{k: a.get(f"decision_list.classify/{k}", nan) for k in ("err_sup", "acc_pop", "min_margin", "perfect")},
            **{k: a.get(f"decision_list.V/{k}", nan) for k in ("cos_c", "perm_recovery", "drift")},
            "norm_V": a.get("decision_list.V/norm", nan), "lambda_max": a.get("decision_list.hessian/lambda_max", nan),
            "lambda_max_upper": a.get("decision_list.hessian/lambda_max_upper", a.get("decision_list.hessian/lambda_max", nan))}


# ---------------------------------------------------------------- drawing helpers (figures drawn from the CSVs)
#: figure width (inches) of the decision-list figures: at the style's 130 dpi about 1050 px, shown 600–900 px
#: wide on the report page, so the fonts of ``page_rc`` stay at ≥ 10 pt there
PAGE_WIDTH = 7.2


def page_rc() -> dict:
    """rc settings (for ``plt.rc_context``) on top of ``style.apply()``: text large enough to read at ≥ 10 pt
    when a ``PAGE_WIDTH``-wide figure is shown ~800 px wide."""
    return {"font.size": 14, "axes.titlesize": 14, "axes.labelsize": 14, "xtick.labelsize": 13,
            "ytick.labelsize": 13, "legend.fontsize": 13, "legend.title_fontsize": 13, "figure.titlesize": 15,
            "legend.framealpha": 0.9}


def panel_grid(nrows: int, ncols: int = 1, *, axes_h: float = 3.2, gap: float = 1.0, top: float = 1.2,
               bottom: float = 0.8, wspace: float = 0.3, **kw):
    """``plt.subplots`` laid out in inches (``PAGE_WIDTH`` wide): ``nrows`` rows of axes ``axes_h`` high,
    ``gap`` between rows (room for a legend under each), ``top`` above (the figure's title), ``bottom``
    below; ``kw`` goes to ``plt.subplots`` (sharey, ...)."""
    import matplotlib.pyplot as plt

    h = top + bottom + nrows * axes_h + (nrows - 1) * gap
    fig, axes = plt.subplots(nrows, ncols, figsize=(PAGE_WIDTH, h), squeeze=False, **kw)
    fig.subplots_adjust(top=1 - top / h, bottom=bottom / h, hspace=gap / axes_h, wspace=wspace, left=0.16,
                        right=0.97)
    return fig, axes


def is_quick(out_dir: Path, quick: bool | None) -> bool:
    """``quick`` if given, else what ``out_dir``'s results.json says (a redraw of committed evidence)."""
    if quick is not None:
        return bool(quick)
    p = Path(out_dir) / "results.json"
    return bool(runs.read_json(p).get("quick")) if p.exists() else False   # garbled: one line naming it


def tables_in(out_dir: Path, names: tuple[str, ...]) -> Tables:
    """The tables ``names`` of ``out_dir`` (``<name>.csv``), read as the runner reads them back."""
    return {t: read_table(Path(out_dir) / f"{t}.csv") for t in names}


def figure_title(text: str, quick: bool) -> str:
    """A figure's title, marked when the run used the quick settings."""
    return text + ("\n[QUICK settings: a pipeline check, not the evidence]" if quick else "")


def _sci(v: float) -> str:
    """A power of ten (or 0) as mathtext: ±10^k."""
    if v == 0:
        return "0"
    k = int(round(math.log10(abs(v))))
    return f"$\\mathregular{{{'-' if v < 0 else ''}10^{{{k}}}}}$"


def log_ticks(ax, which: str = "y", max_ticks: int = 6) -> None:
    """Legible ticks on a log axis, from its current limits: at most ``max_ticks`` labelled powers of ten
    (every k-th decade on a wide axis), or 1-2-5-style plain numbers when it spans about a decade or less;
    minor ticks unlabelled."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = sorted(ax.get_ylim() if which == "y" else ax.get_xlim())
    span = math.log10(hi / lo)
    if span <= 1.3:
        for mant in ((1, 2, 3, 4, 5, 6, 8), (1, 2, 3, 5, 7), (1, 2, 5), (1, 3), (1,)):
            ticks = [m * 10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                     for m in mant if lo <= m * 10.0 ** k <= hi]
            if len(ticks) <= max_ticks:
                break
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    else:
        step = max(1, math.ceil(span / max_ticks))
        ks = [k for k in range(math.ceil(math.log10(lo)), math.floor(math.log10(hi)) + 1) if k % step == 0]
        axis.set_major_locator(FixedLocator([10.0 ** k for k in ks]))
        axis.set_major_formatter(FuncFormatter(lambda v, _: _sci(v)))
        axis.set_minor_locator(LogLocator(subs=(1.0,), numticks=100) if step > 1 else LogLocator(subs="auto", numticks=100))
    axis.set_minor_formatter(NullFormatter())
    (ax.set_ylim if which == "y" else ax.set_xlim)(lo, hi)


def symlog_ticks(ax, linthresh: float, which: str = "y", max_ticks: int = 7) -> None:
    """A symlog axis (linear within ±``linthresh``, one decade wide) with legible ticks: 0 and at most
    ``max_ticks`` labelled ±powers of ten, every k-th decade, none closer to 0 than k decades (so the labels
    near 0 do not collide); minor ticks off. Call after plotting (it reads the data limits)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    (ax.set_yscale if which == "y" else ax.set_xscale)("symlog", linthresh=linthresh, linscale=1.0)
    lo, hi = ax.dataLim.intervaly if which == "y" else ax.dataLim.intervalx

    def pad(v):   # ~0.6 decade of head room beyond the data (room for a marker on the last point)
        return v * 4 if abs(v) > linthresh else math.copysign(linthresh * 4, v) if v else 0.0
    lo, hi = pad(min(lo, 0.0)), pad(max(hi, 0.0))
    t0 = math.floor(math.log10(linthresh))
    top_pos = math.floor(math.log10(hi)) if hi > linthresh else None
    top_neg = math.floor(math.log10(-lo)) if lo < -linthresh else None
    span = sum(t - t0 + 1 for t in (top_pos, top_neg) if t is not None)
    step = max(1, math.ceil(span / max(1, max_ticks - 1)))
    ticks = [0.0]
    for top, sign in ((top_pos, 1), (top_neg, -1)):
        if top is None:
            continue
        # decades from top down, every step-th; the decade-coordinate distance to 0 is 1 + (k − log10 linthresh)
        ticks += [sign * 10.0 ** k for k in range(top, t0 - 1, -1)
                  if k % step == 0 and 1 + k - math.log10(linthresh) >= 0.9 * step]
    axis = ax.yaxis if which == "y" else ax.xaxis
    axis.set_major_locator(FixedLocator(sorted(ticks)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _sci(v)))
    axis.set_minor_locator(NullLocator())
    (ax.set_ylim if which == "y" else ax.set_xlim)(lo, hi)
