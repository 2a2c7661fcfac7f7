"""topic/two-stage (E4, docs/reproductions/topic.md#variants-e1-to-e6,
docs/reproductions/topic.md#two-stage-mechanism, docs/reproductions/topic.md#two-stage-measurement,
docs/reproductions/topic.md#topictwo-stage): from small init, W_V moves first and W_K, W_Q catch up much later,
over the grid optimizer (Adam, SGD) × init scale × learning rate; and the ``topic`` bench (training steps per
second of the topic/stage1 and topic/two-stage settings). Stage times are defined in
``tdyn.experiments.topic_common``."""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from tdyn import runs
from tdyn.bench import on_device, register_bench, seconds
from tdyn.data.lda import NUM_SPECIAL, LdaDataConfig
from tdyn.experiments.common import claim
from tdyn.experiments.registry import ReproduceContext, register
from tdyn.experiments.topic_common import (E2, E4, PER_READING, READINGS, TWO_STAGE_DEF, all_seeds, final,
                                           member_model, metrics_table, run_reference, stage_readings,
                                           stage_times, train_runs, with_stage_probe)
from tdyn.probes import topic_stages as ts
from tdyn.probes.topic_stages import model_scores
from tdyn.report import style
from tdyn.runs import write_csv
from tdyn.tasks.lda_mlm import dataset, lda_config
from tdyn.train.trainer import train


E4_GRID = {"adam": {"lrs": [0.001, 0.01], "init_scales": [1.0, 10.0]},
           "sgd": {"lrs": [1.0, 10.0], "init_scales": [1.0, 10.0]}}


def two_stage_configs(seed: int = 0, quick: bool = False, model: dict | None = None) -> dict[str, dict]:
    """E4 jobs (docs/reproductions/topic.md#two-stage-measurement, issue 12 item 6): the grid optimizer × init
    scale × learning rate. Each optimizer is one ensemble over its learning rates and init scales ε ∈ {1e-3, 1e-2}
    (ε·U[0,1)): 10k steps and 3 seeds (the plan asked 20k–50k steps and ≥ 3 seeds,
    docs/reproductions/topic.md#departures; the full grid took 100 min on this 2-core machine, its results are in
    docs/results/topic__two-stage); quick: 200 steps, one seed."""
    steps, every = (200, 20) if quick else (10_000, 50)
    seeds = [seed] if quick else [seed, seed + 1, seed + 2]
    m = E4 | (model or {})
    out = {}
    for opt, g in E4_GRID.items():
        c = with_stage_probe(lda_config(m, steps=steps, every=every, seeds=seeds, optimizer=opt, lr=g["lrs"][-1],
                                        quick=quick))
        c["ensemble"] = {"lrs": [{"all": lr} for lr in g["lrs"]], "init_scales": g["init_scales"]}
        c["checkpoint"] = {"schedule": "log", "num": 12}
        out[opt] = c
    return out


def _variant_label(job: str, d: Path) -> tuple[str, dict]:
    meta = runs.read_meta(d)
    eps = runs.read_config(d)["model"]["init_eps"] * meta["init_scale"]
    lr = meta["lrs"]["all"]
    return f"{job} lr={lr:g} ε={eps:g}", {"optimizer": job, "lr": lr, "eps": eps, "seed": meta["seed"]}


def run_two_stage(ctx: ReproduceContext, name: str, configs: dict[str, dict]) -> dict:
    """Train the E4 jobs, compute stage times per member; the table of the members of seed ``ctx.seed``."""
    table, times, rows, dirs_of = {}, {}, [], {}
    v = None
    for job, base in configs.items():
        cfg, dirs = train_runs(ctx, f"{name}-{job}", base)
        v = cfg.typed_data().words_per_topic
        for d in dirs:
            label, info = _variant_label(job, d)
            m = metrics_table(d)
            t = stage_times(m, run_reference(d))
            rows.append(info | {"run": f"{name}-{job}/{d.name}"} | t
                        | {"final_loss": final(m, "loss"), "wv_contrast": final(m, "topic.blocks/V_contrast")})
            if info["seed"] == ctx.seed:
                table[label], times[label], dirs_of[label] = m, t, d
    return {"rows": rows, "table": table, "times": times, "v": v, "dirs": dirs_of, "ref": run_reference(d)}


RUN_COLS = ["run", "optimizer", "lr", "eps", "seed", "t_v_structure", "t_v_loss", "t_v_plateau", "t_kq_kappa",
            "t_kq_gap", *PER_READING, "kappa_at_t_v_loss", "gap_at_t_v_loss", "final_kappa", "final_kappa_se",
            "final_gap", "final_gap_se", "t_value_half_norm", "t_kq_5pct_norm", "final_loss", "wv_contrast"]
GRID_COLS = ["optimizer", "lr", "eps", "seeds", "t_v_structure", "t_v_loss", "t_kq_kappa", "t_kq_gap",
             *[f"{k}_{tv}_{kq}" for tv, kq in READINGS for k in ("delay", "ordering", "verdict")],
             "kappa_at_t_v_loss", "gap_at_t_v_loss", "final_kappa", "final_gap", "t_v_plateau",
             "t_value_half_norm", "t_kq_5pct_norm"]


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.median(xs)) if xs else None


def _cell_verdict(rs: list[dict], name: str) -> tuple[bool | None, str | None]:
    held, why = all_seeds([r[f"two_stage_{name}"] for r in rs])
    if held is None:
        why = "; ".join(sorted({r[f"reason_{name}"] for r in rs if r[f"reason_{name}"]})) or why
    return held, why


def _summaries(rows: list[dict]) -> list[dict]:
    """One row per grid cell (optimizer, lr, ε): medians over seeds, the ordering counts and verdicts
    per reading."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["optimizer"], r["lr"], r["eps"]), []).append(r)
    out = []
    for (opt, lr, eps), rs in sorted(groups.items()):
        c = {"optimizer": opt, "lr": lr, "eps": eps, "seeds": [r["seed"] for r in rs]}
        for k in ("t_v_structure", "t_v_loss", "t_v_plateau", "t_kq_kappa", "t_kq_gap", "kappa_at_t_v_loss",
                  "gap_at_t_v_loss", "final_kappa", "final_gap", "t_value_half_norm", "t_kq_5pct_norm",
                  *[f"delay_{tv}_{kq}" for tv, kq in READINGS]):
            c[k] = _median([r.get(k) for r in rs])
        for tv, kq in READINGS:
            name = f"{tv}_{kq}"
            held, why = _cell_verdict(rs, name)
            c[f"ordering_{name}"] = (f"{sum(r[f'two_stage_{name}'] is True for r in rs)} two-stage, "
                                     f"{sum(r[f'two_stage_{name}'] is False for r in rs)} not, "
                                     f"{sum(r[f'two_stage_{name}'] is None for r in rs)} undefined")
            c[f"verdict_{name}"] = {True: "holds", False: "fails", None: "inconclusive"}[held]
            c[f"held_{name}"], c[f"reason_{name}"] = held, why
        out.append(c)
    return out


def init_scale_effect(cells: list[dict]) -> list[dict]:
    """Per optimizer and lr: stage-2 onset (κ) and W_V half-way (loss) at ε = 1e-3 over ε = 1e-2. Under
    SGD the K/Q gradient is O(ε·‖W_V‖), so a smaller ε delays K/Q; Adam normalises each coordinate's step
    (≈ lr whatever the gradient's size), so it does not (docs/reproductions/topic.md#two-stage-mechanism note)."""
    out = []
    for c in cells:
        big = next((x for x in cells if x["optimizer"] == c["optimizer"] and x["lr"] == c["lr"]
                    and x["eps"] > c["eps"] * 1.5), None)
        if big is None:
            continue
        ratio = lambda k: (c[k] / big[k]) if c[k] and big[k] else None  # noqa: E731
        out.append({"optimizer": c["optimizer"], "lr": c["lr"], "eps_small": c["eps"], "eps_large": big["eps"],
                    "t_kq_kappa_small": c["t_kq_kappa"], "t_kq_kappa_large": big["t_kq_kappa"],
                    "t_kq_ratio_small_over_large": ratio("t_kq_kappa"),
                    "t_v_loss_small": c["t_v_loss"], "t_v_loss_large": big["t_v_loss"],
                    "final_kappa_small": c["final_kappa"], "final_kappa_large": big["final_kappa"]})
    return out


ADAM_NOTE = ("Under Adam the init scale does not slow W_K, W_Q: Adam normalises each coordinate's step (≈ lr whatever "
             "the gradient's size), so the O(ε·‖W_V‖) smallness of the key/query gradient at a small init, which "
             "delays K/Q under SGD, is divided out. The two-stage separation under Adam therefore rests only on "
             "the key/query gradient having no consistent topic-block direction until W_V is structured. "
             "See init_scale_effect (t_KQ at ε = 1e-3 over ε = 1e-2, per optimizer and lr).")


@register("topic/two-stage", "E4: from small init, W_V moves first and W_K, W_Q catch up much later "
          "(Adam and SGD over init scales and learning rates)",
          configs=lambda ctx: two_stage_configs(ctx.seed, ctx.quick))
def reproduce_two_stage(ctx: ReproduceContext) -> dict:
    res = run_two_stage(ctx, "e4", two_stage_configs(ctx.seed, ctx.quick))
    write_csv(ctx.out / "two_stage.csv", res["rows"], RUN_COLS)
    cells = _summaries(res["rows"])
    write_csv(ctx.out / "two_stage_grid.csv", cells, GRID_COLS)
    _two_stage_figure(ctx.out / "two_stage.png", res["table"], res["times"], res["ref"],
                      "E4: stage 1 (W_V block contrast, probe loss; half-way lines to the fitted stage-1 optimum) and "
                      "stage 2 (topic-block score κ, attention gap; onset lines); seed " + str(ctx.seed))
    default = next(lbl for lbl in res["dirs"] if lbl.startswith("adam lr=0.01 ε=0.001"))
    _stage_heatmaps(ctx.out / "two_stage_matrices.png", res["dirs"][default], res["v"])
    claims = []
    for c in cells:
        rd = stage_readings(c)
        claims.append(claim(
            f"e4-two-stage-{c['optimizer']}-lr{c['lr']:g}-eps{c['eps']:g}",
            f"{c['optimizer']} lr {c['lr']:g}, ε = {c['eps']:g}: W_V is half-way to the stage-1 optimum before "
            "W_K, W_Q start to give same-topic attention (two stages), every seed",
            paper="Introduction / project page: 'in stage 1, only the value matrix changes significantly; in stage 2, "
                  "the key and query matrices catch up much later', from small init, SGD or Adam; docs/reproductions/topic.md#two-stage-mechanism, docs/reproductions/topic.md#two-stage-measurement, docs/reproductions/topic.md#topictwo-stage",
            definition=TWO_STAGE_DEF, measured="t_V (structure, loss), t_KQ (κ, gap), delay factor t_KQ/t_V, per seed",
            expected="t_V < t_KQ for every seed under every reading", readings=rd,
            t_v_structure=c["t_v_structure"], t_v_loss=c["t_v_loss"], t_kq_kappa=c["t_kq_kappa"],
            t_kq_gap=c["t_kq_gap"], kappa_at_t_v_loss=c["kappa_at_t_v_loss"], gap_at_t_v_loss=c["gap_at_t_v_loss"]))
    return {"experiment": "topic/two-stage", "stage1_reference": res["ref"], "grid": cells,
            "init_scale_effect": init_scale_effect(cells), "adam_init_scale_note": ADAM_NOTE,
            "definition": TWO_STAGE_DEF, "runs": res["rows"], "claims": claims,
            "files": ["two_stage.csv", "two_stage_grid.csv", "two_stage.png", "two_stage_matrices.png"]}


# ---------------------------------------------------------------- figures


def _band(ax, s, y, se, color, label):
    ax.plot(s, y, color=color, label=label)
    ax.fill_between(s, y - 2 * se, y + 2 * se, color=color, alpha=0.2, lw=0)


def _two_stage_figure(path: Path, table: dict[str, dict[str, np.ndarray]], times: dict[str, dict],
                      ref: dict[str, float], title: str) -> None:
    """Per grid cell: the W_V block contrast and the probe loss with their half-way lines to the fitted
    stage-1 optimum (t_V); the topic-block score κ and the attention gap (± 2·noise) with their onset
    thresholds (t_KQ); stage markers on every panel."""
    import matplotlib.pyplot as plt

    style.apply()
    n = len(table)
    fig, axes = plt.subplots(4, n, figsize=(3.3 * n, 11), squeeze=False, layout="constrained", sharex="col")
    marks = (("t_v_structure", "--", "C0", "t_V (structure)"), ("t_v_loss", "--", "C3", "t_V (loss)"),
             ("t_kq_kappa", "-.", "C1", "t_KQ (κ)"), ("t_kq_gap", "-.", "C2", "t_KQ (gap)"))
    for j, (label, m) in enumerate(table.items()):
        t = times[label]
        s = np.maximum(m["step"], 1)
        cv, L = m["topic.blocks/V_contrast"], m["topic.dev_loss/dev_loss"]
        axes[0][j].plot(s, cv, color="C0", label="W_V block contrast")
        axes[0][j].axhline(cv[0] + 0.5 * (ref["contrast"] - cv[0]), color="C0", ls=":", lw=0.8,
                           label="half-way to the fitted optimum's")
        ok = np.isfinite(m["loss"])
        axes[1][j].plot(s[ok], m["loss"][ok], color="0.55", lw=0.8, label="training loss (batch)")
        axes[1][j].plot(s, L, color="C3", label="probe dev loss")
        axes[1][j].axhline(L[0] + 0.5 * (ref["probe_loss"] - L[0]), color="C3", ls=":", lw=0.8,
                           label="half-way to the fitted optimum's")
        _band(axes[2][j], s, m["topic.stages/kappa"], m["topic.stages/kappa_se"], "C1", "topic-block score κ")
        axes[2][j].axhline(ts.KAPPA_ONSET, color="C1", ls=":", lw=0.8, label="onset: ln 1.05")
        _band(axes[3][j], s, m["topic.stages/gap_doc"], m["topic.stages/gap_se"], "C2", "attention gap")
        axes[3][j].axhline(ts.GAP_ONSET, color="C2", ls=":", lw=0.8, label="onset: 0.05")
        for ax in axes[:, j]:
            for key, ls, col, name in marks:
                if t[key] is not None:
                    ax.axvline(max(t[key], 1), color=col, ls=ls, lw=0.9, label=name)
            ax.set_xscale("log")
        word = {True: "2 stages", False: "not", None: "?"}
        axes[0][j].set_title(label + "\n" + ", ".join(f"{tv[0]}/{kq[0]}: {word[t[f'two_stage_{tv}_{kq}']]}"
                                                     for tv, kq in READINGS), fontsize=7)
        axes[3][j].set_xlabel("step")
        if j == 0:
            for ax, name in zip(axes[:, j], ("W_V block contrast", "MLM loss (nats)", "κ (logits)",
                                             "same − diff topic attention / uniform")):
                ax.set_ylabel(name)
                ax.legend(fontsize=6)
    fig.suptitle(title)
    style.save(fig, path)


def _stage_heatmaps(path: Path, d: Path, v: int) -> None:
    """W_V − W_V(0) and the key-centred word scores of one run at the checkpoints nearest to t_V,
    t_KQ (κ) and the end (docs/reproductions/topic.md#two-stage-measurement plots)."""
    import matplotlib.pyplot as plt

    t = stage_times(metrics_table(d), run_reference(d))
    avail = runs.checkpoint_steps(d)
    picks = [(f"≈{name} (step {min(avail, key=lambda s: abs(s - t[key]))})", min(avail, key=lambda s: abs(s - t[key])))
             for name, key in (("t_V", "t_v_loss"), ("t_KQ", "t_kq_kappa")) if t[key] is not None]
    cols = sorted(picks, key=lambda x: x[1]) + [("end", "final")]
    W0 = runs.params_of(runs.load_checkpoint(d, 0))["W_V"]
    style.apply()
    fig, axes = plt.subplots(2, len(cols), figsize=(4.4 * len(cols), 8), squeeze=False, layout="constrained")
    for j, (title, step) in enumerate(cols):
        model, _ = member_model(d, step)
        with torch.no_grad():
            mats = (("W_V − W_V(0)", model.W_V[0] - W0),
                    ("key-centred scores (words; rows: query)", ts.key_centred_words(model_scores(model), NUM_SPECIAL)[0]))
        for i, (name, M) in enumerate(mats):
            ax = axes[i][j]
            M = M.detach().double().numpy()
            lim = np.abs(M).max() or 1.0
            im = ax.imshow(M, cmap="RdBu_r", vmin=-lim, vmax=lim)
            ax.set_title(f"{name}, {title}", fontsize=8)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    fig.suptitle(f"E4 {d.parent.name}/{d.name}: each panel on its own colour scale")
    style.save(fig, path)


# ---------------------------------------------------------------- speed


@register_bench("topic")
def _bench(quick: bool) -> dict[str, float]:
    """``tdyn bench``: steps/s of the topic/stage1 and topic/two-stage settings."""
    return {f"{k}_steps_per_s": v for k, v in bench(20 if quick else 100).items()}


def bench(steps: int = 50, reps: int = 3) -> dict[str, float]:
    """Training steps per second (one member, probes off) for the topic/stage1 and topic/two-stage
    settings, from the median of ``reps`` timed runs (one run of E2 is ~0.2 s: a single timing moved
    2–3× with the VM's load); the dataset is built before timing."""
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
