"""Stage measurements for the two-stage claim (docs/reproductions/topic.md#two-stage-mechanism,
docs/reproductions/topic.md#two-stage-measurement), on what the paper means rather than on parameter norms.

Why not ‖W_Kᵀ W_Q‖: a change of the scores that depends only on the query (a row constant of the
query×key score matrix), only on the key, or only on the special keys START/END leaves the same- vs
different-topic attention unchanged, yet it dominates the Frobenius norm. And ‖W_V − W_V(0)‖ grows
without bound under unregularised cross-entropy, so "half of its final value" depends on the run length.

Definitions (pure functions first, tested on hand-made cases; then the ``topic.stages`` probe):

* **Effective scores** S[a, b] = (W_Q ẽ_a + b_Q)·(W_K ẽ_b + b_K)/√d_h for query id a and key id b,
  ẽ the embedding table (one-hot: the identity), heads averaged, layer 0, biases included.
* **Topic-block score** κ: on the word ids only (START/END/PAD/MASK rows and columns dropped), centre
  each query row over the word keys (softmax is invariant to a row constant), then κ = mean over
  same-topic off-diagonal (query, key) pairs − mean over different-topic pairs. It is exactly 0 for a
  query-only, a key-only or a special-key-only score change; it is in logit units, so a same-topic key
  gets e^κ times the attention of a different-topic key, all else equal. ``kappa_se`` = standard
  deviation of the 10 per-topic values / √T (the noise margin: a real topic block shows in every topic).
* **Attention gap** (corrected classes, docs/reproductions/topic.md#corrected-attention-classes): per probe
  document the same-topic minus different-topic attention (relative to uniform); ``gap_doc`` its mean over
  documents, ``gap_se`` the standard error over documents.
* **W_V half-way** t_V, against a fixed reference, the fitted stage-1 optimum (the convex optimum of the
  uniform-attention model class on the same static masks, docs/reproductions/topic.md#stage-1-reference-optimum),
  in two readings: *structure*: the W_V block-contrast change reaches half of the optimum's block contrast; *loss*:
  the probe dev loss has covered half of the way from its initial value to the optimum's loss on the same
  documents. Neither moves with the run length (‖ΔW_V‖ "half of final" did). Also reported, not used in the
  verdict: the *plateau* reading, half of the contrast's own stage-1 plateau, the value at the first logged step
  t_p after which it grows by at most 5% over a doubling of the step count (undefined, None, when it never does: a
  creeping contrast has no plateau).
* **Stage-2 onset** t_KQ: the first logged step where the topic-block score κ ≥ ln 1.05 (a same-topic
  key gets ≥ 5% more attention) *and* κ > 2·kappa_se; the gap reading: gap_doc ≥ 0.05 (5% more than
  uniform) and > 2·gap_se. Never reached → K/Q never moved above noise → inconclusive.
* **Two stages** (per run, per reading of t_V × reading of t_KQ): t_V < t_KQ; delay factor t_KQ / t_V.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tdyn.probes import ProbeContext, probe
from tdyn.probes.topic import block_contrast, pair_classes

KAPPA_ONSET = math.log(1.05)      # logits: a same-topic key gets 5% more attention than a different-topic key
GAP_ONSET = 0.05                  # attention relative to uniform: 5% more on same-topic keys
PLATEAU_REL = 0.05                # plateau: ≤ 5% growth over a doubling of the step count
NOISE_K = 2.0                     # margin above noise, as common.decide


# ---------------------------------------------------------------- pure functions


def effective_scores(table: torch.Tensor, W_Q: torch.Tensor, W_K: torch.Tensor, b_Q: torch.Tensor | None,
                     b_K: torch.Tensor | None, n_heads: int = 1) -> torch.Tensor:
    """S [S, V, V] (rows: query id, columns: key id), heads averaged, from the embedding table
    ``table`` [S, V, d] and one layer's W_Q, W_K [S, d, d], b_Q, b_K [S, d] (or None)."""
    Q = table @ W_Q.transpose(1, 2)
    K = table @ W_K.transpose(1, 2)
    if b_Q is not None:
        Q = Q + b_Q[:, None]
    if b_K is not None:
        K = K + b_K[:, None]
    S_, V, d = Q.shape
    dh = d // n_heads
    Qh, Kh = Q.view(S_, V, n_heads, dh), K.view(S_, V, n_heads, dh)
    return torch.einsum("sahc,sbhc->sab", Qh, Kh) / (n_heads * math.sqrt(dh))


def key_centred_words(S: torch.Tensor, num_special: int) -> torch.Tensor:
    """The word×word block of S [S, V, V] with each query row centred over the word keys."""
    W = S[:, num_special:, num_special:]
    return W - W.mean(-1, keepdim=True)


def topic_block_score(S: torch.Tensor, v: int, num_special: int) -> dict[str, torch.Tensor]:
    """κ, its per-topic values and noise (module docstring) of the score matrix S [S, V, V]."""
    bc = block_contrast(key_centred_words(S, num_special), v, 0)
    per = bc["per_topic"]
    T = per.shape[-1]
    se = per.std(-1, unbiased=True) / math.sqrt(T) if T > 1 else torch.zeros_like(bc["contrast"])
    return {"kappa": bc["contrast"], "kappa_se": se, "kappa_per_topic": per}


def attention_gap_docs(A: torch.Tensor, tokens: torch.Tensor, keys: torch.Tensor, v: int,
                       num_special: int) -> dict[str, torch.Tensor]:
    """Per-document same- minus different-topic attention (relative to uniform), A [S, B, L, L]:
    ``gap_doc`` (mean over documents) and ``gap_se`` (standard error over documents), each [S]."""
    n = keys.sum(-1).to(A.dtype)
    R = A * n[..., None, None]
    m = pair_classes(tokens, v, num_special)
    per = []
    for c in ("same_topic", "diff_topic"):
        s, k = (R * m[c]).sum((-1, -2)), m[c].sum((-1, -2)).to(A.dtype)
        per.append(s / k)
    g = per[0] - per[1]                                             # [S, B], NaN where a class is empty
    ok = ~torch.isnan(g)
    cnt = ok.sum(1).to(A.dtype)
    mean = torch.where(ok, g, 0).sum(1) / cnt.clamp(min=1)
    var = (torch.where(ok, g - mean[:, None], 0) ** 2).sum(1) / (cnt - 1).clamp(min=1)
    return {"gap_doc": mean, "gap_se": var.sqrt() / cnt.clamp(min=1).sqrt()}


def plateau(steps: np.ndarray, x: np.ndarray, rel: float = PLATEAU_REL) -> tuple[float, float] | None:
    """(t_p, x(t_p)): the first logged step t_p > 0 with x(t_p) > 0 after which x grows by at most
    ``rel``·x(t_p) up to the first logged step ≥ 2·t_p; None if no such step (no plateau in the run)."""
    steps, x = np.asarray(steps, float), np.asarray(x, float)
    for i, t in enumerate(steps):
        if t <= 0 or not x[i] > 0:
            continue
        j = np.searchsorted(steps, 2 * t)
        if j >= len(steps):
            return None
        if x[j] - x[i] <= rel * x[i]:
            return float(t), float(x[i])
    return None


def fraction_of_plateau_time(steps: np.ndarray, x: np.ndarray, frac: float = 0.5,
                             rel: float = PLATEAU_REL) -> dict[str, float] | None:
    """First logged step where x ≥ ``frac``·plateau(x); with the plateau step and value. None if no plateau."""
    p = plateau(steps, x, rel)
    if p is None:
        return None
    steps, x = np.asarray(steps, float), np.asarray(x, float)
    hit = np.nonzero(x >= frac * p[1])[0]
    return {"t": float(steps[hit[0]]), "t_plateau": p[0], "plateau": p[1]}


def half_way_time(steps: np.ndarray, x: np.ndarray, ref: float, frac: float = 0.5) -> float | None:
    """First logged step where x has covered ``frac`` of the way from x[0] to the fixed reference ``ref``
    (either direction: a rising contrast or a falling loss); None if never."""
    x = np.asarray(x, float)
    span = ref - x[0]
    if not math.isfinite(span) or span == 0:
        return None
    hit = np.nonzero((x - x[0]) / span >= frac)[0]
    return float(np.asarray(steps, float)[hit[0]]) if len(hit) else None


def onset_time(steps: np.ndarray, x: np.ndarray, se: np.ndarray, threshold: float,
               k: float = NOISE_K) -> float | None:
    """First logged step with x ≥ ``threshold`` and x > k·se (an effect of a stated size, above noise);
    None if never (the quantity never moved above noise)."""
    x, se = np.asarray(x, float), np.asarray(se, float)
    hit = np.nonzero((x >= threshold) & (x > k * se))[0]
    return float(np.asarray(steps, float)[hit[0]]) if len(hit) else None


def ordering(t_v: float | None, t_kq: float | None) -> dict:
    """Two stages for one run and one reading: held True (t_V < t_KQ), False, or None with a reason."""
    if t_v is None:
        return {"held": None, "reason": "W_V never got half-way to the stage-1 reference within the run", "delay": None}
    if t_kq is None:
        return {"held": None, "reason": "K/Q never moved above noise (stage-2 onset never reached)", "delay": None}
    return {"held": t_v < t_kq, "reason": None, "delay": t_kq / t_v if t_v > 0 else math.inf}


# ---------------------------------------------------------------- the probe (task: lda_mlm)


def _layer0(model, name: str):
    p = getattr(model, name, None)
    if p is None:
        return None
    return p[:, 0] if (model.cfg.n_layers > 1 and isinstance(p, torch.nn.Parameter)) else p


def model_scores(model) -> torch.Tensor | None:
    """Effective scores of layer 0 of a ``TopicTransformer`` (None under frozen uniform attention)."""
    if getattr(model, "W_Q", None) is None:
        return None
    return effective_scores(model.embed_table(), _layer0(model, "W_Q"), _layer0(model, "W_K"),
                            _layer0(model, "b_Q"), _layer0(model, "b_K"), model.cfg.n_heads)


@probe("topic.stages")
@torch.no_grad()
def _stages(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    m, b, f = ctx.model, ctx.batch, ctx.task.facts
    v, ns = f["words_per_topic"], f["num_special"]
    out = {}
    S = model_scores(m)
    if S is not None:
        k = topic_block_score(S, v, ns)
        out |= {"kappa": k["kappa"], "kappa_se": k["kappa_se"]}
    A = m.attention(b["clean_tokens"], b["clean_keys"]).mean(2)
    out |= attention_gap_docs(A, b["clean_tokens"], b["clean_keys"], v, ns)
    return out
