"""Bietti et al. 2023, the memories' formation over training (``birth/memories``;
docs/reproductions/birth.md#birthmemories).

Phases: ``plan`` trains one ensemble of seeds on the authors' README task (K = 5 fixed triggers, loss on the
in-context outputs, SGD with momentum); ``measure`` reads each member's probes (table memories: the recall of
W_O², W_K², W_K¹, the in-context accuracy and the attention probes every ``probe_every`` steps); ``judge`` and
``draw`` read that table.
"""

from __future__ import annotations

from tdyn import stats
from tdyn.papers.birth.analysis import (COLUMNS, FULL, PAPER, QUICK, QUOTE_MEMORIES, QUOTE_SUCCEED, Options,
                                        Settings, by_seed, final, formation_step, grid_dict, initial,
                                        ordered, reading, per_seed, trained_rows, with_grid_options, UNIT,
                                        run_config, setting_text, two_panels)
from tdyn.reproduce.common import claim
from tdyn.reproduce.phases import Phases, Tables, register_phases
from tdyn.reproduce.registry import ReproduceContext

#: tdyn's readings, fixed before any run (docs/reproductions/birth.md#claims)
ACC_MIN = 0.9                                      # "reliably predict": in-context accuracy at the end
FORMED = ("abs:0.5", "abs:0.9", "rel:0.5")         # readings of "formed" (see analysis.formation_step)
MEMORIES = ("W_O2", "W_K2", "W_K1")                # the order the claim states
LABELS = {"W_O2": "W_O²", "W_K2": "W_K²", "W_K1": "W_K¹"}


def settings(ctx: ReproduceContext) -> Settings:
    return with_grid_options(QUICK if ctx.quick else FULL, ctx.options)


def plan(ctx: ReproduceContext) -> dict[str, dict]:
    st = settings(ctx)
    return per_seed(ctx, "memories", run_config(st))


def measure(ctx: ReproduceContext, trained: dict) -> Tables:
    return {"memories": trained_rows(trained)}


def judge(ctx: ReproduceContext, tables: Tables) -> dict:
    st = settings(ctx)
    rows = tables["memories"]
    setting = setting_text(ctx, plan(ctx), st, "fixed triggers", "loss on the in-context outputs", probes="")
    acc, first = final(rows, "acc_out"), final(rows, "acc_first")
    m, se = stats.mean_se(acc)
    a1 = stats.paired(final(rows, "attn1_prev"), initial(rows, "attn1_prev"))
    a2 = stats.paired(final(rows, "attn2_ind"), initial(rows, "attn2_ind"))
    claims = [claim(
        "induction_head_forms",
        f"The two-layer model predicts the in-context bigrams reliably by an induction head ({setting})",
        source="paper", quote=QUOTE_SUCCEED, paper=PAPER + ", introduction",
        readings=[reading(f"in-context accuracy (occ ≥ 2) at the end ≥ {ACC_MIN}", stats.decide(m - ACC_MIN, se),
                          name="accuracy", mean=m, se=se, values=acc, first_occurrence_accuracy=first,
                          **stats.margin(m - ACC_MIN, se)),
                  reading("the mechanism: layer-1 attention on the previous token after a trigger, and layer-2 "
                          "attention on the token after an earlier occurrence, both rise from their init "
                          "(paired, 2 SE each)",
                          stats.every_cell({"layer 1": stats.decide(a1[0], a1[1]),
                                           "layer 2": stats.decide(a2[0], a2[1])})[0],
                          name="attention", attn1_gain=a1[0], attn1_se=a1[1], attn2_gain=a2[0], attn2_se=a2[1],
                          attn1_final=final(rows, "attn1_prev"), attn2_final=final(rows, "attn2_ind"))],
        definition="accuracy: top-1 next-token accuracy at the positions whose token is a trigger seen before in the "
                   "sequence (occ ≥ 2, the authors' acc_end); first occurrences (occ = 1) cannot be predicted from the "
                   f"context and are reported beside it. {ACC_MIN} is tdyn's reading of 'reliably', fixed before the runs",
        measured="final in-context accuracy; attention probes' gain over training", expected=f"≥ {ACC_MIN}; gains > 0")]
    rec = {mem: final(rows, f"recall_{mem}") for mem in MEMORIES}
    rec0 = {mem: initial(rows, f"recall_{mem}") for mem in MEMORIES}
    rds = []
    for mem in MEMORIES:
        dm, dse = stats.paired(rec[mem], rec0[mem])
        rds.append(reading(f"recall of {mem} rises from init to the end (paired, 2 SE)", stats.decide(dm, dse),
                           name=mem, initial=rec0[mem], final=rec[mem], **stats.margin(dm, dse)))
    claims.append(claim(
        "memories_are_learned",
        f"Each trained matrix becomes an associative memory of its pairs: its recall rises over training ({setting})",
        readings=rds, source="paper", quote=QUOTE_MEMORIES, paper=PAPER + ", abstract",
        definition="recall (theory.recall_scores, the authors' memory probes): W_O²: fraction of output tokens k with "
                   "argmax_j W_U(j)ᵀ W_O² W_V² w_E(k) = k; W_K²: fraction of triggers k with argmax_k' w_E(k)ᵀ W_K² "
                   "W_O¹ W_V¹ w_E(k') = k (chance 1/K); W_K¹: fraction of positions t+1 with argmax_s p_{t+1}ᵀ W_K¹ p_s "
                   "= t (chance 1/(T−1))", measured="final − initial recall per matrix", expected="> 0 by 2 SE"))
    order_rds = []
    times = {}
    for rd in FORMED:
        t = {}
        for mem in MEMORIES:
            steps, _, v = by_seed(rows, f"recall_{mem}")
            t[mem] = [formation_step(steps, v[i], rd) for i in range(v.shape[0])]
        times[rd] = t
        what = (f"recall first ≥ {rd.split(':')[1]}" if rd.startswith("abs") else
                f"recall first past {float(rd.split(':')[1]):.0%} of its rise from init to the end")
        a = ordered(t["W_O2"], t["W_K2"], "W_O2 before W_K2", f"formed = {what}; W_O² before W_K²")
        b = ordered(t["W_K2"], t["W_K1"], "W_K2 before W_K1", f"formed = {what}; W_K² before W_K¹")
        held, why = stats.every_cell({a["name"]: a["held"], b["name"]: b["held"]})
        order_rds.append(reading(f"formed = {what}: W_O² before W_K² and W_K² before W_K¹ (both comparisons)", held,
                                 name=rd, reason=why if held is None else None,
                                 comparisons={"W_O2 before W_K2": a, "W_K2 before W_K1": b}))
    claims.append(claim(
        "memory_order",
        f"The memories form in the order W_O² (output), then W_K² (induction key-query), then W_K¹ (previous-token "
        f"key-query) ({setting})", readings=order_rds, source="derived",
        derived="the issue's reading of the paper (its theory's top-down gradient steps and its recall probes over "
                "training), which tdyn could not read in full: the order as measured on trained ensembles, each "
                "reading of 'formed' side by side",
        paper=PAPER + ", abstract: " + QUOTE_MEMORIES,
        definition="for each reading of 'formed' (first step with recall ≥ 0.5; ≥ 0.9; past half of its rise), the "
                   "formation steps of two memories compared per seed (paired, 2 SE, at the probe cadence); a reading "
                   "holds when both comparisons hold and fails when either fails (tdyn.stats.every_cell); the readings "
                   "combined by tdyn.stats.combine",
        measured="formation steps per memory and seed", expected="t(W_O²) < t(W_K²) < t(W_K¹)",
        formation_steps=times))
    return {"experiment": "birth/memories", "claims": claims, "settings": grid_dict(st),
            "final": {k: final(rows, k) for k in ("recall_W_O2", "recall_W_K2", "recall_W_K1", "acc_out", "acc_first",
                                                  "loss_out", "attn1_prev", "attn2_ind")},
            "definitions": {"occ": "the authors' outputs_seq counter: how many times the current trigger has occurred",
                            "loss": "cross-entropy of the next token at occ ≥ 2 (the authors' loss_head_only)"}}


def draw(ctx: ReproduceContext, tables: Tables, results: dict) -> list[str]:
    recalls = [(f"recall_{mem}", f"{LABELS[mem]} recall") for mem in MEMORIES]
    icl = [("acc_out", "in-context accuracy (occ ≥ 2)"), ("acc_first", "first occurrences"),
           ("attn1_prev", "layer-1 attention on previous token"), ("attn2_ind", "layer-2 induction attention")]
    return two_panels(ctx, tables["memories"],
                      (recalls, 0, dict(ylabel="memory recall", ylim=UNIT, title="Memory recall probes")),
                      (icl, 3, dict(ylabel="fraction", ylim=UNIT, title="In-context prediction")),
                      "Birth of the induction head: memories over training", "memories.png")

PHASES = Phases(plan=plan, measure=measure, judge=judge, draw=draw, tables=("memories",),
                columns={"memories": COLUMNS})
register_phases("birth/memories", PHASES, options=Options)
