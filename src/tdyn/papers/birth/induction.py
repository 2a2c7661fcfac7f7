"""Bietti et al. 2023, global bigrams before the induction head, and the head on held-out output tokens
(``birth/induction``; docs/reproductions/birth.md#birthinduction).

Phases: ``plan`` trains one ensemble of seeds with the loss on every position and the trained linear feed-forward
W_F (so the model can store the global bigrams), output tokens drawn from the first 75 % of the vocabulary (the
authors' ``train_test="train"``) and a second probe set whose outputs come from the last 25 % (``"test"``);
``measure`` reads each member's probes (table induction); ``judge`` and ``draw`` read it.
"""

from __future__ import annotations

import dataclasses

from tdyn import stats
from tdyn.papers.birth.analysis import (COLUMNS, PAPER, QUOTE_BIGRAMS_FIRST, Options, Settings, by_seed,
                                        final, formation_step, grid_dict, ordered, per_seed,
                                        trained_rows, with_grid_options, UNIT, run_config, setting_text, two_panels)
from tdyn.papers.birth.analysis import FULL as MEM_FULL, QUICK as MEM_QUICK
from tdyn.reproduce.common import claim
from tdyn.reproduce.phases import Phases, Tables, register_phases
from tdyn.reproduce.registry import ReproduceContext

#: tdyn's readings, fixed before any run (docs/reproductions/birth.md#claims)
OOD_MIN = 0.9       # held-out / in-distribution in-context accuracy
READINGS = (("loss_bigram", "rel:0.5"), ("loss_bigram", "rel:0.9"), ("bigram_kl", "rel:0.5"))
#: induction formed: the in-context accuracy first reaches this level (uniform outputs: global statistics alone stay
#: near 1/48; a relative reading of the accuracy would time its early rise from the outputs' frequencies instead)
IND_LEVEL = "abs:0.5"
QUICK = MEM_QUICK
#: trained on every position, the head forms later than on the outputs alone: more steps than birth/memories
FULL = dataclasses.replace(MEM_FULL, steps=1000)
__all__ = ["Options", "Settings"]


def settings(ctx: ReproduceContext) -> Settings:
    return with_grid_options(QUICK if ctx.quick else FULL, ctx.options)


def plan(ctx: ReproduceContext) -> dict[str, dict]:
    st = settings(ctx)
    return per_seed(ctx, "induction", run_config(st, final_ffn=True, loss_on="all",
                                                 data={"outputs": "train", "ood_outputs": "test"}))


def measure(ctx: ReproduceContext, trained: dict) -> Tables:
    return {"induction": trained_rows(trained)}


def judge(ctx: ReproduceContext, tables: Tables) -> dict:
    st = settings(ctx)
    rows = tables["induction"]
    setting = setting_text(ctx, plan(ctx), st, "fixed triggers", "loss on every position, trained W_F, outputs from "
                           "the first 75 % of the vocabulary")
    steps, _, acc = by_seed(rows, "acc_out")
    t_ind = [formation_step(steps, acc[i], IND_LEVEL) for i in range(acc.shape[0])]
    rds, times = [], {"acc_out": t_ind}
    for key, rd in READINGS:
        _, _, v = by_seed(rows, key)
        t_big = [formation_step(steps, v[i], rd, above=False) for i in range(v.shape[0])]
        times[f"{key} {rd}"] = t_big
        frac = float(rd.split(":")[1])
        rds.append(ordered(t_big, t_ind, f"{key} ({frac:.0%}) before acc_out ≥ {IND_LEVEL[4:]}",
                           f"the step {key} has made {frac:.0%} of its decrease (init → end) precedes the first step "
                           f"the in-context accuracy reaches {IND_LEVEL[4:]}"))
    claims = [claim(
        "bigrams_before_induction",
        f"The global bigrams are learnt before the induction head ({setting})", readings=rds, source="paper",
        quote=QUOTE_BIGRAMS_FIRST, paper=PAPER + ", abstract",
        definition="global bigrams: the cross-entropy at positions whose token is no trigger (occ = 0, the authors' "
                   "loss_bigram), and the KL of the W_F memory to the bigram conditionals (the authors' ff1 probe); "
                   f"induction: in-context accuracy at occ ≥ 2. The bigrams are timed as the step a curve has made a "
                   f"fraction of its change over the run (50 % and 90 %), the induction head as the first step its "
                   f"accuracy reaches {IND_LEVEL[4:]}; paired over seeds, 2 SE",
        measured="formation steps per seed", expected="t(bigrams) < t(induction)", formation_steps=times)]
    acc_in, acc_first = final(rows, "acc_out"), final(rows, "acc_first")
    dm, dse = stats.paired(acc_in, acc_first)
    claims.append(claim(
        "induction_with_bigrams",
        f"Trained on every position with the bigram memory W_F, the model still predicts the in-context bigrams "
        f"beyond what first occurrences allow ({setting})", stats.decide(dm, dse), source="derived",
        derived="the memories reproduction trains on the in-context outputs only (the authors' loss_head_only); this "
                "checks that the induction head also forms beside the global-bigram memory",
        paper=PAPER + ", abstract: " + QUOTE_BIGRAMS_FIRST,
        definition="final accuracy at occ ≥ 2 minus final accuracy at occ = 1 (first occurrences, whose next token "
                   "the context does not give), paired over seeds", measured="accuracy gap", expected="> 0 by 2 SE",
        acc_out=acc_in, acc_first=acc_first, **stats.margin(dm, dse)))
    ood = final(rows, "acc_out_ood")
    ratio = [o / a if a > 0 else float("nan") for o, a in zip(ood, acc_in)]
    m, se = stats.mean_se(ratio)
    claims.append(claim(
        "induction_on_heldout_outputs",
        f"The induction head predicts output tokens never seen as outputs in training as well as the seen ones "
        f"(ratio ≥ {OOD_MIN}) ({setting})", stats.decide(m - OOD_MIN, se), source="derived",
        derived="the authors' code trains on outputs from the first 75 % of the tokens and tests on the last 25 % "
                "(ihead_data train_test); an induction head copies whatever followed the trigger, so it should not "
                "depend on which tokens were outputs in training",
        paper=PAPER + ", abstract: " + QUOTE_BIGRAMS_FIRST,
        definition="final in-context accuracy (occ ≥ 2) on probe sequences whose outputs come from the held-out 25 % "
                   f"of the vocabulary, divided by the same on the training pool; {OOD_MIN} is tdyn's, fixed before "
                   "the runs", measured="held-out / seen accuracy, seed mean", expected=f"≥ {OOD_MIN} by 2 SE",
        acc_ood=ood, acc_in=acc_in, ratio=ratio, mean=m, se=se, **stats.margin(m - OOD_MIN, se)))
    return {"experiment": "birth/induction", "claims": claims, "settings": grid_dict(st),
            "final": {k: final(rows, k) for k in ("acc_out", "acc_out_ood", "acc_first", "loss_bigram", "bigram_kl",
                                                  "recall_W_O2", "recall_W_K2", "recall_W_K1")}}


def draw(ctx: ReproduceContext, tables: Tables, results: dict) -> list[str]:
    losses = [("loss_bigram", "loss on non-trigger tokens (global bigrams)"),
              ("loss_out", "loss on in-context outputs (occ ≥ 2)"),
              ("bigram_kl", "KL of the W_F memory to the bigrams")]
    head = [("acc_out", "in-context accuracy, seen outputs"), ("acc_out_ood", "in-context accuracy, held-out outputs"),
            ("recall_W_K1", "W_K¹ recall"), ("recall_W_O2", "W_O² recall")]
    return two_panels(ctx, tables["induction"], (losses, 0, dict(ylabel="nats", title="Losses")),
                      (head, 3, dict(ylabel="fraction", ylim=UNIT, title="Induction head")),
                      "Global bigrams first, the induction head later", "induction.png")

PHASES = Phases(plan=plan, measure=measure, judge=judge, draw=draw, tables=("induction",),
                columns={"induction": COLUMNS})
register_phases("birth/induction", PHASES, options=Options)
