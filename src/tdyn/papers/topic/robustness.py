"""topic/robustness (E5) and topic/squared-loss (E6) (docs/reproductions/topic.md#variants-e1-to-e6,
docs/reproductions/topic.md#topicrobustness): do the paper's claims — the value block learns the topics,
same-topic attention, two stages — still hold under other optimizers and learning rates (the paper's own
setting: "standard SGD or Adam"), and, beyond the paper, under two heads, two layers, the full BERT block,
dynamic masking, the authors' embedding LayerNorm and the squared loss? One table of variants, several seeds per
variant (``--seeds``, default 3: one seed has no noise band), claims per variant.

Judged on the right object (issue 32):

* **value block** on each architecture's *value path* (``tdyn.probes.topic_value.value_path``): W_V for the
  one-layer model, W_V⁽²⁾ W_V⁽¹⁾ for two layers, W_dec W_O W_V for the BERT block, the effective value map
  (Ẽ W_Vᵀ)ᵀ for the embedding LayerNorm — not layer 0's W_V (reported beside it, unjudged). Judged at the end of
  the run and at the end of stage 1 (the last checkpoint before the stage-2 onset: with trained attention the value
  path's contrast can decay once attention takes over);
* **attention** on every layer (heads averaged), one claim per layer;
* **stage-2 onset** (for the end of stage 1 and the "too short" label) from the checkpoints: the first checkpoint
  from which some layer's attention gap stays ≥ 0.05 and > 2 SE (over documents) at every later checkpoint — a
  crossing that persists, not a transient.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from tdyn import runs, stats
from tdyn.data.lda import NUM_SPECIAL
from tdyn.errors import ConfigError
from tdyn.reproduce.common import claim, decide
from tdyn.papers.topic import quotes as quotes
from tdyn.reproduce.registry import ReproduceContext, register
from tdyn.papers.topic.analysis import (E2, E4, GAP_DEF, dense_probe_steps, final, heatmaps, member_model,
                                           metrics_table, run_reference, stage_times, train_runs, two_stage_claims,
                                           with_stage_probe)
from tdyn.probes.topic_stages import GAP_ONSET, attention_gap_docs
from tdyn.probes.topic_value import value_path, value_structure
from tdyn.report import style
from tdyn.runs import write_csv
from tdyn.schema import Strict
from tdyn.tasks.lda_mlm import dataset, lda_config

SEEDS = 3               # seeds per variant (full settings); --quick: one
CHECKPOINTS = 24        # log-spaced checkpoints: the value path and every layer's attention over training

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


def trajectory(d: Path, v: int, kq_trained: bool, device: str = "cpu") -> list[dict[str, Any]]:
    """Per checkpoint of run ``d``: the value path's min per-topic contrast and noise and every layer's
    attention gap ± SE (the attention computed on ``device``)."""
    _, dc = member_model(d, 0)
    docs = _probe_docs(dc, device)
    rows = []
    for s in runs.checkpoint_steps(d):
        model, _ = member_model(d, s)
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


def summarise_run(d: Path, device: str = "cpu") -> dict[str, Any]:
    """One run (one seed): final loss, the value path at the end and at the end of stage 1, every
    layer's final attention gap, the checkpoint-based stage-2 onset and (W_K, W_Q trained) the stage
    times of ``topic_common.stage_times``."""
    m = metrics_table(d)
    model, dc = member_model(d)
    v = dc.words_per_topic
    kq = model.cfg.attention == "trained"
    out: dict[str, Any] = {"final_loss": final(m, "loss"), "dev_loss_probe": final(m, "topic.dev_loss/dev_loss"),
                           "kq_trained": kq, "n_layers": model.cfg.n_layers, "steps": int(m["step"][-1])}
    out |= value_numbers(model, v)
    traj = trajectory(d, v, kq, device)
    out["trajectory"] = traj
    if kq:
        for layer, (g, se) in enumerate(layer_gaps(model, _probe_docs(dc, device), v)):
            out |= {f"gap_layer{layer}": g, f"gap_se_layer{layer}": se}
        onset = persistent_onset(traj, model.cfg.n_layers)
        e1 = end_of_stage1(traj, onset)
        out |= {"stage2_onset": onset, "stage1_end_step": e1["step"],
                "stage1_value_min_topic_contrast": e1["value_min_topic_contrast"],
                "stage1_value_contrast_noise": e1["value_contrast_noise"]}
        st = stage_times(m, run_reference(d)) | {"seed": runs.read_meta(d)["seed"]}
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
    """The run configs ``_claim_table`` trains for ``variants`` (the ``topic.stages`` probe where W_K, W_Q train)."""
    return {label: with_stage_probe(copy.deepcopy(base)) if base["model"].get("attention", "trained") == "trained"
            else base for label, base in variants.items()}


def run_name(label: str) -> str:
    """The run directory of a variant under runs/ (from its label: the same whichever variants are selected)."""
    return "v-" + re.sub(r"[^a-z0-9.]+", "-", label.lower()).strip("-")


def _claim_table(ctx: ReproduceContext, variants: dict[str, dict]) -> list[dict]:
    """Train each variant (run ``run_name(label)``, one member per seed) and summarise its runs, one row per run."""
    rows = []
    for label, base in _variant_configs(variants).items():
        _, dirs = train_runs(ctx, run_name(label), base)
        rows += [{"variant": label, "seed": runs.read_meta(d)["seed"], "dir": d}
                 | summarise_run(d, getattr(ctx, "device", "cpu")) for d in dirs]
    return rows


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


def _table_claims(rows: list[dict], prefix: str) -> list[dict]:
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
                         **pv, definition=VALUE_DEF + "; at the end of stage 1 = the last checkpoint (24 log-spaced) "
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
    """The two two-stage claims of a variant (``topic_common.two_stage_claims``: the literal weight-norm statement
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
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.4), layout="constrained")
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    for label, col in zip(labels, style.colors(len(labels))):
        rs = [r for r in rows if r["variant"] == label]
        steps = np.array([max(t["step"], 1) for t in rs[0]["trajectory"]])
        ratio = np.mean([[t["value_min_topic_contrast"] / t["value_contrast_noise"] for t in r["trajectory"]]
                         for r in rs], 0)
        ax.plot(steps, ratio, color=col, label=label)
        for layer in range(rs[0]["n_layers"] if rs[0]["kq_trained"] else 0):
            g = np.mean([[t[f"gap_layer{layer}"] for t in r["trajectory"]] for r in rs], 0)
            bx.plot(steps, g, color=col, ls="-" if layer == 0 else "--", label=label + (f" (layer {layer})" if
                                                                                        rs[0]["n_layers"] > 1 else ""))
    ax.axhline(2, color="k", ls=":", lw=0.8, label="2 × noise")
    bx.axhline(GAP_ONSET, color="k", ls=":", lw=0.8, label=f"onset level {GAP_ONSET}")
    for a, yl in ((ax, "value path: min per-topic contrast / relabelling noise"),
                  (bx, "attention gap (same − different topic, / uniform)")):
        a.set_xscale("log")
        a.set_xlabel("step")
        a.set_ylabel(yl)
        a.legend(fontsize=6)
    ax.set_title("value block on the value path (seed mean)", fontsize=9)
    bx.set_title("attention gap, every layer (seed mean; dashed: layer 1)", fontsize=9)
    fig.suptitle(title)
    style.save(fig, path)


def _tables(ctx: ReproduceContext, rows: list[dict], name: str) -> list[str]:
    write_csv(ctx.out / f"{name}.csv", [dict.fromkeys(SUMMARY_COLS) | r for r in rows], SUMMARY_COLS)
    write_csv(ctx.out / f"{name}_trajectory.csv", [dict.fromkeys(TRAJ_COLS) | {"variant": r["variant"], "seed": r["seed"]}
                                                  | t for r in rows for t in r["trajectory"]], TRAJ_COLS)
    return [f"{name}.csv", f"{name}_trajectory.csv"]


def _table_json(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("trajectory", "stage", "dir")} for r in rows]


# ---------------------------------------------------------------- E5: robustness


def robustness_variants(seed: int = 0, quick: bool = False, seeds: int | None = None,
                        steps: int | None = None) -> dict[str, dict]:
    """E5 (docs/reproductions/topic.md#variants-e1-to-e6): the E4 setting under other optimizers, learning rates,
    heads, layers, the full BERT block, standard dynamic masking and the authors' embedding LayerNorm; ``seeds``
    seeds per variant (default 3, quick 1), 24 log-spaced checkpoints."""
    n = seeds or (1 if quick else SEEDS)
    steps, every = (steps or (150 if quick else 3000)), (25 if quick else 50)

    def cfg(model=None, data=None, optimizer="adam", lr=0.01):
        c = lda_config(E4 | (model or {}), data=data, steps=steps, every=every, seeds=range(seed, seed + n),
                       optimizer=optimizer, lr=lr, quick=quick)
        c["checkpoint"] = {"schedule": "log", "num": 8 if quick else CHECKPOINTS}
        c["probes"]["steps"] = dense_probe_steps(steps)          # log-spaced early: Adam's stages are short
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


@register("topic/robustness", "E5: do the value blocks (on each architecture's value path), same-topic attention "
          "(every layer) and two stages survive other optimizers, learning rates, heads, layers and the full BERT "
          "block? (3 seeds per variant)", options=RobustnessOptions,
          configs=lambda ctx: _variant_configs(_robustness(ctx)))
def reproduce_robustness(ctx: ReproduceContext) -> dict:
    rows = _claim_table(ctx, _robustness(ctx))
    files = _tables(ctx, rows, "robustness")
    trajectory_figure(ctx.out / "robustness.png", rows, "E5: value path and attention over training")
    return {"experiment": "topic/robustness", "grid_note": GRID_NOTE, "table": _table_json(rows),
            "claims": _table_claims(rows, "e5"), "files": files + ["robustness.png"]}


# ---------------------------------------------------------------- E6: squared loss


def squared_variants(seed: int = 0, quick: bool = False, seeds: int | None = None,
                     steps: int | None = None) -> dict[str, dict]:
    """E6: E2 and E4 under cross-entropy and the squared loss; ``seeds`` seeds per variant (default 3)."""
    n = seeds or (1 if quick else SEEDS)
    steps, every = (steps or (150 if quick else 3000)), (25 if quick else 50)
    out = {}
    for name, model in (("E2", E2), ("E4", E4)):
        for loss in ("ce", "squared"):
            c = lda_config(model | {"loss": loss}, steps=steps, every=every, seeds=range(seed, seed + n), quick=quick)
            c["checkpoint"] = {"schedule": "log", "num": 8 if quick else CHECKPOINTS}
            c["probes"]["steps"] = dense_probe_steps(steps)
            out[f"{name} {loss}"] = c
    return out


def _squared(ctx: ReproduceContext) -> dict[str, dict]:
    o = _opts(ctx)
    return _select(squared_variants(ctx.seed, ctx.quick, o.seeds, o.steps), o.variants)


@register("topic/squared-loss", "E6: E2 and E4 with the squared loss instead of cross-entropy (3 seeds per variant)",
          options=RobustnessOptions, configs=lambda ctx: _variant_configs(_squared(ctx)))
def reproduce_squared(ctx: ReproduceContext) -> dict:
    variants = _squared(ctx)
    rows = _claim_table(ctx, variants)
    files = _tables(ctx, rows, "squared_loss")
    shown = "E2 squared" if "E2 squared" in variants else next(iter(variants))
    model, _ = member_model(next(r["dir"] for r in rows if r["variant"] == shown))     # its first seed
    W = value_path(model)[0]
    heatmaps(ctx.out / "squared_loss_value.png", {f"W_V ({shown})": W, "W_Vᵀ W_V": W.T @ W},
             10, "E6: stage 1 with the squared loss")
    trajectory_figure(ctx.out / "squared_loss.png", rows, "E6: value path and attention over training")
    return {"experiment": "topic/squared-loss", "table": _table_json(rows), "claims": _table_claims(rows, "e6"),
            "files": files + ["squared_loss_value.png", "squared_loss.png"]}
