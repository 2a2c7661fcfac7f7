"""Scan and Snap Fig 6 and Figs 11–12 (Tian et al. 2023 App G;
docs/reproductions/scan-snap.md#the-authors-commands, docs/reproductions/scan-snap.md#distinct-token-entropy,
docs/reproductions/scan-snap.md#recall-at-threshold): the Syn-Medium sweep (640 runs as 8 ensemble jobs), its
entropy table, and recall vs attention threshold from the same sweep's final weights. Both are phases that plan
the same sweep (:attr:`Phases.sweeps`): given the same ``--sweep-dir`` they train it once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from pydantic import Field

from tdyn import runs, stats
from tdyn.config import override_key
from tdyn.errors import UserError
from tdyn.papers.scan_snap import data
from tdyn.papers.scan_snap import probes as pr
from tdyn.papers.scan_snap.analysis import FIG6, FIG6_QUICK, SweepGrid, facts_of, fig6_spec  # noqa: F401
from tdyn.papers.scan_snap.task import yz_config
from tdyn.reproduce.common import claim, decide, every_cell, paired, reading
from tdyn.reproduce.phases import Phases, register_phases
from tdyn.reproduce.registry import ReproduceContext
from tdyn.report import style
from tdyn.schema import Strict


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


# ---------------------------------------------------------------- Fig 6 sweep (shared with Figs 11–12)


def fig6_grid(ctx: ReproduceContext) -> SweepGrid:
    """The sweep's grid: the paper's (or --quick) with the user's grid options in place."""
    return (FIG6_QUICK if ctx.quick else FIG6).with_options(ctx.options)


def fig6_sweeps(ctx: ReproduceContext) -> dict[str, dict]:
    """The sweep, into ``fig6[-quick]-<digest>`` under ``--sweep-dir`` (default OUT/runs). It uses the paper's
    seeds 1..10 (``--seed`` is not used)."""
    return {"fig6-quick" if ctx.quick else "fig6": fig6_spec(fig6_grid(ctx))}


def fig6_configs(ctx: ReproduceContext) -> dict[str, dict]:
    """The sweep's base run config, what ``tdyn config`` prints and ``--set`` is checked against (the sweep sets
    data.num_last, η_Z and η_Y per run: overriding one of those axes is an error, as the sweep would shadow it)."""
    spec = fig6_spec(fig6_grid(ctx))
    axes = {k for kind in ("grid", "zip") for k in spec["axes"][kind]}
    swept = [o for o in ctx.overrides if override_key(o) in axes]
    if swept:
        raise UserError(f"--set {swept[0]}: {override_key(swept[0])} is an axis of the Fig 6 sweep "
                        f"({', '.join(sorted(axes))}); the sweep would shadow the override")
    return {"fig6-sweep-base": spec["config"]}


def sweep_cells(root: Path) -> dict[tuple, dict]:
    """Each run of the sweep in ``root`` read once (one :class:`tdyn.runs.Run`): per cell (num_last, η_Z, ratio),
    the facts of its distribution, its seeds and their final Z stacked [seeds, M, M] in seed order."""
    facts, cells = {}, {}
    for r in runs.read_sweep(root)["runs"]:
        run = runs.Run(root / r["name"])
        nl = r["axes"]["data.num_last"]
        if nl not in facts:
            facts[nl] = facts_of(run.config)
        eta_y, eta_z = run.lrs["Y"], run.lrs["Z"]
        cells.setdefault((nl, eta_z, round(eta_y / eta_z, 6)), []).append((r["seed"], run.params("final")["Z"].double()))
    return {k: {"dist": facts[k[0]], "seeds": [s for s, _ in sorted(v, key=lambda x: x[0])],
                "Z": torch.stack([z for _, z in sorted(v, key=lambda x: x[0])])} for k, v in sorted(cells.items())}


# ---------------------------------------------------------------- Fig 6

TABLE_COLS = ["num_last", "num_next", "eta_z", "ratio", "seeds", "entropy_mean", "entropy_std"]


def fig6_measure(ctx: ReproduceContext, trained: dict) -> dict:
    """The Fig 6 entropy (docs/reproductions/scan-snap.md#distinct-token-entropy) of each run's final weights
    (entropy.csv) and its mean ± sample std over seeds per (#query/#next, η_Z, ratio) (table.csv)."""
    (root,) = trained.values()
    table, per_run = [], []
    for (nl, ez, ratio), c in sweep_cells(root).items():
        d = c["dist"]
        H = pr.distinct_entropy(c["Z"], d.table, d.query, d.distinct).numpy()
        table.append({"num_last": nl, "num_next": d.K, "eta_z": ez, "ratio": ratio, "seeds": len(c["seeds"]),
                      "entropy_mean": float(H.mean()), "entropy_std": stats.sd(H)})
        per_run += [{"num_last": nl, "num_next": d.K, "eta_z": ez, "ratio": ratio, "seed": s, "entropy": float(h)}
                    for s, h in zip(c["seeds"], H)]
    return {"table": table, "entropy": per_run}


def _fig6_comparisons(grid: SweepGrid, Hs: dict) -> dict[str, dict]:
    """The paper's trends as paired per-seed comparisons (runs with the same seed share init and data stream),
    each decided with a margin of 2 standard errors: per family, comparison → (verdict, numbers)."""
    ez, rt, panels = grid.etas_z, grid.ratios, grid.num_last

    def cmp(lo_key, hi_key):
        """H(hi_key) − H(lo_key) > 0 supports the claim."""
        diff, se = paired(Hs[hi_key], Hs[lo_key])
        return decide(diff, se), {"diff": diff, "se": se, "verdict": stats.word(decide(diff, se))}

    out = {"dec": {f"{nl}/{2 * nl},ratio={r:g},eta_z={a:g}>{b:g}": cmp((nl, b, r), (nl, a, r))
                   for nl in panels if nl != 1 for r in rt for a, b in zip(ez, ez[1:])},
           "dec_small": {f"1/2,ratio={r:g},eta_z={a:g}>{b:g}": cmp((1, b, r), (1, a, r))
                         for r in rt for a, b in zip(ez, ez[1:])} if 1 in panels else {},
           "past2": {f"{nl}/{2 * nl},eta_z={e:g}": cmp((nl, e, 2.0), (nl, e, rt[-1])) for nl in panels for e in ez}
           if 2.0 in rt else {},
           "dip": {},
           "rise": {f"1/2,eta_z={e:g},ratio={a:g}<{b:g}": cmp((1, e, a), (1, e, b))
                    for e in ez if e <= 1 for a, b in zip(rt, rt[1:])} if 1 in panels else {}}
    if {1.0, 2.0, 10.0} <= set(rt):
        for nl in [nl for nl in panels if 2 * nl >= 6]:
            for e in [e for e in ez if e >= 1]:
                out["dip"][f"{nl}/{2 * nl},eta_z={e:g},vs_ratio1"] = cmp((nl, e, 2.0), (nl, e, 1.0))
                out["dip"][f"{nl}/{2 * nl},eta_z={e:g},vs_ratio10"] = cmp((nl, e, 2.0), (nl, e, 10.0))
    return out


FIG6_DEFINITION = (
    "per seed: the Fig 6 entropy (docs/reproductions/scan-snap.md#distinct-token-entropy) of the final weights; per "
    "comparison: the paired per-seed difference, mean ± SE over seeds, decided with a margin of 2 SE; the claim holds "
    "if every comparison holds, fails if any fails, else inconclusive")


def fig6_judge(ctx: ReproduceContext, tables: dict) -> dict:
    """The four Fig 6 trends from the per-run entropies (entropy.csv)."""
    grid = fig6_grid(ctx)
    Hs: dict[tuple, list] = {}
    for r in tables["entropy"]:        # in seed order within a cell
        Hs.setdefault((r["num_last"], r["eta_z"], r["ratio"]), []).append(r["entropy"])
    c = _fig6_comparisons(grid, {k: np.array(v) for k, v in Hs.items()})
    verdict = lambda cells: every_cell({k: v for k, (v, _) in cells.items()})  # noqa: E731
    nums = lambda cells: {k: n for k, (_, n) in cells.items()}  # noqa: E731
    rt, defn = grid.ratios, FIG6_DEFINITION
    v1, r1 = verdict(c["dec"])
    v2, r2 = verdict(c["past2"])
    v3, r3 = verdict(c["dip"])
    v4, r4 = verdict(c["rise"])
    claims = [
        claim("entropy-decreases-with-eta-z", "Entropy decreases with η_Z at every ratio (exceptions allowed only in "
              "the noisy 1/2 panel)", v1, reason=r1, source="paper",
              quote="entropy falls with larger η_Z (Fig 6, docs/reproductions/scan-snap.md#figures); a larger η_Z, or both "
                    "rates scaled, gives a sparser one (§6 prediction (b), docs/reproductions/scan-snap.md#snap-phase-transition)",
              paper="Fig 6; §6 prediction (b) (larger η_Z, sparser attention)",
              definition=defn, measured="H(η_Z) − H(next larger η_Z) per (panel ≠ 1/2, ratio)",
              expected="> 0 beyond 2 SE in every comparison", comparisons=nums(c["dec"]),
              comparisons_1_2_panel_not_judged=nums(c["dec_small"])),
        claim("rises-past-ratio-2", "At fixed η_Z, entropy rises once the ratio passes about 2 (ratio-10 entropy "
              "above ratio-2)", v2, reason=r2, source="paper",
              quote="at fixed η_Z it rises once the ratio passes about 2 (Fig 6, docs/reproductions/scan-snap.md#figures); "
                    "Empirically, (c) shows only once η_Y/η_Z exceeds about 2, since the theory needs η_Y ≫ η_Z "
                    "(§8, docs/reproductions/scan-snap.md#snap-phase-transition)",
              paper="Fig 6; §6 prediction (c) (shows once η_Y/η_Z > 2, §8)",
              definition=defn, measured=f"H(ratio {rt[-1]:g}) − H(ratio 2) per (panel, η_Z)",
              expected="> 0 beyond 2 SE in every (panel, η_Z)", comparisons=nums(c["past2"])),
        claim("dip-at-ratio-2", "For K ≥ 6 and η_Z ≥ 1 the ratio-2 entropy is below both ratio 1 and ratio 10",
              v3, reason=r3, source="paper", quote="dip at ratio 2 for K ≥ 6 (Fig 6, docs/reproductions/scan-snap.md#figures)",
              paper="Fig 6 (dip at ratio 2 for K ≥ 6)", definition=defn,
              measured="H(ratio 1) − H(ratio 2) and H(ratio 10) − H(ratio 2) (K ≥ 6, η_Z ≥ 1)",
              expected="> 0 beyond 2 SE in every such cell", comparisons=nums(c["dip"])),
        claim("small-panel-rises", "In the 1/2 panel entropy rises with the ratio for η_Z ≤ 1", v4, reason=r4,
              source="paper", quote="in 1/2, entropy rises with the ratio for η_Z ≤ 1 (Fig 6's 1/2 panel, as read "
                                    "in docs/reproductions/scan-snap.md#scan-snapfig6)",
              paper="Fig 6 (1/2 panel)", definition=defn,
              measured="H(next larger ratio) − H(ratio), 1/2 panel, η_Z ≤ 1",
              expected="> 0 beyond 2 SE at each step of the ratio axis", comparisons=nums(c["rise"])),
    ]
    return {"experiment": "scan-snap/fig6", "grid": grid.as_dict(), "runs": len(tables["entropy"]), "claims": claims}


def fig6_draw(ctx: ReproduceContext, tables: dict, results: dict) -> list[str]:
    """Entropy (mean ± std over seeds) against η_Y/η_Z per η_Z, one panel per #query/#next."""
    plt = style.pyplot()
    grid, rows = fig6_grid(ctx), tables["table"]
    style.apply()
    n = len(grid.num_last)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.4), squeeze=False)
    for ax, nl in zip(axes[0], grid.num_last):
        for i, ez in enumerate(grid.etas_z):
            rr = [r for r in rows if r["num_last"] == nl and r["eta_z"] == ez]
            ax.errorbar([r["ratio"] for r in rr], [r["entropy_mean"] for r in rr], yerr=[r["entropy_std"] for r in rr],
                        marker="o", ms=4, capsize=2, color=style.PALETTE[i], label=f"η_Z={ez:g}")
        ax.set_xscale("log")
        ax.set_xticks(grid.ratios, [f"{r:g}" for r in grid.ratios])
        ax.set_title(f"#last/next = {nl}/{2 * nl}")
        ax.set_xlabel("η_Y/η_Z")
    axes[0, 0].set_ylabel("avg distinct-token entropy (nats)")
    axes[0, 0].legend()
    style.save(fig, ctx.out / "fig6.png")
    return ["fig6.png"]


register_phases("scan-snap/fig6", Phases(sweeps=fig6_sweeps, measure=fig6_measure, judge=fig6_judge, draw=fig6_draw,
                                         tables=("table", "entropy"), columns={"table": TABLE_COLS}),
                configs=fig6_configs, options=SweepOptions)


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
RECALL_COLS = ["num_last", "num_next", "eta_z", "ratio", "threshold", "seeds", "recall_mean", "recall_std"]
RATE_COLS = ["reading", "num_last", "num_next", "eta_z", "ratio", "seeds", "descent_rate_mean", "descent_rate_se",
             "recall_level_mean"]
CELL_COLS = ["claim", "reading", "panel", "fixed", "sparser_cell", "denser_cell", "rate_sparser", "rate_denser", "diff",
             "noise_se", "band", "verdict"]


def fig11_12_measure(ctx: ReproduceContext, trained: dict) -> dict:
    """Recall (docs/reproductions/scan-snap.md#recall-at-threshold: softmax over all M tokens per query, tag ≥
    threshold, share of the query's distinct tokens tagged) per run, mean over seeds per cell (recall.csv); each
    run's descent rate by every reading, mean ± SE per cell (descent_rate.csv), and the paired seed differences
    between the two ends of each swept axis (descent_cells.csv)."""
    (root,) = trained.values()
    recall, rates, level = [], {}, {}
    for (nl, e, ratio), c in sweep_cells(root).items():
        d, Zs = c["dist"], c["Z"]
        thr = torch.linspace(*RECALL_THRESHOLDS[nl], 11, dtype=torch.float64)
        rec = pr.recall(Zs, d.query, d.distinct, thr).numpy()        # [seeds, T]
        level[nl, e, ratio] = rec.mean(1)
        for name, _, axis, how in DESCENT_READINGS:
            x = axis(nl, d.M)
            y = rec if x.shape == thr.shape and np.allclose(x, thr.numpy()) else pr.recall(Zs, d.query, d.distinct, torch.tensor(x)).numpy()
            rates[name, nl, e, ratio] = pr.descent_rate(x, y, how)   # [seeds]
        recall += [{"num_last": nl, "num_next": d.K, "eta_z": e, "ratio": ratio, "threshold": float(t),
                    "seeds": len(c["seeds"]), "recall_mean": float(m), "recall_std": float(s)}
                   for t, m, s in zip(thr.numpy(), rec.mean(0), [stats.sd(col) for col in rec.T])]
    rate_rows = [{"reading": name, "num_last": nl, "num_next": 2 * nl, "eta_z": e, "ratio": r, "seeds": len(v),
                  "descent_rate_mean": float(np.mean(v)), "descent_rate_se": stats.se(v),
                  "recall_level_mean": float(level[nl, e, r].mean())}
                 for (name, nl, e, r), v in rates.items()]
    return {"recall": recall, "descent_rate": rate_rows, "descent_cells": _descent_cells(fig6_grid(ctx), rates)}


def _claim_axes(grid: SweepGrid) -> dict[str, list[tuple]]:
    """Per claim, its cells: (panel, the fixed value, the sparser end, the denser end) of the swept axis."""
    ez, rt = grid.etas_z, grid.ratios
    return {"smaller-ratio-sparser": [(nl, f"eta_z={e:g}", (nl, e, rt[0]), (nl, e, rt[-1])) for nl in grid.num_last for e in ez],
            "larger-eta-z-sparser": [(nl, f"ratio={r:g}", (nl, ez[-1], r), (nl, ez[0], r)) for nl in grid.num_last for r in rt]}


def _descent_cells(grid: SweepGrid, rates: dict) -> list[dict]:
    """Per (claim, reading, cell): the denser end's descent rate minus the sparser end's, paired per seed, and its SE
    (> 0 supports the claim: the sparser end, expected to descend more slowly)."""
    rows = []
    for cname, cells in _claim_axes(grid).items():
        for name, _, _, _ in DESCENT_READINGS:
            for nl, fixed, sparse, dense in cells:
                a, b = rates[(name, *sparse)], rates[(name, *dense)]
                diff, noise = paired(b, a)
                rows.append({"claim": cname, "reading": name, "panel": f"{nl}/{2 * nl}", "fixed": fixed,
                             "sparser_cell": f"eta_z={sparse[1]:g},ratio={sparse[2]:g}",
                             "denser_cell": f"eta_z={dense[1]:g},ratio={dense[2]:g}",
                             "rate_sparser": float(np.mean(a)), "rate_denser": float(np.mean(b)),
                             "diff": diff, "noise_se": noise, "band": 2 * noise, "verdict": stats.word(decide(diff, noise))})
    return rows


def _descent_readings(cells: list[dict]) -> dict[str, list[dict]]:
    """Per claim, one reading per descent-rate definition: every (panel, cell) decided with a margin of 2 SE."""
    out: dict[str, list[dict]] = {}
    for cname in dict.fromkeys(c["claim"] for c in cells):
        for name, desc, _, _ in DESCENT_READINGS:
            verdicts, per_panel = {}, {}
            for c in cells:
                if c["claim"] == cname and c["reading"] == name:
                    v = decide(c["diff"], c["noise_se"])
                    verdicts[f"{c['panel']},{c['fixed']}"] = v
                    per_panel.setdefault(c["panel"], {})[c["fixed"]] = stats.word(v)
            held, why = every_cell(verdicts)
            out.setdefault(cname, []).append(reading(
                f"{name}: {desc}", held, reason=why,
                cells_holding=sum(v is True for v in verdicts.values()),
                cells_failing=sum(v is False for v in verdicts.values()), cells=len(verdicts), per_panel=per_panel))
    return out


FIG11_12_DEFINITION = (
    "descent rate of a run's recall–threshold curve (recall: docs/reproductions/scan-snap.md#recall-at-threshold), per "
    "seed; per cell the paired seed-mean difference between the two ends of the swept axis, decided with a margin of 2 "
    "standard errors; a reading holds if every (panel, cell) holds, fails if any cell fails")


def fig11_12_judge(ctx: ReproduceContext, tables: dict) -> dict:
    """The paper reads sparsity from the descent rate of recall against threshold (App G; a sparser map descends
    more slowly), not its level: both claims, per panel and cell, from descent_cells.csv, one reading per fit."""
    grid = fig6_grid(ctx)
    ez, rt = grid.etas_z, grid.ratios
    readings = _descent_readings(tables["descent_cells"])
    claims = [
        claim("smaller-ratio-sparser", f"Smaller η_Y/η_Z gives sparser attention, i.e. a slower descent of recall with "
              f"threshold: descent rate at ratio {rt[0]:g} below ratio {rt[-1]:g} in every (panel, η_Z) cell",
              source="paper", quote="a sparser attention map gives a slower descent of the recall–threshold line; "
                                    "the Fig 11 / Fig 12 captions draw the conclusions (smaller η_Y/η_Z […] give a smaller "
                                    "descent rate, hence sparser attention) (App G and the Fig 11 caption, as stated in "
                                    "docs/reproductions/scan-snap.md#recall-at-threshold)",
              paper="App. G, Fig 11 caption (smaller η_Y/η_Z → smaller descent rate → sparser attention)",
              definition=FIG11_12_DEFINITION, measured="descent rate per (panel, η_Z, ratio), per seed",
              expected=f"rate(ratio {rt[0]:g}) < rate(ratio {rt[-1]:g}) beyond 2 SE in every cell",
              readings=readings["smaller-ratio-sparser"]),
        claim("larger-eta-z-sparser", f"Larger η_Z gives sparser attention (slower descent): descent rate at "
              f"η_Z={ez[-1]:g} below η_Z={ez[0]:g} in every (panel, ratio) cell",
              source="paper", quote="a sparser attention map gives a slower descent of the recall–threshold line; "
                                    "the Fig 11 / Fig 12 captions draw the conclusions ([…] larger η_Z, give a smaller "
                                    "descent rate, hence sparser attention) (App G and the Fig 12 caption, as stated in "
                                    "docs/reproductions/scan-snap.md#recall-at-threshold)",
              paper="App. G, Fig 12 caption (larger η_Z → smaller descent rate → sparser attention)",
              definition=FIG11_12_DEFINITION, measured="descent rate per (panel, ratio, η_Z), per seed",
              expected=f"rate(η_Z={ez[-1]:g}) < rate(η_Z={ez[0]:g}) beyond 2 SE in every cell",
              readings=readings["larger-eta-z-sparser"]),
    ]
    first = DESCENT_READINGS[0][0]
    return {"experiment": "scan-snap/fig11-12", "grid": grid.as_dict(),
            "runs": sum(r["seeds"] for r in tables["descent_rate"] if r["reading"] == first), "claims": claims}


def fig11_12_draw(ctx: ReproduceContext, tables: dict, results: dict) -> list[str]:
    """Fig 11 (recall curves per ratio, a panel per (#query, η_Z)), Fig 12 (per η_Z, a panel per (#query, ratio)),
    and the descent rate of every reading against the ratio."""
    plt = style.pyplot()
    grid = fig6_grid(ctx)
    style.apply()
    rate = {(r["reading"], r["num_last"], r["eta_z"], r["ratio"]): r for r in tables["descent_rate"]}
    for name in ("fig11", "fig12"):
        _recall_figure(plt, name, grid, tables["recall"], rate, ctx.out)
    _descent_figure(plt, grid, rate, ctx.out)
    return ["fig11.png", "fig12.png", "descent_rate.png"]


def _recall_figure(plt, name: str, grid: SweepGrid, recall: list[dict], rate: dict, out: Path) -> None:
    ez, rt, panels = grid.etas_z, grid.ratios, grid.num_last
    outer, inner, lab_o, lab_i = (ez, rt, "η_Z", "η_Y/η_Z") if name == "fig11" else (rt, ez, "η_Y/η_Z", "η_Z")
    fig, axes = plt.subplots(len(panels), len(outer), figsize=(2.8 * len(outer), 2.2 * len(panels) + 0.4),
                             squeeze=False, constrained_layout=True)
    for i, nl in enumerate(panels):
        for j, o in enumerate(outer):
            ax = axes[i, j]
            rates = []
            for k, v in enumerate(inner):
                e, r = (o, v) if name == "fig11" else (v, o)
                curve = [x for x in recall if x["num_last"] == nl and x["eta_z"] == e and x["ratio"] == r]
                ax.plot([x["threshold"] for x in curve], [x["recall_mean"] for x in curve], marker=".",
                        color=style.PALETTE[k], label=f"{lab_i} = {v:g}")
                rates.append(f"{rate['lsq-paper-axis', nl, e, r]['descent_rate_mean']:.0f}")
            # each curve's descent rate (lsq), in the curves' order and colours' order: one legible line
            ax.text(0.97, 0.96, "rates " + ", ".join(rates), transform=ax.transAxes, ha="right", va="top",
                    fontsize=8)
            ax.set_title(f"{nl}/{2 * nl}, {lab_o}={o:g}", fontsize=9)
            ax.set_ylim(-0.02, 1.1)
            ax.xaxis.set_major_locator(plt.MaxNLocator(4))
            if i == len(panels) - 1:
                ax.set_xlabel("threshold")
            if j == 0:
                ax.set_ylabel("recall")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=len(inner), fontsize=9,
               frameon=False, title=f"colour: {lab_i}; \"rates\": each curve's descent rate (lsq), in this order",
               title_fontsize=9)
    fig.savefig(out / f"{name}.png", dpi=100)      # 16 panels: a lower resolution keeps the file small
    plt.close(fig)


def _descent_figure(plt, grid: SweepGrid, rate: dict, out: Path) -> None:
    ez, rt, panels = grid.etas_z, grid.ratios, grid.num_last
    fig, axes = plt.subplots(len(DESCENT_READINGS), len(panels), figsize=(3.2 * len(panels), 2.6 * len(DESCENT_READINGS) + 0.8),
                             squeeze=False, layout="constrained")
    for i, (name, _, _, _) in enumerate(DESCENT_READINGS):
        for j, nl in enumerate(panels):
            ax = axes[i, j]
            for k, e in enumerate(ez):
                v = [rate[name, nl, e, r] for r in rt]
                ax.errorbar(rt, [x["descent_rate_mean"] for x in v], yerr=[2 * x["descent_rate_se"] for x in v],
                            marker="o", ms=3, capsize=2, color=style.PALETTE[k], label=f"η_Z={e:g}")
            ax.set_xscale("log")
            ax.set_xticks(rt, [f"{r:g}" for r in rt])
            ax.set_title(f"#last/next {nl}/{2 * nl}", fontsize=10)
            if i == len(DESCENT_READINGS) - 1:
                ax.set_xlabel("η_Y/η_Z")
            if j == 0:
                ax.set_ylabel(f"{name}\n−dR/dθ (±2 SE)")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=len(ez), frameon=False)
    fig.suptitle("Descent rate of recall R against the attention threshold θ, per reading (rows) and query count "
                 "(columns)")
    style.save(fig, out / "descent_rate.png")


register_phases("scan-snap/fig11-12", Phases(sweeps=fig6_sweeps, measure=fig11_12_measure, judge=fig11_12_judge,
                                             draw=fig11_12_draw, tables=("recall", "descent_rate", "descent_cells"),
                                             columns={"recall": RECALL_COLS, "descent_rate": RATE_COLS,
                                                      "descent_cells": CELL_COLS}),
                configs=fig6_configs, options=SweepOptions)
