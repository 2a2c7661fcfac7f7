"""topic/two-stage (E4; docs/reproductions/topic.md#two-stage-mechanism,
docs/reproductions/topic.md#two-stage-measurement, docs/reproductions/topic.md#topictwo-stage): from small init,
W_V moves first and W_K, W_Q catch up much later, over the grid optimizer (Adam, SGD) × init scale × learning rate,
the clean model and the authors' parameterisation; and the ``topic`` bench (training steps per second of the
topic/stage1 and topic/two-stage settings). Stage times: :mod:`tdyn.papers.topic.analysis`."""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tdyn import stats
from tdyn.bench import on_device, register_bench, seconds
from tdyn.papers.topic import stages as ts
from tdyn.papers.topic.analysis import (E2, E4, LITERAL_DEF, MATRIX_COLS, PER_READING, TWO_STAGE_DEF, as_run,
                                        dense_probe_steps, final, matrices_of, matrix_rows, member_model,
                                        metrics_table, run_reference, stage_times, two_stage_claims,
                                        value_contrast_series, with_stage_probe)
from tdyn.papers.topic.data import NUM_SPECIAL, LdaDataConfig
from tdyn.papers.topic.stages import model_scores
from tdyn.papers.topic.task import dataset, lda_config
from tdyn.report import style
from tdyn.reproduce.phases import Phases, register_phases
from tdyn.reproduce.registry import ReproduceContext
from tdyn.runs import Run
from tdyn.train.trainer import train


@dataclasses.dataclass(frozen=True)
class Cells:
    """One job's ensemble: an optimizer over learning rates × init scales (ε = init_eps × scale)."""

    optimizer: str
    lrs: tuple[float, ...]
    init_scales: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Grid:
    """Steps, probe schedule, seeds and checkpoints of the E4 jobs (docs/reproductions/topic.md#two-stage-measurement):
    probes log-spaced up to ``dense_upto`` (None: the whole run) and every ``every`` steps after."""

    steps: int
    every: int
    seeds: int
    dense_upto: int | None
    checkpoints: int = 12


FULL = Grid(steps=10_000, every=50, seeds=3, dense_upto=1000)
QUICK = Grid(steps=200, every=20, seeds=1, dense_upto=None)
E4_GRID = {"adam": Cells("adam", lrs=(0.001, 0.01), init_scales=(1.0, 10.0)),
           "sgd": Cells("sgd", lrs=(1.0, 10.0), init_scales=(1.0, 10.0))}
#: the authors' parameterisation (docs/reproductions/topic.md#model-as-in-the-authors-code): their model always has
#: the embedding LayerNorm with a token-type vector; the small-init option U[0, ε), biases 0; their one shipped
#: config's optimizer (Adam, lr 0.01, batch 40), with lr 0.001 beside it as in the clean grid; ε = 1e-3 only (the
#: robustness variant's; under Adam the init scale does not delay W_K, W_Q, see ADAM_NOTE)
AUTHORS = E4 | {"emb_layernorm": True}
AUTHORS_GRID = Cells("adam", lrs=(0.001, 0.01), init_scales=(1.0,))
PARAMS = {"clean": "clean (paper's model)", "authors": "authors' parameterisation (embedding LayerNorm + token type)"}


def two_stage_configs(seed: int = 0, quick: bool = False, model: dict | None = None) -> dict[str, dict]:
    """E4 jobs: the clean grid (jobs ``adam``, ``sgd``) and the authors' parameterisation under Adam (job
    ``authors``), each one ensemble over its learning rates and init scales (``FULL`` or ``QUICK``)."""
    g = QUICK if quick else FULL
    out = {}
    for job, (m, cells) in {"adam": (E4 | (model or {}), E4_GRID["adam"]), "sgd": (E4 | (model or {}), E4_GRID["sgd"]),
                            "authors": (AUTHORS | (model or {}), AUTHORS_GRID)}.items():
        c = with_stage_probe(lda_config(m, steps=g.steps, every=g.every, seeds=list(range(seed, seed + g.seeds)),
                                        optimizer=cells.optimizer, lr=cells.lrs[-1], quick=quick))
        c["probes"]["steps"] = dense_probe_steps(g.steps, upto=g.dense_upto or g.steps)
        c["ensemble"] = {"lrs": [{"all": lr} for lr in cells.lrs], "init_scales": list(cells.init_scales)}
        c["checkpoint"] = {"schedule": "log", "num": g.checkpoints}
        out[job] = c
    return out


def plan(ctx: ReproduceContext) -> dict[str, dict]:
    """The three E4 jobs, trained all at once (``Phases.all_at_once``): on 2 cores two 12-member jobs and the
    6-member one time-share the cores instead of the 6-member one waiting for a 12-member one (issue 35:
    critical path sgd + authors 518 + 246 s of 1316 s in all). Not split into smaller ensembles: a member's bits
    depend on its job's other seeds (the loss kernel pads every document's selected positions to the job's
    largest count, ``kernels.selected_query_loss``: seeds 0, 1, 2 draw 34, 29, 28 at step 0) and its probes on
    its slot's parity in the ensemble (the product ``W.sum(-1) @ Z`` of ``probes.block_contrast`` rounds even and
    odd rows differently), so a split by seed changes the training and one by learning rate or init scale moves
    members to slots of the other parity
    (benchmarks/README.md#issue-35-session-2026-11-27-sixteenth-helper-tsplit-topictwo-stage-on-both-cores)."""
    return {f"e4-{job}": c for job, c in two_stage_configs(ctx.seed, ctx.quick).items()}


def _variant(job: str, run: Run) -> dict[str, Any]:
    meta, cfg = run.meta, run.config
    return {"param": "authors" if job == "authors" else "clean", "optimizer": cfg["optim"]["groups"]["all"]["optimizer"],
            "lr": meta["lrs"]["all"], "eps": cfg["model"]["init_eps"] * meta["init_scale"], "seed": meta["seed"]}


def _label(r: dict) -> str:
    """A run's label in the figure: optimizer (after "authors" for that parameterisation), lr and ε."""
    prefix = r["optimizer"] if r["param"] == "clean" else f"authors {r['optimizer']}"
    return f"{prefix} lr={r['lr']:g} ε={r['eps']:g}"


RATIO_COLS = [f"ratio_{w}{at}" for at in ("s1_end", "t_v", "step100", "step500") for w in ("", "K_", "Q_")]
RUN_COLS = ["run", "param", "optimizer", "lr", "eps", "seed", "t_v_structure", "t_v_plateau", "t_v_loss", "t_plateau",
            "v_plateau", "applicable_structure", "t_kq_kappa", "t_kq_gap", "t_kq_kappa_first", "t_kq_gap_first",
            "t_s1_end", *PER_READING, *RATIO_COLS, "value_contrast_s1_end", "value_contrast_final",
            "value_min_topic_s1_end", "value_min_topic_final", "kappa_at_t_v_loss", "gap_at_t_v_loss", "final_kappa",
            "final_kappa_se", "final_gap", "final_gap_se", "t_value_half_norm", "t_kq_5pct_norm", "final_loss"]
GRID_COLS = ["param", "optimizer", "lr", "eps", "seeds", "literal", "order", "t_v_structure", "t_v_plateau", "t_v_loss",
             "t_kq_kappa", "t_kq_gap", "t_kq_kappa_first", "t_kq_gap_first", "t_s1_end", "ratio_s1_end", "ratio_t_v",
             "ratio_step100", "ratio_step500", "value_contrast_s1_end", "value_contrast_final", "final_kappa",
             "final_gap", "t_value_half_norm", "t_kq_5pct_norm"]


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["param"], r["optimizer"], r["lr"], r["eps"]), []).append(r)
    return dict(sorted(groups.items()))


def _cell_id(param: str, opt: str, lr: float, eps: float) -> str:
    return f"e4-{'' if param == 'clean' else 'authors-'}{opt}-lr{lr:g}-eps{eps:g}"


def _cell_label(param: str, opt: str, lr: float, eps: float) -> str:
    return f"{'authors param., ' if param == 'authors' else ''}{opt} lr {lr:g}, ε = {eps:g}"


def _summaries(rows: list[dict], claims: dict[str, list[dict]]) -> list[dict]:
    """One row per grid cell (parameterisation, optimizer, lr, ε): medians over seeds and the two verdicts
    (``claims``: :func:`_cell_claims`; measured into ``two_stage_grid.csv`` as a summary, judged again from the
    per-member times)."""
    out = []
    for (param, opt, lr, eps), rs in _groups(rows).items():
        lit, order = claims[_cell_id(param, opt, lr, eps)]
        c = {"param": param, "optimizer": opt, "lr": lr, "eps": eps, "seeds": [r["seed"] for r in rs],
             "literal": lit["verdict"], "order": order["verdict"]}
        for k in GRID_COLS[7:]:
            c[k] = stats.median([r.get(k) for r in rs])
        out.append(c)
    return out


def init_scale_effect(cells: list[dict]) -> list[dict]:
    """Per parameterisation, optimizer and lr: stage-2 onset (κ) and W_V half-way (loss) at ε = 1e-3 over
    ε = 1e-2. Under SGD the K/Q gradient is O(ε·‖W_V‖), so a smaller ε delays K/Q; Adam normalises each
    coordinate's step (≈ lr whatever the gradient's size), so it does not
    (docs/reproductions/topic.md#two-stage-mechanism note)."""
    out = []
    for c in cells:
        big = next((x for x in cells if x["param"] == c["param"] and x["optimizer"] == c["optimizer"]
                    and x["lr"] == c["lr"] and x["eps"] > c["eps"] * 1.5), None)
        if big is None:
            continue
        ratio = lambda k: (c[k] / big[k]) if c[k] and big[k] else None  # noqa: E731
        out.append({"param": c["param"], "optimizer": c["optimizer"], "lr": c["lr"], "eps_small": c["eps"],
                    "eps_large": big["eps"], "t_kq_kappa_small": c["t_kq_kappa"], "t_kq_kappa_large": big["t_kq_kappa"],
                    "t_kq_ratio_small_over_large": ratio("t_kq_kappa"),
                    "t_v_loss_small": c["t_v_loss"], "t_v_loss_large": big["t_v_loss"],
                    "final_kappa_small": c["final_kappa"], "final_kappa_large": big["final_kappa"]})
    return out


ADAM_NOTE = ("Under Adam the init scale does not slow W_K, W_Q: Adam normalises each coordinate's step (≈ lr whatever "
             "the gradient's size), so the O(ε·‖W_V‖) smallness of the key/query gradient at a small init, which "
             "delays K/Q under SGD, is divided out. The two-stage separation under Adam therefore rests only on "
             "the key/query gradient having no consistent topic-block direction until W_V is structured. "
             "See init_scale_effect (t_KQ at ε = 1e-3 over ε = 1e-2, per optimizer and lr).")
AUTHORS_VALUE_NOTE = ("Authors' parameterisation: the value structure is that of the effective value map "
                      "W_V Ẽᵀ (Ẽ = LN(I + T₀)·γ + β, the LN'd embedding table), not of W_V, whose rows see "
                      "every word through a large shared token-type component; its contrast is reported at the "
                      "end of stage 1 and at the end (value_contrast_s1_end, value_contrast_final).")


# ---------------------------------------------------------------- measure


SERIES = {"dV": "topic.norms/dV", "dK": "topic.norms/dK", "dQ": "topic.norms/dQ", "dev_loss": "topic.dev_loss/dev_loss",
          "kappa": "topic.stages/kappa", "gap_doc": "topic.stages/gap_doc"}
SERIES_COLS = ["label", "step", "value_contrast", *SERIES]
PANEL_COLS = ["panel", "title", "step", "run"]


def measure(ctx: ReproduceContext, trained: dict) -> dict[str, list[dict]]:
    """Stage times per member (every key of ``stage_times``, and the ``two_stage.csv`` subset); the per-cell
    summary with its verdicts; the metric series of seed ``ctx.seed`` (the figure); the stage-1 reference; the
    matrices of the default cell (Adam lr 0.01, ε = 1e-3) at t_V, t_KQ and the end."""
    rows, series, ref, default = [], [], None, None
    for name, dirs in trained.items():
        for d in dirs:
            run = as_run(d)
            info = _variant(name.removeprefix("e4-"), run)
            m = metrics_table(run)
            ref = run_reference(run)
            t = stage_times(m, ref)
            rows.append(info | {"run": f"{name}/{d.name}"} | t | {"final_loss": final(m, "loss")})
            if info["seed"] == ctx.seed:
                series += _series_rows(_label(info), m)
                if default is None and _label(info).startswith("adam lr=0.01 ε=0.001"):
                    default = (run, t, f"{name}/{d.name}")
    keys = list(dict.fromkeys(k for r in rows for k in r))
    rows = [dict.fromkeys(keys) | r for r in rows]
    panels, mats = _stage_matrices(*default)
    return {"two_stage": rows, "two_stage_times": rows, "two_stage_grid": _summaries(rows, _cell_claims(rows)),
            "two_stage_series": series, "two_stage_reference": [ref], "two_stage_panels": panels,
            "two_stage_matrices": matrix_rows(mats)}


def _series_rows(label: str, m: dict[str, np.ndarray]) -> list[dict]:
    cv, _ = value_contrast_series(m)
    cols = {k: m[key].tolist() if key in m else [None] * len(cv) for k, key in SERIES.items()}
    return [{"label": label, "step": s, "value_contrast": c} | {k: cols[k][i] for k in SERIES}
            for i, (s, c) in enumerate(zip(m["step"].tolist(), cv.tolist()))]


def _stage_matrices(run: Run, t: dict, name: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """W_V − W_V(0) and the key-centred word scores of one run at the checkpoints nearest to t_V, t_KQ (κ) and
    the end (docs/reproductions/topic.md#two-stage-measurement plots): the panels and the matrices."""
    avail = run.steps()
    picks = [(f"≈{what} (step {min(avail, key=lambda s: abs(s - t[key]))})", min(avail, key=lambda s: abs(s - t[key])))
             for what, key in (("t_V", "t_v_loss"), ("t_KQ", "t_kq_kappa")) if t[key] is not None]
    cols = sorted(picks, key=lambda x: x[1]) + [("end", "final")]
    W0 = run.params(0)["W_V"]
    panels, mats = [], {}
    for j, (title, step) in enumerate(cols):
        model, _ = member_model(run, step)
        with torch.no_grad():
            mats[f"dWV {j}"] = model.W_V[0] - W0
            mats[f"scores {j}"] = ts.key_centred_words(model_scores(model), NUM_SPECIAL)[0]
        panels.append({"panel": j, "title": title, "step": step, "run": name})
    return panels, mats


# ---------------------------------------------------------------- judge


def _cell_claims(rows: list[dict]) -> dict[str, list[dict]]:
    """The two claims (literal, order) of every grid cell, by cell id."""
    return {_cell_id(*cell): two_stage_claims(rs, id=_cell_id(*cell), label=_cell_label(*cell),
                                              where="docs/reproductions/topic.md#topictwo-stage",
                                              value_note=AUTHORS_VALUE_NOTE if cell[0] == "authors" else "")
            for cell, rs in _groups(rows).items()}


def judge(ctx: ReproduceContext, tables: dict) -> dict[str, Any]:
    """Every cell's two claims from the per-member stage times, the per-cell summary and the init-scale effect."""
    rows = tables["two_stage_times"]
    by_cell = _cell_claims(rows)
    cells = _summaries(rows, by_cell)
    return {"experiment": "topic/two-stage", "stage1_reference": tables["two_stage_reference"][0], "grid": cells,
            "init_scale_effect": init_scale_effect(cells), "adam_init_scale_note": ADAM_NOTE,
            "definition": TWO_STAGE_DEF, "literal_definition": LITERAL_DEF, "runs": rows,
            "claims": [c for pair in by_cell.values() for c in pair]}


# ---------------------------------------------------------------- draw


def draw(ctx: ReproduceContext, tables: dict, results: dict) -> list[str]:
    times = {_label(r): r for r in tables["two_stage_times"] if r["seed"] == ctx.seed}
    series: dict[str, dict[str, np.ndarray]] = {}
    for r in tables["two_stage_series"]:
        series.setdefault(r["label"], []).append(r)
    series = {k: {c: np.array([np.nan if r[c] is None else r[c] for r in rs], dtype=float) for c in SERIES_COLS[1:]
                  if any(r[c] is not None for r in rs)} for k, rs in series.items()}
    _two_stage_figure(ctx.out / "two_stage.png", series, times, tables["two_stage_reference"][0], ctx.seed)
    panels = tables["two_stage_panels"]
    shown = next((r for r in tables["two_stage_times"] if r["run"] == panels[0]["run"]), None)
    _stage_heatmaps(ctx.out / "two_stage_matrices.png", panels, matrices_of(tables["two_stage_matrices"]), shown)
    return ["two_stage.png", "two_stage_matrices.png"]


def _two_stage_figure(path: Path, series: dict[str, dict[str, np.ndarray]], times: dict[str, dict],
                      ref: dict[str, float], seed: int) -> None:
    """One row per (parameterisation, optimizer, lr), ε = 1e-3 solid and 1e-2 dashed, seed ``seed``; columns:
    the weight changes ‖ΔW_V‖, ‖ΔW_K‖, ‖ΔW_Q‖ (the literal statement); stage 1's progress (value contrast over
    its stage-1 plateau, probe loss's way to the fitted optimum); stage 2 (κ and the attention gap with their
    onset thresholds). Stage 1 is shaded up to its end (the last logged step before the persistent onset)."""
    import matplotlib.pyplot as plt

    style.apply()
    rows: dict[str, list[str]] = {}
    for label in series:
        rows.setdefault(label.split(" ε=")[0], []).append(label)
    rows = dict(sorted(rows.items(), key=lambda kv: (kv[0].startswith("authors"), kv[0].split(" lr=")[0],
                                                      float(kv[0].split(" lr=")[1]))))
    n = len(rows)
    fig, axes = plt.subplots(n, 3, figsize=(11, 2.9 * n), squeeze=False, layout="constrained")
    for i, (row, labels) in enumerate(rows.items()):
        for label in sorted(labels, key=lambda lb: float(lb.split("ε=")[1])):
            m, t = series[label], times[label]
            ls = "-" if float(label.split("ε=")[1]) < 5e-3 else "--"
            s = np.maximum(m["step"], 1)
            _weights_panel(axes[i][0], s, m, ls)
            _stage1_panel(axes[i][1], s, m, t, ref, ls)
            _stage2_panel(axes[i][2], s, m, ls)
            for ax in axes[i]:
                if t["t_s1_end"]:
                    ax.axvspan(1, max(t["t_s1_end"], 1), color="0.85" if ls == "-" else "0.93", zorder=0, lw=0)
                    ax.axvline(max(t["t_s1_end"], 1), color="k", ls=ls, lw=1.0)
                ax.set_xscale("log")
        axes[i][0].set_title(f"{row}\nweight changes", fontsize=14)
        axes[i][1].set_title(f"{row}\nway to the fitted optimum", fontsize=14)
        axes[i][2].set_title(f"{row}\nstage 2 (dotted: onset levels)", fontsize=14)
        if i == 0:
            for ax, loc in zip(axes[i], ("best", "upper left", "upper left")):   # the weights' curves fill the top left
                ax.legend(fontsize=11, loc=loc)
        if i == n - 1:
            for ax in axes[i]:
                ax.set_xlabel("step", fontsize=12)
    fig.suptitle(f"E4 two stages, seed {seed}; ε = 1e-3 solid, 1e-2 dashed\nstage 1 (grey) ends at the last logged "
                 "step before the persistent onset (κ ≥ ln 1.05 or gap ≥ 0.05 through [t, 2t])", fontsize=14)
    style.save(fig, path)


def _weights_panel(ax, s: np.ndarray, m: dict[str, np.ndarray], ls: str) -> None:
    for key, col, nm in (("dV", "C0", "‖ΔW_V‖"), ("dK", "C1", "‖ΔW_K‖"), ("dQ", "C2", "‖ΔW_Q‖")):
        if key in m:
            ax.plot(s, m[key], color=col, ls=ls, label=nm if ls == "-" else None)
    ax.set_yscale("log")


def _stage1_panel(ax, s: np.ndarray, m: dict[str, np.ndarray], t: dict, ref: dict, ls: str) -> None:
    cv = m["value_contrast"]
    ax.plot(s, (cv - cv[0]) / (ref["contrast"] - cv[0]), color="C0", ls=ls, label="value contrast" if ls == "-" else None)
    if t["v_plateau"] is not None:
        ax.plot(max(t["t_plateau"], 1), (t["v_plateau"] - cv[0]) / (ref["contrast"] - cv[0]), "o", color="C0",
                mfc="none" if ls == "--" else "C0", label="its stage-1 plateau" if ls == "-" else None)
    L = m["dev_loss"]
    ax.plot(s, (L[0] - L) / (L[0] - ref["probe_loss"]), color="C3", ls=ls, label="probe loss" if ls == "-" else None)
    ax.axhline(0.5, color="0.5", lw=0.8, ls=":")


def _stage2_panel(ax, s: np.ndarray, m: dict[str, np.ndarray], ls: str) -> None:
    ax.plot(s, m["kappa"], color="C1", ls=ls, label="κ" if ls == "-" else None)
    ax.plot(s, m["gap_doc"], color="C2", ls=ls, label="attention gap" if ls == "-" else None)
    ax.axhline(ts.KAPPA_ONSET, color="C1", lw=0.8, ls=":")
    ax.axhline(ts.GAP_ONSET, color="C2", lw=0.8, ls=":")


def _stage_heatmaps(path: Path, panels: list[dict], mats: dict[str, np.ndarray], times: dict | None = None) -> None:
    """W_V − W_V(0) (top) and the key-centred word scores (bottom) at each panel's checkpoint; ``times``: the run's
    row of two_stage_times, whose t_V and t_KQ the titles give beside the checkpoint nearest to each."""
    import matplotlib.pyplot as plt

    def title(p: dict) -> str:
        for what, key in (("t_V", "t_v_loss"), ("t_KQ", "t_kq_kappa")):
            if p["title"].startswith(f"≈{what}"):
                t = times.get(key) if times else None
                return f"checkpoint {p['step']}" + (f" (nearest to {what} = {t:g})" if t is not None else f" (≈{what})")
        return "end of training"

    style.apply()
    fig, axes = plt.subplots(2, len(panels), figsize=(4.6 * len(panels), 8.6), squeeze=False, layout="constrained")
    for p in panels:
        j = p["panel"]
        for i, (key, name, xl, yl) in enumerate((("dWV", "W_V − W_V(0)", "token id", "token id"),
                                                 ("scores", "key-centred scores", "key word", "query word"))):
            ax = axes[i][j]
            M = mats[f"{key} {j}"]
            lim = np.abs(M).max() or 1.0
            im = ax.imshow(M, cmap="RdBu_r", vmin=-lim, vmax=lim)
            ax.set_title(f"{name}\n{title(p)}", fontsize=11)
            ax.set_xlabel(xl)
            ax.set_ylabel(yl)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    run = (f"{times['param']} model, {times['optimizer']} lr {times['lr']:g}, ε = {times['eps']:g}, seed {times['seed']}"
           if times else panels[0]["run"])
    fig.suptitle(f"E4 ({run}): each panel on its own colour scale")
    style.save(fig, path)


register_phases("topic/two-stage", Phases(
    plan=plan, measure=measure, judge=judge, draw=draw,
    tables=("two_stage", "two_stage_grid", "two_stage_times", "two_stage_series", "two_stage_reference",
            "two_stage_panels", "two_stage_matrices"),
    columns={"two_stage": RUN_COLS, "two_stage_grid": GRID_COLS, "two_stage_series": SERIES_COLS,
             "two_stage_panels": PANEL_COLS, "two_stage_matrices": MATRIX_COLS}, all_at_once=True))


# ---------------------------------------------------------------- speed


@register_bench("topic")
def _bench(quick: bool) -> dict[str, float]:
    """``tdyn bench``: steps/s of the topic/stage1 and topic/two-stage settings."""
    return {f"{k}_steps_per_s": v for k, v in bench(20 if quick else 100).items()}


@register_bench("topic_two_stage_probes")
def _bench_probes(quick: bool) -> dict[str, float]:
    """``tdyn bench``: the full topic/two-stage ``adam`` job (12 members, its probes) for a few steps, probes
    evaluated every 5 steps, no checkpoints: milliseconds per training step and per probe evaluation, from its
    meta.json ``seconds`` (the split every run records), so probe cost is reported apart from training."""
    steps = 10 if quick else 40
    cfg = two_stage_configs()["adam"]
    cfg["optim"]["steps"] = steps
    cfg["probes"]["steps"], cfg["probes"]["every"] = [], 5
    cfg["checkpoint"] = {"schedule": "none"}
    cfg = on_device(cfg)
    dataset(LdaDataConfig.model_validate(cfg["data"]))
    with tempfile.TemporaryDirectory() as tmp:
        (d, *_) = train(cfg, Path(tmp) / "b", progress=False)
        sec = Run(d).meta["seconds"]
    evals = steps // 5 + 1
    return {"members": len(cfg["ensemble"]["lrs"]) * len(cfg["ensemble"]["init_scales"]) * len(cfg["seeds"]),
            "train_ms_per_step": 1e3 * sec["training"] / steps, "probe_ms_per_evaluation": 1e3 * sec["probes"] / evals}


def bench(steps: int = 50, reps: int = 3) -> dict[str, float]:
    """Training steps per second (one member, probes off) for the topic/stage1 and topic/two-stage settings,
    from the median of ``reps`` timed runs (benchmarks/README.md#topic-reproductions-as-phases-issue-34); the
    dataset is built before timing."""
    out = {}
    for name, model in (("topic/stage1", E2), ("topic/two-stage", E4)):
        cfg = on_device(lda_config(model, steps=steps, seeds=[0]))
        cfg["probes"] = {"names": [], "every": steps}
        cfg["checkpoint"] = {"schedule": "none"}
        dataset(LdaDataConfig.model_validate(cfg["data"]))
        with tempfile.TemporaryDirectory() as tmp:
            train(cfg, Path(tmp) / "b", progress=False)                       # warm-up (build, allocator)
            out[name] = steps / statistics.median(seconds(lambda: train(cfg, Path(tmp) / f"c{i}", progress=False))
                                                  for i in range(reps))
    return out
