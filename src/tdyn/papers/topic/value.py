"""Value-structure checks for the topic model (docs/reproductions/topic.md#stage-1-value-blocks,
docs/reproductions/topic.md#block-contrast; issue 12 item 5).

Definitions (each has a hand-made test in ``tests/test_topic_value.py``):

* **Form R²** ``r2_aIbBc11(W, v)``: on an n×n word block (n = T·v, words ordered by topic), the R² of
  the least-squares fit W ≈ a·I + b·B + c·11ᵀ, B_ij = 1 iff words i, j share a topic; R² = 1 − RSS/TSS
  with TSS about the mean entry. A matrix exactly of that form gives R² = 1.
* **Gauge-fixed R²**: the stage-1 logits W h + b are unchanged by W → W + u1ᵀ (with b → b − u, since
  Σh = 1) and by W → W + 1wᵀ (the same shift of every logit). ``gauge_fix`` returns the
  minimum-Frobenius-norm member of that orbit (W double-centred over the full |V|×|V| matrix); the
  gauge-fixed R² is the form R² of its word block. An ℓ2-regularised optimum is already gauge-fixed.
* **Per-topic block contrast** (``tdyn.papers.topic.probes.block_contrast``): for the rows of topic t, the mean
  same-topic off-diagonal entry minus the mean entry in other topics' columns.
* **Block-contrast noise** ``contrast_noise``: the standard deviation of the per-topic contrast of the
  same matrix after a random relabelling of its words (one permutation applied to rows and columns),
  over ``n_perm`` relabellings: what the contrast reads when the topics carry no structure.
* **Effective map** ``effective_value_map``: with uniform attention the one-layer model computes
  logits = W_dec(W_V Ẽᵀ h + b_V) + b_dec for the visible bag of words h (Ẽ the embedding table, LN'd
  in the authors' setting), so (W_eff, b_eff) = (W_dec W_V Ẽᵀ, W_dec b_V + b_dec) is the model's point
  in the convex stage-1 class (docs/reproductions/topic.md#stage-1-reference-optimum). In the clean setting
  (one-hot, W_dec = I) W_eff = W_V.
* **Value path** ``value_path`` (any architecture; issue 32: judge the value block on the object that carries
  the structure): the product of the linear maps a key's embedding goes through to the logits,
  W_dec · Π_layers (W_O) W_V · Ẽᵀ, with the biases carried along. Attention rows sum to one over the visible
  keys, so for plain attention layers (any number of layers, one head or heads sharing one attention) the
  logits are *exactly* W_eff (A_L ⋯ A_1 X) + b_eff: the attention-weighted bag of the input words mapped by
  W_eff. Two layers: W_V⁽²⁾ W_V⁽¹⁾ (Ẽ = I, W_dec = I); the embedding LayerNorm: W_V Ẽᵀ = (Ẽ W_Vᵀ)ᵀ, the effective
  value map; the BERT block: W_dec W_O W_V Ẽᵀ, the attention-to-logit path with the LayerNorms (their centring,
  gains and per-position scale), the residual and the FFN left out (a linearisation, not exact).
"""

from __future__ import annotations

import functools

import torch

from tdyn import stats
from tdyn.papers.topic.probes import block_contrast


def _design(n: int, v: int) -> torch.Tensor:
    ids = torch.arange(n)
    B = (ids[:, None] // v == ids[None, :] // v).double()
    return torch.stack([torch.eye(n, dtype=torch.float64).flatten(), B.flatten(),
                        torch.ones(n * n, dtype=torch.float64)], 1)


def fit_aIbBc11(W: torch.Tensor, v: int) -> tuple[dict[str, float], float]:
    """Least-squares (a, b, c) of W ≈ a·I + b·B + c·11ᵀ on a word block, and its R²."""
    X = _design(W.shape[0], v)
    y = W.double().flatten()
    coef = torch.linalg.lstsq(X, y[:, None]).solution[:, 0]
    res = y - X @ coef
    tss = (y - y.mean()).pow(2).sum()
    r2 = float(1 - res.pow(2).sum() / tss) if tss > 0 else 1.0
    return {"a": float(coef[0]), "b": float(coef[1]), "c": float(coef[2])}, r2


def r2_aIbBc11(W: torch.Tensor, v: int) -> float:
    """R² of W ≈ a·I + b·B + c·11ᵀ on a word block W [n, n] (module docstring)."""
    return fit_aIbBc11(W, v)[1]


def gauge_fix(W: torch.Tensor) -> torch.Tensor:
    """W − row means − column means + grand mean: the least-norm W + u1ᵀ + 1wᵀ (module docstring)."""
    W = W.double()
    return W - W.mean(1, keepdim=True) - W.mean(0, keepdim=True) + W.mean()


@functools.lru_cache(maxsize=8)
def relabellings(n: int, n_perm: int, seed: int) -> torch.Tensor:
    """The ``n_perm`` word relabellings of ``contrast_noise`` [n_perm, n]: permutations of range(n) drawn one
    after another from a generator seeded ``seed`` (the same for every matrix, so drawn once; read-only)."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n, generator=g) for _ in range(n_perm)])


def contrast_noise(W: torch.Tensor, v: int, num_special: int, n_perm: int = 200, seed: int = 0) -> float:
    """Std of the per-topic block contrast of ``W`` [V, V] under random word relabellings (``relabellings``:
    permutation p applied to rows and columns, W[p][:, p], all at once)."""
    P = relabellings(W.shape[-1] - num_special, n_perm, seed)
    Ww = W[num_special:, num_special:].double()
    pt = block_contrast(Ww[P[:, :, None], P[:, None, :]], v, 0)["per_topic"]
    return stats.sd(pt.flatten().tolist())


def value_structure(W: torch.Tensor, v: int, num_special: int, n_perm: int = 200) -> dict[str, object]:
    """Every value-structure number of a |V|×|V| matrix: per-topic contrast, its minimum, the
    relabelling noise, the fitted (a, b, c) and the raw and gauge-fixed form R²."""
    W = W.detach().double()
    pt = block_contrast(W[None], v, num_special)["per_topic"][0]
    coef, r2 = fit_aIbBc11(W[num_special:, num_special:], v)
    return {"per_topic_contrast": pt.tolist(), "min_topic_contrast": float(pt.min()),
            "contrast_noise": contrast_noise(W, v, num_special, n_perm), "form": coef, "r2": r2,
            "r2_gauge_fixed": r2_aIbBc11(gauge_fix(W)[num_special:, num_special:], v)}


@torch.no_grad()
def effective_value_map(model) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_eff [V, V], b_eff [V]) of member 0 of a one-layer uniform-attention ``TopicTransformer``."""
    if model.cfg.attention != "uniform" or model.cfg.n_layers != 1 or model.cfg.block != "attention":
        raise ValueError("effective_value_map: needs one layer, uniform attention, no BERT block")
    E = model.embed_table()[0].double()                        # [V, d]
    W_V, W_dec = model.W_V[0].double(), model.W_dec[0].double()
    b_V = model.b_V[0].double() if getattr(model, "b_V", None) is not None else torch.zeros(model.d, dtype=torch.float64)
    b_dec = model.b_dec[0].double() if getattr(model, "b_dec", None) is not None else 0.0
    return W_dec @ W_V @ E.T, W_dec @ b_V + b_dec


@torch.no_grad()
def value_path(model, member: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_eff [V, V], b_eff [V]) of member ``member`` of a ``TopicTransformer`` of any architecture: the
    value path W_dec · Π_l (W_O⁽ˡ⁾) W_V⁽ˡ⁾ · Ẽᵀ from a key's embedding to the logits (module docstring; exact
    for plain attention layers, the linear part of the BERT block otherwise). Column w: what a key of word
    w contributes to the logits. With one layer and uniform attention it is ``effective_value_map``."""
    cfg = model.cfg
    M = model.embed_table()[member].double().T                 # [d, V]: column w = ẽ_w
    b = torch.zeros(M.shape[0], dtype=torch.float64)
    for layer in range(cfg.n_layers):
        w = model.layer_weights(layer)
        for W, bias in ((w.W_V, w.b_V), (w.W_O, w.b_O)):       # V = E W_Vᵀ + b_V, then (BERT) H W_Oᵀ + b_O
            if W is not None:                                  # None: the identity (W_V = I) or no W_O
                M, b = W[member].double() @ M, W[member].double() @ b
            if bias is not None:
                b = b + bias[member].double()
    W_dec = model.W_dec[member].double()
    b_dec = model.b_dec[member].double() if getattr(model, "b_dec", None) is not None else 0.0
    return W_dec @ M, W_dec @ b + b_dec


def value_claim_numbers(vs: dict) -> dict[str, float]:
    """The numbers a block-contrast claim stores beside its verdict."""
    return {"min_topic_contrast": vs["min_topic_contrast"], "contrast_noise": vs["contrast_noise"],
            "r2_aI_bB_c11": vs["r2"], "r2_gauge_fixed": vs["r2_gauge_fixed"]}
