"""Decision lists (docs/reproductions/decision-lists.md): what the three reproductions share — the run configs of the
``decision_list`` task they train, the initial model of a config, metrics of a run as a curve, and the
benchmarks. The reproductions: ``decision_list_claim1`` (result (1), the reduced ODE),
``decision_list_claim2`` (result (2), GD through the trainer), ``decision_list_uniform`` (claim (c)).
Samplers, δ/γ and "perfect" are tdyn's choices (docs/reproductions/decision-lists.md#samplers-delta-and-gamma,
docs/reproductions/decision-lists.md#perfect-classification); every output names the ones it uses.
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from tdyn import runs
from tdyn.bench import register_bench
from tdyn.config import validate_config
from tdyn.data import decision_list as dl
from tdyn.reproduce.common import with_options
from tdyn.models.decision_list import DecisionListModel, DecisionListModelConfig
from tdyn.tasks import build_task
from tdyn.theory import decision_list as th
from tdyn.train.trainer import expand_members

TIME_UNITS = "paper Eqn 2 normalisation: (1/n) sum_j per sequence, averaged over sequences"


def _fmt(x):
    return "" if x is None else x


class PlannedJobs:
    """A reproduction's jobs, fixed before training from its settings (the full or --quick ones with the
    user's typed options in place) and computed once per (seed, settings): ``plan(ctx)`` → the jobs,
    ``plan.settings(ctx)`` → the settings. ``build(seed, settings)`` returns the jobs (dicts with
    ``name`` and ``config``, and whatever the analysis needs)."""

    def __init__(self, settings: Callable[[bool], dict], build: Callable[[int, dict], list[dict]]):
        self._settings, self._build = settings, build
        self._cached = functools.lru_cache(maxsize=4)(lambda seed, text: tuple(build(seed, json.loads(text))))

    def settings(self, ctx) -> dict:
        return with_options(self._settings(ctx.quick), ctx.options)

    def __call__(self, ctx) -> tuple[dict, ...]:
        return self._cached(ctx.seed, json.dumps(self.settings(ctx)))

    def configs(self, ctx) -> dict[str, dict]:
        """Every run config by job name (the reproduction's ``configs=``, printed by ``tdyn config``)."""
        return {j["name"]: j["config"] for j in self(ctx)}


def initial_model(cfg: dict, member: int = 0) -> tuple[DecisionListModel, object]:
    """Member ``member``'s model at step 0 as the trainer builds it from ``cfg`` (S = 1), and the task."""
    rc = validate_config(cfg)
    task = build_task(rc, [expand_members(rc)[member]])
    return task.model, task


def lambda_max0(cfg: dict, start_seed: int = 0) -> float:
    """λ_max of the population Hessian over (W, V) at the config's initial state (member 0), Lanczos from
    a start vector drawn with ``start_seed``: what η = f/λ_max(0) divides by."""
    model, task = initial_model(cfg)
    return th.top_hessian_eigenvalue(model, task.dist, task.types, gen=torch.Generator().manual_seed(start_seed))


def curve(d: Path) -> dict[str, np.ndarray]:
    """A decision-list run's metrics as arrays: step, loss, err_sup, acc_pop, min_margin, perfect, cos_c,
    perm_recovery, norm_V, drift (max|V − V₀|), lambda_max and the upper end of its certified bracket
    lambda_max_upper (NaN where not measured; runs from before the bracket: lambda_max)."""
    a = runs.Run(d).arrays()
    nan = np.full(len(a["step"]), np.nan)
    return {"step": a["step"].astype(int), "loss": a["loss"],
            **{k: a.get(f"decision_list.classify/{k}", nan) for k in ("err_sup", "acc_pop", "min_margin", "perfect")},
            **{k: a.get(f"decision_list.V/{k}", nan) for k in ("cos_c", "perm_recovery", "drift")},
            "norm_V": a.get("decision_list.V/norm", nan), "lambda_max": a.get("decision_list.hessian/lambda_max", nan),
            "lambda_max_upper": a.get("decision_list.hessian/lambda_max_upper", a.get("decision_list.hessian/lambda_max", nan))}


# ---------------------------------------------------------------- benchmarks
def _pop_grad_bench(L: int, n: int, sampler: str) -> dict:
    task = dl.make_task(L, 3, seed=0)
    types = th.enumerate_types(task, n, sampler)
    model = DecisionListModel(DecisionListModelConfig(L))
    with torch.no_grad():
        model.W.normal_(generator=torch.Generator().manual_seed(0))
        model.V.copy_(10 * task.P)
    th.population_loss(model, task, types, backward=True)  # warm-up
    t0 = time.perf_counter()
    th.population_loss(model, task, types, backward=True)
    return {"types": len(types), "seconds": time.perf_counter() - t0}


@register_bench("decision_list_popgrad_L32_n4")
def _b1(quick: bool) -> dict:
    """One exact population loss + gradient, sampler B, (L, n) = (32, 4): 35,960 sets."""
    return _pop_grad_bench(32, 4, "B")


@register_bench("decision_list_popgrad_L16_n5")
def _b2(quick: bool) -> dict:
    """One exact population loss + gradient, sampler A, (L, n) = (16, 5): 15,504 multisets."""
    return _pop_grad_bench(16, 5, "A")


@register_bench("decision_list_reduced_ode_L10000")
def _b3(quick: bool) -> dict:
    """Reduced W-only flow to perfect classification, sampler B, L = 10⁴, n = 8, M = 4, c = 4n log L/δ."""
    L, n, M = 10000, 8, 4
    dg = dl.delta_gamma(L, n, M, "B")
    t0 = time.perf_counter()
    res = th.solve_reduced_flow(L, n, M, "B", 4 * n * math.log(L) / dg["delta"], t_max=1e9)
    return {"seconds": time.perf_counter() - t0, "T_sup": res.T_sup}


@register_bench("decision_list_task_and_samples_L10000")
def _b4(quick: bool) -> dict:
    """claim1's data at its largest L: make_task(L = 10⁴, M = 4), then N = 10⁴ sequences of n = 8 tokens
    by sampler B (Gumbel top-k over 10⁸ uniforms)."""
    t0 = time.perf_counter()
    task = dl.make_task(10000, 4, seed=0)
    t1 = time.perf_counter()
    dl.sample(task, 10000, 8, "B", torch.Generator().manual_seed(0))
    return {"make_task_seconds": t1 - t0, "sample_seconds": time.perf_counter() - t1}
