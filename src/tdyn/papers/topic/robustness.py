"""topic/robustness (E5) and topic/squared-loss (E6) (docs/reproductions/topic.md#topicrobustness,
docs/reproductions/topic.md#topicsquared-loss): do the value blocks, same-topic attention and two stages still hold
under other optimizers and learning rates (the paper's "standard SGD or Adam"), and, beyond the paper, under two
heads, two layers, the full BERT block, dynamic masking, the authors' embedding LayerNorm and the squared loss? One
table of variants, several seeds per variant, claims per variant: the value block on each architecture's value path
(:func:`tdyn.papers.topic.value.value_path`), attention on every layer, the two-stage claims."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from tdyn import stats
from tdyn.errors import ConfigError
from tdyn.papers.topic import quotes as quotes
from tdyn.papers.topic.analysis import (E2, E4, GAP_DEF, MATRIX_COLS, as_run, dense_probe_steps, final, heatmaps,
                                        matrices_of, matrix_rows, member_model, metrics_table, run_reference,
                                        stage1_reference, stage_times, two_stage_claims, with_stage_probe)
from tdyn.papers.topic.data import NUM_SPECIAL
from tdyn.papers.topic.stages import GAP_ONSET, attention_gap_docs
from tdyn.papers.topic.task import dataset, lda_config
from tdyn.papers.topic.value import value_path, value_structure
from tdyn.report import style
from tdyn.reproduce.common import claim, configure, decide
from tdyn.reproduce.phases import Phases, register_phases
from tdyn.reproduce.registry import ReproduceContext
from tdyn.runs import Run
from tdyn.schema import Strict
from tdyn.sweep.executors import pool_map


@dataclasses.dataclass(frozen=True)
class Grid:
    """Seeds per variant, training steps, probe interval and log-spaced checkpoints of every variant."""

    seeds: int
    steps: int
    every: int
    checkpoints: int

    def with_options(self, seeds: int | None = None, steps: int | None = None) -> Grid:
        """The grid with the options the user gave (``--seeds``, ``--steps``; None: as it is)."""
        return dataclasses.replace(self, **{k: v for k, v in (("seeds", seeds), ("steps", steps)) if v is not None})


FULL = Grid(seeds=3, steps=3000, every=50, checkpoints=24)
QUICK = Grid(seeds=1, steps=150, every=25, checkpoints=8)
SEEDS = FULL.seeds      # seeds per variant (full settings); --quick: one

# ---------------------------------------------------------------- provenance of the variants

QUOTE_VALUE, PAPER_VALUE = quotes.VALUE, quotes.VALUE_WHERE
QUOTE_ATTENTION, PAPER_ATTENTION = quotes.SIMILARITY, quotes.SIMILARITY_WHERE
GRID_NOTE = ("the settings of the paper's own two-stage figure (ε, optimizers, learning rates, steps) are not in any "
             "available text and the authors' repository ships only the stage-1 demo config: this grid is tdyn's "
             "choice around the one setting the code fixes (Adam lr 0.01, batch 40)")

#: what each variant adds beyond the paper (None: the paper's own setting — one layer, one head, the
#: paper's model, static masks, cross-entropy, SGD or Adam), for ``source="derived"`` claims
DERIVED = {
    "2 heads": "two heads instead of the paper's one-head model: tdyn's extrapolation of the paper's one-layer, "
               "one-head claims to a multi-head layer (heads averaged)",
    "2 layers": "two layers instead of the paper's 'simplified one-layer transformer': tdyn's extrapolation; the "
                "value claim is read on the composed value path W_V⁽²⁾ W_V⁽¹⁾ and attention on both layers",
    "bert block (default init, trained decoder)": "the full BERT block (output projection, residual, LayerNorms, FFN) "
                "and a trained decoder, absent from the paper's model: tdyn's extrapolation; the value claim is "
                "read on the linear value path W_dec W_O W_V (LayerNorms, residual and FFN left out)",
    "dynamic masking, selected keys visible": "standard BERT masking (masks redrawn per batch, selected keys "
                "visible) instead of the authors' static masks with selected keys hidden: tdyn's extrapolation",
    "embedding LayerNorm + token type": "the authors' code's embedding LN(W_E x + T₀), not in the paper's model: "
                "tdyn's extrapolation of the paper's claims to the authors' parameterisation; the value claim is "
                "read on the effective value map (Ẽ W_Vᵀ)ᵀ, at the end of stage 1 and at the end",
    "squared": "the squared loss instead of cross-entropy: the spec marks a cross-entropy vs squared-loss "
               "comparison as likely in the paper's robustness discussion, unverified against any available text "
               "(docs/reproductions/topic.md#loss)",
}


def variant_source(label: str) -> str | None:
    """The ``derived`` text of a variant (None: the paper's own setting)."""
    for key, text in DERIVED.items():
        if label == key or label.endswith(" " + key):
            return text
    return None


def _provenance(label: str, quote: str, paper: str) -> dict[str, str]:
    derived = variant_source(label)
    if derived is None:
        return {"source": "paper", "quote": quote, "paper": paper}
    return {"source": "derived", "derived": derived, "paper": paper + f"; quoted statement: “{quote}”"}


# ---------------------------------------------------------------- measuring one run


def _probe_docs(dc, device: str = "cpu") -> dict[str, torch.Tensor]:
    pb = dataset(dc).probe_batch()
    return {"tokens": pb["clean_tokens"][None].to(device), "keys": pb["clean_keys"][None].to(device)}


@torch.no_grad()
def layer_gaps(model, docs: dict[str, torch.Tensor], v: int) -> list[tuple[float, float]]:
    """(gap_doc, gap_se) of every layer (heads averaged) on the clean probe documents: the corrected
    same- minus different-topic attention per document, mean and standard error over documents (on the
    device of ``docs``)."""
    model = model.to(docs["tokens"].device)
    out = []
    for layer in range(model.cfg.n_layers):
        A = model.attention(docs["tokens"], docs["keys"], layer).mean(2)
        g = attention_gap_docs(A, docs["tokens"], docs["keys"], v, NUM_SPECIAL)
        out.append((float(g["gap_doc"][0]), float(g["gap_se"][0])))
    return out


def value_numbers(model, v: int) -> dict[str, float]:
    """Value-path structure (judged) and layer 0's raw W_V (reported, unjudged) of member 0."""
    W, _ = value_path(model)
    vs = value_structure(W, v, NUM_SPECIAL)
    W0 = model.W_V[0] if model.cfg.n_layers == 1 else model.W_V[0, 0]
    raw = value_structure(W0.detach(), v, NUM_SPECIAL) if W0.shape[0] == W.shape[0] else None
    return {"value_min_topic_contrast": vs["min_topic_contrast"], "value_contrast_noise": vs["contrast_noise"],
            "value_r2_aI_bB_c11": vs["r2"],
            "wv_layer0_min_topic_contrast": raw and raw["min_topic_contrast"],
            "wv_layer0_contrast_noise": raw and raw["contrast_noise"]}


def trajectory(run: Run, v: int, kq_trained: bool, device: str = "cpu") -> list[dict[str, Any]]:
    """Per checkpoint of ``run``: the value path's min per-topic contrast and noise and every layer's
    attention gap ± SE (the attention computed on ``device``)."""
    _, dc = member_model(run, 0)
    docs = _probe_docs(dc, device)
    rows = []
    for s in run.steps():
        model, _ = member_model(run, s)
        r = {"step": s} | value_numbers(model, v)
        if kq_trained:
            for layer, (g, se) in enumerate(layer_gaps(model, docs, v)):
                r |= {f"gap_layer{layer}": g, f"gap_se_layer{layer}": se}
        rows.append(r)
    return rows


def persistent_onset(traj: list[dict], n_layers: int) -> float | None:
    """Stage-2 onset from the checkpoints: the first checkpoint step from which some layer's attention
    gap is ≥ GAP_ONSET (0.05) and > 2·SE at that and at every later checkpoint (a crossing that
    persists); None when no layer gets there within the run."""
    best = None
    for layer in range(n_layers):
        ok = [r[f"gap_layer{layer}"] >= GAP_ONSET and decide(r[f"gap_layer{layer}"], r[f"gap_se_layer{layer}"]) is True
              for r in traj]
        for i in range(len(traj)):
            if traj[i]["step"] > 0 and all(ok[i:]):
                best = traj[i]["step"] if best is None else min(best, traj[i]["step"])
                break
    return best


def end_of_stage1(traj: list[dict], onset: float | None) -> dict[str, Any]:
    """The checkpoint at the end of stage 1: the last one before the stage-2 onset (the final one, when
    stage 2 never began within the run)."""
    before = [r for r in traj if onset is None or r["step"] < onset]
    return before[-1] if before else traj[0]


def summarise_run(run: Run, device: str = "cpu", seed: int | None = None,
                  reference: dict[str, float] | None = None) -> dict[str, Any]:
    """One run (one seed, ``seed`` if known): final loss, the value path at the end and at the end of stage 1,
    every layer's final attention gap, the checkpoint-based stage-2 onset and (W_K, W_Q trained) the stage
    times of :func:`tdyn.papers.topic.analysis.stage_times` (``reference``: the run's ``run_reference``, fitted
    here when None)."""
    m = metrics_table(run)
    model, dc = member_model(run)
    v = dc.words_per_topic
    kq = model.cfg.attention == "trained"
    out: dict[str, Any] = {"final_loss": final(m, "loss"), "dev_loss_probe": final(m, "topic.dev_loss/dev_loss"),
                           "kq_trained": kq, "n_layers": model.cfg.n_layers, "steps": int(m["step"][-1])}
    out |= value_numbers(model, v)
    traj = trajectory(run, v, kq, device)
    out["trajectory"] = traj
    if kq:
        for layer, (g, se) in enumerate(layer_gaps(model, _probe_docs(dc, device), v)):
            out |= {f"gap_layer{layer}": g, f"gap_se_layer{layer}": se}
        onset = persistent_onset(traj, model.cfg.n_layers)
        e1 = end_of_stage1(traj, onset)
        out |= {"stage2_onset": onset, "stage1_end_step": e1["step"],
                "stage1_value_min_topic_contrast": e1["value_min_topic_contrast"],
                "stage1_value_contrast_noise": e1["value_contrast_noise"]}
        ref = run_reference(run) if reference is None else reference
        st = stage_times(m, ref) | {"seed": run.seed if seed is None else seed}
        if model.cfg.n_layers > 1 or model.cfg.block == "bert":
            for tv in ("structure", "plateau"):                  # the probe's value contrast is layer 0's map
                st |= {f"applicable_{tv}": False, f"na_{tv}": LAYER0_VALUE_NA}
        out["stage"] = st
        out |= {k: st.get(k) for k in STAGE_KEYS}
    return out


LAYER0_VALUE_NA = ("the probes' value contrast is layer 0's W_dec W_V Ẽᵀ, not this architecture's value path (W_V⁽²⁾W_V⁽¹⁾ "
                   "for two layers, W_dec W_O W_V for the BERT block): not a reading of its stage-1 value structure")
STAGE_KEYS = ["t_v_structure", "t_v_plateau", "t_v_loss", "t_kq_kappa", "t_kq_gap", "t_kq_kappa_first",
              "t_kq_gap_first", "t_s1_end", "ratio_s1_end", "ratio_t_v", "ratio_step100", "ratio_step500"]
SUMMARY_COLS = ["variant", "seed", "steps", "final_loss", "dev_loss_probe", "value_min_topic_contrast",
                "value_contrast_noise", "value_r2_aI_bB_c11", "wv_layer0_min_topic_contrast", "wv_layer0_contrast_noise",
                "gap_layer0", "gap_se_layer0", "gap_layer1", "gap_se_layer1", "stage2_onset", "stage1_end_step",
                "stage1_value_min_topic_contrast", "stage1_value_contrast_noise", *STAGE_KEYS]
TRAJ_COLS = ["variant", "seed", "step", "value_min_topic_contrast", "value_contrast_noise",
             "wv_layer0_min_topic_contrast", "gap_layer0", "gap_se_layer0", "gap_layer1", "gap_se_layer1"]


# ---------------------------------------------------------------- the variant table


def _variant_configs(variants: dict[str, dict]) -> dict[str, dict]:
    """The run configs of ``variants`` (the ``topic.stages`` probe where W_K, W_Q train), by variant label."""
    return {label: with_stage_probe(copy.deepcopy(base)) if base["model"].get("attention", "trained") == "trained"
            else base for label, base in variants.items()}


def run_name(label: str) -> str:
    """The run directory of a variant under runs/ (from its label: the same whichever variants are selected)."""
    return "v-" + re.sub(r"[^a-z0-9.]+", "-", label.lower()).strip("-")


VALUE_DEF = ("per topic t: mean same-topic off-diagonal entry of the value path W_eff (rows of t, word ids) minus the "
             "mean entry in other topics' columns; W_eff = W_dec · Π_layers (W_O) W_V · Ẽᵀ (tdyn.probes.topic_value."
             "value_path: W_V for one layer, W_V⁽²⁾W_V⁽¹⁾ for two, W_dec W_O W_V for the BERT block, (Ẽ W_Vᵀ)ᵀ with the "
             "embedding LayerNorm); noise = std of that contrast over 200 random word relabellings of the same "
             "matrix; per seed: min over topics > 2 × noise; every seed")


def _anti_topic(r: dict) -> bool:
    """Some layer's final attention gap is below −2 SE: attention moved, away from same-topic keys."""
    return any(decide(r[f"gap_layer{layer}"], r[f"gap_se_layer{layer}"]) is False for layer in range(r["n_layers"]))


def _too_short(rs: list[dict]) -> str:
    """Why stage 2 never began in some seeds: the run was too short (attention still inside its noise band),
    or attention moved away from same-topic keys (no stage 2 to wait for)."""
    none = [r for r in rs if r["stage2_onset"] is None]
    anti = [r for r in none if _anti_topic(r)]
    out = (f"no persistent stage-2 onset (some layer's attention gap ≥ {GAP_ONSET} and > 2 SE from a checkpoint on) "
           f"within {rs[0]['steps']} steps in {len(none)} of {len(rs)} seeds")
    if len(anti) == len(none):
        return out + ": attention moved away from same-topic keys (a final gap below −2 SE), not a run too short"
    return "run too short to reach stage 2: " + out + (f" ({len(anti)} of them anti-topic)" if anti else "")


def _table_claims(rows: list[dict], prefix: str, checkpoints: int) -> list[dict]:
    out = []
    for label in dict.fromkeys(r["variant"] for r in rows):
        rs = [r for r in rows if r["variant"] == label]
        nl, kq = rs[0]["n_layers"], rs[0]["kq_trained"]
        pv = _provenance(label, QUOTE_VALUE, PAPER_VALUE)
        votes = [decide(r["value_min_topic_contrast"], r["value_contrast_noise"]) for r in rs]
        held, why = stats.all_seeds(votes)
        out.append(claim(f"{prefix}-{label}-value-blocks", f"{label}: the value path learns the topic blocks "
                         "(block contrast > 0 for every topic) by the end of the run, every seed", held,
                         reason=why and f"{why} (smallest per-topic contrast within 2× its relabelling noise)",
                         **pv, definition=VALUE_DEF + "; at the final state",
                         measured="min per-topic contrast of the value path and its relabelling noise, per seed "
                                  "(layer 0's raw W_V beside it, unjudged)",
                         expected="> 2 × noise for every topic and seed",
                         min_topic_contrast=[r["value_min_topic_contrast"] for r in rs],
                         contrast_noise=[r["value_contrast_noise"] for r in rs],
                         r2_aI_bB_c11_unjudged=[r["value_r2_aI_bB_c11"] for r in rs],
                         layer0_wv_min_topic_contrast_unjudged=[r["wv_layer0_min_topic_contrast"] for r in rs],
                         layer0_wv_contrast_noise_unjudged=[r["wv_layer0_contrast_noise"] for r in rs]))
        if not kq:
            continue
        votes = [decide(r["stage1_value_min_topic_contrast"], r["stage1_value_contrast_noise"]) for r in rs]
        held, why = stats.all_seeds(votes)
        short = [r for r in rs if r["stage2_onset"] is None]
        out.append(claim(f"{prefix}-{label}-value-blocks-stage1", f"{label}: the value path has the topic blocks at "
                         "the end of stage 1 (before attention takes over), every seed", held,
                         reason=why and f"{why} (smallest per-topic contrast within 2× its relabelling noise)",
                         **pv, definition=VALUE_DEF + f"; at the end of stage 1 = the last checkpoint ({checkpoints} log-spaced) "
                         "before the persistent stage-2 onset (the final checkpoint when stage 2 never began)"
                         + (f"; {_too_short(rs)}" if short else ""),
                         measured="min per-topic value-path contrast and noise at the end of stage 1, per seed",
                         expected="> 2 × noise for every topic and seed",
                         stage1_end_step=[r["stage1_end_step"] for r in rs],
                         stage2_onset=[r["stage2_onset"] for r in rs],
                         min_topic_contrast=[r["stage1_value_min_topic_contrast"] for r in rs],
                         contrast_noise=[r["stage1_value_contrast_noise"] for r in rs]))
        pa = _provenance(label, QUOTE_ATTENTION, PAPER_ATTENTION)
        for layer in range(nl):
            votes = [decide(r[f"gap_layer{layer}"], r[f"gap_se_layer{layer}"]) for r in rs]
            held, why = stats.all_seeds(votes)
            if held is None and short:
                why = f"{why}; {_too_short(rs)}"
            suffix = f"-layer{layer}" if nl > 1 else ""
            out.append(claim(f"{prefix}-{label}-attention{suffix}", f"{label}: same-topic attention > different-topic"
                             + (f" in layer {layer}" if nl > 1 else "") + " at the end of the run, every seed",
                             held, reason=why, **pa,
                             definition=GAP_DEF + f"; layer {layer}, heads averaged; per seed: gap > 2 SE",
                             measured="final attention gap ± SE over probe documents, per seed",
                             expected="gap > 2·SE for every seed", gap=[r[f"gap_layer{layer}"] for r in rs],
                             se=[r[f"gap_se_layer{layer}"] for r in rs]))
        out += _two_stage(prefix, label, rs)
    return out


VALUE_NOTE = ("Robustness variant: the value contrast of the order readings is the topic.stages probe's effective "
              "value map of layer 0 (W_dec W_V Ẽᵀ; for two layers and the BERT block not the whole value path, "
              "which the value-blocks claims judge), and the weight norms are layer 0's.")


def _two_stage(prefix: str, label: str, rs: list[dict]) -> list[dict]:
    """The two two-stage claims of a variant (``analysis.two_stage_claims``: the literal weight-norm statement
    and the functional order), derived for the variants beyond the paper's setting, with the "too short" label
    when stage 2 never began within the run in some seed."""
    out = two_stage_claims([r["stage"] for r in rs], id=f"{prefix}-{label}-two-stage", label=label,
                           where="docs/reproductions/topic.md#topicrobustness", value_note=VALUE_NOTE)
    derived = variant_source(label)
    short = [r for r in rs if not r["stage"].get("stage2_began")]
    for c in out:
        if derived is not None:
            c["source"], c["derived"] = "derived", derived
            c["paper"] += f"; quoted statement: “{c.pop('quote')}”"
        if short and c["verdict"] == "inconclusive":
            why = ("attention moved away from same-topic keys" if all(_anti_topic(r) for r in short)
                   else "run too short to reach stage 2")
            c["reason"] = (f"{c.get('reason') or ''}; {why}: no persistent stage-2 onset in the probes within "
                           f"{rs[0]['steps']} steps in {len(short)} of {len(rs)} seeds").lstrip("; ")
    return out


# ---------------------------------------------------------------- options, figure


class RobustnessOptions(Strict):
    """Options of topic/robustness and topic/squared-loss."""

    seeds: int | None = Field(None, ge=1, description=f"seeds per variant (default {SEEDS}; --quick: 1)")
    steps: int | None = Field(None, ge=1, description="training steps of every variant (default 3000; --quick 150)")
    variants: list[str] | None = Field(None, description="train only these variants: each a label as in the "
                                       "table or the start of exactly one label (e.g. bert,dynamic,2 layers)")


def _opts(ctx: ReproduceContext) -> RobustnessOptions:
    return ctx.options or RobustnessOptions()


def _select(variants: dict[str, dict], only: list[str] | None) -> dict[str, dict]:
    if not only:
        return variants
    out = {}
    for o in only:
        hits = [k for k in variants if k == o] or [k for k in variants if k.startswith(o)]
        if len(hits) != 1:
            raise ConfigError(f"--variants {o!r} names {len(hits)} variants; known: {', '.join(variants)}")
        out[hits[0]] = variants[hits[0]]
    return out


def trajectory_figure(path: Path, rows: list[dict], title: str) -> None:
    """Left: the value path's min per-topic contrast / relabelling noise over training (seed mean); right:
    every layer's attention gap (seed mean), one colour per variant."""
    import matplotlib.pyplot as plt

    style.apply()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 5.2), layout="constrained")
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    for label, col in zip(labels, style.colors(len(labels))):
        rs = [r for r in rows if r["variant"] == label]
        steps = np.array([max(t["step"], 1) for t in rs[0]["trajectory"]])
        ratio = np.mean([[t["value_min_topic_contrast"] / t["value_contrast_noise"] for t in r["trajectory"]]
                         for r in rs], 0)
        ax.plot(steps, ratio, color=col, label=label)
        for layer in range(rs[0]["n_layers"] if rs[0]["kq_trained"] else 0):
            g = np.mean([[t[f"gap_layer{layer}"] for t in r["trajectory"]] for r in rs], 0)
            bx.plot(steps, g, color=col, ls="-" if layer == 0 else "--")
    # the reference lines named on the axes, the variants in one legend under both panels (one colour each)
    for a, level, text, x in ((ax, 2.0, "2 × noise", 0.99), (bx, GAP_ONSET, f"onset level {GAP_ONSET}", 0.01)):
        a.axhline(level, color="k", ls=":", lw=0.8)
        a.annotate(text, (x, level), xycoords=("axes fraction", "data"), xytext=(0, 3), textcoords="offset points",
                   fontsize=9, va="bottom", ha="right" if x > 0.5 else "left")
    for a, yl in ((ax, "value path: min per-topic contrast / relabelling noise"),
                  (bx, "attention gap (same − different topic, / uniform)")):
        a.set_xscale("log")
        a.set_xlabel("step")
        a.set_ylabel(yl)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=min(len(labels), 4), fontsize=9,
               frameon=False)
    ax.set_title("value block on the value path (seed mean)", fontsize=10)
    bx.set_title("attention gap, every layer (seed mean; dashed: layer 1)", fontsize=10)
    fig.suptitle(title)
    style.save(fig, path)


# ---------------------------------------------------------------- the phases, shared by E5 and E6


def _grid(quick: bool, seeds: int | None, steps: int | None) -> Grid:
    return (QUICK if quick else FULL).with_options(seeds=seeds, steps=steps)


#: seconds of each variant's job in the committed full run (docs/results/topic__robustness: its members' meta.json,
#: two workers): the jobs are handed to the workers and measured longest first, so that both finish together
#: (an order only: each job's bits do not depend on it); variants not listed come after, in table order
JOB_SECONDS = {"2 layers": 713, "bert block (default init, trained decoder)": 283, "2 heads": 163,
               "adam lr 0.01 (E4)": 76, "adam lr 0.001": 76, "embedding LayerNorm + token type": 69,
               "sgd lr 1": 65, "sgd lr 10": 65, "dynamic masking, selected keys visible": 39}


def longest_first(labels) -> list[str]:
    """``labels`` in descending order of ``JOB_SECONDS`` (stable; unknown labels last)."""
    return sorted(labels, key=lambda label: -JOB_SECONDS.get(label, 0))


def _summarise(member: Path, device: str, reference: dict[str, float] | None) -> dict[str, Any]:
    """``summarise_run`` of the member directory ``member`` (a pool's call: module-level, plain arguments)."""
    run = as_run(member)
    return {"seed": run.seed} | summarise_run(run, device, run.seed, reference)


def _measure(ctx: ReproduceContext, trained: dict, variants: dict[str, dict], name: str) -> dict[str, list[dict]]:
    """Every run of every variant summarised (``summarise_run``): the summary, the trajectories, every number of
    a run (``<name>_runs``) and its stage times (``<name>_stages``, W_K and W_Q trained). The runs are summarised
    on the local pool (``pool_map``, longest first), after the stage-1 references of their data and loss
    (one fit each, on the pool, handed to every run that needs it)."""
    device = getattr(ctx, "device", "cpu")
    members = [(label, Path(d)) for label in longest_first(variants) for d in trained[run_name(label)]]
    configs = {d: as_run(d).config for _, d in members}
    key = lambda c: (json.dumps(c["data"], sort_keys=True), c["model"].get("loss", "ce"))  # noqa: E731
    kq = [c for c in configs.values() if c["model"].get("attention", "trained") == "trained"]
    wanted = list(dict.fromkeys(key(c) for c in kq))
    refs = dict(zip(wanted, pool_map(stage1_reference, [(json.loads(data), loss) for data, loss in wanted])))
    done = dict(zip([d for _, d in members],
                    pool_map(_summarise, [(d, device, refs.get(key(configs[d]))) for _, d in members],
                             cost=[float(JOB_SECONDS.get(label, 0)) for label, _ in members])))
    rows = [{"variant": label} | done[Path(d)] for label in variants for d in trained[run_name(label)]]
    n = max(r["n_layers"] for r in rows)
    cols = [*BASE_KEYS, *(f"{k}_layer{layer}" for layer in range(n) for k in ("gap", "gap_se")), *KQ_KEYS]
    stages = [{"variant": r["variant"]} | r["stage"] for r in rows if r["kq_trained"]]
    stage_cols = list(dict.fromkeys(k for r in stages for k in r))
    return {name: rows,
            f"{name}_trajectory": [dict.fromkeys(TRAJ_COLS) | {"variant": r["variant"], "seed": r["seed"]} | t
                                   for r in rows for t in r["trajectory"]],
            f"{name}_runs": [{k: r.get(k) for k in cols} for r in rows],
            f"{name}_stages": [{k: r.get(k) for k in stage_cols} for r in stages]}


BASE_KEYS = ["variant", "seed", "final_loss", "dev_loss_probe", "kq_trained", "n_layers", "steps",
             "value_min_topic_contrast", "value_contrast_noise", "value_r2_aI_bB_c11", "wv_layer0_min_topic_contrast",
             "wv_layer0_contrast_noise"]
KQ_KEYS = ["stage2_onset", "stage1_end_step", "stage1_value_min_topic_contrast", "stage1_value_contrast_noise",
           *STAGE_KEYS]


def _rows(tables: dict, name: str) -> list[dict]:
    """The runs as ``summarise_run`` gave them, from the tables: each run's numbers (those its architecture has),
    its ``trajectory`` and (W_K, W_Q trained) its ``stage`` times."""
    stages = {(r["variant"], r["seed"]): {k: v for k, v in r.items() if k != "variant"} for r in tables[f"{name}_stages"]}
    traj: dict[tuple, list[dict]] = {}
    for t in tables[f"{name}_trajectory"]:
        traj.setdefault((t["variant"], t["seed"]), []).append(t)
    out = []
    for r in tables[f"{name}_runs"]:
        kq = r["kq_trained"]
        keys = BASE_KEYS + ([f"{k}_layer{layer}" for layer in range(r["n_layers"]) for k in ("gap", "gap_se")]
                            + KQ_KEYS if kq else [])
        row = {k: r[k] for k in keys} | {"trajectory": traj.get((r["variant"], r["seed"]), [])}
        out.append(row | ({"stage": stages[(r["variant"], r["seed"])]} if kq else {}))
    return out


def _table_json(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("trajectory", "stage", "dir")} for r in rows]


def _phases(name: str, prefix: str, variants, draw) -> Phases:
    """The phases of E5 or E6 (tables ``<name>``, ``<name>_trajectory``, ``<name>_runs``, ``<name>_stages``)."""
    def measure(ctx, trained):
        return _measure(ctx, trained, variants(ctx), name)

    def judge(ctx, tables):
        rows = _rows(tables, name)
        note = {"grid_note": GRID_NOTE} if prefix == "e5" else {}
        return {"experiment": f"topic/{name.replace('_', '-')}"} | note | {
            "table": _table_json(rows),
            "claims": _table_claims(rows, prefix, configure(next(iter(plan(ctx).values())), ctx.overrides).checkpoint.num)}

    def plan(ctx):   # each variant trains into runs/<run_name(label)>, the longest jobs first
        configs = _variant_configs(variants(ctx))
        return {run_name(label): configs[label] for label in longest_first(configs)}

    return Phases(plan=plan, measure=measure, judge=judge, draw=draw,
                  tables=(name, f"{name}_trajectory", f"{name}_runs", f"{name}_stages"),
                  columns={name: SUMMARY_COLS, f"{name}_trajectory": TRAJ_COLS})


# ---------------------------------------------------------------- E5: robustness


def robustness_variants(seed: int = 0, quick: bool = False, seeds: int | None = None,
                        steps: int | None = None) -> dict[str, dict]:
    """E5 (docs/reproductions/topic.md#variants-e1-to-e6): the E4 setting under other optimizers, learning rates,
    heads, layers, the full BERT block, standard dynamic masking and the authors' embedding LayerNorm (``FULL``:
    3 seeds per variant, 24 log-spaced checkpoints; ``QUICK``; ``seeds``, ``steps``: the options)."""
    g = _grid(quick, seeds, steps)

    def cfg(model=None, data=None, optimizer="adam", lr=0.01):
        c = lda_config(E4 | (model or {}), data=data, steps=g.steps, every=g.every, seeds=range(seed, seed + g.seeds),
                       optimizer=optimizer, lr=lr, quick=quick)
        c["checkpoint"] = {"schedule": "log", "num": g.checkpoints}
        c["probes"]["steps"] = dense_probe_steps(g.steps)          # log-spaced early: Adam's stages are short
        return c

    return {
        "adam lr 0.01 (E4)": cfg(),
        "adam lr 0.001": cfg(lr=0.001),
        "sgd lr 1": cfg(optimizer="sgd", lr=1.0),
        "sgd lr 10": cfg(optimizer="sgd", lr=10.0),
        "2 heads": cfg({"n_heads": 2}),
        "2 layers": cfg({"n_layers": 2}),
        "bert block (default init, trained decoder)": cfg({"block": "bert", "decoder": "trained", "init": "default"}),
        "dynamic masking, selected keys visible": cfg(data={"masking": "dynamic", "attend_to_selected": True}),
        "embedding LayerNorm + token type": cfg({"emb_layernorm": True}),
    }


def _robustness(ctx: ReproduceContext) -> dict[str, dict]:
    o = _opts(ctx)
    return _select(robustness_variants(ctx.seed, ctx.quick, o.seeds, o.steps), o.variants)


def _robustness_draw(ctx: ReproduceContext, tables: dict, results: dict) -> list[str]:
    trajectory_figure(ctx.out / "robustness.png", _rows(tables, "robustness"), "E5: value path and attention over training")
    return ["robustness.png"]


register_phases("topic/robustness", _phases("robustness", "e5", _robustness, _robustness_draw),
                options=RobustnessOptions)


# ---------------------------------------------------------------- E6: squared loss


def squared_variants(seed: int = 0, quick: bool = False, seeds: int | None = None,
                     steps: int | None = None) -> dict[str, dict]:
    """E6: E2 and E4 under cross-entropy and the squared loss (the grid of E5)."""
    g = _grid(quick, seeds, steps)
    out = {}
    for name, model in (("E2", E2), ("E4", E4)):
        for loss in ("ce", "squared"):
            c = lda_config(model | {"loss": loss}, steps=g.steps, every=g.every, seeds=range(seed, seed + g.seeds),
                           quick=quick)
            c["checkpoint"] = {"schedule": "log", "num": g.checkpoints}
            c["probes"]["steps"] = dense_probe_steps(g.steps)
            out[f"{name} {loss}"] = c
    return out


def _squared(ctx: ReproduceContext) -> dict[str, dict]:
    o = _opts(ctx)
    return _select(squared_variants(ctx.seed, ctx.quick, o.seeds, o.steps), o.variants)


def _squared_measure(ctx: ReproduceContext, trained: dict) -> dict[str, list[dict]]:
    """E6's tables (``_measure``) and the value path of the first seed of "E2 squared" (else the first variant)."""
    variants = _squared(ctx)
    out = _measure(ctx, trained, variants, "squared_loss")
    shown = "E2 squared" if "E2 squared" in variants else next(iter(variants))
    W = value_path(member_model(trained[run_name(shown)][0])[0])[0]
    return out | {"squared_loss_matrices": matrix_rows({f"W_V ({shown})": W, "W_Vᵀ W_V": W.T @ W})}


def _squared_draw(ctx: ReproduceContext, tables: dict, results: dict) -> list[str]:
    variants = _squared(ctx)
    shown = "E2 squared" if "E2 squared" in variants else next(iter(variants))
    words = configure(_variant_configs(variants)[shown], ctx.overrides).typed_data().words_per_topic
    heatmaps(ctx.out / "squared_loss_value.png", matrices_of(tables["squared_loss_matrices"]), words,
             "E6: stage 1 with the squared loss")
    trajectory_figure(ctx.out / "squared_loss.png", _rows(tables, "squared_loss"),
                      "E6: value path and attention over training")
    return ["squared_loss_value.png", "squared_loss.png"]


_E6 = _phases("squared_loss", "e6", _squared, _squared_draw)
register_phases("topic/squared-loss",
                dataclasses.replace(_E6, measure=_squared_measure, tables=(*_E6.tables, "squared_loss_matrices"),
                                    columns=_E6.columns | {"squared_loss_matrices": MATRIX_COLS}),
                options=RobustnessOptions)
