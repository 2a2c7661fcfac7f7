"""What the real-text reproductions share: the corpora checked, the tutorial LM's run configs and parameter
groups (real/attention-maps, real/entropy-vs-lr), the departures from the authors' code said in every LM
claim, and the figure settings (docs/reproductions/real-text.md)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from tdyn.reproduce.common import results_in

CORPORA = ("wiki", "bbc")

LM_PARAMS_ATTN = ("in_W", "in_b", "out_W", "out_b")
LM_PARAMS_FFN = ("W1", "b1", "W2", "b2")

#: How tdyn's LM runs depart from the authors' code (docs/reproductions/real-text.md#departures), said in every claim
LM_DEPARTURES = ("training windows of bptt = 35 tokens drawn at uniform random offsets of the training stream (the "
                 "authors' tutorial code walks 20 fixed columns in order); the entropy is measured on 20 fixed, evenly "
                 "spaced validation windows (700 tokens), not on the whole validation set")


@dataclasses.dataclass(frozen=True)
class LMGrid:
    """The tutorial LM's shapes: vocabulary and, where not the model's defaults (None), width and hidden width."""

    vocab_size: int
    d: int | None = None
    d_hid: int | None = None

    def model(self) -> dict:
        """The model config's shape entries (none at the defaults)."""
        return {k: v for k, v in (("d", self.d), ("d_hid", self.d_hid)) if v is not None}


LM_FULL = LMGrid(vocab_size=20000)
LM_QUICK = LMGrid(vocab_size=2000, d=64, d_hid=64)


def lm_groups(n_layers: int, split: Literal["one", "ffn", "attention"], lr: float | tuple[float, float]) -> dict:
    """SGD parameter groups: one group; FFN vs rest (Fig 7 notebook, lr 10 / 5); attention ("Z") vs rest ("Y")."""
    names = ["emb", "dec_W", "dec_b"] + [f"layers.{i}.{p}" for i in range(n_layers)
                                         for p in LM_PARAMS_ATTN + LM_PARAMS_FFN +
                                         ("ln1_g", "ln1_b", "ln2_g", "ln2_b")]
    if split == "one":
        return {"all": {"params": names, "optimizer": "sgd", "lr": lr, "momentum": 0.0}}
    sel = LM_PARAMS_FFN if split == "ffn" else LM_PARAMS_ATTN
    inner = [n for n in names if n.split(".")[-1] in sel]
    a, b = lr
    g1, g2 = ("ffn", "rest") if split == "ffn" else ("Z", "Y")
    return {g1: {"params": inner, "optimizer": "sgd", "lr": a, "momentum": 0.0},
            g2: {"params": [n for n in names if n not in inner], "optimizer": "sgd", "lr": b, "momentum": 0.0}}


def lm_config(ctx, *, corpus: str, n_layers: int, dropout: float, steps: int, seeds,
              groups: dict, ckpt_steps: list[int], every: int) -> dict:
    """A corpus_lm run config at ``ctx``'s setting (:data:`LM_QUICK` or :data:`LM_FULL` shapes)."""
    lm = LM_QUICK if ctx.quick else LM_FULL
    return {
        "task": "corpus_lm",
        "data": {"corpus": corpus, "vocab_size": lm.vocab_size},
        "model": {"n_layers": n_layers, "dropout": dropout} | lm.model(),
        "seeds": list(seeds),
        "optim": {"steps": steps, "groups": groups, "grad_clip": 0.5},
        "probes": {"names": ["corpus_lm.attention"], "every": every},
        "checkpoint": {"schedule": "none", "steps": ckpt_steps},
    }


def is_quick(out_dir: Path, quick: bool | None) -> bool:
    """``quick`` as given, else as the directory's results.json says (False without one)."""
    return quick if quick is not None else bool(results_in(out_dir).get("quick"))


def font_sizes() -> dict:
    """Sizes for figures shown 600–900 px wide: at most 13 inches wide, ≥ 13 pt text (≥ 10 pt once scaled)."""
    return {"font.size": 13, "axes.titlesize": 14, "axes.labelsize": 13, "xtick.labelsize": 12,
            "ytick.labelsize": 12, "legend.fontsize": 12, "figure.titlesize": 15}
