"""von Oswald et al. 2023, the weight construction (``icl-gd/construction``; docs/reproductions/icl-gd.md#icl-gdconstruction):
nothing is trained. ``measure`` applies the construction's LSA layers to random sequences and compares them with
gradient descent step by step (table construction), checks the closed-form one-step moments, η* and the loss
against Monte Carlo (table optimal_step), and computes the loss of K steps of GD at η*_K and of K GD++ layers
(table k_steps); ``judge`` reads the three tables, ``draw`` the figure from optimal_step and k_steps.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from pydantic import Field

from tdyn import stats
from tdyn.papers.icl_gd import data as icl
from tdyn.papers.icl_gd import theory as th
from tdyn.papers.icl_gd.analysis import (PAPER, QUOTE_CONSTRUCTION, QUOTE_CURVATURE, figure_title, grid_dict,
                                         with_grid_options)
from tdyn.reproduce.common import claim, reading
from tdyn.reproduce.phases import Phases, Tables, register_phases
from tdyn.reproduce.registry import ReproduceContext
from tdyn.report import style
from tdyn.schema import Strict
from tdyn.seeding import generator
from tdyn.sweep.executors import pool_map

#: the largest |LSA − GD| / scale that counts as equal: float64 rounding of a few hundred operations on O(1) numbers
EXACT_TOL = 1e-12
K_SIGMA = 4.0        # Monte Carlo comparisons: |closed form − MC| ≤ 4 standard errors


@dataclasses.dataclass(frozen=True)
class Grid:
    """What the construction's checks run on: sizes (d, N) and input half-widths, the sequences per exactness
    check, the Monte Carlo sequences for the closed forms, the GD steps K and the GD++ steps."""
    sizes: list[tuple[int, int]]
    x_max: list[float]
    noise: list[float]
    exact_seqs: int
    mc: int
    gd_steps: list[int]
    gdpp_steps: list[int]
    gdpp_mc: int


QUICK = Grid(sizes=[(10, 10), (3, 5)], x_max=[1.0], noise=[0.0], exact_seqs=64, mc=1 << 15, gd_steps=[1, 2, 3],
             gdpp_steps=[1, 2], gdpp_mc=1 << 13)
FULL = Grid(sizes=[(10, 10), (3, 5), (10, 40), (20, 10)], x_max=[1.0, 0.5], noise=[0.0, 0.5], exact_seqs=1024,
            mc=1 << 20, gd_steps=[1, 2, 3, 4, 5, 6], gdpp_steps=[1, 2, 3, 4], gdpp_mc=1 << 16)


class Options(Strict):
    """The construction checks' grid (None: the full or --quick grid)."""

    mc: int | None = Field(None, ge=1024, le=1 << 24, description="Monte Carlo sequences for the closed forms")
    gd_steps: list[int] | None = Field(None, description="GD steps K whose loss at η*_K is computed")


def grid_of(ctx: ReproduceContext) -> Grid:
    return with_grid_options(QUICK if ctx.quick else FULL, ctx.options)


CONSTRUCTION_COLUMNS = ["d", "N", "steps", "W0", "max_abs_pred", "max_abs_ctx", "scale", "rel_err"]
OPTIMAL_COLUMNS = ["d", "N", "x_max", "noise", "eta_star", "loss_star", "loss_zero", "E_yb", "E_yb_mc", "E_yb_se",
                   "E_bb", "E_bb_mc", "E_bb_se", "E_yy", "E_yy_mc", "E_yy_se", "loss_star_mc", "loss_star_se",
                   "eta_mc"]
K_STEPS_COLUMNS = ["method", "steps", "eta", "gamma", "loss", "se", "n"]


def _exactness_rows(grid: Grid, seed: int) -> list[dict]:
    """The construction's layers against GD: one step from W₀ = 0 and from a random W₀ (the query token holding
    −W₀ x_q), and K layers against K steps from W₀ = 0 (the context tokens' y entries against the residuals
    y_i − W_K x_i): the largest absolute differences and the scale of the compared numbers."""
    rows = []
    for d, N in grid.sizes:
        g = generator(seed, f"icl_gd/construction/{d}/{N}")
        E, _ = icl.sample(grid.exact_seqs, d, N, g, dtype=th.F64)
        x, y, x_q = icl.split(E)
        eta = th.one_step(d, N).eta_star
        for steps, w0 in [(1, False), (1, True)] + [(k, False) for k in grid.gd_steps if k > 1]:
            W0 = torch.randn(d, generator=g, dtype=th.F64) if w0 else None
            E_in = E.clone()
            if w0:
                E_in[:, -1, -1] = -(x_q @ W0)                      # the query token (x_q, −W₀ x_q)
            out, _ = th.lsa(E_in, [th.construction(d, eta, N, W0)] * steps)
            pred_gd, W = th.gd_steps(E, eta, steps, W0)
            pred = -out[:, -1, -1]
            ctx_ref = y - (x @ W.unsqueeze(-1)).squeeze(-1) if not w0 else None
            d_ctx = float((out[:, :-1, -1] - ctx_ref).abs().max()) if ctx_ref is not None else 0.0
            d_pred = float((pred - pred_gd).abs().max())
            scale = float(max(pred_gd.abs().max(), y.abs().max()))
            rows.append({"d": d, "N": N, "steps": steps, "W0": "random" if w0 else "zero", "max_abs_pred": d_pred,
                         "max_abs_ctx": d_ctx, "scale": scale, "rel_err": max(d_pred, d_ctx) / scale})
    return rows


def _optimal_row(d: int, N: int, a: float, sigma: float, mc: int, seed: int) -> dict:
    """At (d, N, x_max = a, noise = σ): the closed-form moments, η* and the losses beside their Monte Carlo estimates
    (mean and standard error over ``mc`` sequences), and the Monte Carlo argmin of the loss."""
    os_ = th.one_step(d, N, a, 1.0, sigma)
    yb, bb, yy, ls = [], [], [], []
    for E, y in th.mc_sample(mc, d, N, seed, x_max=a, noise=sigma):
        b = th.gd_poly(E, 1)[:, 0]
        yb.append(y * b), bb.append(b * b), yy.append(y * y), ls.append(0.5 * (y - os_.eta_star * b) ** 2)
    cat = {k: torch.cat(v) for k, v in (("yb", yb), ("bb", bb), ("yy", yy), ("ls", ls))}
    ms = {k: (float(v.mean()), float(stats.se_along(v, 0))) for k, v in cat.items()}
    return {"d": d, "N": N, "x_max": a, "noise": sigma, "eta_star": os_.eta_star,
            "loss_star": os_.loss_star, "loss_zero": os_.loss_zero,
            "E_yb": os_.E_yb, "E_yb_mc": ms["yb"][0], "E_yb_se": ms["yb"][1],
            "E_bb": os_.E_bb, "E_bb_mc": ms["bb"][0], "E_bb_se": ms["bb"][1],
            "E_yy": os_.E_yy, "E_yy_mc": ms["yy"][0], "E_yy_se": ms["yy"][1],
            "loss_star_mc": ms["ls"][0], "loss_star_se": ms["ls"][1],
            "eta_mc": ms["yb"][0] / ms["bb"][0]}


def _gd_row(K: int, mc: int, seed: int) -> dict:
    """At the paper's sizes (d = N = 10, x ~ U(−1, 1)): K steps of GD at η*_K (fitted on min(mc, 2¹⁸) sequences)
    and their loss on ``mc`` independent ones, with its Monte Carlo standard error."""
    eta, _ = th.optimal_eta(K, 10, 10, n=min(mc, 1 << 18), seed=seed)
    mc_ = th.gd_loss_mc(K, float(eta), 10, 10, n=mc, seed=seed + 1)   # an independent sample
    return {"method": "GD", "steps": K, "eta": float(eta), "gamma": 0.0, "loss": mc_.loss, "se": mc_.se, "n": mc_.n}


def _gdpp_row(K: int, gdpp_mc: int, seed: int) -> dict:
    """K GD++ layers at their fitted (η, γ) on ``gdpp_mc`` sequences (in-sample), d = N = 10, x ~ U(−1, 1)."""
    eta, gamma, mc = th.optimal_gdpp(K, 10, 10, n=gdpp_mc, seed=seed + 2)
    return {"method": "GD++", "steps": K, "eta": eta, "gamma": gamma, "loss": mc.loss, "se": mc.se, "n": mc.n}


_ROWS = {"optimal": _optimal_row, "gd": _gd_row, "gdpp": _gdpp_row}


def _row(kind: str, *args) -> dict:
    """One independent row of the optimal_step or k_steps table (a pool call; module level, so importable)."""
    return _ROWS[kind](*args)


def measure(ctx: ReproduceContext, trained: dict) -> Tables:
    """The three tables; the Monte Carlo rows are independent (each draws its own keyed stream), so they are computed
    on the local pool, the costliest first (``pool_map``: the same bits as one after another)."""
    grid = grid_of(ctx)
    seed = ctx.seed
    opt = [("optimal", d, N, a, sigma, grid.mc, seed) for d, N in grid.sizes for a in grid.x_max for sigma in grid.noise]
    ks = [("gd", K, grid.mc, seed) for K in grid.gd_steps] + [("gdpp", K, grid.gdpp_mc, seed) for K in grid.gdpp_steps]
    # rough costs (sequence entries touched) for the order only: sampling and one product per sequence for a
    # moment row; two samples and K products for GD; ≈ 30 Nelder–Mead evaluations' worth per GD++ layer
    cost = ([c[5] * (c[1] + 1) * (c[2] + 1) for c in opt]
            + [(grid.mc + min(grid.mc, 1 << 18)) * 121 * (2 + c[1]) / 3 for c in ks if c[0] == "gd"]
            + [grid.gdpp_mc * 121 * 30 * c[1] / 3 for c in ks if c[0] == "gdpp"])
    rows = pool_map(_row, opt + ks, cost=cost)
    return {"construction": _exactness_rows(grid, seed), "optimal_step": rows[:len(opt)], "k_steps": rows[len(opt):]}


def judge(ctx: ReproduceContext, tables: Tables) -> dict:
    grid = grid_of(ctx)
    ex = tables["construction"]
    one = [r for r in ex if r["steps"] == 1]
    many = [r for r in ex if r["steps"] > 1]
    claims = [
        claim("construction_is_one_gd_step",
              "The LSA layer with W_K = W_Q = [[I, 0], [0, 0]], W_V = [[0, 0], [W₀, −1]], P = (η/N)·e_y e_yᵀ turns the "
              "query token (x_q, −W₀x_q) into (x_q, −W₁x_q), W₁ one GD step of size η from W₀ on "
              "L(W) = 1/(2N) Σ (W x_i − y_i)², on every sequence (float64)",
              max(r["rel_err"] for r in one) <= EXACT_TOL, source="paper", quote=QUOTE_CONSTRUCTION,
              paper=PAPER + " (the weight construction; the authors' create_weights)",
              definition="rel_err = max over sequences of |ŷ_LSA − ŷ_GD| (and, from W₀ = 0, of the context tokens' y "
                         "entries against the residuals y_i − W₁ x_i), divided by the largest |y| or |ŷ_GD|; W₀ = 0 "
                         "and W₀ ~ N(0, I); η = η*; sizes " + ", ".join(f"(d, N) = ({d}, {N})" for d, N in grid.sizes),
              measured="largest rel_err over the sizes and both W₀", expected=f"≤ {EXACT_TOL:g} (float64 rounding)",
              rel_err=[r["rel_err"] for r in one], sequences=grid.exact_seqs),
        claim("k_layers_are_k_gd_steps",
              "K layers of the same construction (W₀ = 0) are K steps of GD: the query's prediction and the context "
              "tokens' y entries (the residuals y_i − W_K x_i) agree to rounding for every K of the grid",
              max(r["rel_err"] for r in many) <= EXACT_TOL if many else None,
              reason=None if many else "no K > 1 in this grid", source="derived",
              derived="the paper's construction is of one layer; stacking it is tdyn's check that K layers give K "
                      "GD steps (each layer writes the residuals into the context tokens, which the next layer's "
                      "values read)",
              paper=PAPER + " (the weight construction, stacked)",
              definition="rel_err as in construction_is_one_gd_step, per K", measured="largest rel_err over K and sizes",
              expected=f"≤ {EXACT_TOL:g}", rel_err={f"K={r['steps']},d={r['d']},N={r['N']}": r["rel_err"] for r in many}),
    ]
    # the closed form against Monte Carlo
    rds = []
    for r in tables["optimal_step"]:
        name = f"d={r['d']},N={r['N']},x_max={r['x_max']:g},noise={r['noise']:g}"
        zs = {k: (r[f"{k}_mc"] - r[k]) / r[f"{k}_se"] for k in ("E_yb", "E_bb", "E_yy")}
        zs["loss_star"] = (r["loss_star_mc"] - r["loss_star"]) / r["loss_star_se"]
        ok = all(abs(z) <= K_SIGMA for z in zs.values())
        rds.append(reading(name, ok, name=name, z_scores=zs, eta_star=r["eta_star"], eta_mc=r["eta_mc"],
                           loss_star=r["loss_star"], loss_star_mc=r["loss_star_mc"]))
    claims.append(claim(
        "optimal_step_closed_form",
        "The closed forms of E[y_q b], E[b²], E[y_q²] and of the loss at η* = E[y_q b]/E[b²] agree with Monte Carlo "
        f"within {K_SIGMA:g} standard errors at every (d, N, x_max, noise) of the grid",
        readings=rds, source="derived",
        derived="the paper tunes GD's step size numerically (the authors' scan_lrs: a grid of η on 10,000 tasks); "
                "tdyn derives the optimal one-step η* and its loss for x ~ U(−a, a)^d, w ~ N(0, I) in closed form "
                "(docs/reproductions/icl-gd.md#optimal-step) and checks it here",
        paper=PAPER + " (GD at its best step size, the reference of every comparison)",
        definition="b = (1/N) Σ_i y_i x_iᵀ x_q (the one-step prediction at η = 1 from W₀ = 0); z = (MC − closed form) "
                   f"/ MC standard error over {grid.mc} sequences",
        measured="z-scores of the three moments and of the loss at η*", expected=f"|z| ≤ {K_SIGMA:g} everywhere"))
    # GD++ against GD
    ks = tables["k_steps"]
    gd = {r["steps"]: r for r in ks if r["method"] == "GD"}
    pp = {r["steps"]: r for r in ks if r["method"] == "GD++"}
    cells = {}
    for K, r in pp.items():
        if K >= 2 and K in gd:
            cells[f"K={K}"] = stats.decide(gd[K]["loss"] - r["loss"], math.hypot(gd[K]["se"], r["se"]), k=K_SIGMA)
    held, reason = stats.every_cell(cells)
    claims.append(claim(
        "gdpp_beats_gd", "At the paper's sizes, K GD++ layers (a curvature correction x ← (I − γΣ̂)x besides the GD "
        "step, (η, γ) fitted) reach a lower loss than K steps of GD at η*_K, for every K ≥ 2 of the grid",
        held, reason=reason, source="derived",
        derived="the abstract attributes the trained Transformers' advantage over plain GD to 'an iterative curvature "
                "correction'; tdyn checks that the authors' GD++ construction (their create_weights(lin_diag=True), "
                "two numbers per model) is such a correction: better than GD at the same depth",
        paper=PAPER + ": " + QUOTE_CURVATURE,
        definition=f"loss = ½E[(ŷ − y_q)²], d = N = 10, x ~ U(−1, 1); GD at η*_K (exact argmin on a Monte Carlo "
                   f"sample), GD++ at (η, γ) fitted by Nelder–Mead on {grid.gdpp_mc} sequences (in-sample); margin "
                   f"{K_SIGMA:g} standard errors of the difference",
        measured="loss(GD, K) − loss(GD++, K)", expected="> 0 beyond the noise for every K ≥ 2",
        losses={f"K={K}": {"GD": gd[K]["loss"] if K in gd else None, "GD++": r["loss"]} for K, r in pp.items()}))
    return {"experiment": "icl-gd/construction", "claims": claims, "grid": grid_dict(grid),
            "definitions": {"loss": "½ E[(ŷ − y_q)²] (the authors' compute_loss)",
                            "gd": "GD on L(W) = 1/(2N) Σ_i (W x_i − y_i)² from W₀ = 0",
                            "eta_star": "E[y_q b]/E[b²] with b = (1/N) Σ y_i x_iᵀ x_q (closed form, one step); "
                                        "η*_K: exact argmin of the K-step loss on a Monte Carlo sample"}}


def draw(ctx: ReproduceContext, tables: Tables, results: dict) -> list[str]:
    """construction.png: left, the one-step loss ℓ(η) in closed form at the paper's sizes with η* and the Monte
    Carlo loss at η*; right, the loss of K steps of GD and of K GD++ layers against K."""
    import matplotlib.pyplot as plt

    style.apply()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    r = next((r for r in tables["optimal_step"] if (r["d"], r["N"], r["x_max"], r["noise"]) == (10, 10, 1.0, 0.0)),
             tables["optimal_step"][0])
    os_ = th.OneStep(r["E_yy"], r["E_yb"], r["E_bb"])
    eta = np.linspace(0, 2.5 * r["eta_star"], 200)
    a1.plot(eta, [os_.loss(e) for e in eta], color=style.PALETTE[0], label="½E[(y_q − η b)²], closed form")
    a1.errorbar([r["eta_star"]], [r["loss_star_mc"]], yerr=[2 * r["loss_star_se"]], fmt="o", color=style.PALETTE[1],
                label=f"Monte Carlo at η* = {r['eta_star']:.4g} (±2 SE)")
    a1.axvline(r["eta_star"], color="grey", ls=":")
    a1.set(xlabel="η (one GD step from W₀ = 0)", ylabel="loss",
           title=f"One GD step, d = {r['d']}, N = {r['N']}, x ~ U(−{r['x_max']:g}, {r['x_max']:g})")
    a1.legend(fontsize=9)
    for i, method in enumerate(("GD", "GD++")):
        rows = sorted((x for x in tables["k_steps"] if x["method"] == method), key=lambda x: x["steps"])
        if rows:
            a2.errorbar([x["steps"] for x in rows], [x["loss"] for x in rows], yerr=[2 * x["se"] for x in rows],
                        marker="os"[i], color=style.PALETTE[i], label=f"{method} (tuned), ±2 SE")
    a2.set(xlabel="steps K", ylabel="loss", title="K steps of GD vs K GD++ layers (d = N = 10)")
    a2.set_xticks(sorted({x["steps"] for x in tables["k_steps"]}))
    a2.legend(fontsize=9)
    fig.suptitle(figure_title("The construction's references: one GD step at η*, K steps of GD and GD++", ctx.quick))
    fig.subplots_adjust(top=0.78 if ctx.quick else 0.84, wspace=0.25)
    style.save(fig, ctx.out / "construction.png")
    return ["construction.png"]


PHASES = Phases(measure=measure, judge=judge, draw=draw, tables=("construction", "optimal_step", "k_steps"),
                columns={"construction": CONSTRUCTION_COLUMNS, "optimal_step": OPTIMAL_COLUMNS,
                         "k_steps": K_STEPS_COLUMNS})
register_phases("icl-gd/construction", PHASES, options=Options)
