"""Bietti et al. 2023, the induction head on held-out trigger tokens (``birth/heldout-triggers``;
docs/reproductions/birth.md#birthheldout-triggers).

Phases: ``plan`` trains one ensemble of seeds on the memories task with triggers drawn per sequence (∝ π_u, K = 5)
from the first 75 % of the vocabulary only (``data.triggers = "train"``; the authors' code has no trigger pool:
tdyn's departure), and probes a second fixed set whose triggers come from the last 25 % (``ood_triggers``), tokens
that were never triggers in training; ``measure`` reads each member's probes (table triggers); ``judge`` and
``draw`` read it.
"""

from __future__ import annotations

import dataclasses

from tdyn import stats
from tdyn.papers.birth.analysis import (COLUMNS_TRIGGERS, PAPER, QUOTE_SUCCEED, final,
                                        grid_dict, per_seed, trained_rows, with_grid_options, UNIT, run_config,
                                        setting_text, two_panels)
from tdyn.papers.birth.analysis import FULL as MEM_FULL, QUICK, Options, Settings
from tdyn.reproduce.common import claim
from tdyn.reproduce.phases import Phases, Tables, register_phases
from tdyn.reproduce.registry import ReproduceContext

#: tdyn's readings, fixed before any run (docs/reproductions/birth.md#claims)
ACC_MIN = 0.9       # the head formed on the training pool's triggers: in-context accuracy at the end
OOD_MIN = 0.9       # held-out / seen in-context accuracy (as induction_on_heldout_outputs)
#: triggers drawn per sequence from 48 tokens instead of 5 fixed ones: the steps of birth/induction, probes every 20
FULL = dataclasses.replace(MEM_FULL, steps=1000, probe_every=20)
__all__ = ["Options", "Settings"]


def settings(ctx: ReproduceContext) -> Settings:
    return with_grid_options(QUICK if ctx.quick else FULL, ctx.options)


def plan(ctx: ReproduceContext) -> dict[str, dict]:
    st = settings(ctx)
    return per_seed(ctx, "triggers", run_config(st, data={"fixed_triggers": False, "triggers": "train",
                                                          "ood_triggers": "test"}))


def measure(ctx: ReproduceContext, trained: dict) -> Tables:
    return {"triggers": trained_rows(trained)}


def judge(ctx: ReproduceContext, tables: Tables) -> dict:
    st = settings(ctx)
    rows = tables["triggers"]
    setting = setting_text(ctx, plan(ctx), st, "triggers drawn per sequence ∝ π_u from the first 75 % of the "
                           "vocabulary, outputs uniform", "loss on the in-context outputs", probes=" per set")
    acc, first = final(rows, "acc_out"), final(rows, "acc_first")
    m, se = stats.mean_se(acc)
    claims = [claim(
        "induction_with_random_triggers",
        f"With triggers drawn per sequence, the two-layer model predicts the in-context bigrams reliably "
        f"(in-context accuracy ≥ {ACC_MIN}) ({setting})", stats.decide(m - ACC_MIN, se), source="derived",
        derived="the introduction's claim that two-layer transformers succeed by an induction head, judged in "
                "birth/memories with 5 fixed triggers; here the triggers change from sequence to sequence (the "
                "authors' default fixed_special_toks=False), drawn from 48 tokens",
        paper=PAPER + ", introduction: " + QUOTE_SUCCEED,
        definition=f"final top-1 accuracy at occ ≥ 2 on probe sequences whose triggers come from the training pool; "
                   f"{ACC_MIN} is tdyn's reading of 'reliably' (as induction_head_forms), fixed before the runs",
        measured="final in-context accuracy, seed mean", expected=f"≥ {ACC_MIN} by 2 SE", values=acc,
        first_occurrence_accuracy=first, mean=m, se=se, **stats.margin(m - ACC_MIN, se))]
    ood = final(rows, "acc_out_tood")
    ratio = [o / a if a > 0 else float("nan") for o, a in zip(ood, acc)]
    rm, rse = stats.mean_se(ratio)
    claims.append(claim(
        "induction_on_heldout_triggers",
        f"The induction head predicts the in-context bigrams of trigger tokens never seen as triggers in training as "
        f"well as those of the seen ones (ratio ≥ {OOD_MIN}) ({setting})", stats.decide(rm - OOD_MIN, rse),
        source="derived",
        derived="the introduction's claim that two-layer transformers succeed by an induction head: as a mechanism "
                "it copies whatever followed the current token, so it should not depend on which tokens were "
                "triggers in training — unless W_K²'s memory is trigger-specific, which this measures",
        paper=PAPER + ", introduction: " + QUOTE_SUCCEED,
        definition="final in-context accuracy (occ ≥ 2) on probe sequences whose triggers come from the last 25 % of "
                   "the vocabulary (never triggers in training, though they occur as ordinary tokens), divided by "
                   f"the same on sequences whose triggers come from the training pool; {OOD_MIN} is tdyn's (as "
                   "induction_on_heldout_outputs), fixed before the runs",
        measured="held-out / seen accuracy, seed mean", expected=f"≥ {OOD_MIN} by 2 SE",
        acc_heldout=ood, acc_seen=acc, ratio=ratio, mean=rm, se=rse,
        recall_W_K2_seen=final(rows, "recall_W_K2"), recall_W_K2_heldout=final(rows, "recall_W_K2_ood"),
        attn2_ind_seen=final(rows, "attn2_ind"), attn2_ind_heldout=final(rows, "attn2_ind_tood"),
        **stats.margin(rm - OOD_MIN, rse)))
    return {"experiment": "birth/heldout-triggers", "claims": claims, "settings": grid_dict(st),
            "final": {k: final(rows, k) for k in ("acc_out", "acc_out_tood", "acc_first", "loss_out",
                                                  "loss_out_tood", "attn1_prev", "attn2_ind", "attn2_ind_tood",
                                                  "recall_W_O2", "recall_W_K2", "recall_W_K2_ood",
                                                  "recall_W_K1")},
            "definitions": {"seen": "triggers drawn ∝ π_u from tokens 0–47 (the training pool)",
                            "held-out": "triggers drawn ∝ π_u from tokens 48–64 ('j' … 'z' of tiny Shakespeare)",
                            "recall_W_K2": "W_K² recall over the training pool's 48 tokens (chance 1/48); "
                                           "recall_W_K2_ood over the 17 held-out ones (chance 1/17)"}}


def draw(ctx: ReproduceContext, tables: Tables, results: dict) -> list[str]:
    icl = [("acc_out", "in-context accuracy, seen triggers"),
           ("acc_out_tood", "in-context accuracy, held-out triggers"),
           ("attn2_ind", "layer-2 induction attention, seen"),
           ("attn2_ind_tood", "layer-2 induction attention, held-out")]
    recalls = [("recall_W_K2", "W_K² recall, seen triggers (of 48)"),
               ("recall_W_K2_ood", "W_K² recall, held-out triggers (of 17)"),
               ("recall_W_O2", "W_O² recall"), ("recall_W_K1", "W_K¹ recall")]
    return two_panels(ctx, tables["triggers"],
                      (icl, 0, dict(ylabel="fraction", ylim=UNIT, title="In-context prediction")),
                      (recalls, 4, dict(ylabel="recall", ylim=UNIT, title="Memory recall probes")),
                      "The induction head on held-out triggers", "triggers.png")

PHASES = Phases(plan=plan, measure=measure, judge=judge, draw=draw, tables=("triggers",),
                columns={"triggers": COLUMNS_TRIGGERS})
register_phases("birth/heldout-triggers", PHASES, options=Options)
