"""Scan and Snap Fig 6 and Figs 11–12 (Tian et al. 2023 App G;
docs/reproductions/scan-snap.md#the-authors-commands, docs/reproductions/scan-snap.md#distinct-token-entropy,
docs/reproductions/scan-snap.md#recall-at-threshold): the Syn-Medium sweep (640 runs as 8 ensemble jobs), its
entropy table, and recall vs attention threshold from the same sweep's final weights (typed option ``--sweep-dir``:
Figs 6 and 11–12 given the same directory train once); the ``fig6_sweep`` bench."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from pydantic import Field

from tdyn import runs, stats
from tdyn.bench import on_device, register_bench, timed_train
from tdyn.config import override_key, validate_config
from tdyn.papers.scan_snap import data
from tdyn.errors import UserError
from tdyn.reproduce.common import claim, configure, decide, every_cell, on_reproduction_device, paired, reading, with_options
from tdyn.reproduce.registry import ReproduceContext, register
from tdyn.papers.scan_snap.analysis import _facts, _final, _lrs
from tdyn.papers.scan_snap import probes as pr
from tdyn.report import style
from tdyn.runs import write_csv
from tdyn.schema import Strict
from tdyn.sweep import run_sweep
from tdyn.sweep.executors import start_method
from tdyn.sweep.spec import load_spec, plan
from tdyn.papers.scan_snap.task import yz_config
from tdyn.train.trainer import expand_members, member_config


class SweepOptions(Strict):
    """Options of scan-snap/fig6 and fig11-12: where the sweep lives and its grid (None: the paper's grid,
    or the --quick one)."""

    sweep_dir: Path | None = Field(None, description="where the Fig 6 sweep's runs live (default OUT/runs); "
                                   "an earlier scan-snap/fig6 --out also works. Figs 6 and 11-12 given the same "
                                   "directory train once")
    num_last: list[int] | None = Field(None, description="numbers of queries (one panel each)")
    etas_z: list[float] | None = Field(None, description="η_Z values")
    ratios: list[float] | None = Field(None, description="η_Y/η_Z ratios")
    seeds: list[int] | None = Field(None, description="seeds of every cell")
    steps: int | None = Field(None, ge=1, description="training steps")


def fig6_grid(ctx: ReproduceContext) -> dict:
    """The sweep's grid: the paper's (or --quick) with the user's grid options in place."""
    return with_options(FIG6_QUICK if ctx.quick else FIG6, ctx.options)



# ---------------------------------------------------------------- Fig 6 sweep (shared with Figs 11–12)

FIG6 = {"num_last": [1, 3, 5, 10], "etas_z": [0.5, 1.0, 2.0, 3.0], "ratios": [1.0, 2.0, 5.0, 10.0],
        "seeds": list(range(1, 11)), "steps": 100}
FIG6_QUICK = {"num_last": [1, 3], "etas_z": [0.5, 3.0], "ratios": [1.0, 2.0, 10.0], "seeds": [1, 2, 3], "steps": 100}


def fig6_spec(grid: dict = FIG6, overrides: list[str] = ()) -> dict:
    """The sweep as a ``tdyn sweep`` spec: #query panels × zipped (η_Z, η_Y = ratio·η_Z) × seeds.

    The authors' command (docs/reproductions/scan-snap.md#the-authors-commands): Syn-Medium, SGD momentum 0.9,
    batch 128, length 128, 100 steps, PyTorch-default init. Each panel's 10 seeds × 16 learning-rate pairs train as
    two ensemble jobs of 5 seeds (the sweep's default ``job_members``, so two workers share the largest panel).
    Probes only at the start and the end, and only the final checkpoint (the sweep needs only the final weights).
    ``overrides``: the user's ``--set``; given as ``ctx.overrides``, also the reproduction's ``--device``.
    """
    base = on_reproduction_device(yz_config(data.syn_medium(grid["num_last"][0]), steps=grid["steps"],
                                            init="torch_default"), overrides)   # a GPU sweep: another digest
    base["probes"] = {"names": [], "every": grid["steps"] or 1}
    base["checkpoint"]["initial"] = False     # the analyses read only the final state
    pairs = [(ez, ez * r) for ez in grid["etas_z"] for r in grid["ratios"]]
    return {"config": base, "set": list(overrides),
            "axes": {"grid": {"data.num_last": grid["num_last"]},
                     "zip": {"optim.groups.Z.lr": [p[0] for p in pairs], "optim.groups.Y.lr": [p[1] for p in pairs]}},
            "seeds": grid["seeds"]}


def fig6_sweep(ctx: ReproduceContext) -> tuple[dict, list[dict]]:
    """Run (or continue) the sweep with ``tdyn sweep``; return (grid, one record per run with its
    final Z and facts).

    Option ``--sweep-dir DIR`` places the sweep (default ``<out>/runs``); DIR may also be an
    earlier ``scan-snap/fig6`` output directory. Finished runs are never retrained, so Figs 6 and
    11–12 given the same ``sweep_dir`` train once. The sweep uses the paper's seeds 1..10
    (``--seed`` is not used).
    """

    overrides = ctx.overrides
    grid = fig6_grid(ctx)
    configure(fig6_configs(ctx)["fig6-sweep-base"], overrides)  # validates (and consumes) the overrides
    opts = ctx.options or SweepOptions()
    base = Path(opts.sweep_dir or ctx.out / runs.RUNS)
    if (base / runs.RESULTS).exists() and (base / runs.RUNS).is_dir():     # an earlier fig6 --out
        base = base / runs.RUNS
    spec = fig6_spec(grid, overrides)
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    root = base / f"fig6{'-quick' if ctx.quick else ''}-{digest}"     # one directory per distinct sweep
    run_sweep(spec, root, progress=ctx.progress)
    records, facts = [], {}
    for r in runs.read_json(root / runs.SWEEP)["runs"]:
        d = root / r["name"]
        nl = r["axes"]["data.num_last"]
        if nl not in facts:
            facts[nl] = _facts(configure(runs.Run(d).config, []))
        eta_y, eta_z = _lrs(d)
        records.append({"num_last": nl, "dist": facts[nl], "eta_z": eta_z, "ratio": round(eta_y / eta_z, 6),
                        "seed": r["seed"], "Z": _final(d), "dir": d})
    return grid, records


def _cells(records: list[dict]) -> dict[tuple, list[dict]]:
    cells: dict[tuple, list[dict]] = {}
    for r in records:
        cells.setdefault((r["num_last"], r["eta_z"], r["ratio"]), []).append(r)
    return cells


def _stack_Z(rs: list[dict]) -> torch.Tensor:
    return torch.stack([r["Z"] for r in rs])


def fig6_configs(ctx: ReproduceContext) -> dict[str, dict]:
    """The sweep's base run config (the sweep sets data.num_last, η_Z and η_Y per run: overriding one of
    those axes is an error, as the sweep would shadow it)."""
    spec = fig6_spec(fig6_grid(ctx))
    axes = {k for kind in ("grid", "zip") for k in spec["axes"][kind]}
    swept = [o for o in ctx.overrides if override_key(o) in axes]
    if swept:
        raise UserError(f"--set {swept[0]}: {override_key(swept[0])} is an axis of the Fig 6 sweep "
                        f"({', '.join(sorted(axes))}); the sweep would shadow the override")
    return {"fig6-sweep-base": spec["config"]}


@register("scan-snap/fig6", "Syn-Medium sweep (640 runs): distinct-token entropy vs η_Y/η_Z per η_Z — "
          "larger η_Z sparser; rises past ratio ≈ 2", configs=fig6_configs, options=SweepOptions)
def fig6(ctx: ReproduceContext) -> dict:
    """Entropy of the final attention's renormalised distinct-token distribution
    (docs/reproductions/scan-snap.md#distinct-token-entropy), mean ± sample std over 10 seeds, per (#query/#next,
    η_Z, ratio)."""

    grid, records = fig6_sweep(ctx)
    rows, Hs = [], {}
    for (nl, ez, ratio), rs in sorted(_cells(records).items()):
        d = rs[0]["dist"]
        rs = sorted(rs, key=lambda r: r["seed"])
        H = pr.distinct_entropy(_stack_Z(rs), d.table, d.query, d.distinct).numpy()
        Hs[nl, ez, ratio] = H
        rows.append({"num_last": nl, "num_next": d.K, "eta_z": ez, "ratio": ratio, "seeds": len(rs),
                     "entropy_mean": float(H.mean()), "entropy_std": stats.sd(H)})
    cols = ["num_last", "num_next", "eta_z", "ratio", "seeds", "entropy_mean", "entropy_std"]
    write_csv(ctx.out / "table.csv", rows, cols)
    E = {(r["num_last"], r["eta_z"], r["ratio"]): r["entropy_mean"] for r in rows}


    style.apply()
    n = len(grid["num_last"])
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.4), squeeze=False)
    for ax, nl in zip(axes[0], grid["num_last"]):
        for i, ez in enumerate(grid["etas_z"]):
            rr = [r for r in rows if r["num_last"] == nl and r["eta_z"] == ez]
            ax.errorbar([r["ratio"] for r in rr], [r["entropy_mean"] for r in rr], yerr=[r["entropy_std"] for r in rr],
                        marker="o", ms=4, capsize=2, color=style.PALETTE[i], label=f"η_Z={ez:g}")
        ax.set_xscale("log")
        ax.set_xticks(grid["ratios"], [f"{r:g}" for r in grid["ratios"]])
        ax.set_title(f"#last/next = {nl}/{2 * nl}")
        ax.set_xlabel("η_Y/η_Z")
    axes[0, 0].set_ylabel("avg distinct-token entropy (nats)")
    axes[0, 0].legend()
    style.save(fig, ctx.out / "fig6.png")

    # ---- the paper's trends (docs/reproductions/scan-snap.md#figures,
    # docs/reproductions/scan-snap.md#scan-snapfig6), each comparison decided with a margin of 2 standard errors
    # of the paired per-seed difference (runs with the same seed share init and data stream)
    ez, rt, panels = grid["etas_z"], grid["ratios"], grid["num_last"]
    word = {True: "holds", False: "fails", None: "inconclusive"}

    def cmp(lo_key, hi_key):
        """H(hi_key) − H(lo_key) > 0 supports the claim: (verdict, numbers)."""
        diff, se = paired(Hs[hi_key], Hs[lo_key])
        return decide(diff, se), {"diff": diff, "se": se, "verdict": word[decide(diff, se)]}

    dec = {f"{nl}/{2 * nl},ratio={r:g},eta_z={a:g}>{b:g}": cmp((nl, b, r), (nl, a, r))
           for nl in panels if nl != 1 for r in rt for a, b in zip(ez, ez[1:])}
    dec_small = {f"1/2,ratio={r:g},eta_z={a:g}>{b:g}": cmp((1, b, r), (1, a, r))
                 for r in rt for a, b in zip(ez, ez[1:])} if 1 in panels else {}
    past2 = {f"{nl}/{2 * nl},eta_z={e:g}": cmp((nl, e, 2.0), (nl, e, rt[-1])) for nl in panels for e in ez} \
        if 2.0 in rt else {}
    big = [nl for nl in panels if 2 * nl >= 6]
    dip = {}
    if {1.0, 2.0, 10.0} <= set(rt):
        for nl in big:
            for e in ez:
                if e >= 1:
                    dip[f"{nl}/{2 * nl},eta_z={e:g},vs_ratio1"] = cmp((nl, e, 2.0), (nl, e, 1.0))
                    dip[f"{nl}/{2 * nl},eta_z={e:g},vs_ratio10"] = cmp((nl, e, 2.0), (nl, e, 10.0))
    rise = {f"1/2,eta_z={e:g},ratio={a:g}<{b:g}": cmp((1, e, a), (1, e, b))
            for e in ez if e <= 1 for a, b in zip(rt, rt[1:])} if 1 in panels else {}

    def verdict(cells):
        return every_cell({k: v for k, (v, _) in cells.items()})

    def nums(cells):
        return {k: n for k, (_, n) in cells.items()}

    defn = ("per seed: the Fig 6 entropy (docs/reproductions/scan-snap.md#distinct-token-entropy) of the final weights; per comparison: the paired per-seed "
            "difference, mean ± SE over seeds, decided with a margin of 2 SE; the claim holds if every comparison "
            "holds, fails if any fails, else inconclusive")
    v1, r1 = verdict(dec)
    v2, r2 = verdict(past2)
    v3, r3 = verdict(dip)
    v4, r4 = verdict(rise)
    claims = [
        claim("entropy-decreases-with-eta-z", "Entropy decreases with η_Z at every ratio (exceptions allowed only in "
              "the noisy 1/2 panel)", v1, reason=r1, source="paper",
              quote="entropy falls with larger η_Z (Fig 6, docs/reproductions/scan-snap.md#figures); a larger η_Z, or both "
                    "rates scaled, gives a sparser one (§6 prediction (b), docs/reproductions/scan-snap.md#snap-phase-transition)",
              paper="Fig 6; §6 prediction (b) (larger η_Z, sparser attention)",
              definition=defn, measured="H(η_Z) − H(next larger η_Z) per (panel ≠ 1/2, ratio)",
              expected="> 0 beyond 2 SE in every comparison", comparisons=nums(dec),
              comparisons_1_2_panel_not_judged=nums(dec_small)),
        claim("rises-past-ratio-2", "At fixed η_Z, entropy rises once the ratio passes about 2 (ratio-10 entropy "
              "above ratio-2)", v2, reason=r2, source="paper",
              quote="at fixed η_Z it rises once the ratio passes about 2 (Fig 6, docs/reproductions/scan-snap.md#figures); "
                    "Empirically, (c) shows only once η_Y/η_Z exceeds about 2, since the theory needs η_Y ≫ η_Z "
                    "(§8, docs/reproductions/scan-snap.md#snap-phase-transition)",
              paper="Fig 6; §6 prediction (c) (shows once η_Y/η_Z > 2, §8)",
              definition=defn, measured=f"H(ratio {rt[-1]:g}) − H(ratio 2) per (panel, η_Z)",
              expected="> 0 beyond 2 SE in every (panel, η_Z)", comparisons=nums(past2)),
        claim("dip-at-ratio-2", "For K ≥ 6 and η_Z ≥ 1 the ratio-2 entropy is below both ratio 1 and ratio 10",
              v3, reason=r3, source="paper", quote="dip at ratio 2 for K ≥ 6 (Fig 6, docs/reproductions/scan-snap.md#figures)",
              paper="Fig 6 (dip at ratio 2 for K ≥ 6)", definition=defn,
              measured="H(ratio 1) − H(ratio 2) and H(ratio 10) − H(ratio 2) (K ≥ 6, η_Z ≥ 1)",
              expected="> 0 beyond 2 SE in every such cell", comparisons=nums(dip)),
        claim("small-panel-rises", "In the 1/2 panel entropy rises with the ratio for η_Z ≤ 1", v4, reason=r4,
              source="paper", quote="in 1/2, entropy rises with the ratio for η_Z ≤ 1 (Fig 6's 1/2 panel, as read "
                                    "in docs/reproductions/scan-snap.md#scan-snapfig6)",
              paper="Fig 6 (1/2 panel)", definition=defn,
              measured="H(next larger ratio) − H(ratio), 1/2 panel, η_Z ≤ 1",
              expected="> 0 beyond 2 SE at each step of the ratio axis", comparisons=nums(rise)),
    ]
    return {"experiment": "scan-snap/fig6", "grid": grid, "runs": len(records), "claims": claims,
            "files": ["table.csv", "fig6.png"]}



# ---------------------------------------------------------------- Figs 11–12

RECALL_THRESHOLDS = {1: (0.028, 0.038), 3: (0.012, 0.016), 5: (0.0075, 0.0105), 10: (0.0040, 0.0050)}

#: The open definition of the descent rate (App G does not say over which range or how it is fitted):
#: each reading is (name, description, threshold axis from (num_last, M), fit).
DESCENT_READINGS = (
    ("lsq-paper-axis", "−(least-squares slope) of recall vs threshold over the panel's plotted threshold axis "
     "(docs/reproductions/scan-snap.md#recall-at-threshold: 11 thresholds)", lambda nl, M: np.linspace(*RECALL_THRESHOLDS[nl], 11), "lsq"),
    ("secant-paper-axis", "(recall at the axis's first threshold − at its last)/(axis width), the panel's plotted "
     "axis", lambda nl, M: np.linspace(*RECALL_THRESHOLDS[nl], 11), "secant"),
    ("lsq-wide-axis", "−(least-squares slope) of recall vs threshold over [0.5/M, 2/M] (31 thresholds; the plotted "
     "axes all lie near 0.9/M–1.3/M)", lambda nl, M: np.linspace(0.5 / M, 2.0 / M, 31), "lsq"),
)


@register("scan-snap/fig11-12", "Recall of distinct tokens vs attention threshold from the Fig 6 sweep's final "
          "weights: smaller ratio or larger η_Z → sparser, read from the descent rate",
          configs=fig6_configs, options=SweepOptions)
def fig11_12(ctx: ReproduceContext) -> dict:
    """Recall (docs/reproductions/scan-snap.md#recall-at-threshold: softmax over all M tokens per query, tag ≥
    threshold, share of the query's distinct tokens tagged), mean over seeds; Fig 11 curves per ratio, Fig 12
    curves per η_Z. Reuses the Fig 6 runs under the same ``sweep_dir`` (trains them only if absent).

    **How the paper reads the curves** (App G and the Fig 11/12 captions;
    docs/reproductions/scan-snap.md#recall-at-threshold): sparsity is read from the *descent rate* of recall
    against threshold — a sparser attention map gives a slower descent — not from the level of recall. The two
    claims (smaller η_Y/η_Z ⇒ sparser; larger η_Z ⇒ sparser) are judged per panel and cell by the descent rate: per
    seed, the rate of each run's recall curve; per cell, the paired seed difference between the two ends of the
    swept axis (ratio 1 vs 10 at fixed η_Z; η_Z 0.5 vs 3 at fixed ratio) and its standard error. The paper leaves
    the fit open, so each reading in ``DESCENT_READINGS`` is measured side by side.
    """

    grid, records = fig6_sweep(ctx)
    ez, rt, panels = grid["etas_z"], grid["ratios"], grid["num_last"]
    rows, R, rates, level = [], {}, {}, {}
    for (nl, e, ratio), rs in sorted(_cells(records).items()):
        rs = sorted(rs, key=lambda r: r["seed"])
        d = rs[0]["dist"]
        Zs = _stack_Z(rs)
        thr = torch.linspace(*RECALL_THRESHOLDS[nl], 11, dtype=torch.float64)
        rec = pr.recall(Zs, d.query, d.distinct, thr).numpy()        # [seeds, T]
        R[nl, e, ratio] = (thr.numpy(), rec.mean(0))
        level[nl, e, ratio] = rec.mean(1)
        for name, _, axis, how in DESCENT_READINGS:
            x = axis(nl, d.M)
            y = rec if x.shape == thr.shape and np.allclose(x, thr.numpy()) else pr.recall(Zs, d.query, d.distinct, torch.tensor(x)).numpy()
            rates[name, nl, e, ratio] = pr.descent_rate(x, y, how)   # [seeds]
        rows += [{"num_last": nl, "num_next": d.K, "eta_z": e, "ratio": ratio, "threshold": float(t), "seeds": len(rs),
                  "recall_mean": float(m), "recall_std": float(s)}
                 for t, m, s in zip(thr.numpy(), rec.mean(0), [stats.sd(col) for col in rec.T])]
    write_csv(ctx.out / "recall.csv", rows, ["num_last", "num_next", "eta_z", "ratio", "threshold", "seeds",
                                             "recall_mean", "recall_std"])
    se = stats.se
    rate_rows = [{"reading": name, "num_last": nl, "num_next": 2 * nl, "eta_z": e, "ratio": r, "seeds": len(v),
                  "descent_rate_mean": float(np.mean(v)), "descent_rate_se": se(v),
                  "recall_level_mean": float(level[nl, e, r].mean())}
                 for (name, nl, e, r), v in rates.items()]
    write_csv(ctx.out / "descent_rate.csv", rate_rows, ["reading", "num_last", "num_next", "eta_z", "ratio", "seeds",
                                                         "descent_rate_mean", "descent_rate_se", "recall_level_mean"])

    # ---- per-cell verdicts: the sparser end (expected slower descent) against the denser end
    claim_axes = {
        "smaller-ratio-sparser": [(nl, f"eta_z={e:g}", (nl, e, rt[0]), (nl, e, rt[-1])) for nl in panels for e in ez],
        "larger-eta-z-sparser": [(nl, f"ratio={r:g}", (nl, ez[-1], r), (nl, ez[0], r)) for nl in panels for r in rt],
    }
    cell_rows, readings = [], {c: [] for c in claim_axes}
    for cname, cells in claim_axes.items():
        for name, desc, _, _ in DESCENT_READINGS:
            verdicts, per_panel = {}, {}
            for nl, fixed, sparse, dense in cells:
                a, b = rates[(name, *sparse)], rates[(name, *dense)]
                diff, noise = paired(b, a)                     # denser − sparser rate: > 0 supports the claim
                v = decide(diff, noise)
                key = f"{nl}/{2 * nl},{fixed}"
                verdicts[key] = v
                per_panel.setdefault(f"{nl}/{2 * nl}", {})[fixed] = v
                cell_rows.append({"claim": cname, "reading": name, "panel": f"{nl}/{2 * nl}", "fixed": fixed,
                                  "sparser_cell": f"eta_z={sparse[1]:g},ratio={sparse[2]:g}",
                                  "denser_cell": f"eta_z={dense[1]:g},ratio={dense[2]:g}",
                                  "rate_sparser": float(np.mean(a)), "rate_denser": float(np.mean(b)),
                                  "diff": diff, "noise_se": noise, "band": 2 * noise,
                                  "verdict": {True: "holds", False: "fails", None: "inconclusive"}[v]})
            held, why = every_cell(verdicts)
            readings[cname].append(reading(
                f"{name}: {desc}", held, reason=why,
                cells_holding=sum(v is True for v in verdicts.values()),
                cells_failing=sum(v is False for v in verdicts.values()), cells=len(verdicts),
                per_panel={p: {k: {True: "holds", False: "fails", None: "inconclusive"}[v] for k, v in pv.items()}
                           for p, pv in per_panel.items()}))
    write_csv(ctx.out / "descent_cells.csv", cell_rows, ["claim", "reading", "panel", "fixed", "sparser_cell",
                                                         "denser_cell", "rate_sparser", "rate_denser", "diff",
                                                         "noise_se", "band", "verdict"])


    style.apply()
    for name, outer, inner, lab_o, lab_i in (("fig11", ez, rt, "η_Z", "η_Y/η_Z"), ("fig12", rt, ez, "η_Y/η_Z", "η_Z")):
        fig, axes = plt.subplots(len(panels), len(outer), figsize=(2.8 * len(outer), 2.2 * len(panels)), squeeze=False,
                                 constrained_layout=True)
        for i, nl in enumerate(panels):
            for j, o in enumerate(outer):
                ax = axes[i, j]
                for k, v in enumerate(inner):
                    key = (nl, o, v) if name == "fig11" else (nl, v, o)
                    rate = float(np.mean(rates[("lsq-paper-axis", *key)]))
                    ax.plot(*R[key], marker=".", color=style.PALETTE[k], label=f"{lab_i}={v:g}: rate {rate:.0f}")
                ax.set_title(f"{nl}/{2 * nl}, {lab_o}={o:g}", fontsize=9)
                ax.set_ylim(-0.02, 1.02)
                ax.xaxis.set_major_locator(plt.MaxNLocator(4))
                ax.legend(fontsize=6, title="descent rate (lsq)", title_fontsize=6)
                if i == len(panels) - 1:
                    ax.set_xlabel("threshold")
                if j == 0:
                    ax.set_ylabel("recall")
        fig.savefig(ctx.out / f"{name}.png", dpi=100)      # 16 panels: a lower resolution keeps the file small
        plt.close(fig)
    fig, axes = plt.subplots(len(DESCENT_READINGS), len(panels), figsize=(3.4 * len(panels), 2.8 * len(DESCENT_READINGS)),
                             squeeze=False, constrained_layout=True)
    for i, (name, _, _, _) in enumerate(DESCENT_READINGS):
        for j, nl in enumerate(panels):
            ax = axes[i, j]
            for k, e in enumerate(ez):
                v = [rates[name, nl, e, r] for r in rt]
                ax.errorbar(rt, [np.mean(x) for x in v], yerr=[2 * se(x) for x in v], marker="o", ms=3, capsize=2,
                            color=style.PALETTE[k], label=f"η_Z={e:g}")
            ax.set_xscale("log")
            ax.set_xticks(rt, [f"{r:g}" for r in rt])
            ax.set_title(f"{nl}/{2 * nl}: {name}", fontsize=9)
            if i == len(DESCENT_READINGS) - 1:
                ax.set_xlabel("η_Y/η_Z")
            if j == 0:
                ax.set_ylabel("descent rate −dR/dθ (±2 SE)")
    axes[0, 0].legend(fontsize=7)
    style.save(fig, ctx.out / "descent_rate.png")

    definition = ("descent rate of a run's recall–threshold curve (recall: docs/reproductions/scan-snap.md#recall-at-threshold), per seed; per cell the paired "
                  "seed-mean difference between the two ends of the swept axis, decided with a margin of 2 standard "
                  "errors; a reading holds if every (panel, cell) holds, fails if any cell fails")
    claims = [
        claim("smaller-ratio-sparser", f"Smaller η_Y/η_Z gives sparser attention, i.e. a slower descent of recall with "
              f"threshold: descent rate at ratio {rt[0]:g} below ratio {rt[-1]:g} in every (panel, η_Z) cell",
              source="paper", quote="a sparser attention map gives a slower descent of the recall–threshold line; "
                                    "the Fig 11 / Fig 12 captions draw the conclusions (smaller η_Y/η_Z […] give a smaller "
                                    "descent rate, hence sparser attention) (App G and the Fig 11 caption, as stated in "
                                    "docs/reproductions/scan-snap.md#recall-at-threshold)",
              paper="App. G, Fig 11 caption (smaller η_Y/η_Z → smaller descent rate → sparser attention)",
              definition=definition, measured="descent rate per (panel, η_Z, ratio), per seed",
              expected=f"rate(ratio {rt[0]:g}) < rate(ratio {rt[-1]:g}) beyond 2 SE in every cell",
              readings=readings["smaller-ratio-sparser"]),
        claim("larger-eta-z-sparser", f"Larger η_Z gives sparser attention (slower descent): descent rate at "
              f"η_Z={ez[-1]:g} below η_Z={ez[0]:g} in every (panel, ratio) cell",
              source="paper", quote="a sparser attention map gives a slower descent of the recall–threshold line; "
                                    "the Fig 11 / Fig 12 captions draw the conclusions ([…] larger η_Z, give a smaller "
                                    "descent rate, hence sparser attention) (App G and the Fig 12 caption, as stated in "
                                    "docs/reproductions/scan-snap.md#recall-at-threshold)",
              paper="App. G, Fig 12 caption (larger η_Z → smaller descent rate → sparser attention)",
              definition=definition, measured="descent rate per (panel, ratio, η_Z), per seed",
              expected=f"rate(η_Z={ez[-1]:g}) < rate(η_Z={ez[0]:g}) beyond 2 SE in every cell",
              readings=readings["larger-eta-z-sparser"]),
    ]
    return {"experiment": "scan-snap/fig11-12", "grid": grid, "runs": len(records), "claims": claims,
            "files": ["recall.csv", "descent_rate.csv", "descent_cells.csv", "fig11.png", "fig12.png",
                      "descent_rate.png"]}



# ---------------------------------------------------------------- benchmark


@register_bench("fig6_sweep")
def _bench_fig6(quick: bool) -> dict:
    """The Fig 6 sweep (640 runs) with ``tdyn sweep`` (batched into 8 ensemble jobs on the local
    pool; the median of 3 sweeps, each into a fresh directory, 1 if ``quick``: one sweep's wall time
    varies by ~±8% on this VM) vs the same runs trained one at a time in this process (``quick`` and on
    CUDA: extrapolated from a few runs per job)."""
    import statistics

    spec = fig6_spec(FIG6)
    spec["config"] = on_device(spec["config"])
    method = start_method()   # how the sweep's pool starts its workers here (forked or spawned)
    sweeps = []               # (wall seconds, workers' busy seconds) of each sweep
    for _ in range(1 if quick else 3):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            run_sweep(spec, Path(d) / "sweep", progress=False, workers=1 if spec["config"]["device"] == "cuda" else None)
            sweeps.append((time.perf_counter() - t0, sorted(
                runs.read_json(Path(d) / "sweep" / runs.SWEEP)["worker_busy_seconds"].values(), reverse=True)))
    batched = statistics.median(w for w, _ in sweeps)
    busy = next(b for w, b in sweeps if w == batched)
    seq, timed, total_runs = 0.0, 0, 0
    # quick, or on a GPU (where one run is bound by kernel launches, alike across a job's members, and 640
    # of them would take minutes of a lent device): a few runs per job, extrapolated
    few = quick or spec["config"]["device"] == "cuda"
    for job in plan(load_spec(spec)):
        cfg = validate_config(job.config)
        members = expand_members(cfg)
        total_runs += len(members)
        picked = members[:: max(1, len(members) // 3)] if few else members
        t = sum(timed_train(member_config(cfg, m)) for m in picked)
        timed += len(picked)
        seq += t * len(members) / len(picked)
    return {"runs": total_runs, "batched_s": batched, "batched_s_each": [w for w, _ in sweeps], "worker_busy_s": busy,
            "start_method": method, "sequential_s": seq, "ratio": seq / batched,
            "sequential_runs_timed": timed, "sequential_extrapolated": timed < total_runs,
            "under_2_min": batched < 120}
