"""Scan and Snap trained reproductions beyond Fig 4 (Tian et al. 2023 §8, App G; spec §5–7, §13).

* ``scan-snap/fig5``: Syn-Small with Adam, η_Y = η_Z ∈ {0.1, 0.5, 1};
* ``scan-snap/fig6``: the Syn-Medium sweep (640 runs as 4 ensemble jobs) and its entropy table;
* ``scan-snap/fig11-12``: recall vs attention threshold from the same sweep's final weights;
* ``scan-snap/thm3``: the Thm 3 invariant in the long-sequence regime;
* ``scan-snap/snap-time``: measured phase-transition time vs the predicted 2K ln M/η_Y.
"""

from __future__ import annotations

import hashlib
import json

import math
from pathlib import Path

import numpy as np
import torch

from pydantic import Field

from tdyn import runs
from tdyn.config import override_key
from tdyn.errors import UserError
from tdyn.schema import Strict
from tdyn.bench import register_bench
from tdyn.data import scan_snap as data
from tdyn.experiments.common import (claim, configure, decide, every_cell, margin, paired, reading, train_into,
                                    within, write_csv)
from tdyn.experiments.registry import ReproduceContext, register
from tdyn.experiments.scan_snap import yz_config
from tdyn.probes import scan_snap as pr
from tdyn.theory import scan_snap as th


def _facts(cfg) -> data.SequenceClasses:
    return data.build(data.ScanSnapDataConfig.model_validate(cfg.data))


def _final(run_dir: Path, name: str = "Z") -> torch.Tensor:
    return runs.Run(run_dir).params("final")[name].double()


def _lrs(run_dir: Path) -> tuple[float, float]:
    lrs = runs.Run(run_dir).lrs
    return lrs["Y"], lrs["Z"]


class SweepOptions(Strict):
    """Options of scan-snap/fig6 and fig11-12 (``--sweep-dir DIR``)."""

    sweep_dir: Path | None = Field(None, description="where the Fig 6 sweep's runs live (default OUT/runs); "
                                   "an earlier scan-snap/fig6 --out also works. Figs 6 and 11-12 given the same "
                                   "directory train once")


# ---------------------------------------------------------------- Fig 6 sweep (shared with Figs 11–12)

FIG6 = {"num_last": [1, 3, 5, 10], "etas_z": [0.5, 1.0, 2.0, 3.0], "ratios": [1.0, 2.0, 5.0, 10.0],
        "seeds": list(range(1, 11)), "steps": 100}
FIG6_QUICK = {"num_last": [1, 3], "etas_z": [0.5, 3.0], "ratios": [1.0, 2.0, 10.0], "seeds": [1, 2, 3], "steps": 100}


def fig6_spec(grid: dict = FIG6, overrides: list[str] = ()) -> dict:
    """The sweep as a ``tdyn sweep`` spec: #query panels × zipped (η_Z, η_Y = ratio·η_Z) × seeds.

    The authors' command (spec §5.2): Syn-Medium, SGD momentum 0.9, batch 128, length 128,
    100 steps, PyTorch-default init. Each panel's 10 seeds × 16 learning-rate pairs train as one
    ensemble job. Probes only at the start and the end (the sweep needs only the final weights).
    """
    base = yz_config(data.syn_medium(grid["num_last"][0]), steps=grid["steps"], init="torch_default")
    base["probes"] = {"names": [], "every": grid["steps"] or 1}
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
    from tdyn.sweep import run_sweep

    overrides = ctx.overrides
    grid = FIG6_QUICK if ctx.quick else FIG6
    configure(fig6_configs(ctx)["fig6-sweep-base"], overrides)  # validates (and consumes) the overrides
    opts = ctx.options or SweepOptions()
    base = Path(opts.sweep_dir or ctx.out / "runs")
    if (base / runs.RESULTS).exists() and (base / "runs").is_dir():     # an earlier fig6 --out
        base = base / "runs"
    spec = fig6_spec(grid, list(overrides))
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
    spec = fig6_spec(FIG6_QUICK if ctx.quick else FIG6)
    axes = {k for kind in ("grid", "zip") for k in spec["axes"][kind]}
    swept = [o for o in ctx.overrides if override_key(o) in axes]
    if swept:
        raise UserError(f"--set {swept[0]}: {override_key(swept[0])} is an axis of the Fig 6 sweep "
                        f"({', '.join(sorted(axes))}); the sweep would shadow the override")
    return {"fig6-sweep-base": spec["config"]}


@register("scan-snap/fig6", "Syn-Medium sweep (640 runs): distinct-token entropy vs η_Y/η_Z per η_Z — "
          "larger η_Z sparser; rises past ratio ≈ 2", configs=fig6_configs, options=SweepOptions)
def fig6(ctx: ReproduceContext) -> dict:
    """Entropy of the final attention's renormalised distinct-token distribution (spec §7.2),
    mean ± sample std over 10 seeds, per (#query/#next, η_Z, ratio)."""
    from tdyn.report import style

    grid, records = fig6_sweep(ctx)
    rows, Hs = [], {}
    for (nl, ez, ratio), rs in sorted(_cells(records).items()):
        d = rs[0]["dist"]
        rs = sorted(rs, key=lambda r: r["seed"])
        H = pr.distinct_entropy(_stack_Z(rs), d.table, d.query, d.distinct).numpy()
        Hs[nl, ez, ratio] = H
        rows.append({"num_last": nl, "num_next": d.K, "eta_z": ez, "ratio": ratio, "seeds": len(rs),
                     "entropy_mean": float(H.mean()), "entropy_std": float(H.std(ddof=1)) if len(H) > 1 else float("nan")})
    cols = ["num_last", "num_next", "eta_z", "ratio", "seeds", "entropy_mean", "entropy_std"]
    write_csv(ctx.out / "table.csv", rows, cols)
    E = {(r["num_last"], r["eta_z"], r["ratio"]): r["entropy_mean"] for r in rows}

    import matplotlib.pyplot as plt

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

    # ---- the paper's trends (spec §8, §13 test 6), each comparison decided with a margin of 2 standard errors
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

    defn = ("per seed: the Fig 6 entropy (spec §7.2) of the final weights; per comparison: the paired per-seed "
            "difference, mean ± SE over seeds, decided with a margin of 2 SE; the claim holds if every comparison "
            "holds, fails if any fails, else inconclusive")
    v1, r1 = verdict(dec)
    v2, r2 = verdict(past2)
    v3, r3 = verdict(dip)
    v4, r4 = verdict(rise)
    claims = [
        claim("entropy-decreases-with-eta-z", "Entropy decreases with η_Z at every ratio (exceptions allowed only in "
              "the noisy 1/2 panel)", v1, reason=r1, paper="Fig 6; §6 prediction (b) (larger η_Z, sparser attention)",
              definition=defn, measured="H(η_Z) − H(next larger η_Z) per (panel ≠ 1/2, ratio)",
              expected="> 0 beyond 2 SE in every comparison", comparisons=nums(dec),
              comparisons_1_2_panel_not_judged=nums(dec_small)),
        claim("rises-past-ratio-2", "At fixed η_Z, entropy rises once the ratio passes about 2 (ratio-10 entropy "
              "above ratio-2)", v2, reason=r2, paper="Fig 6; §6 prediction (c) (shows once η_Y/η_Z > 2, §8)",
              definition=defn, measured=f"H(ratio {rt[-1]:g}) − H(ratio 2) per (panel, η_Z)",
              expected="> 0 beyond 2 SE in every (panel, η_Z)", comparisons=nums(past2)),
        claim("dip-at-ratio-2", "For K ≥ 6 and η_Z ≥ 1 the ratio-2 entropy is below both ratio 1 and ratio 10",
              v3, reason=r3, paper="Fig 6 (dip at ratio 2 for K ≥ 6)", definition=defn,
              measured="H(ratio 1) − H(ratio 2) and H(ratio 10) − H(ratio 2) (K ≥ 6, η_Z ≥ 1)",
              expected="> 0 beyond 2 SE in every such cell", comparisons=nums(dip)),
        claim("small-panel-rises", "In the 1/2 panel entropy rises with the ratio for η_Z ≤ 1", v4, reason=r4,
              paper="Fig 6 (1/2 panel)", definition=defn,
              measured="H(next larger ratio) − H(ratio), 1/2 panel, η_Z ≤ 1",
              expected="> 0 beyond 2 SE at each step of the ratio axis", comparisons=nums(rise)),
    ]
    return {"experiment": "scan-snap/fig6", "grid": grid, "runs": len(records), "claims": claims,
            "files": ["table.csv", "fig6.png"]}


# ---------------------------------------------------------------- verdict helpers (shared by the claims below)


# ---------------------------------------------------------------- Figs 11–12

RECALL_THRESHOLDS = {1: (0.028, 0.038), 3: (0.012, 0.016), 5: (0.0075, 0.0105), 10: (0.0040, 0.0050)}

#: The open definition of the descent rate (App G does not say over which range or how it is fitted):
#: each reading is (name, description, threshold axis from (num_last, M), fit).
DESCENT_READINGS = (
    ("lsq-paper-axis", "−(least-squares slope) of recall vs threshold over the panel's plotted threshold axis "
     "(spec §7.3: 11 thresholds)", lambda nl, M: np.linspace(*RECALL_THRESHOLDS[nl], 11), "lsq"),
    ("secant-paper-axis", "(recall at the axis's first threshold − at its last)/(axis width), the panel's plotted "
     "axis", lambda nl, M: np.linspace(*RECALL_THRESHOLDS[nl], 11), "secant"),
    ("lsq-wide-axis", "−(least-squares slope) of recall vs threshold over [0.5/M, 2/M] (31 thresholds; the plotted "
     "axes all lie near 0.9/M–1.3/M)", lambda nl, M: np.linspace(0.5 / M, 2.0 / M, 31), "lsq"),
)


@register("scan-snap/fig11-12", "Recall of distinct tokens vs attention threshold from the Fig 6 sweep's final "
          "weights: smaller ratio or larger η_Z → sparser, read from the descent rate",
          configs=fig6_configs, options=SweepOptions)
def fig11_12(ctx: ReproduceContext) -> dict:
    """Recall (spec §7.3: softmax over all M tokens per query, tag ≥ threshold, share of the query's
    distinct tokens tagged), mean over seeds; Fig 11 curves per ratio, Fig 12 curves per η_Z.
    Reuses the Fig 6 runs under the same ``sweep_dir`` (trains them only if absent).

    **How the paper reads the curves** (App G and the Fig 11/12 captions; spec §7.3): sparsity is read
    from the *descent rate* of recall against threshold — a sparser attention map gives a slower
    descent — not from the level of recall. The two claims (smaller η_Y/η_Z ⇒ sparser; larger η_Z ⇒
    sparser) are judged per panel and cell by the descent rate: per seed, the rate of each run's
    recall curve; per cell, the paired seed difference between the two ends of the swept axis
    (ratio 1 vs 10 at fixed η_Z; η_Z 0.5 vs 3 at fixed ratio) and its standard error. The paper leaves
    the fit open, so each reading in ``DESCENT_READINGS`` is measured side by side.
    """
    from tdyn.report import style

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
                 for t, m, s in zip(thr.numpy(), rec.mean(0), rec.std(0, ddof=1) if len(rs) > 1 else np.full(len(thr), np.nan))]
    write_csv(ctx.out / "recall.csv", rows, ["num_last", "num_next", "eta_z", "ratio", "threshold", "seeds",
                                             "recall_mean", "recall_std"])
    se = lambda v: float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")  # noqa: E731
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

    import matplotlib.pyplot as plt

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

    definition = ("descent rate of a run's recall–threshold curve (recall: spec §7.3), per seed; per cell the paired "
                  "seed-mean difference between the two ends of the swept axis, decided with a margin of 2 standard "
                  "errors; a reading holds if every (panel, cell) holds, fails if any cell fails")
    claims = [
        claim("smaller-ratio-sparser", f"Smaller η_Y/η_Z gives sparser attention, i.e. a slower descent of recall with "
              f"threshold: descent rate at ratio {rt[0]:g} below ratio {rt[-1]:g} in every (panel, η_Z) cell",
              paper="App. G, Fig 11 caption (smaller η_Y/η_Z → smaller descent rate → sparser attention)",
              definition=definition, measured="descent rate per (panel, η_Z, ratio), per seed",
              expected=f"rate(ratio {rt[0]:g}) < rate(ratio {rt[-1]:g}) beyond 2 SE in every cell",
              readings=readings["smaller-ratio-sparser"]),
        claim("larger-eta-z-sparser", f"Larger η_Z gives sparser attention (slower descent): descent rate at "
              f"η_Z={ez[-1]:g} below η_Z={ez[0]:g} in every (panel, ratio) cell",
              paper="App. G, Fig 12 caption (larger η_Z → smaller descent rate → sparser attention)",
              definition=definition, measured="descent rate per (panel, ratio, η_Z), per seed",
              expected=f"rate(η_Z={ez[-1]:g}) < rate(η_Z={ez[0]:g}) beyond 2 SE in every cell",
              readings=readings["larger-eta-z-sparser"]),
    ]
    return {"experiment": "scan-snap/fig11-12", "grid": grid, "runs": len(records), "claims": claims,
            "files": ["recall.csv", "descent_rate.csv", "descent_cells.csv", "fig11.png", "fig12.png",
                      "descent_rate.png"]}


# ---------------------------------------------------------------- Fig 5

FIG5_ETAS = [0.1, 0.5, 1.0]


def fig5_config(seed: int = 0) -> dict:
    """Fig 4's command with Adam (default betas), η_Y = η_Z ∈ {0.1, 0.5, 1} (spec §5.2), zero init; 3 seeds
    (data streams) so that the rate-to-rate difference can be set against the seed-to-seed one."""
    from tdyn.experiments.scan_snap import FIG4_ROWS

    cfg = yz_config(data.SYN_SMALL, optimizer="adam", seeds=(seed, seed + 1, seed + 2))
    cfg["ensemble"] = {"lrs": [{"Y": e, "Z": e} for e in FIG5_ETAS]}
    cfg["checkpoint"] = {"schedule": "none", "steps": FIG4_ROWS}
    return cfg


def fig5_configs(ctx: ReproduceContext) -> dict[str, dict]:
    cfg = fig5_config(ctx.seed)
    if ctx.quick:
        cfg["optim"]["steps"] = 50
    return {"fig5": cfg}


@register("scan-snap/fig5", "Syn-Small with Adam, η ∈ {0.1, 0.5, 1}: different rates pick different distinct tokens",
          default_config=fig5_config, configs=fig5_configs)
def fig5(ctx: ReproduceContext) -> dict:
    """c_n maps of class n = 1 (tokens 0–19; rows = iterations 0..10 and Final) per learning rate.

    The subset a run "picks" is the set of the class's distinct tokens holding at least 10% of its
    renormalised distinct-token attention c_n at the end (uniform share: 1/10)."""
    from tdyn.experiments.scan_snap import FIG4_ROWS
    from tdyn.report import style
    cfg = configure(fig5_configs(ctx)["fig5"], ctx.overrides)
    dist = _facts(cfg)
    dirs = train_into(ctx, "fig5", cfg)
    keys = FIG4_ROWS + ["final"]
    per, rows, allq = {}, [], {}
    for d in dirs:
        eta = _lrs(d)[1]
        run = runs.Run(d)
        seed = run.seed
        Zs = torch.stack([run.params(k)["Z"].double() for k in keys])
        c = pr.c_n(Zs, dist.table, dist.query)                                   # [rows, K, M]
        q = pr.distinct_distribution(Zs[-1:], dist.table, dist.query, dist.distinct)[0]
        picked = [sorted(int(i) for i in torch.nonzero(q[n] >= 0.1).flatten()) for n in range(dist.K)]
        allq[eta, seed] = {"q": q, "picked": picked}
        if seed != ctx.seed:
            continue
        per[eta] = {"c": c, "picked": picked, "argmax": [int(q[n].argmax()) for n in range(dist.K)],
                    "entropy": float(pr.distinct_entropy(Zs[-1:], dist.table, dist.query, dist.distinct)[0])}
        rows += [{"eta": eta, "iteration": str(k), "class": n + 1, "token": l, "c": float(c[i, n, l])}
                 for i, k in enumerate(keys) for n in range(dist.K) for l in range(dist.num_contextual)]
    write_csv(ctx.out / "c_n.csv", rows, ["eta", "iteration", "class", "token", "c"])

    import matplotlib.pyplot as plt

    style.apply()
    fig, axes = plt.subplots(1, len(per), figsize=(4.2 * len(per), 3.2), squeeze=False, constrained_layout=True)
    for ax, (eta, r) in zip(axes[0], per.items()):
        im = ax.imshow(r["c"][:, 0, :20].numpy(), aspect="auto", cmap=style.SEQUENTIAL, vmin=0)
        ax.axvline(9.5, color="w", ls="--", lw=0.8)
        ax.set_yticks(range(len(keys)), [str(k) for k in FIG4_ROWS] + ["Final"])
        ax.set_title(f"Adam, η_Y = η_Z = {eta:g}: c_n, n = 1")
        ax.set_xlabel("token (common | distinct seq1)")
        fig.colorbar(im, ax=ax, fraction=0.05)
    axes[0, 0].set_ylabel("iteration")
    style.save(fig, ctx.out / "fig5.png")

    subsets = {f"eta={e:g},seed={sd}": r["picked"] for (e, sd), r in allq.items()}
    top = [int(torch.nonzero(dist.distinct[n]).max()) for n in range(dist.K)]
    seeds = sorted({sd for _, sd in allq})
    etas = sorted({e for e, _ in allq})
    # reading 1: the ≥ 10% subsets (class 1) differ between at least two rates — in every seed (holds), in none
    # (fails), in some (inconclusive: the difference is not reproducible across data streams)
    differ = {sd: len({tuple(allq[e, sd]["picked"][0]) for e in etas}) > 1 for sd in seeds}
    r1 = True if all(differ.values()) else False if not any(differ.values()) else None
    # reading 2: total-variation distance of the final distinct-token distributions (class 1), between rates
    # (same seed) vs between seeds (same rate): the rate effect must exceed the seed-to-seed one by 2 SE
    tv = lambda a, b: 0.5 * float((a["q"][0] - b["q"][0]).abs().sum())  # noqa: E731
    between = [tv(allq[a, sd], allq[b, sd]) for sd in seeds for i, a in enumerate(etas) for b in etas[i + 1:]]
    within = [tv(allq[e, s1], allq[e, s2]) for e in etas for i, s1 in enumerate(seeds) for s2 in seeds[i + 1:]]
    d_tv = float(np.mean(between) - np.mean(within))
    se_tv = math.sqrt(np.var(between, ddof=1) / len(between) + np.var(within, ddof=1) / len(within)) \
        if len(between) > 1 and len(within) > 1 else float("nan")
    claims = [
        claim("different-subsets", "Different learning rates (Adam) pick different subsets of distinct tokens",
              paper="Fig 5 and its caption (different η pick different subsets of distinct tokens)",
              definition="the subset a run picks: class 1's distinct tokens holding ≥ 10% of its renormalised "
                         "distinct-token attention c_n at the end (uniform share 1/10); compared between rates with "
                         "seed-to-seed noise, two readings",
              measured="class-1 subsets / distinct-distribution distances per (η, seed)",
              expected="subsets differ between rates in every seed; rate-to-rate distance > seed-to-seed beyond 2 SE",
              readings=[
                  reading("subsets (≥ 10% of class 1's distinct attention) differ between at least two rates, "
                          "in every seed", r1, reason="the subsets differ in some seeds only",
                          differ_by_seed={str(k): v for k, v in differ.items()}),
                  reading("total-variation distance of class 1's final distinct distribution: between rates (same "
                          "seed) minus between seeds (same rate), 2-SE margin", decide(d_tv, se_tv),
                          reason="rate-to-rate distance within 2 SE of the seed-to-seed distance",
                          tv_between_rates=float(np.mean(between)), tv_between_seeds=float(np.mean(within)),
                          **margin(d_tv, se_tv, noise_source="SE of the two mean distances combined")),
              ],
              picked_tokens=subsets, final_argmax={f"eta={e:g}": r["argmax"] for e, r in per.items()}, top_p_token=top,
              distinct_entropy={f"eta={e:g}": r["entropy"] for e, r in per.items()}),
    ]
    return {"experiment": "scan-snap/fig5", "config": cfg.model_dump(mode="json"), "claims": claims,
            "files": ["c_n.csv", "fig5.png"]}


# ---------------------------------------------------------------- Thm 3 invariant


def thm3_configs(seed: int, quick: bool) -> dict[str, dict]:
    """Long-sequence regime (spec §13 test 8: L = 1024, B = 128, plain SGD, η_Z = 0.1, η_Y = 1, 300
    steps, zero init) and, for contrast, the paper's Fig 4 setting (L = 128, momentum 0.9, η = 1)."""
    long = yz_config(data.SYN_SMALL | {"seq_len": 512 if quick else 1024}, steps=100 if quick else 300,
                     lr_y=1.0, lr_z=0.1, momentum=0.0, seeds=(seed, seed + 1))
    paper = yz_config(data.SYN_SMALL, steps=100, seeds=(seed, seed + 1))
    for c in (long, paper):
        c["checkpoint"] = {"schedule": "log", "num": 12, "steps": []}
    return {"long_L_sgd": long, "paper_L128_momentum": paper}


@register("scan-snap/thm3", "Thm 3 invariant (1 − e^{−2z})/P(l|n)² equal across a class's distinct tokens "
          "(long sequences, plain SGD)", configs=lambda ctx: thm3_configs(ctx.seed, ctx.quick))
def thm3(ctx: ReproduceContext) -> dict:
    """Coefficient of variation of the invariant over each class's 10 distinct tokens, over
    training, in the long-sequence regime and in the paper's L = 128 momentum setting."""
    from scipy.stats import spearmanr

    from tdyn.report import style

    rows, final, signs, inv_final = [], {}, {}, {}
    for name, raw in thm3_configs(ctx.seed, ctx.quick).items():
        cfg = configure(raw, ctx.overrides)
        dist = _facts(cfg)
        for d in train_into(ctx, name, cfg):
            run = runs.Run(d)
            seed = run.seed
            steps = [s for s in run.steps() if s > 0] + ["final"]
            Z = torch.stack([run.params(s)["Z"].double() for s in steps])
            cv = pr.thm3_cv(Z, dist.table, dist.query, dist.distinct)                    # [steps, K]
            rows += [{"setting": name, "seed": seed, "step": cfg.optim.steps if s == "final" else s, "class": n + 1,
                      "cv": float(cv[i, n])} for i, s in enumerate(steps) for n in range(dist.K)]
            final[f"{name},seed={seed}"] = cv[-1].tolist()
            sg = pr.logit_signs(Z[-1:], dist.table, dist.query, dist.distinct, dist.common)
            zr = Z[-1][dist.query]
            rho = [float(spearmanr(zr[n][dist.distinct[n]].numpy(), dist.table[n][dist.distinct[n]].numpy())[0])
                   for n in range(dist.K)]
            signs[f"{name},seed={seed}"] = {k: float(v[0]) for k, v in sg.items()} | {"spearman": rho}
            inv_final[f"{name},seed={seed}"] = pr.thm3_invariant(Z[-1:], dist.table, dist.query, dist.distinct)[0]
    write_csv(ctx.out / "thm3_cv.csv", rows, ["setting", "seed", "step", "class", "cv"])

    import matplotlib.pyplot as plt

    style.apply()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    names = list(thm3_configs(ctx.seed, ctx.quick))
    for i, key in enumerate(final):
        setting, seed = key.split(",")
        col = style.PALETTE[names.index(setting)]
        for n in range(dist.K):
            rr = [r for r in rows if r["setting"] == setting and f"seed={r['seed']}" == seed and r["class"] == n + 1]
            axes[0].plot([r["step"] for r in rr], [r["cv"] for r in rr], color=col, alpha=0.8,
                         label=setting if (n == 0 and seed == f"seed={ctx.seed}") else None)
        inv = inv_final[key]
        for n in range(dist.K):
            m = dist.distinct[n]
            axes[1].plot(dist.table[n][m].numpy(), (inv[n][m] / inv[n][m].mean()).numpy(), "o-", color=col, ms=3,
                         alpha=0.7)
    axes[0].axhline(0.1, color="grey", ls=":", label="CV = 0.1")
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("CV over distinct tokens, per class")
    axes[0].legend()
    axes[1].set_xlabel("P(l|n)")
    axes[1].set_ylabel("(1 − e^{−2z})/P² ÷ class mean (final)")
    axes[1].set_title("flat = Thm 3 invariant holds")
    style.save(fig, ctx.out / "thm3.png")

    lg = {k: v for k, v in final.items() if k.startswith("long")}
    pp = {k: v for k, v in final.items() if k.startswith("paper")}
    sl = {k: v for k, v in signs.items() if k.startswith("long")}
    se = lambda v: float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")  # noqa: E731
    # CV ≤ 0.1 (spec §13 test 8's stated tolerance): the worst class per seed, mean and SE over seeds
    worst = [max(v) for v in lg.values()]
    cv_diff, cv_se = 0.1 - float(np.mean(worst)), se(worst)
    # signs: the extreme logits per seed (min distinct > 0, max common < 0), mean and SE over seeds
    mind = [v["min_distinct"] for v in sl.values()]
    maxc = [v["max_common"] for v in sl.values()]
    rho_ok = all(min(v["spearman"]) > 0.999 for v in sl.values())
    sign_v = [decide(float(np.mean(mind)), se(mind)), decide(-float(np.mean(maxc)), se(maxc))]
    sign_held = False if (False in sign_v or not rho_ok) else (True if all(sign_v) else None)
    # spread: mean CV per seed in each setting
    cv_long = [float(np.mean(v)) for v in lg.values()]
    cv_paper = [float(np.mean(v)) for v in pp.values()]
    sp_diff = float(np.mean(cv_paper) - np.mean(cv_long))
    sp_se = math.sqrt(se(cv_paper) ** 2 + se(cv_long) ** 2)
    claims = [
        claim("invariant-cv", "Long sequences, plain SGD: per class, the invariant's coefficient of variation over "
              "the 10 distinct tokens is ≤ 0.1 at the end (spec §13 test 8)", decide(cv_diff, cv_se),
              reason="the worst-class CV is within 2 SE of 0.1",
              paper="Thm 3 (Eqn 108–111; spec §6.2 derivation: (1 − e^{−2z})/P(l|n)² equal across distinct tokens)",
              definition="per class, std/|mean| (population std) of e^{−2z(0)}(1 − e^{−2(z − z(0))})/P(l|n)² over its "
                         "distinct tokens (z(0) = 0 here: zero init); worst class per seed; 0.1 − its seed mean, "
                         "decided with a margin of 2 SE over seeds",
              measured="final CV of the Thm 3 invariant per class (long L, plain SGD)",
              expected="CV ≤ 0.1 for every class, beyond 2 SE", final_cv=lg,
              **margin(cv_diff, cv_se, noise_source="SE over seeds of the worst-class CV")),
        claim("thm2-signs-long", "Long sequences, plain SGD: every common logit < 0, every distinct logit > 0 and "
              "ordered by P(l|n) (Spearman = 1)", sign_held, reason="an extreme logit is within 2 SE of 0",
              paper="Thm 2 (a), (b) / Cor 2; Thm 3 (scan order by P(l|n))",
              definition="final query-row logits: min distinct logit and −max common logit (mean over seeds, 2-SE "
                         "margin above 0); Spearman(z, P(l|n)) over each class's distinct tokens > 0.999 in every seed",
              measured="final-Z extreme logits and Spearman(z, P(l|n)) per class (long L)",
              expected="min distinct > 0 and max common < 0 beyond 2 SE; Spearman > 0.999", signs=sl,
              min_distinct=margin(float(np.mean(mind)), se(mind)), neg_max_common=margin(-float(np.mean(maxc)), se(maxc))),
        claim("short-momentum-spreads", "At L = 128 with momentum the invariant spreads more: larger final CV "
              "than the long-sequence runs", decide(sp_diff, sp_se), reason="the CV difference is within 2 SE",
              paper="spec §6.5 (Lemma 2's long-sequence limit fails when P(l|n)·T ≈ 1)",
              definition="per seed, the mean over classes of the final CV; difference of the seed means (L = 128 "
                         "momentum − long L SGD), noise = the two SEs combined, 2-SE margin",
              measured="final Thm 3 invariant CV: L = 128 momentum vs long-L plain SGD",
              expected="mean CV (L = 128, momentum) > mean CV (long L, SGD) beyond 2 SE",
              final_cv=pp, signs={k: v for k, v in signs.items() if k.startswith("paper")},
              **margin(sp_diff, sp_se, noise_source="SE over seeds, both settings combined")),
    ]
    return {"experiment": "scan-snap/thm3", "claims": claims, "files": ["thm3_cv.csv", "thm3.png"]}


# ---------------------------------------------------------------- snap time

#: The paper's Syn-Medium data (10 common tokens shared by every class, ρ = f_1ᵀf_2 ≈ 0.72 at Z = 0: Assumption 2
#: is not met), under the theory's protocol (plain SGD, zero init, long sequences; spec §6.5).
SNAP = {"num_last": [1, 3, 5], "etas_y": [0.5, 1.0, 2.0, 4.0], "eta_z": 0.1, "batch_size": 64, "seq_len": 512,
        "seeds": 3, "t0_factor": 4}
SNAP_QUICK = {"num_last": [1, 3], "etas_y": [1.0, 4.0], "eta_z": 0.1, "batch_size": 64, "seq_len": 256, "seeds": 2,
              "t0_factor": 4}
#: Thm 4's setting: one common token, all K classes on one query (§6.3), common weight 0.2 so that the classes are
#: nearly orthogonal (ρ ≈ 0.01; Assumption 2: |λ₁(E)| = (K−1)ρ < 1/K), η_Y ≫ η_Z, long sequences.
#: Small η_Y so that the departure comes after ≳ 10 steps, where B_n is well above the SGD noise.
SNAP_THM = {"K": [2, 4], "etas_y": [0.1, 0.2, 0.4], "eta_z": 0.02, "batch_size": 64, "seq_len": 512,
            "num_common": 1, "common_weight": 0.2, "seeds": 3, "t0_factor": 3}
SNAP_THM_QUICK = {"K": [2], "etas_y": [0.2, 0.4], "eta_z": 0.02, "batch_size": 64, "seq_len": 256,
                  "num_common": 1, "common_weight": 0.2, "seeds": 2, "t0_factor": 3}
#: Stated tolerance for "measured = predicted" (as spec §13 test 9's batch invariance): ±25%.
SNAP_TOL = 0.25
#: The open definition of "B_n(t) leaves its scan-phase law": the local log-log slope of G = e^{4B_n} − 1
#: (2 in the scan law, → 0 in the snap law) first falls below the level.
DEPARTURE_LEVELS = {"slope<1.5": 1.5, "slope<1": 1.0}


def _snap_cfg(dat: dict, K: int, M: int, seed: int, grid: dict) -> dict:
    steps = max(60, math.ceil(grid.get("t0_factor", 3) * th.t0(K, M, min(grid["etas_y"]))))
    cfg = yz_config(dat | {"batch_size": grid["batch_size"], "seq_len": grid["seq_len"]},
                    steps=steps, momentum=0.0, seeds=tuple(range(seed, seed + grid.get("seeds", 2))))
    cfg["ensemble"] = {"lrs": [{"Y": e, "Z": grid["eta_z"]} for e in grid["etas_y"]]}
    cfg["probes"] = {"names": ["scan_snap.attention", "scan_snap.decoder"], "every": 1}
    return cfg


def snap_config(num_last: int, seed: int, grid: dict = SNAP) -> dict:
    """The paper's data: Syn-Medium with K = 2·num_last, plain SGD (spec §6.5), zero init, η_Y grid at
    fixed η_Z, probes every step, ``t0_factor``× the largest predicted t₀ (at least 60 steps)."""
    dat = data.syn_medium(num_last)
    dist = data.build(data.ScanSnapDataConfig(**dat))
    return _snap_cfg(dat, dist.K, dist.M, seed, grid)


def snap_theorem_config(K: int, seed: int, grid: dict = SNAP_THM) -> dict:
    """Thm 4's setting (§6.3): one query with K next tokens, one common token of weight
    ``common_weight`` (the distinct weights as in the paper), otherwise as :func:`snap_config`."""
    dat = {"num_last": 1, "num_next_per_last": K, "num_common": grid["num_common"], "num_common_per_last": 0,
           "common_unnormalized_prob": grid["common_weight"]}
    dist = data.build(data.ScanSnapDataConfig(**dat))
    return _snap_cfg(dat, dist.K, dist.M, seed, grid)


def snap_time(top_logit: np.ndarray) -> int:
    """The peak-growth marker: the step at which the per-step growth of the leading distinct logit
    (3-step centred moving average of z(t+1) − z(t)) peaks. By Thm 2(a) ż_{l₀} ∝ ξ_n ∝ γ(t), and γ
    (Thm 1) peaks where e^{Mh}(Mh − 1) = M − 1, just before the decoder's p(correct) = ½ switch: this
    marker measures the decoder's stage switch, not the attention snap. See ``snap_time_reproduction``."""
    dz = np.convolve(np.diff(top_logit), np.ones(3) / 3, mode="same")
    return int(np.argmax(dz))


def crossing_time(y: np.ndarray, level: float) -> float:
    """First (fractional) step at which ``y`` (one value per step 0, 1, …) reaches ``level``, linearly
    interpolated between the two steps around the crossing; NaN if it never does."""
    y = np.asarray(y, dtype=np.float64)
    up = np.nonzero(y >= level)[0]
    if not len(up):
        return float("nan")
    i = int(up[0])
    if i == 0:
        return 0.0
    return float(i - 1 + (level - y[i - 1]) / (y[i] - y[i - 1]))


def local_exponent(G: np.ndarray, *, t_min: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Centred log-log slope of G (one value per step): at step t, (ln G(t√2) − ln G(t/√2))/ln 2, with
    ln G interpolated linearly in ln t over the steps ≥ ``t_min`` where G > 0. Returns (t, slope)."""
    G = np.asarray(G, dtype=np.float64)
    t = np.arange(len(G), dtype=np.float64)
    ok = (t >= t_min) & (G > 0)
    lt, lg = np.log(t[ok]), np.log(G[ok])
    tc = t[(t / math.sqrt(2) >= t[ok][0]) & (t * math.sqrt(2) <= t[ok][-1])]
    slope = (np.interp(np.log(tc) + 0.5 * math.log(2), lt, lg) - np.interp(np.log(tc) - 0.5 * math.log(2), lt, lg)) \
        / math.log(2)
    return tc, slope


def scan_departure(B: np.ndarray, level: float) -> float:
    """When B_n(t) (one value per step) leaves its scan-phase law (Thm 4): G := e^{4B_n} − 1 = 4Γ/C0 grows as
    t² in the scan phase and as ln² t in the snap phase, so its local log-log slope (:func:`local_exponent`)
    falls from 2 towards 0; the departure is the (interpolated) step at which it last crosses ``level``
    downwards (the theory's slope is monotone, so this is also its first crossing; the last crossing is not
    fooled by the SGD noise of the first few steps, where B_n is tiny). C0 cancels (G is compared with
    itself). NaN if the slope is never at or above ``level`` or never falls below it."""
    tc, slope = local_exponent(np.expm1(4 * np.asarray(B, dtype=np.float64)))
    down = np.nonzero((slope[:-1] >= level) & (slope[1:] < level))[0]
    if not len(down):
        return float("nan")
    i = int(down[-1]) + 1
    return float(tc[i - 1] + (slope[i - 1] - level) / (slope[i - 1] - slope[i]) * (tc[i] - tc[i - 1]))


def theory_B(steps: int, K: int, M: int, eta_y: float, eta_z: float, C0: float = 1.0) -> np.ndarray:
    """§6.3's exact B_n = ¼ ln(1 + 4Γ/C0) per optimiser step 0..steps, with Γ the left Riemann sum
    η_Z Σ_{j<t} γ(j) (step t's attention update uses the decoder after j = t − 1 updates, as in training)."""
    g = th.gamma(np.arange(steps + 1, dtype=np.float64), K, M, eta_y)
    G = eta_z * np.concatenate([[0.0], np.cumsum(g)[:-1]])
    return th.B_from_Gamma(G, C0)


def _exponent(pts: dict, K: int, key: str) -> tuple[float, float]:
    """Log-log slope of the marker vs η_Y at fixed K: fitted per seed, mean and its standard error."""
    per_seed: dict[int, list] = {}
    for (k, e), rs in pts.items():
        if k == K:
            for r in rs:
                per_seed.setdefault(r["seed"], []).append((e, r[key]))
    fits = [float(np.polyfit(np.log([e for e, _ in v]), np.log([x for _, x in v]), 1)[0])
            for v in per_seed.values() if len(v) > 1 and all(x > 0 and math.isfinite(x) for _, x in v)]
    if not fits:
        return float("nan"), float("nan")
    return float(np.mean(fits)), float(np.std(fits, ddof=1) / math.sqrt(len(fits))) if len(fits) > 1 else float("nan")


def _ratio(rows: list[dict], key: str, pred: str) -> tuple[float, float]:
    """Mean over runs of measured/predicted and its standard error over seeds (per-seed means first)."""
    by_seed: dict[int, list] = {}
    for r in rows:
        by_seed.setdefault(r["seed"], []).append(r[key] / r[pred])
    m = [float(np.mean(v)) for v in by_seed.values()]
    if any(not math.isfinite(x) for x in m):
        return float("nan"), float("nan")
    return float(np.mean(m)), float(np.std(m, ddof=1) / math.sqrt(len(m))) if len(m) > 1 else float("nan")


def snap_settings(ctx: ReproduceContext) -> dict:
    """setting -> (grid, grid -> [(name, raw run config)])."""
    quick = ctx.quick
    return {
        "theorem": (SNAP_THM_QUICK if quick else SNAP_THM,
                    lambda g: [(f"thm_K{K}", snap_theorem_config(K, ctx.seed, g)) for K in g["K"]]),
        "paper": (SNAP_QUICK if quick else SNAP,
                  lambda g: [(f"last{nl}", snap_config(nl, ctx.seed, g)) for nl in g["num_last"]]),
    }


@register("scan-snap/snap-time", "Decoder switch vs t'₀ = K ln M/η_Y and attention snap (B_n leaving its scan law) "
          "vs t₀ = 2K ln M/η_Y, in Thm 4's setting and on the paper's Syn-Medium data", configs=lambda ctx: {
              f"{setting}_{name}": raw for setting, (grid, make) in snap_settings(ctx).items() for name, raw in make(grid)})
def snap_time_reproduction(ctx: ReproduceContext) -> dict:
    """The two times of Thm 4 measured separately in training (optimiser steps; spec §5.3: to first order
    batch-independent), each against its prediction, with the constant tested and not only the 1/η_Y scaling.

    **Markers.**

    * *Decoder switch* — the first (interpolated) step at which p(correct) reaches ½, read on the probe
      batch (finite L) and in the long-sequence limit (u = f_n): the two readings. Lemma 9: p(correct) ≤ ½
      for t ≤ t'₀ = K ln M/η_Y; Lemmas 5–6 put p = ½ exactly at K((M−1)(1+ln(M−1)) − 1)/(Mη_Y)
      (``th.switch_time``), which is t'₀ up to the O(1) term Lemma 9 drops. Why this marker: it is the
      quantity Lemma 9 bounds, and it needs no model of the attention.
    * *Attention snap* — the time B_n(t) leaves its scan-phase law (Thm 4, Eqn 14: B_n = ¼ ln(1 + at²)
      before t'₀, ¼ ln(1 + b ln² t) after t₀). B_n is read as −(mean common logit) of the class's query
      row, exact in §6.3's setting (e^{−4z_common} = 1 + 4Γ/C0 and B_n = η_Z∫ξ_n = −z_common); G := e^{4B_n} − 1
      ∝ Γ grows as t² in the scan law and as ln² t in the snap law, so its local log-log slope falls from 2
      towards 0. The departure is the first step at which that slope is below a level; the paper leaves the
      level open, so two readings (1.5: first clear departure; 1: half-way to the snap law) are measured side
      by side. The *prediction* is the same function applied to §6.3's exact B_n(t) (Lemma 6's h, Γ as the
      same left Riemann sum over steps; C0 cancels). The ratio to the paper's t₀ is reported beside it:
      by these definitions the exact theory itself leaves the scan law at about 0.35–0.8 t₀, i.e. around
      t'₀ — t₀ = 2(1+o(1))K ln M/η_Y is where the snap law has taken over, not where the scan law ends.
    * *Peak-growth marker* (the earlier definition, ``snap_time``): the step at which the leading distinct
      logit grows fastest. By Thm 2(a) ż_{l₀} ∝ γ(t), which peaks just before the decoder switch, so it
      measures the decoder switch, not the attention snap. Its earlier agreement with t₀ (≈ 0.87×) was a
      cancellation: on the paper's data the decoder switch arrives ≈ 2× later than t'₀, because the
      classes' next-token distributions are correlated (Remark 1: effective rate (1−ρ)η_Y; ρ ≈ 0.72 at Z = 0,
      so Assumption 2 is not met), and γ peaks at about half of t₀'s 2 ln M·K/η_Y.

    **Settings.** (i) Thm 4's setting (``SNAP_THM``): one query with K ∈ {2, 4} next tokens, one common
    token of weight 0.2 (ρ ≈ 0.01, Assumption 2 met), plain SGD, zero init, batch 64, length 512,
    η_Z = 0.02, η_Y ∈ {0.1, 0.2, 0.4} (η_Y ≫ η_Z; small η_Y so the departures come after ≳ 10 steps,
    where B_n is well above the SGD noise), 3 seeds, 3 t₀ of training. (ii) The paper's Syn-Medium data (``SNAP``): num_last ∈
    {1, 3, 5} (K ∈ {2, 6, 10}, 10 common tokens), same protocol, η_Y ∈ {0.5, 1, 2, 4}, 3 seeds. The
    theory's constants are judged only in (i); (ii) trains 4 t₀ so that the late departures fit in; in (ii) the theorem's hypotheses fail, so those numbers
    are reported with an inconclusive verdict, and (ii) tests the spec §6.5 Remark-1 interval instead.
    """
    from tdyn.report import style

    quick = ctx.quick
    settings = snap_settings(ctx)
    rows, curves, rho = [], {}, {}
    for setting, (grid, make) in settings.items():
        for name, raw in make(grid):
            cfg = configure(raw, ctx.overrides)
            dist = _facts(cfg)
            f0 = pr.f_n(torch.zeros(1, dist.M, dist.M, dtype=torch.float64), dist.table, dist.query)[0]
            G0 = f0 @ f0.T
            rho[setting, dist.K] = float(G0[~torch.eye(dist.K, dtype=torch.bool)].mean())
            for d in train_into(ctx, f"{setting}_{name}", cfg):
                eta_y, eta_z = _lrs(d)
                rec = runs.Run(d).metrics
                z = np.array([r["scan_snap.attention/top_logit"] for r in rec])
                B = -np.array([r["scan_snap.attention/mean_common"] for r in rec])
                Bth = theory_B(len(rec) - 1, dist.K, dist.M, eta_y, eta_z)
                ztheory = np.concatenate([[0.0], np.cumsum(th.gamma(np.arange(len(rec) - 1.0), dist.K, dist.M, eta_y))])
                seed = runs.Run(d).seed
                lo, hi = th.stage_switch_bounds(dist.K, dist.M, eta_y, rho[setting, dist.K])
                row = {"setting": setting, "K": dist.K, "M": dist.M, "eta_y": eta_y, "eta_z": eta_z, "seed": seed,
                       "rho": rho[setting, dist.K],
                       "t0prime": th.t0_prime(dist.K, dist.M, eta_y), "t0": th.t0(dist.K, dist.M, eta_y),
                       "switch_pred": th.switch_time(dist.K, dist.M, eta_y),
                       "switch_batch": crossing_time(np.array([r["scan_snap.decoder/p_correct"] for r in rec]), 0.5),
                       "switch_limit": crossing_time(np.array([r["scan_snap.decoder/p_correct_limit"] for r in rec]), 0.5),
                       "remark1_lo": lo, "remark1_hi": hi,
                       "peak_growth": float(snap_time(z)), "peak_growth_pred": float(snap_time(ztheory))}
                for lab, lev in DEPARTURE_LEVELS.items():
                    row[f"snap_{lab}"] = scan_departure(B, lev)
                    row[f"snap_{lab}_pred"] = scan_departure(Bth, lev)
                rows.append(row)
                if seed == ctx.seed:
                    curves[setting, dist.K, eta_y] = (B, Bth, row)
    cols = list(rows[0])
    write_csv(ctx.out / "snap_time.csv", rows, cols)

    # ---- per-setting summaries
    def sel(setting):
        return [r for r in rows if r["setting"] == setting]

    def pts(setting):
        out: dict[tuple, list] = {}
        for r in sel(setting):
            out.setdefault((r["K"], r["eta_y"]), []).append(r)
        return out

    summary = {}
    for setting in settings:
        s = sel(setting)
        summary[setting] = {
            "switch_over_t0prime": {k: _ratio(s, k, "t0prime") for k in ("switch_batch", "switch_limit")},
            "switch_over_lemma6": {k: _ratio(s, k, "switch_pred") for k in ("switch_batch", "switch_limit")},
            "snap_over_pred": {lab: _ratio(s, f"snap_{lab}", f"snap_{lab}_pred") for lab in DEPARTURE_LEVELS},
            "snap_over_t0": {lab: _ratio(s, f"snap_{lab}", "t0") for lab in DEPARTURE_LEVELS},
            "snap_pred_over_t0": {lab: _ratio(s, f"snap_{lab}_pred", "t0") for lab in DEPARTURE_LEVELS},
            "peak_growth_over_pred": _ratio(s, "peak_growth", "peak_growth_pred"),
            "peak_growth_over_t0": _ratio(s, "peak_growth", "t0"),
            "peak_growth_over_switch": _ratio(s, "peak_growth", "switch_batch"),
            "exponents": {f"K={K}": {k: _exponent(pts(setting), K, k) for k in
                                     ["switch_batch", "switch_limit"] + [f"snap_{lab}" for lab in DEPARTURE_LEVELS]}
                          for K in sorted({r["K"] for r in s})},
        }
    T, P = summary["theorem"], summary["paper"]

    # ---- figure: each marker vs its prediction, both settings; B_n(t) with its departures
    import matplotlib.pyplot as plt

    style.apply()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3), constrained_layout=True)
    mk = {"theorem": "o", "paper": "s"}
    for setting in settings:
        s = sel(setting)
        Ks = sorted({r["K"] for r in s})
        for r in s:
            col = style.PALETTE[Ks.index(r["K"]) + (0 if setting == "theorem" else 2)]
            lab = f"{setting}, K={r['K']}" if r["eta_y"] == s[0]["eta_y"] and r["seed"] == ctx.seed else None
            axes[0].scatter(r["t0prime"], r["switch_batch"], color=col, marker=mk[setting], s=18, label=lab)
            if r["seed"] == ctx.seed:
                axes[0].scatter(r["t0prime"], r["switch_pred"], facecolors="none", edgecolors=col, marker=mk[setting],
                                s=40, lw=0.8, label="Lemma 5–6 p = ½ time" if lab and setting == "theorem" else None)
            axes[1].scatter(r["snap_slope<1_pred"], r["snap_slope<1"], color=col, marker=mk[setting], s=18, label=lab)
    for ax, xl, yl in ((axes[0], "t'₀ = K ln M/η_Y (steps)", "decoder switch: first step p(correct) ≥ ½"),
                       (axes[1], "predicted departure (same definition on §6.3's exact B_n)",
                        "attention snap: B_n leaves scan law (slope < 1)")):
        lim = np.array([0, max(max(c.get_offsets()[:, 0].max(), c.get_offsets()[:, 1].max()) for c in ax.collections) * 1.1])
        ax.plot(lim, lim, color="grey", ls=":", label="measured = predicted")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.legend(fontsize=7)
    lim0 = axes[0].get_xlim()
    xs = np.linspace(0, lim0[1], 10)
    axes[0].plot(xs, 2 * xs, color="k", lw=0.6, ls="--", label="2 t'₀ = t₀")
    axes[0].legend(fontsize=7)
    axes[0].set_title(f"theorem: ×{T['switch_over_t0prime']['switch_batch'][0]:.2f} t'₀; "
                      f"paper: ×{P['switch_over_t0prime']['switch_batch'][0]:.2f} t'₀", fontsize=9)
    axes[1].set_title(f"theorem: ×{T['snap_over_pred']['slope<1'][0]:.2f} predicted "
                      f"(= ×{T['snap_over_t0']['slope<1'][0]:.2f} t₀)", fontsize=9)
    Kc = sorted({r["K"] for r in sel("theorem")})[-1]
    for i, e in enumerate((SNAP_THM_QUICK if quick else SNAP_THM)["etas_y"]):
        c = curves.get(("theorem", Kc, e))
        if c is None:
            continue
        B, Bth, row = c
        t = np.arange(len(B))
        Gm, Gt = np.expm1(4 * B), np.expm1(4 * Bth)
        scale = Gm[-1] / Gt[-1] if Gt[-1] > 0 else 1.0        # C0 is not known: theory matched at the last step
        axes[2].plot(t[1:], Gm[1:], color=style.PALETTE[i], label=f"η_Y={e:g}")
        axes[2].plot(t[1:], Gt[1:] * scale, color=style.PALETTE[i], ls=":", lw=1)
        axes[2].axvline(row["snap_slope<1"], color=style.PALETTE[i], ls="--", lw=0.8)
        axes[2].axvline(row["t0"], color=style.PALETTE[i], ls="-.", lw=0.6)
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("step")
    axes[2].set_ylabel("G = e^{4B_n} − 1 (B_n = −mean common logit)")
    axes[2].set_title(f"theorem K={Kc}: dotted theory (scaled), dashed departure, dash-dot t₀", fontsize=9)
    axes[2].legend(fontsize=7)
    style.save(fig, ctx.out / "snap_time.png")

    # ---- claims
    tol = SNAP_TOL

    sw_T = [reading(f"p(correct) on the {'probe batch (finite L)' if k == 'switch_batch' else 'long-sequence limit u = f_n'}",
                    within(*T["switch_over_lemma6"][k], tol),
                    reason=None if within(*T["switch_over_lemma6"][k], tol) is not None else "ratio within 2 SE of the tolerance",
                    ratio_to_lemma6=T["switch_over_lemma6"][k][0], se=T["switch_over_lemma6"][k][1],
                    ratio_to_t0prime=T["switch_over_t0prime"][k][0], tolerance=tol)
            for k in ("switch_batch", "switch_limit")]
    lemma9 = []
    for k in ("switch_batch", "switch_limit"):
        r, se = T["switch_over_t0prime"][k]
        lemma9.append(reading(f"p(correct) {'probe batch' if k == 'switch_batch' else 'long-sequence limit'}",
                              decide(r - 1.0, se), reason="switch/t'₀ − 1 inside 2 SE of 0", ratio=r, se=se,
                              **margin(r - 1.0, se, noise_source="SE over seeds of the per-seed mean ratio")))
    snap_T = []
    for lab in DEPARTURE_LEVELS:
        r, se = T["snap_over_pred"][lab]
        v = within(r, se, tol)
        snap_T.append(reading(f"departure = first step where the local log-log slope of e^{{4B_n}} − 1 is {lab[5:]}",
                              v, reason=None if v is not None else "ratio within 2 SE of the tolerance",
                              ratio_to_prediction=r, se=se, tolerance=tol,
                              ratio_to_t0=T["snap_over_t0"][lab][0], prediction_over_t0=T["snap_pred_over_t0"][lab][0]))
    expo_T = []
    for K, ex in T["exponents"].items():
        for k, (m, se) in ex.items():
            expo_T.append((f"{K},{k}", within(-m, se, tol), m, se))
    held_expo, why_expo = every_cell({k: v for k, v, _, _ in expo_T})
    pk_r, pk_se = T["peak_growth_over_pred"]
    # Remark-1 interval per (K, η_Y) cell of the paper's data: the seed-mean switch above K ln M/η_Y and below
    # K ln M/((1−ρ)η_Y), each by 2 SE over seeds
    inside, inside_nums = {}, {}
    for (K, e), rs in pts("paper").items():
        v = [r["switch_batch"] for r in rs]
        m, sd = float(np.mean(v)), (float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan"))
        lo_v, hi_v = decide(m - rs[0]["remark1_lo"], sd), decide(rs[0]["remark1_hi"] - m, sd)
        key = f"K={K},eta_y={e:g}"
        inside[key] = False if False in (lo_v, hi_v) else (True if lo_v and hi_v else None)
        inside_nums[key] = {"switch": m, "se": sd, "lo": rs[0]["remark1_lo"], "hi": rs[0]["remark1_hi"]}
    in_held, in_why = every_cell(inside)
    claims = [
        claim("decoder-switch-constant", "Thm 4's setting: the decoder switch (p(correct) = ½) comes at Lemmas 5–6's "
              "time K((M−1)(1+ln(M−1)) − 1)/(Mη_Y), i.e. at t'₀ = K ln M/η_Y up to its dropped O(1) term "
              f"(measured/predicted within 1 ± {tol:g})",
              paper="Lemma 9 / Thm 4: scan phase ends at t'₀ = K ln M/η_Y; Lemmas 5–6 (exact p = ½ time)",
              definition="first (interpolated) optimiser step at which mean p(correct) ≥ ½; ratio to the Lemma-6 time, "
                         "mean over seeds of the per-seed mean over (K, η_Y); noise = SE over seeds",
              measured="decoder switch / Lemma-6 p = ½ time (ratio to t'₀ beside it)",
              expected=f"within 1 ± {tol:g} beyond 2 SE", readings=sw_T, rho=rho_of(rho, "theorem")),
        claim("decoder-switch-after-t0prime", "Thm 4's setting: p(correct) ≤ ½ until t'₀ = K ln M/η_Y (Lemma 9): the "
              "measured switch comes after t'₀", paper="Lemma 9 (for t ≤ K ln M/η_Y, p(correct) ≤ ½)",
              definition="decoder switch / t'₀ − 1 (mean over seeds of the per-seed mean over (K, η_Y)), decided with a "
                         "2-SE margin", measured="decoder switch / t'₀", expected="> 1 beyond 2 SE", readings=lemma9),
        claim("attention-snap-constant", "Thm 4's setting: B_n(t) leaves its scan-phase law when the exact theory "
              f"(§6.3) says it does (measured/predicted within 1 ± {tol:g}); ratios to t₀ = 2K ln M/η_Y reported",
              paper="Thm 4, Eqn 14 (scan law before t'₀, snap law after t₀ = 2(1+o(1))K ln M/η_Y); §6.3",
              definition="B_n := −(mean common logit of the query row) (exact in §6.3); departure = first step at which "
                         "the centred log-log slope of e^{4B_n} − 1 falls below the level; prediction = the same "
                         "function on §6.3's exact B_n(t); noise = SE over seeds",
              measured="attention-snap time / predicted (ratio to t₀ beside it)", expected=f"within 1 ± {tol:g}",
              readings=snap_T),
        claim("inverse-eta-y", "Thm 4's setting: both times scale as 1/η_Y at fixed K (log-log exponent −1 ± "
              f"{tol:g}), for each marker and reading", held_expo, reason=why_expo,
              paper="Thm 4 / Lemma 9: t₀, t'₀ ∝ 1/η_Y (prediction (a))",
              definition="log-log slope of the marker vs η_Y per seed and K; mean and SE over seeds",
              measured="exponent per (K, marker)", expected=f"−1 ± {tol:g} beyond 2 SE in every (K, marker)",
              exponents={k: {"exponent": m, "se": se} for k, _, m, se in expo_T}),
        claim("peak-growth-tracks-decoder", "Thm 4's setting: the peak-growth marker (old definition) falls where "
              "the theory's ż_{l₀} ∝ γ(t) peaks — a decoder time (γ peaks just before p(correct) = ½), not the snap",
              within(pk_r, pk_se, tol), reason="ratio within 2 SE of the tolerance",
              paper="Thm 2(a) (ż_{l₀} = η_Z f²ξ_n, ξ_n ∝ γ) and Thm 1 (γ(t))",
              definition="step of peak 3-step-averaged growth of the leading distinct logit; prediction = the same "
                         "function on z(t) = Σ γ (theory); noise = SE over seeds",
              measured="peak-growth step / its theory value", expected=f"within 1 ± {tol:g}",
              ratio=pk_r, se=pk_se, ratio_to_t0=T["peak_growth_over_t0"][0],
              ratio_to_switch=T["peak_growth_over_switch"][0]),
        claim("paper-data-constants", "The paper's Syn-Medium data: the decoder switch, attention snap and peak-growth "
              "marker against their Thm 4 predictions", None,
              reason=f"outside Thm 4's hypotheses: 10 common tokens shared by every class, ρ = f_nᵀf_n' ≈ "
                     f"{np.mean([v for (s, _), v in rho.items() if s == 'paper']):.2f} at Z = 0, so Assumption 2 "
                     "(|λ₁(E)| < 1/K) fails; the numbers are reported, not judged",
              paper="Thm 4 (needs Assumption 2 and §6.3's single common token)",
              definition="as in the theorem-setting claims", measured="ratios to t'₀, t₀ and to the predictions",
              expected="n/a (hypotheses not met)",
              switch_over_t0prime=P["switch_over_t0prime"], switch_over_lemma6=P["switch_over_lemma6"],
              snap_over_prediction=P["snap_over_pred"], snap_over_t0=P["snap_over_t0"],
              peak_growth_over_t0=P["peak_growth_over_t0"], peak_growth_over_switch=P["peak_growth_over_switch"],
              exponents=P["exponents"]),
        claim("stage-switch-interval", "The paper's data: the decoder switch lies between K ln M/η_Y and "
              "K ln M/((1−ρ)η_Y) (correlated classes train at the effective rate (1−ρ)η_Y)",
              in_held, reason=in_why,
              paper="Remark 1 (effective rate (1−ρ)η_Y); spec §6.5 hypothesis",
              definition="first (interpolated) step with p(correct) ≥ ½ on the probe batch, mean over seeds per "
                         "(K, η_Y); inside the interval by 2 SE over seeds at both ends (a run that never reaches ½ "
                         "makes its cell inconclusive); ρ = mean f_nᵀf_n' at Z = 0",
              measured="decoder switch per (K, η_Y)",
              expected="inside [K ln M/η_Y, K ln M/((1−ρ)η_Y)] beyond 2 SE in every cell",
              cells=inside_nums, rho=rho_of(rho, "paper"),
              switch_over_t0prime=P["switch_over_t0prime"]["switch_batch"]),
    ]
    return {"experiment": "scan-snap/snap-time", "grids": {k: v[0] for k, v in settings.items()},
            "summary": summary, "claims": claims, "files": ["snap_time.csv", "snap_time.png"]}


def rho_of(rho: dict, setting: str) -> dict:
    return {f"K={K}": v for (s, K), v in rho.items() if s == setting}


# ---------------------------------------------------------------- benchmark


@register_bench("fig6_sweep")
def _bench_fig6(quick: bool) -> dict:
    """The Fig 6 sweep (640 runs) with ``tdyn sweep`` (batched into 4 ensemble jobs on the local
    pool) vs the same runs trained one at a time in this process (``quick``: extrapolated from a
    few runs per panel)."""
    import tempfile
    import time

    from tdyn.bench import timed_train
    from tdyn.sweep import run_sweep
    from tdyn.sweep.spec import load_spec, plan
    from tdyn.train.trainer import expand_members, member_config
    from tdyn.config import validate_config

    spec = fig6_spec(FIG6)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        run_sweep(spec, Path(d) / "sweep", progress=False)
        batched = time.perf_counter() - t0
    seq, timed, total_runs = 0.0, 0, 0
    for job in plan(load_spec(spec)):
        cfg = validate_config(job.config)
        members = expand_members(cfg)
        total_runs += len(members)
        picked = members[:: max(1, len(members) // 3)] if quick else members
        t = sum(timed_train(member_config(cfg, m)) for m in picked)
        timed += len(picked)
        seq += t * len(members) / len(picked)
    return {"runs": total_runs, "batched_s": batched, "sequential_s": seq, "ratio": seq / batched,
            "sequential_runs_timed": timed, "sequential_extrapolated": timed < total_runs,
            "under_2_min": batched < 120}
