"""Decision lists, claim (c) (``decision-list/uniform-attention``): uniform attention (W = 0) pushes V
towards P (docs/reproductions/decision-lists.md#decision-listuniform-attention). The first gradient −∇_V F(0, 0) by
enumeration; then training through the trainer on the ``decision_list`` task (run directories under ``runs/``) with
Adam and gradient descent (η = 1/λ_max(0) per seed, fixed η), joint and frozen-W modes from the same V₀
(``model.W_init: zero`` keeps the draw).

Phases: ``plan`` fixes the runs and each seed's η = 1/λ_max(0) (:data:`ua_plan`); ``measure`` writes
first_gradient.csv, uniform_attention.csv (the runs' metrics at log-spaced steps) and uniform_attention_eta.csv
(the η = 1/λ_max(0) of each σ and seed); ``judge`` and ``draw`` read them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from pydantic import Field

from tdyn.papers.decision_list import data as dl
from tdyn.papers.decision_list import theory as th
from tdyn.papers.decision_list.analysis import PlannedJobs, curve, grid_dict, lambda_max0_all
from tdyn.papers.decision_list.model import DecisionListModel, DecisionListModelConfig
from tdyn.papers.decision_list.probes import centred_cosine, perm_recovery
from tdyn.papers.decision_list.task import decision_list_config
from tdyn.reproduce.common import claim, reading
from tdyn.reproduce.phases import Phases, Tables, register_phases
from tdyn.reproduce.registry import ReproduceContext
from tdyn.report import style
from tdyn.runs import Run
from tdyn.schema import Strict

UA_COLUMNS = ["mode", "optimizer", "sigma", "seed", "step", "loss", "cos_c", "perm_recovery", "acc_pop", "err_sup", "norm_V"]
GRAD_COLUMNS = ["sampler", "L", "n", "M", "cos_c_first_grad", "perm_recovery_first_grad"]
ETA_COLUMNS = ["sigma", "seed", "eta"]


def first_gradient(L: int, n: int, M: int, sampler: str, seed: int) -> dict:
    """−∇_V F at (W, V) = (0, 0): centred cosine with P and argmax recovery
    (docs/reproductions/decision-lists.md#decision-listuniform-attention)."""
    task = dl.make_task(L, M, seed=seed)
    model = DecisionListModel(DecisionListModelConfig(L))
    th.population_loss(model, task, th.enumerate_types(task, n, sampler), backward=True)
    G = -model.V.grad[0]
    return {"sampler": sampler, "L": L, "n": n, "M": M, "cos_c_first_grad": float(centred_cosine(G, task.P)),
            "perm_recovery_first_grad": float(perm_recovery(G, task.perm))}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Claim (c)'s grid: the first gradient's L and (n, M); the training task (L, n, M), init scales σ,
    seeds, steps, Adam's learning rate and the fixed GD step size."""
    grad_L: list[int]
    grad_nM: list[tuple[int, int]]
    L: int
    n: int
    M: int
    sigmas: list[float]
    seeds: list[int]
    steps: int
    lr: float
    gd_eta: float


QUICK = Settings(grad_L=[8, 16], grad_nM=[(3, 2)], L=8, n=3, M=2, sigmas=[1e-2], seeds=[0, 1], steps=300, lr=1e-2,
                 gd_eta=1.0)
FULL = Settings(grad_L=[8, 16, 24, 32], grad_nM=[(3, 2), (3, 3), (4, 2), (4, 3)], L=16, n=4, M=3,
                sigmas=[1e-3, 1e-2, 1e-1], seeds=[0, 1, 2, 3, 4], steps=2000, lr=1e-2, gd_eta=1.0)


def ua_settings(quick: bool) -> Settings:
    return QUICK if quick else FULL


UA_OPTIMIZERS = ("adam", "gd_1_over_lambda", "gd_fixed")
QUOTEC = ("we supplement our theorems with empirical results indicating that uniform attention (corresponding to "
          "W = 0) is sufficient to push V in the direction of P")
PAPERC = "abstract §II: uniform attention (W = 0) is sufficient to push V in the direction of P"


def _ua_opt_label(opt: str, st: Settings) -> str:
    return {"adam": f"Adam lr {st.lr}", "gd_1_over_lambda": "GD, η = 1/λ_max(0) per seed",
            "gd_fixed": f"GD, η = {st.gd_eta:g}"}[opt]


def _log_steps(steps: int) -> list[int]:
    return sorted({0, steps} | {int(x) for x in np.geomspace(1, steps, 40)})


class UAOptions(Strict):
    """Claim (c)'s training grid (None: the full or --quick setting)."""

    sigmas: list[float] | None = Field(None, description="init scales σ (W₀, V₀ ~ σ·N(0,1))")
    seeds: list[int] | None = Field(None, description="seeds")
    steps: int | None = Field(None, ge=1, description="training steps")
    lr: float | None = Field(None, gt=0, description="Adam's learning rate")
    gd_eta: float | None = Field(None, gt=0, description="the fixed GD step size")


def _plan(seed: int, st: Settings) -> list[dict]:
    """Every training job: per σ, mode (joint / frozen_W) and optimizer. Adam and fixed-η GD train the
    seeds as one ensemble; GD with η = 1/λ_max(0) trains each seed alone (its own η, from the joint
    (W₀, V₀) of that seed, used by both modes)."""
    geo = {"L": st.L, "n": st.n, "M": st.M, "task_seed": seed, "steps": st.steps,
           "probe_steps": _log_steps(st.steps)}
    jobs = []
    starts = [(sigma, sd) for sigma in st.sigmas for sd in st.seeds]   # every λ_max(0) at once, on the local pool
    lam = dict(zip(starts, lambda_max0_all([decision_list_config(**geo, seeds=[sd], lrs=[1.0], model={"init_std": sigma})
                                            for sigma, sd in starts])))
    for sigma in st.sigmas:
        lam0 = {sd: lam[sigma, sd] for sd in st.seeds}
        for mode in ("joint", "frozen_W"):
            model = {"init_std": sigma} | ({"W_init": "zero"} if mode == "frozen_W" else {})
            frozen = ["W"] if mode == "frozen_W" else []
            for opt in UA_OPTIMIZERS:
                base = {"sigma": sigma, "mode": mode, "optimizer": opt}
                if opt == "gd_1_over_lambda":
                    for sd in st.seeds:
                        jobs.append(base | {"name": f"s{sigma:g}_{mode}_{opt}_seed{sd}", "eta": 1.0 / lam0[sd],
                                            "config": decision_list_config(**geo, seeds=[sd], lrs=[1.0 / lam0[sd]], model=model,
                                                                frozen=frozen)})
                else:
                    kind, lr = ("adam", st.lr) if opt == "adam" else ("sgd", st.gd_eta)
                    jobs.append(base | {"name": f"s{sigma:g}_{mode}_{opt}", "config": decision_list_config(
                        **geo, seeds=st.seeds, lrs=[lr], optimizer=kind, model=model, frozen=frozen)})
    return jobs


ua_plan = PlannedJobs(ua_settings, _plan)


def _ua_rows(job: dict, d, log_steps: set[int]) -> list[dict]:
    """uniform_attention.csv's rows of one run of ``job`` at the log-spaced steps."""
    run = Run(d)
    cv, sd = curve(run), run.seed
    return [{"mode": job["mode"], "optimizer": job["optimizer"], "sigma": job["sigma"], "seed": sd,
             "step": int(cv["step"][i]), "loss": float(cv["loss"][i]), "cos_c": float(cv["cos_c"][i]),
             "perm_recovery": float(cv["perm_recovery"][i]), "acc_pop": float(cv["acc_pop"][i]),
             "err_sup": float(cv["err_sup"][i]), "norm_V": float(cv["norm_V"][i])}
            for i in np.nonzero(np.isin(cv["step"], list(log_steps)))[0]]


def measure(ctx: ReproduceContext, trained: dict) -> Tables:
    """The first gradient at every (sampler, n, M, L) of the grid (enumeration), the trained runs' metrics
    (each run read once) and the η = 1/λ_max(0) the plan fixed per σ and seed."""
    st = ua_plan.grid(ctx)
    grows = [first_gradient(L, n, M, s, ctx.seed) for s in dl.SAMPLERS for (n, M) in st.grad_nM
             for L in st.grad_L if not (s == "B" and n > L)]
    log_steps = set(_log_steps(st.steps))
    rows, etas = [], []
    for job in ua_plan(ctx):
        if "eta" in job and job["mode"] == "joint":
            etas.append({"sigma": job["sigma"], "seed": job["config"]["seeds"][0], "eta": job["eta"]})
        for d in trained[job["name"]]:
            rows += _ua_rows(job, d, log_steps)
    rows.sort(key=lambda r: (st.sigmas.index(r["sigma"]), r["mode"] != "joint", UA_OPTIMIZERS.index(r["optimizer"]),
                             r["step"], r["seed"]))
    return {"first_gradient": grows, "uniform_attention": rows, "uniform_attention_eta": etas}


def _first_step_all_cos(rows: list[dict], mode: str, opt: str) -> int | None:
    """The first logged step at which every seed and σ of (mode, optimizer) has cos_c ≥ 0.5."""
    for k in sorted({r["step"] for r in rows}):
        v = [r["cos_c"] for r in rows if r["mode"] == mode and r["optimizer"] == opt and r["step"] == k]
        if min(v) >= 0.5:
            return k
    return None


def _first_gradient_claims(grows: list[dict], st: Settings) -> list[dict]:
    """The first gradient −∇_V F(0, 0): recovers π at the largest L; its cosine with P rises with L."""
    big = [r for r in grows if r["L"] == max(st.grad_L)]
    by_L = {s: [r["cos_c_first_grad"] for r in grows if r["sampler"] == s and (r["n"], r["M"]) == st.grad_nM[0]]
            for s in dl.SAMPLERS}
    return [
        claim("first_gradient_recovers_P",
              f"At (W,V)=(0,0) the column argmax of −∇_V F recovers π at L = {max(st.grad_L)} "
              "for every (sampler, n, M) (exact enumeration)",
              all(r["perm_recovery_first_grad"] == 1.0 for r in big),
              source="paper", quote=QUOTEC,
              paper=PAPERC + " (the first step from W = V = 0, docs/reproductions/decision-lists.md#decision-listuniform-attention derivation)",
              definition="−∇_V F(0, 0) on the exact population loss; recovery = mean_t 1[argmax_r G[r,t] = π(t)]",
              measured="argmax recovery of π from −∇_V F(0,0) at the largest L",
              expected="= 1 for every (sampler, n, M)",
              cos_c=[(r["sampler"], r["n"], r["M"], r["cos_c_first_grad"]) for r in big]),
        claim("first_gradient_cosine_rises_with_L",
              "Hypothesis (docs/reproductions/decision-lists.md#decision-listuniform-attention): the centred cosine of −∇_V F(0,0) with P rises with L at fixed (n, M) "
              f"= {st.grad_nM[0]}", all(np.all(np.diff(v) > 0) for v in by_L.values()),
              source="derived",
              derived="tdyn's hypothesis: the abstract says uniform attention pushes V toward P, not how the "
                      "alignment depends on L; tdyn's derivation (the gauge term is constant within a column, "
                      "self-labels weigh 1/n of each column) suggests it sharpens as L grows",
              paper=PAPERC + " (its dependence on L: docs/reproductions/decision-lists.md#decision-listuniform-attention)",
              definition="cos_c = cosine of column-centred −∇_V F(0,0) and column-centred P",
              measured="centred cosine of −∇_V F(0,0) with P, vs L, per sampler",
              expected="strictly increasing in L for each sampler", cos_by_L=by_L,
              L=st.grad_L)]


def _training_claims(rows: list[dict], st: Settings) -> list[dict]:
    """Training from small init: with W frozen V recovers π, and joint training reaches Err_sup = 0 (one
    reading per optimizer)."""
    final = [r for r in rows if r["step"] == st.steps]
    frozen_rd = [reading(_ua_opt_label(o, st), all(r["perm_recovery"] == 1.0 for r in final
                                                   if r["mode"] == "frozen_W" and r["optimizer"] == o),
                         cos_c_final=[r["cos_c"] for r in final if r["mode"] == "frozen_W" and r["optimizer"] == o],
                         first_step_all_cos_ge_0_5=_first_step_all_cos(rows, "frozen_W", o)) for o in UA_OPTIMIZERS]
    joint_rd = [reading(_ua_opt_label(o, st), all(r["err_sup"] == 0 for r in final
                                                  if r["mode"] == "joint" and r["optimizer"] == o),
                        err_sup=[r["err_sup"] for r in final if r["mode"] == "joint" and r["optimizer"] == o],
                        first_step_all_cos_ge_0_5=_first_step_all_cos(rows, "joint", o)) for o in UA_OPTIMIZERS]
    setting = f"sampler B, L={st.L}, n={st.n}, M={st.M}, σ ∈ {st.sigmas}, seeds {st.seeds}, {st.steps} steps"
    return [
        claim("frozen_W_recovers_P",
              f"W frozen at 0 (uniform attention), V trained from the same V_0 as the joint runs ({setting}): "
              "argmax recovery of π = 1 for every seed and σ at the end, for each optimizer",
              source="paper", quote=QUOTEC,
              paper=PAPERC,
              definition="recovery = mean_t 1[argmax_r V[r,t] = π(t)] (docs/reproductions/decision-lists.md#decision-listuniform-attention); the optimizer is not given by the "
                         "paper: each is a reading",
              measured="argmax recovery of π from the final V (W frozen at 0)",
              expected="= 1 for every seed, σ and optimizer", readings=frozen_rd),
        claim("joint_training_perfect",
              f"Joint training of (W, V) from small init ({setting}): perfect classification (Err_sup = 0) at the "
              "end, for each optimizer",
              source="derived",
              derived="the abstract leaves full convergence from small random initialization to future work "
                      "('a tantalizing opportunity in future work to extend these results into a full convergence "
                      "result beginning from small, random initialization'); tdyn checks whether joint training "
                      "from small init reaches perfect classification in its setting",
              paper="abstract §II outlook: a full convergence result beginning from small, random initialization "
                    "(docs/reproductions/decision-lists.md#decision-listuniform-attention)",
              definition="Err_sup = fraction of misclassified (set, query) pairs, strict argmax (docs/reproductions/decision-lists.md#perfect-classification)",
              measured="Err_sup after the final step of joint training",
              expected="= 0 for every seed, σ and optimizer", readings=joint_rd)]


def judge(ctx: ReproduceContext, tables: Tables) -> dict:
    """Claim (c) from first_gradient.csv and uniform_attention.csv; the η = 1/λ_max(0) of each seed reported
    (uniform_attention_eta.csv)."""
    st = ua_plan.grid(ctx)
    c1, c2 = _first_gradient_claims(tables["first_gradient"], st)
    etas: dict[str, list[float]] = {}
    for r in tables["uniform_attention_eta"]:
        etas.setdefault(str(r["sigma"]), []).append(r["eta"])
    return {"experiment": "decision-list/uniform-attention",
            "claims": [c1, c2, *_training_claims(tables["uniform_attention"], st)], "settings": grid_dict(st),
            "eta_1_over_lambda": etas,
            "definitions": {"cos_c": "cosine between column-centred V and column-centred P",
                            "sampler_training": "B (n distinct tokens), uniform, equal lists",
                            "init": "per seed one draw W₀, V₀ ~ σ·N(0,1); frozen_W uses the same V₀ with W = 0",
                            "optimizers": {o: _ua_opt_label(o, st) for o in UA_OPTIMIZERS},
                            "lambda_max": "largest Hessian eigenvalue over (W, V) at the seed's (W₀, V₀), as the λ_max "
                                          "probe measures it (dense Hessian, tight block bracket, or Lanczos to 1e-12)"}}


def draw(ctx: ReproduceContext, tables: Tables, results: dict) -> list[str]:
    """uniform_attention.png (cos_c, recovery and Err_sup over training) and first_gradient.png."""
    st = ua_plan.grid(ctx)
    _draw_training(ctx.out, tables["uniform_attention"], st)
    _draw_first_gradient(ctx.out, tables["first_gradient"], st)
    return ["uniform_attention.png", "first_gradient.png"]


def _draw_training(out, rows: list[dict], st: Settings) -> None:
    import matplotlib.pyplot as plt

    style.apply()
    fig, axes = plt.subplots(2, 3, figsize=(14.5, 7.5), layout="constrained")
    sigma = st.sigmas[len(st.sigmas) // 2]
    for col_i, opt in enumerate(UA_OPTIMIZERS):
        for j, mode in enumerate(("joint", "frozen_W")):
            for i, sg in enumerate(st.sigmas):
                sel = [r for r in rows if r["mode"] == mode and r["sigma"] == sg and r["optimizer"] == opt]
                steps = sorted({r["step"] for r in sel})
                v = np.array([[r["cos_c"] for r in sel if r["step"] == k] for k in steps])
                sty = style.series(2 * i + j)
                col = sty["color"]
                ax = axes[0, col_i]
                ax.plot(np.array(steps) + 1, v.mean(1), **sty, ls="-" if mode == "joint" else "--",
                        label=f"{mode}, σ={sg}")
                ax.fill_between(np.array(steps) + 1, v.min(1), v.max(1), color=col, alpha=0.2)
            sel = [r for r in rows if r["mode"] == mode and r["sigma"] == sigma and r["optimizer"] == opt]
            steps = sorted({r["step"] for r in sel})
            rec = np.array([[r["perm_recovery"] for r in sel if r["step"] == k] for k in steps])
            axes[1, col_i].plot(np.array(steps) + 1, rec.mean(1), ls="-" if mode == "joint" else "--",
                                label=f"{mode}: argmax recovery")
            if mode == "joint":
                err = np.array([[r["err_sup"] for r in sel if r["step"] == k] for k in steps])
                axes[1, col_i].plot(np.array(steps) + 1, err.mean(1), ls=":", label="joint: Err_sup")
        axes[0, col_i].set(xscale="log", xlabel="step + 1", ylabel="centred cos(V, P)",
                           title=f"C1: V → P, {_ua_opt_label(opt, st)} (band: seeds)")
        axes[1, col_i].set(xscale="log", xlabel="step + 1", ylim=(-0.05, 1.05),
                           title=f"{_ua_opt_label(opt, st)}, σ={sigma} (seed mean)")
    for row in axes:      # the curves are the same in every column: one legend per row, beside it
        row[-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=10, frameon=False)
    style.save(fig, out / "uniform_attention.png")


def _draw_first_gradient(out, grows: list[dict], st: Settings) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, s in enumerate(dl.SAMPLERS):
        for j, (n, M) in enumerate(st.grad_nM):
            pts = [(r["L"], r["cos_c_first_grad"]) for r in grows if r["sampler"] == s and (r["n"], r["M"]) == (n, M)]
            x, y = zip(*pts)
            ax.plot(x, y, ls="-" if s == "B" else "--", **style.series(j, marker="o" if s == "B" else "s"),
                    label=f"{s}, n={n}, M={M}")
    ax.set(xlabel="L", ylabel="centred cos(−∇_V F(0,0), P)", title="C3: first gradient")
    ax.legend(fontsize=9)
    style.save(fig, out / "first_gradient.png")


PHASES = Phases(plan=ua_plan.configs, measure=measure, judge=judge, draw=draw,
                tables=("first_gradient", "uniform_attention", "uniform_attention_eta"),
                columns={"first_gradient": GRAD_COLUMNS, "uniform_attention": UA_COLUMNS,
                         "uniform_attention_eta": ETA_COLUMNS})
register_phases("decision-list/uniform-attention", PHASES, options=UAOptions)
