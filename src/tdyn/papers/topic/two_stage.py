"""topic/two-stage (E4, docs/reproductions/topic.md#variants-e1-to-e6,
docs/reproductions/topic.md#two-stage-mechanism, docs/reproductions/topic.md#two-stage-measurement,
docs/reproductions/topic.md#topictwo-stage): from small init, W_V moves first and W_K, W_Q catch up much later,
over the grid optimizer (Adam, SGD) × init scale × learning rate; and the ``topic`` bench (training steps per
second of the topic/stage1 and topic/two-stage settings). Stage times are defined in
``tdyn.papers.topic.analysis``."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from tdyn import runs, stats
from tdyn.bench import on_device, register_bench, seconds
from tdyn.data.lda import NUM_SPECIAL, LdaDataConfig
from tdyn.reproduce.registry import ReproduceContext, register
from tdyn.papers.topic.analysis import (E2, E4, LITERAL_DEF, PER_READING, TWO_STAGE_DEF, dense_probe_steps, final,
                                           member_model, metrics_table, run_reference, stage_times, train_runs,
                                           two_stage_claims, value_contrast_series, with_stage_probe)
from tdyn.probes import topic_stages as ts
from tdyn.probes.topic_stages import model_scores
from tdyn.report import style
from tdyn.runs import write_csv
from tdyn.tasks.lda_mlm import dataset, lda_config
from tdyn.train.trainer import train


E4_GRID = {"adam": {"lrs": [0.001, 0.01], "init_scales": [1.0, 10.0]},
           "sgd": {"lrs": [1.0, 10.0], "init_scales": [1.0, 10.0]}}
#: the authors' parameterisation (docs/reproductions/topic.md#model-as-in-the-authors-code): their model always has
#: the embedding LayerNorm with a token-type vector; the small-init option U[0, ε), biases 0; their one shipped
#: config's optimizer (Adam, lr 0.01, batch 40), with lr 0.001 beside it as in the clean grid; ε = 1e-3 only (the
#: robustness variant's; under Adam the init scale does not delay W_K, W_Q, see ADAM_NOTE)
AUTHORS = E4 | {"emb_layernorm": True}
AUTHORS_GRID = {"lrs": [0.001, 0.01], "init_scales": [1.0]}
PARAMS = {"clean": "clean (paper's model)", "authors": "authors' parameterisation (embedding LayerNorm + token type)"}


def two_stage_configs(seed: int = 0, quick: bool = False, model: dict | None = None) -> dict[str, dict]:
    """E4 jobs (docs/reproductions/topic.md#two-stage-measurement): the clean grid optimizer × init scale × learning
    rate (jobs ``adam``, ``sgd``) and the authors' parameterisation under Adam (job ``authors``). Each job is one
    ensemble over its learning rates and init scales ε ∈ {1e-3, 1e-2} (ε·U[0,1)): 10k steps and 3 seeds, probes
    log-spaced over the first 1000 steps (40 of them) and every 50 after (both stages of Adam lr 0.01 fall within
    steps 50–300); quick: 200 steps, one seed, probes every 20 and log-spaced to 200."""
    steps, every = (200, 20) if quick else (10_000, 50)
    seeds = [seed] if quick else [seed, seed + 1, seed + 2]
    out = {}
    for job, (m, opt, g) in {"adam": (E4 | (model or {}), "adam", E4_GRID["adam"]),
                             "sgd": (E4 | (model or {}), "sgd", E4_GRID["sgd"]),
                             "authors": (AUTHORS | (model or {}), "adam", AUTHORS_GRID)}.items():
        c = with_stage_probe(lda_config(m, steps=steps, every=every, seeds=seeds, optimizer=opt, lr=g["lrs"][-1],
                                        quick=quick))
        c["probes"]["steps"] = dense_probe_steps(steps, upto=steps if quick else 1000)
        c["ensemble"] = {"lrs": [{"all": lr} for lr in g["lrs"]], "init_scales": g["init_scales"]}
        c["checkpoint"] = {"schedule": "log", "num": 12}
        out[job] = c
    return out


def _variant_label(job: str, d: Path) -> tuple[str, dict]:
    meta = runs.read_meta(d)
    cfg = runs.read_config(d)
    eps = cfg["model"]["init_eps"] * meta["init_scale"]
    lr = meta["lrs"]["all"]
    opt = cfg["optim"]["groups"]["all"]["optimizer"]
    param = "authors" if job == "authors" else "clean"
    prefix = f"{opt}" if param == "clean" else f"authors {opt}"
    return f"{prefix} lr={lr:g} ε={eps:g}", {"param": param, "optimizer": opt, "lr": lr, "eps": eps, "seed": meta["seed"]}


def run_two_stage(ctx: ReproduceContext, name: str, configs: dict[str, dict]) -> dict:
    """Train the E4 jobs, compute stage times per member; the table of the members of seed ``ctx.seed``."""
    table, times, rows, dirs_of = {}, {}, [], {}
    v = ref = None
    for job, base in configs.items():
        cfg, dirs = train_runs(ctx, f"{name}-{job}", base)
        v = cfg.typed_data().words_per_topic
        for d in dirs:
            label, info = _variant_label(job, d)
            m = metrics_table(d)
            ref = run_reference(d)
            t = stage_times(m, ref)
            rows.append(info | {"run": f"{name}-{job}/{d.name}"} | t | {"final_loss": final(m, "loss")})
            if info["seed"] == ctx.seed:
                table[label], times[label], dirs_of[label] = m, t, d
    return {"rows": rows, "table": table, "times": times, "v": v, "dirs": dirs_of, "ref": ref}


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
    """One row per grid cell (parameterisation, optimizer, lr, ε): medians over seeds and the two verdicts."""
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


@register("topic/two-stage", "E4: from small init, W_V moves first and W_K, W_Q catch up much later "
          "(Adam and SGD over init scales and learning rates; the clean model and the authors' parameterisation)",
          configs=lambda ctx: two_stage_configs(ctx.seed, ctx.quick))
def reproduce_two_stage(ctx: ReproduceContext) -> dict:
    res = run_two_stage(ctx, "e4", two_stage_configs(ctx.seed, ctx.quick))
    write_csv(ctx.out / "two_stage.csv", res["rows"], RUN_COLS)
    by_cell = {}
    for (param, opt, lr, eps), rs in _groups(res["rows"]).items():
        by_cell[_cell_id(param, opt, lr, eps)] = two_stage_claims(
            rs, id=_cell_id(param, opt, lr, eps), label=_cell_label(param, opt, lr, eps),
            where="docs/reproductions/topic.md#topictwo-stage", value_note=AUTHORS_VALUE_NOTE if param == "authors" else "")
    cells = _summaries(res["rows"], by_cell)
    write_csv(ctx.out / "two_stage_grid.csv", cells, GRID_COLS)
    _two_stage_figure(ctx.out / "two_stage.png", res["table"], res["times"], res["ref"], ctx.seed)
    default = next(lbl for lbl in res["dirs"] if lbl.startswith("adam lr=0.01 ε=0.001"))
    _stage_heatmaps(ctx.out / "two_stage_matrices.png", res["dirs"][default], res["v"])
    claims = [c for pair in by_cell.values() for c in pair]
    return {"experiment": "topic/two-stage", "stage1_reference": res["ref"], "grid": cells,
            "init_scale_effect": init_scale_effect(cells), "adam_init_scale_note": ADAM_NOTE,
            "definition": TWO_STAGE_DEF, "literal_definition": LITERAL_DEF, "runs": res["rows"], "claims": claims,
            "files": ["two_stage.csv", "two_stage_grid.csv", "two_stage.png", "two_stage_matrices.png"]}


# ---------------------------------------------------------------- figures


def _two_stage_figure(path: Path, table: dict[str, dict[str, np.ndarray]], times: dict[str, dict],
                      ref: dict[str, float], seed: int) -> None:
    """One row per (parameterisation, optimizer, lr), ε = 1e-3 solid and 1e-2 dashed, seed ``seed``; columns:
    the weight changes ‖ΔW_V‖, ‖ΔW_K‖, ‖ΔW_Q‖ (the literal statement); stage 1's progress (value contrast over
    its stage-1 plateau, probe loss's way to the fitted optimum); stage 2 (κ and the attention gap with their
    onset thresholds). Stage 1 is shaded up to its end (the last logged step before the persistent onset)."""
    import matplotlib.pyplot as plt

    style.apply()
    rows: dict[str, list[str]] = {}
    for label in table:
        rows.setdefault(label.split(" ε=")[0], []).append(label)
    rows = dict(sorted(rows.items(), key=lambda kv: (kv[0].startswith("authors"), kv[0].split(" lr=")[0],
                                                      float(kv[0].split(" lr=")[1]))))
    n = len(rows)
    fig, axes = plt.subplots(n, 3, figsize=(11, 2.9 * n), squeeze=False, layout="constrained")
    for i, (row, labels) in enumerate(rows.items()):
        for label in sorted(labels, key=lambda lb: float(lb.split("ε=")[1])):
            m, t = table[label], times[label]
            ls = "-" if float(label.split("ε=")[1]) < 5e-3 else "--"
            s = np.maximum(m["step"], 1)
            ax = axes[i][0]
            for key, col, nm in (("dV", "C0", "‖ΔW_V‖"), ("dK", "C1", "‖ΔW_K‖"), ("dQ", "C2", "‖ΔW_Q‖")):
                if f"topic.norms/{key}" in m:
                    ax.plot(s, m[f"topic.norms/{key}"], color=col, ls=ls, label=nm if ls == "-" else None)
            ax.set_yscale("log")
            cv, _ = value_contrast_series(m)
            ax = axes[i][1]
            ax.plot(s, (cv - cv[0]) / (ref["contrast"] - cv[0]), color="C0", ls=ls,
                    label="value contrast" if ls == "-" else None)
            if t["v_plateau"] is not None:
                ax.plot(max(t["t_plateau"], 1), (t["v_plateau"] - cv[0]) / (ref["contrast"] - cv[0]), "o", color="C0",
                        mfc="none" if ls == "--" else "C0", label="its stage-1 plateau" if ls == "-" else None)
            L = m["topic.dev_loss/dev_loss"]
            ax.plot(s, (L[0] - L) / (L[0] - ref["probe_loss"]), color="C3", ls=ls,
                    label="probe loss" if ls == "-" else None)
            ax.axhline(0.5, color="0.5", lw=0.8, ls=":")
            ax = axes[i][2]
            ax.plot(s, m["topic.stages/kappa"], color="C1", ls=ls, label="κ" if ls == "-" else None)
            ax.plot(s, m["topic.stages/gap_doc"], color="C2", ls=ls, label="attention gap" if ls == "-" else None)
            ax.axhline(ts.KAPPA_ONSET, color="C1", lw=0.8, ls=":")
            ax.axhline(ts.GAP_ONSET, color="C2", lw=0.8, ls=":")
            for ax in axes[i]:
                if t["t_s1_end"]:
                    ax.axvspan(1, max(t["t_s1_end"], 1), color="0.85" if ls == "-" else "0.93", zorder=0, lw=0)
                    ax.axvline(max(t["t_s1_end"], 1), color="k", ls=ls, lw=1.0)
                ax.set_xscale("log")
        axes[i][0].set_title(f"{row}\nweight changes", fontsize=14)
        axes[i][1].set_title(f"{row}\nway to the fitted optimum", fontsize=14)
        axes[i][2].set_title(f"{row}\nstage 2 (dotted: onset levels)", fontsize=14)
        if i == 0:
            for ax in axes[i]:
                ax.legend(fontsize=11, loc="upper left")
        if i == n - 1:
            for ax in axes[i]:
                ax.set_xlabel("step", fontsize=12)
    fig.suptitle(f"E4 two stages, seed {seed}; ε = 1e-3 solid, 1e-2 dashed\nstage 1 (grey) ends at the last logged "
                 "step before the persistent onset (κ ≥ ln 1.05 or gap ≥ 0.05 through [t, 2t])", fontsize=14)
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
