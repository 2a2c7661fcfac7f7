"""real/entropy-vs-lr: Tian et al. Fig 10 analogue: the final layer-0 attention entropy of the one-layer tutorial
LM falls with the learning rate, on the offline `wiki` and `bbc` corpora; beyond the paper, separate rates for
the attention block and the rest (docs/reproductions/real-text.md#realentropy-vs-lr). Measure reads each run's
probe curve; judge and draw read the tables, at the last probe or (``--at-step``) at an earlier one."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from tdyn import runs, stats
from tdyn.errors import UserError
from tdyn.papers.real_text.analysis import CORPORA, LM_DEPARTURES, font_sizes, is_quick, lm_config, lm_groups
from tdyn.papers.real_text.model import LMConfig
from tdyn.report import style
from tdyn.reproduce.common import claim, configure, decide, every_cell, reading, results_in
from tdyn.reproduce.phases import Phases, read_table, register_phases
from tdyn.reproduce.registry import ReproduceContext
from tdyn.schema import Strict


@dataclasses.dataclass(frozen=True)
class Grid:
    """Training steps and seeds; the single rates η (5 seeds); the attention-block rates η_Z and ratios
    η_Y/η_Z (the first 3 seeds); dropout; probes every ``steps // 20``."""

    steps: int
    seeds: tuple[int, ...]
    etas: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0, 5.0)
    eta_Z: tuple[float, ...] = (1.0, 3.0)
    ratios: tuple[float, ...] = (1.0, 2.0, 5.0)
    ratio_seeds: int = 3
    dropout: float = 0.2


FULL = Grid(steps=5000, seeds=(1, 2, 3, 4, 5))
QUICK = Grid(steps=150, seeds=(1,))

def departures_fig10(step: int, tokens: int) -> str:
    """How the runs depart from the paper's Fig 10 (docs/reproductions/real-text.md#departures), said in every claim,
    with the step judged and the training tokens up to it (step × batch × bptt of the runs as trained)."""
    return ("Departures (docs/reproductions/real-text.md#departures): `wiki` (Wikipedia lead sections, about 0.71M "
            "training tokens) stands in for WikiText-2 and `bbc` (BBC News, about 0.77M) for WikiText-103 (103M "
            f"tokens); {LM_DEPARTURES}; judged at step {step} ({tokens / 1e6:.1f}M training tokens, about "
            f"{tokens / 0.71e6:.1f} passes over wiki and {tokens / 0.77e6:.1f} over bbc), where the authors trained "
            "5 epochs (about 14,900 steps of WikiText-2, about 736,000 of WikiText-103)")
#: tdyn's split of the tutorial LM into the Y/Z model's two rates, and why the ratio claims are not the paper's
LM_GROUPING = ("tdyn's parameter grouping: \"Z\" = the whole attention block (the in-projection W_Q, W_K, W_V with its "
               "bias, and the out-projection W_O), \"Y\" = everything else (embedding, decoder, feed-forward, "
               "LayerNorms). It is not the paper's: there Y = U W_Vᵀ Uᵀ holds the value map and Z = U W_Q W_Kᵀ Uᵀ/√d only "
               "query and key, so W_V (and the out-projection W_O, which acts on the value path) belongs to Y")
LM_RATIO_DERIVED = ("tdyn's extrapolation of a Y/Z-model prediction to real text; the paper does not make it: \"in the "
                    "original parameterization, it is not clear how to set η_Y and η_Z properly and we leave it for "
                    "future work\" (App. G, as quoted in docs/reproductions/real-text.md#wikitext-training-in-the-paper), and no real-data experiment with separate "
                    "rates exists. " + LM_GROUPING + ". The η_Z = 3 cells use η_Y = 6 and 15, beyond the single-rate "
                    "grid")


def ratio_derived(single: dict, lead: str = "") -> str:
    """:data:`LM_RATIO_DERIVED` with what the single-rate runs measured at the grid's end (``single``: one corpus's
    entropy_vs_eta entry), where the separate-rate cells' η_Y goes beyond it."""
    eta, mean = single["eta"], single["mean"]
    def nats(m: float) -> str:
        return f"{m:.2f}" if abs(m) >= 0.1 else f"{m:.2g}"

    ends = ", ".join(f"{nats(m)} at η = {e:g}" for e, m in list(zip(eta, mean))[-2:])
    text = LM_RATIO_DERIVED + (f" (η ≤ {max(eta):g}), whose final entropy is {ends} against {nats(mean[0])} at "
                               f"η = {eta[0]:g} (entropy_vs_eta in this results.json)")
    return text.replace("The η_Z = 3 cells use", lead) if lead else text
NOISE_DEF = ("σ = standard error over seeds (tdyn.stats.se; one seed gives no noise band, so every "
             "comparison it makes is inconclusive)")

FINAL_COLS = ["corpus", "seed", "all", "entropy", "val_loss"]
CURVE_COLS = ["corpus", "eta", "seed", "step", "entropy", "val_loss"]
RATIO_COLS = ["corpus", "seed", "Z", "Y", "ratio", "entropy", "val_loss"]
RATIO_CURVE_COLS = ["corpus", "Z", "Y", "ratio", "seed", "step", "entropy", "val_loss"]
#: per run of the single-rate panel its last probe and its probe curve; per run of the separate-rate panel the same
COLUMNS = {"final_entropy": FINAL_COLS, "entropy_curves": CURVE_COLS, "ratio": RATIO_COLS,
           "ratio_curves": RATIO_CURVE_COLS}


class EntropyVsLrOptions(Strict):
    """Where the claims are judged."""

    at_step: int | None = Field(
        None, ge=1, description="judge every claim at this probe step, from the probe curves (entropy_curves.csv, "
        "ratio_curves.csv) instead of each run's last probe; with --judge-only, on the tables already in OUT. "
        "results.json says so in settings_note and in each claim's definition")

    @model_validator(mode="before")
    @classmethod
    def _drop_from_tables(cls, values: Any) -> Any:
        """Options recorded before --judge-only replaced ``from_tables`` still read."""
        if isinstance(values, dict) and "from_tables" in values:
            values = {k: v for k, v in values.items() if k != "from_tables"}
        return values


def fig10_configs(ctx: ReproduceContext, corpus: str) -> tuple[dict, dict]:
    """(unified η ∈ {1..5} × 5 seeds; attention η_Z ∈ {1, 3} × ratio η_Y/η_Z ∈ {1, 2, 5} × 3 seeds)."""
    grid = QUICK if ctx.quick else FULL
    kw = dict(corpus=corpus, n_layers=1, dropout=grid.dropout, steps=grid.steps, ckpt_steps=[],
              every=max(grid.steps // 20, 1))
    eta = lm_config(ctx, seeds=grid.seeds, groups=lm_groups(1, "one", 1.0), **kw)
    eta["ensemble"] = {"lrs": [{"all": e} for e in grid.etas]}
    ratio = lm_config(ctx, seeds=grid.seeds[:grid.ratio_seeds], groups=lm_groups(1, "attention", (1.0, 1.0)), **kw)
    ratio["ensemble"] = {"lrs": [{"Z": z, "Y": z * r} for z in grid.eta_Z for r in grid.ratios]}
    return eta, ratio


def fig10_all(ctx: ReproduceContext) -> dict[str, dict]:
    out = {}
    for corpus in CORPORA:
        out[f"{corpus}_eta"], out[f"{corpus}_ratio"] = fig10_configs(ctx, corpus)
    return out


# ---------------------------------------------------------------------------------------------- measure

def _curve(d: Path) -> tuple[dict, list[dict]]:
    """(the run's seed and learning rates; its probe curve: step, entropy, validation loss)."""
    run = runs.Run(d)
    curve = [{"step": x["step"], "entropy": x["corpus_lm.attention/entropy_layer0"],
              "val_loss": x["corpus_lm.attention/val_loss"]}
             for x in run.metrics if "corpus_lm.attention/entropy_layer0" in x]
    return {"seed": run.config["seeds"][0], **run.lrs}, curve


def measure(ctx: ReproduceContext, trained: dict) -> dict[str, list[dict]]:
    """Per run its last probe (final_entropy, ratio) and its probe curve (entropy_curves, ratio_curves)."""
    out: dict[str, list[dict]] = {t: [] for t in COLUMNS}
    for corpus in CORPORA:
        for d in trained[f"{corpus}_eta"]:
            run, curve = _curve(d)
            out["final_entropy"].append(run | {k: curve[-1][k] for k in ("entropy", "val_loss")} | {"corpus": corpus})
            out["entropy_curves"] += [c | {"corpus": corpus, "eta": run["all"], "seed": run["seed"]} for c in curve]
        for d in trained[f"{corpus}_ratio"]:
            run, curve = _curve(d)
            key = run | {"corpus": corpus, "ratio": run["Y"] / run["Z"]}
            out["ratio"].append(key | {k: curve[-1][k] for k in ("entropy", "val_loss")})
            out["ratio_curves"] += [key | c for c in curve]
    return out


# ---------------------------------------------------------------------------------------------- judge

def _every_cell(cells: dict[str, tuple[float, float]]) -> tuple[bool | None, str | None, dict]:
    """(verdict, reason, per-cell numbers) of "every cell holds by 2σ" over ``label: (diff, noise)``."""
    verdicts = {k: decide(d, n) for k, (d, n) in cells.items()}
    held, why = every_cell(verdicts)
    bandless = [k for k, (_, n) in cells.items() if not math.isfinite(n)]
    if held is None and bandless:
        why = f"no noise band (one seed) in {len(bandless)} of {len(cells)} cells" + (f"; {why}" if why else "")
    return held, why, {k: {"diff": d, "noise": n, "verdict": "no noise band" if k in bandless else _word(verdicts[k])}
                       for k, (d, n) in cells.items()}


def _word(v: bool | None) -> str:
    return {True: "holds", False: "fails", None: "within noise"}[v]


def _cells_claim(id: str, statement: str, cells: dict[str, tuple[float, float]], **kw) -> dict:
    """A claim over cells, each ``label: (difference supporting the claim, its noise)``: every cell
    decided with ``decide`` (2σ), combined with ``every_cell``; the per-cell verdicts go in the numbers."""
    held, why, numbers = _every_cell(cells)
    return claim(id, statement, held, reason=why, cells=numbers, **kw)


def _eta_claim(corpus: str, finals: list[dict], departures: str) -> tuple[dict, dict]:
    """(entropy_vs_eta's entry, the Fig 10 claim) of one corpus: two readings of "decreases in η"."""
    etas = sorted({f["all"] for f in finals})
    mean = [float(np.mean([f["entropy"] for f in finals if f["all"] == e])) for e in etas]
    std = [float(np.std([f["entropy"] for f in finals if f["all"] == e])) for e in etas]
    noise = [stats.se([f["entropy"] for f in finals if f["all"] == e]) for e in etas]
    cells = {f"η {x:g}→{y:g}": (a - b, float(np.hypot(na, nb)))
             for x, y, a, b, na, nb in zip(etas, etas[1:], mean, mean[1:], noise, noise[1:])}
    # The paper reports only the trend ("entropy decreases from η = 1 to η = 5"): two readings, side by side
    each, why, cell_numbers = _every_cell(cells)
    ends = (mean[0] - mean[-1], float(np.hypot(noise[0], noise[-1])))
    return {"eta": etas, "mean": mean, "std": std}, claim(
        f"entropy_decreases_in_eta_{corpus}",
        f"final attention entropy decreases from η = 1 to η = 5 ({corpus})",
        readings=[reading("each consecutive η lower than the one before by 2σ (a monotone decrease)", each,
                          reason=why, name="every step", cells=cell_numbers),
                  reading(f"η = {etas[-1]:g} lower than η = {etas[0]:g} by 2σ (the trend's ends)", decide(*ends),
                          reason="η = 5 minus η = 1 within 2σ" if math.isfinite(ends[1]) else "one seed: no noise band",
                          name="the ends", diff=ends[0], noise=ends[1])],
        source="paper",
        quote="validation entropy vs unified η ∈ {1..5}; WikiText-2/-103; 1 layer; 5 seeds ±1 std […] entropy "
              "decreases with η (Fig 10, App. G, docs/reproductions/scan-snap.md#figures)",
        paper="Tian et al. Fig 10 (App. G): the validation attention entropy decreases from η = 1 to η = 5 "
              "(a larger learning rate gives sparser attention; the paper reports the trend only)",
        definition="final layer-0 validation attention entropy, mean over seeds, for each η; " + NOISE_DEF + ". "
                   + departures,
        measured="final validation attention entropy (mean over seeds) vs η",
        expected="decreasing in η beyond 2σ, under each reading", cells=cell_numbers, eta=etas, mean=mean, std=std,
        noise=noise)


def _ratio_claims(corpus: str, rfin: list[dict], departures: str, single: dict) -> tuple[dict, list[dict]]:
    """(ratio's entry, the two separate-rate claims) of one corpus: §6 predictions (b) and (c), tdyn's; ``single``:
    the corpus's single-rate entropy_vs_eta entry, which the derivation cites."""
    zs, rs = sorted({f["Z"] for f in rfin}), sorted({f["ratio"] for f in rfin})
    group = {(z, q): [f["entropy"] for f in rfin if f["Z"] == z and f["ratio"] == q] for z in zs for q in rs}
    tab = {z: [float(np.mean(group[z, q])) for q in rs] for z in zs}
    sd = {z: [stats.se(group[z, q]) for q in rs] for z in zs}
    by_z = _cells_claim(
        f"entropy_decreases_in_eta_Z_{corpus}",
        f"at every ratio η_Y/η_Z, a larger attention-block lr η_Z gives lower entropy ({corpus})",
        {f"ratio {q:g}": (tab[zs[0]][i] - tab[zs[-1]][i], float(np.hypot(sd[zs[0]][i], sd[zs[-1]][i])))
         for i, q in enumerate(rs)},
        source="derived", derived=ratio_derived(single, "Its η_Z = 3 cells at ratios 2 and 5 use")
        + "; here prediction (b), a larger η_Z gives sparser attention, carried to real text",
        paper="Tian et al. §6 prediction (b) (a Y/Z-model result) and App. G (separate rates on real text left "
              "open)",
        definition="final layer-0 validation attention entropy, mean over seeds, largest vs smallest η_Z at "
                   "each ratio; " + NOISE_DEF + ". " + LM_GROUPING + ". " + departures,
        measured="final attention entropy (mean over seeds) vs η_Z and η_Y/η_Z",
        expected="largest η_Z < smallest η_Z by 2σ, at every ratio", table=tab, noise=sd)
    by_ratio = _cells_claim(
        f"entropy_rises_with_ratio_{corpus}",
        f"at fixed η_Z, a larger η_Y/η_Z (beyond ~2) gives denser attention ({corpus})",
        {f"η_Z {z:g}": (v[-1] - v[0], float(np.hypot(sd[z][-1], sd[z][0]))) for z, v in tab.items()},
        source="derived", derived=ratio_derived(single) + "; here prediction (c), a larger η_Y/η_Z gives denser "
                                                          "attention, carried to real text",
        paper="Tian et al. §6 prediction (c) (a Y/Z-model result) and App. G (separate rates on real text left "
              "open)",
        definition="final layer-0 validation attention entropy, mean over seeds, largest vs smallest "
                   "η_Y/η_Z at each η_Z; " + NOISE_DEF + ". " + LM_GROUPING + ". " + departures,
        measured="final attention entropy (mean over seeds) vs η_Y/η_Z",
        expected="largest ratio > smallest ratio by 2σ, at every η_Z", table=tab, noise=sd)
    return {"eta_Z": zs, "ratio": rs, "mean_entropy": {str(z): v for z, v in tab.items()}}, [by_z, by_ratio]


def _at(curves: list[dict], step: int, table: str, runs_of: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """The rows of the probe-curve table ``table`` at probe step ``step``, one per run of ``runs_of``."""
    at = [r for r in curves if r["step"] == step]
    have = {tuple(r[k] for k in keys) for r in at}
    missing = [r for r in runs_of if tuple(r[k] for k in keys) not in have]
    if missing:
        steps = sorted({r["step"] for r in curves})
        raise UserError(f"--at-step {step}: {table}.csv has no probe at step {step} for {len(missing)} of "
                        f"{len(runs_of)} runs (its probes: steps {steps[0] if steps else '-'}..{steps[-1] if steps else '-'})")
    return at


def judged_rows(ctx: ReproduceContext, tables: dict) -> tuple[list[dict], list[dict], list[dict]]:
    """(single-rate rows, their curves, separate-rate rows) as judged: each run's last probe, or with
    ``--at-step N`` its probe at step N (and the curves up to N)."""
    at = ctx.options.at_step if ctx.options is not None else None
    if at is None:
        return tables["final_entropy"], tables["entropy_curves"], tables["ratio"]
    if "ratio_curves" not in tables:
        raise UserError("--at-step: this directory has no ratio_curves.csv (its tables were made before the "
                        "separate-rate curves were kept), so its separate-rate claims can be judged only at each "
                        "run's last probe: judge it without --at-step")
    with_all = [c | {"all": c["eta"]} for c in tables["entropy_curves"]]
    final = [{k: r[k] for k in FINAL_COLS}
             for r in _at(with_all, at, "entropy_curves", tables["final_entropy"], ("corpus", "seed", "all"))]
    ratio = [{k: r[k] for k in RATIO_COLS}
             for r in _at(tables["ratio_curves"], at, "ratio_curves", tables["ratio"], ("corpus", "seed", "Z", "Y"))]
    return final, [c for c in tables["entropy_curves"] if c["step"] <= at], ratio


def judge(ctx: ReproduceContext, tables: dict) -> dict[str, Any]:
    """Per corpus the Fig 10 claim and the two separate-rate claims, from the rows :func:`judged_rows` gives."""
    finals, curves, ratios = judged_rows(ctx, tables)
    at = ctx.options.at_step if ctx.options is not None else None
    last = max(c["step"] for c in tables["entropy_curves"])
    data = configure(next(iter(fig10_all(ctx).values())), ctx.overrides).typed_data()
    departures = departures_fig10(at or last, (at or last) * data.batch_size * data.bptt)
    res = {"experiment": "real/entropy-vs-lr", "claims": [], "entropy_vs_eta": {}, "ratio": {}}
    for corpus in CORPORA:
        res["entropy_vs_eta"][corpus], eta_claim = _eta_claim(corpus, [f for f in finals if f["corpus"] == corpus],
                                                              departures)
        res["ratio"][corpus], ratio_claims = _ratio_claims(corpus, [f for f in ratios if f["corpus"] == corpus],
                                                           departures, res["entropy_vs_eta"][corpus])
        res["claims"] += [eta_claim, *ratio_claims]
    if at is not None:
        res["at_step"] = at
        res["settings_note"] = f"{'quick' if ctx.quick else 'full'} settings, judged at step {at} of {last}"
        for c in res["claims"]:
            c["definition"] = f"at step {at} of {last} (--at-step): " + c["definition"]
    return res


# ---------------------------------------------------------------------------------------------- draw

def _note_text(note: str) -> str:
    """A settings note as the figure's title says it: without the quick/full lead (said otherwise) and the
    tail of notes written by the former --from-tables."""
    note = note.split("; claims re-judged")[0]
    for lead in ("quick settings", "full settings"):
        note = note.removeprefix(lead)
    return note.strip(" ,;")


MARK = {True: "✓", None: "≈", False: "✗"}


def _eta_panel(ax, fin: list[dict], corpus: str) -> list[float]:
    """Fig 10's panel: final entropy vs η (mean ± 1 std over seeds), the every-step reading's mark between
    neighbours (σ = SE over seeds). Returns the η drawn."""
    etas = sorted({f["all"] for f in fin})
    by = {e: [f["entropy"] for f in fin if f["all"] == e] for e in etas}
    mean = [float(np.mean(by[e])) for e in etas]
    ax.errorbar(etas, mean, yerr=[float(np.std(by[e])) for e in etas], marker="o", capsize=4, color="k", lw=1.5)
    se = [stats.se(by[e]) for e in etas]
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + 0.15 * (hi - lo))        # a strip above the data for the verdict marks
    for x0, x1, a, b, na, nb in zip(etas, etas[1:], mean, mean[1:], se, se[1:]):
        ax.text((x0 + x1) / 2, 0.955, MARK[decide(a - b, float(np.hypot(na, nb)))], ha="center", va="top",
                fontsize=15, color="0.2", transform=ax.get_xaxis_transform())
    ax.set_xticks(etas, [f"{e:g}" for e in etas])
    ax.set_xlabel("learning rate η (one rate for all weights)")
    ax.set_ylabel("final attention entropy (nats)")
    ax.set_title(f"{corpus}: final entropy vs η (±1 std)")
    return etas


def _curve_panel(ax, curves: list[dict], corpus: str, etas: list[float]) -> None:
    """The entropy over training per η, mean ± 1 std over seeds."""
    cols = style.colors(len(etas))
    for k, e in enumerate(etas):
        pts = [p for p in curves if p["corpus"] == corpus and p["eta"] == e]
        st = sorted({p["step"] for p in pts})
        y = np.array([[p["entropy"] for p in pts if p["step"] == s] for s in st], dtype=object)
        m = np.array([np.mean(v) for v in y])
        sd = np.array([np.std(v) for v in y])
        ax.plot(st, m, color=cols[k], lw=2, label=f"η = {e:g}")
        ax.fill_between(st, m - sd, m + sd, color=cols[k], alpha=0.12, lw=0)
    ax.set_xlabel("training step")
    ax.set_ylabel("attention entropy (nats)")
    ax.set_title(f"{corpus}: entropy over training")


def _ratio_panel(ax, rfin: list[dict], corpus: str) -> None:
    """Beyond the paper: final entropy vs η_Y/η_Z, one curve per η_Z (mean ± 1 std over seeds)."""
    zs, rs = sorted({f["Z"] for f in rfin}), sorted({f["ratio"] for f in rfin})
    zcol = style.colors(len(zs))
    for k, z in enumerate(zs):
        g = [[f["entropy"] for f in rfin if f["Z"] == z and f["ratio"] == q] for q in rs]
        ax.errorbar(rs, [float(np.mean(v)) for v in g], yerr=[float(np.std(v)) for v in g], marker="o",
                    capsize=4, color=zcol[k], lw=1.5, label=f"η_Z = {z:g}")
    ax.set_xscale("log")
    ax.set_xticks(rs, [f"{q:g}" for q in rs])
    ax.minorticks_off()
    ax.set_xlabel("η_Y / η_Z (rest / attention block)")
    ax.set_ylabel("final entropy (nats)")
    ax.set_title(f"{corpus}: separate attention-block rate (±1 std)")
    ax.legend()


def _setting(finals: list[dict], curves: list[dict], quick: bool, note: str, overrides=()) -> str:
    """The title's settings line: QUICK for quick runs, steps, shapes (the config's after ``overrides``, the run's
    ``--set``), seeds and the note."""
    overrides = list(overrides)
    eta_cfg = configure(fig10_configs(ReproduceContext(out=Path("."), quick=quick, overrides=overrides), "wiki")[0],
                        overrides).model_dump(mode="json")
    d = eta_cfg["model"].get("d", LMConfig().d)
    n_seeds = len({f["seed"] for f in finals})
    return (f"{'QUICK run: ' if quick else ''}{int(max(c['step'] for c in curves))} steps, vocabulary "
            f"{eta_cfg['data']['vocab_size']:,}, d = {d}, {n_seeds} seed{'s' * (n_seeds != 1)}"
            + (f" {note}" if note else ""))


def draw_fig10(finals: list[dict], curves: list[dict], ratios: list[dict], quick: bool, note: str, path: Path,
               overrides=()) -> Path:
    """entropy_vs_lr.png. Top, Tian et al.'s Fig 10 per corpus: final entropy vs the one rate η (✓ lower by
    2σ, ≈ within 2σ, ✗ higher by 2σ between neighbours) and the entropy over training per η. Bottom, set apart
    as beyond the paper (App. G leaves separate rates on real text open): the separate attention-block rate."""
    import matplotlib.pyplot as plt

    style.apply()
    plt.rcParams.update(font_sizes())
    fig = plt.figure(figsize=(12, 13.5), layout="constrained")
    paper, beyond = fig.subfigures(2, 1, height_ratios=[2.15, 1])
    axes = paper.subplots(2, len(CORPORA), squeeze=False)
    rax = beyond.subplots(1, len(CORPORA), squeeze=False)[0]
    beyond.set_facecolor("0.93")
    for c, corpus in enumerate(CORPORA):
        etas = _eta_panel(axes[0, c], [f for f in finals if f["corpus"] == corpus], corpus)
        _curve_panel(axes[1, c], curves, corpus, etas)
        _ratio_panel(rax[c], [f for f in ratios if f["corpus"] == corpus], corpus)
    axes[1, -1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False, title="mean ± 1 std")
    paper.suptitle(f"Tian et al. Fig 10 analogue: attention entropy vs learning rate\n"
                   f"{_setting(finals, curves, quick, note, overrides)}\n"
                   "between η: ✓ lower by 2σ, ≈ within 2σ, ✗ higher by 2σ (σ = SE over seeds)")
    beyond.suptitle("BEYOND THE PAPER (tdyn's, not Fig 10): separate rates η_Y, η_Z on real text, which the paper\n"
                    "leaves open (App. G); tdyn's Z = the whole attention block", color="0.15")
    style.save(fig, path)
    return path


def draw(ctx: ReproduceContext, tables: dict, results: dict) -> list[str]:
    finals, curves, ratios = judged_rows(ctx, tables)
    note = results.get("settings_note") or (f"(--set {' '.join(ctx.overrides)})" if ctx.overrides else "")
    draw_fig10(finals, curves, ratios, ctx.quick, _note_text(note), Path(ctx.out) / "entropy_vs_lr.png",
               list(ctx.overrides))
    return ["entropy_vs_lr.png"]


def draw_entropy_vs_lr(out_dir: Path, quick: bool | None = None, note: str | None = None) -> Path:
    """entropy_vs_lr.png redrawn from OUT's final_entropy.csv, entropy_curves.csv and ratio.csv; ``quick``,
    ``note``: None reads them from OUT's results.json (its settings note)."""
    out_dir = Path(out_dir)
    results = results_in(out_dir)
    if note is None:
        note = _note_text(results.get("settings_note", ""))
    return draw_fig10(*(read_table(out_dir / f"{t}.csv") for t in ("final_entropy", "entropy_curves", "ratio")),
                      is_quick(out_dir, quick), note, out_dir / "entropy_vs_lr.png", results.get("overrides") or [])


#: ratio_curves.csv is optional: the committed evidence (docs/results/real__entropy-vs-lr*) was made before it
#: was kept, and is judged at each run's last probe, as it was
PHASES = Phases(plan=fig10_all, measure=measure, judge=judge, draw=draw, tables=tuple(COLUMNS), columns=COLUMNS,
                optional=("ratio_curves",))
register_phases("real/entropy-vs-lr", PHASES, configs=fig10_all, options=EntropyVsLrOptions)
