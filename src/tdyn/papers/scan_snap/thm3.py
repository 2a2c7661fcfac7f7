"""Scan and Snap Thm 3 (docs/reproductions/scan-snap.md#attention-dynamics,
docs/reproductions/scan-snap.md#reproductions): the invariant (1 − e^{−2z})/P(l|n)² across a class's distinct
tokens, flat in the long-sequence regime with plain SGD."""

from __future__ import annotations


import matplotlib.pyplot as plt
import numpy as np
import torch
from scipy.stats import spearmanr

from tdyn import runs, stats
from tdyn.papers.scan_snap import data
from tdyn.reproduce.common import claim, configure, decide, margin, train_into
from tdyn.reproduce.registry import ReproduceContext, register
from tdyn.papers.scan_snap.analysis import _facts
from tdyn.papers.scan_snap import probes as pr
from tdyn.report import style
from tdyn.runs import write_csv
from tdyn.papers.scan_snap.task import yz_config


# ---------------------------------------------------------------- Thm 3 invariant


def thm3_configs(seed: int, quick: bool) -> dict[str, dict]:
    """Long-sequence regime (docs/reproductions/scan-snap.md#scan-snapthm3: L = 1024, B = 128, plain SGD, η_Z =
    0.1, η_Y = 1, 300 steps, zero init) and, for contrast, the paper's Fig 4 setting (L = 128, momentum 0.9, η =
    1)."""
    long = yz_config(data.SYN_SMALL | {"seq_len": 512 if quick else 1024}, steps=100 if quick else 300,
                     lr_y=1.0, lr_z=0.1, momentum=0.0, seeds=(seed, seed + 1))
    paper = yz_config(data.SYN_SMALL, steps=100, seeds=(seed, seed + 1))
    for c in (long, paper):
        c["checkpoint"] = {"schedule": "log", "num": 12, "steps": []}
    return {"long_L_sgd": long, "paper_L128_momentum": paper}


#: legend names of the two settings
LABELS = {"long_L_sgd": "$L = 1024$, plain SGD (Thm 3 regime)", "paper_L128_momentum": "$L = 128$, momentum 0.9 (Fig 4)"}


@register("scan-snap/thm3", "Thm 3 invariant (1 − e^{−2z})/P(l|n)² equal across a class's distinct tokens "
          "(long sequences, plain SGD)", configs=lambda ctx: thm3_configs(ctx.seed, ctx.quick))
def thm3(ctx: ReproduceContext) -> dict:
    """Coefficient of variation of the invariant over each class's 10 distinct tokens, over
    training, in the long-sequence regime and in the paper's L = 128 momentum setting."""


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


    style.apply()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), constrained_layout=True)
    names = list(thm3_configs(ctx.seed, ctx.quick))
    for i, key in enumerate(final):
        setting, seed = key.split(",")
        col = style.PALETTE[names.index(setting)]
        for n in range(dist.K):
            rr = [r for r in rows if r["setting"] == setting and f"seed={r['seed']}" == seed and r["class"] == n + 1]
            axes[0].plot([r["step"] for r in rr], [r["cv"] for r in rr], color=col, alpha=0.8,
                         label=LABELS[setting] if (n == 0 and seed == f"seed={ctx.seed}") else None)
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
    axes[1].set_xlabel("$P(l|n)$")
    axes[1].set_ylabel("$(1 - e^{-2z})/P^2$ ÷ class mean (final)")
    axes[1].set_title("flat = Thm 3 invariant holds")
    style.save(fig, ctx.out / "thm3.png")

    lg = {k: v for k, v in final.items() if k.startswith("long")}
    pp = {k: v for k, v in final.items() if k.startswith("paper")}
    sl = {k: v for k, v in signs.items() if k.startswith("long")}
    se = stats.se
    # CV ≤ 0.1 (the tolerance stated in docs/reproductions/scan-snap.md#scan-snapthm3): the worst class per seed,
    # mean and SE over seeds
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
    sp_se = stats.se_of_difference(cv_paper, cv_long)
    claims = [
        claim("invariant-cv", "Long sequences, plain SGD: per class, the invariant's coefficient of variation over "
              "the 10 distinct tokens is ≤ 0.1 at the end (docs/reproductions/scan-snap.md#scan-snapthm3)", decide(cv_diff, cv_se),
              reason="the worst-class CV is within 2 SE of 0.1", source="derived",
              derived="tdyn's quantitative consequence of Thm 3 (docs/reproductions/scan-snap.md#attention-dynamics, from Eqn 108–111: ż_l ∝ "
                      "P(l|n)² e^{2z_l} with a factor shared by the class's distinct tokens, so (1 − e^{−2z})/P(l|n)² "
                      "is equal across them); the paper states the ordering and the bounds on χ, not this invariant, "
                      "and tests neither in training. The CV ≤ 0.1 tolerance is tdyn's",
              paper="Thm 3 (Eqn 108–111; docs/reproductions/scan-snap.md#attention-dynamics derivation: (1 − e^{−2z})/P(l|n)² equal across distinct tokens)",
              definition="per class, std/|mean| (population std) of e^{−2z(0)}(1 − e^{−2(z − z(0))})/P(l|n)² over its "
                         "distinct tokens (z(0) = 0 here: zero init); worst class per seed; 0.1 − its seed mean, "
                         "decided with a margin of 2 SE over seeds",
              measured="final CV of the Thm 3 invariant per class (long L, plain SGD)",
              expected="CV ≤ 0.1 for every class, beyond 2 SE", final_cv=lg,
              **margin(cv_diff, cv_se, noise_source="SE over seeds of the worst-class CV")),
        claim("thm2-signs-long", "Long sequences, plain SGD: every common logit < 0, every distinct logit > 0 and "
              "ordered by P(l|n) (Spearman = 1)", sign_held, reason="an extreme logit is within 2 SE of 0",
              source="paper",
              quote="Every distinct token l of class n has ż_{ψ(n),l} = η_Z f_{nl}² ξ_n > 0 (Thm 2 (a)); [the] common "
                    "token has ż_{ml} < 0 (Thm 2 (b), Cor 2); Among distinct tokens, it progressively drops attention "
                    "weights, following the order of low to high co-occurrence (abstract) (Thm 2 as stated in the "
                    "docs/reproductions/scan-snap.md#attention-dynamics)",
              paper="Thm 2 (a), (b) / Cor 2; Thm 3 (scan order by P(l|n))",
              definition="final query-row logits: min distinct logit and −max common logit (mean over seeds, 2-SE "
                         "margin above 0); Spearman(z, P(l|n)) over each class's distinct tokens > 0.999 in every seed",
              measured="final-Z extreme logits and Spearman(z, P(l|n)) per class (long L)",
              expected="min distinct > 0 and max common < 0 beyond 2 SE; Spearman > 0.999", signs=sl,
              min_distinct=margin(float(np.mean(mind)), se(mind)), neg_max_common=margin(-float(np.mean(maxc)), se(maxc))),
        claim("short-momentum-spreads", "At L = 128 with momentum the invariant spreads more: larger final CV "
              "than the long-sequence runs", decide(sp_diff, sp_se), reason="the CV difference is within 2 SE",
              source="derived",
              derived="tdyn's contrast, not a claim of the paper: the theory assumes long sequences (Assumption 1b, "
                      "T → ∞); docs/reproductions/scan-snap.md#theory-on-trained-models expects the invariant to break at L = 128 (Lemma 2's limit "
                      "fails when P(l|n)·T ≈ 1) and momentum to spread it",
              paper="docs/reproductions/scan-snap.md#theory-on-trained-models (Lemma 2's long-sequence limit fails when P(l|n)·T ≈ 1)",
              definition="per seed, the mean over classes of the final CV; difference of the seed means (L = 128 "
                         "momentum − long L SGD), noise = the two SEs combined, 2-SE margin",
              measured="final Thm 3 invariant CV: L = 128 momentum vs long-L plain SGD",
              expected="mean CV (L = 128, momentum) > mean CV (long L, SGD) beyond 2 SE",
              final_cv=pp, signs={k: v for k, v in signs.items() if k.startswith("paper")},
              **margin(sp_diff, sp_se, noise_source="SE over seeds, both settings combined")),
    ]
    return {"experiment": "scan-snap/thm3", "claims": claims, "files": ["thm3_cv.csv", "thm3.png"]}
