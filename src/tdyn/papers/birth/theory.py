"""Bietti et al. 2023: weight matrices as associative memories (docs/reproductions/birth.md#theory).

An associative memory stores pairs (v_i → u_i) of input and output embeddings as the sum of outer products

    W = Σ_i u_i v_iᵀ                                                             (:func:`memory`)

and recalls u_i from v_i by the best-scoring output: î = argmax_j u_jᵀ W v_i. With near-orthogonal random
embeddings (d large), u_jᵀ W v_i ≈ δ_ij ‖u_i‖² ‖v_i‖², so the recall is exact with high probability; with
orthonormal embeddings it is exact. :func:`recall` is the fraction of pairs recalled, the measure behind the
authors' memory recall probes.

The induction head of the simplified model (:mod:`tdyn.papers.birth.model`) is three such memories
(:func:`induction_memories`):

* W_K¹ = Σ_t p_{t+1} p_tᵀ — position t+1 attends to t (the previous-token head);
* W_K² = Σ_k w_E(k) (W_O¹ W_V¹ w_E(k))ᵀ — a token attends to where it was copied as the previous token;
* W_O² = Σ_k W_U(k) (W_V² w_E(k))ᵀ — the attended token's embedding is read out as that token.

:func:`recall_scores` measures the three on a model (the authors' ``test_wk0``, ``test_wk1``, ``test_wo1``).
"""

from __future__ import annotations

import torch


def memory(U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """W = Σ_i u_i v_iᵀ for rows u_i of U (n, d_out) and v_i of V (n, d_in): (..., d_out, d_in)."""
    return U.transpose(-1, -2) @ V


def recall(W: torch.Tensor, U: torch.Tensor, V: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
    """Fraction of inputs v_i (rows of V, (..., n, d_in)) whose best output argmax_j u_jᵀ W v_i (U: (..., m, d_out))
    is ``targets[i]`` (default i). W (..., d_out, d_in); returns (...)."""
    scores = V @ W.transpose(-1, -2) @ U.transpose(-1, -2)                # (..., n, m): u_jᵀ W v_i
    if targets is None:
        targets = torch.arange(V.shape[-2], device=V.device)
    return (scores.argmax(-1) == targets).to(torch.float64).mean(-1)


def recall_scores(model, *, out_tokens: torch.Tensor, triggers: torch.Tensor, cutoff: int | None = None
                  ) -> dict[str, torch.Tensor]:
    """The three memory recalls of every member (S,):

    * ``W_O2``: tokens k of ``out_tokens`` with argmax_j W_U(j)ᵀ W_O² W_V² w_E(k) = k (the authors' ``test_wo1``);
    * ``W_K2``: tokens k of ``triggers`` with argmax over k' ∈ triggers of w_E(k)ᵀ W_K² W_O¹ W_V¹ w_E(k') = k
      (``test_wk1``; ``triggers``: the fixed triggers, or every token when triggers are drawn per sequence);
    * ``W_K1``: positions t+1 ≤ T−1 (or < ``cutoff``) with argmax over s of p_{t+1}ᵀ W_K¹ p_s = t (``test_wk0``).
    """
    m = model
    E = m.w_E.to(torch.float64)
    WU = m.W_U.to(torch.float64)
    d = lambda name: getattr(m, name).to(torch.float64)   # noqa: E731
    eo = E[:, out_tokens]
    wo2 = recall(d("W_O2") @ d("W_V2"), WU, eo, targets=out_tokens.to(E.device))
    wk2 = _wk2(d("W_K2"), d("W_O1") @ d("W_V1"), E[:, triggers])
    p = m.p.to(torch.float64)[:, :cutoff]
    wk1 = _prev(d("W_K1"), p)
    return {"W_O2": wo2, "W_K2": wk2, "W_K1": wk1}


def _wk2(W_K2: torch.Tensor, A1: torch.Tensor, et: torch.Tensor) -> torch.Tensor:
    """Queries w_E(k), keys W_K² A1 w_E(k'): fraction with argmax_k' = k."""
    keys = et @ A1.transpose(-1, -2) @ W_K2.transpose(-1, -2)            # rows W_K² A1 w_E(k')
    scores = et @ keys.transpose(-1, -2)                                  # (S, K, K): w_E(k)ᵀ W_K² A1 w_E(k')
    idx = torch.arange(et.shape[-2], device=et.device)
    return (scores.argmax(-1) == idx).to(torch.float64).mean(-1)


def _prev(W_K1: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Queries p_{t+1}, keys W_K¹ p_s for s ≤ T−2 (all of them, as the authors' probe): fraction with argmax_s = t."""
    q, k = p[:, 1:], p[:, :-1] @ W_K1.transpose(-1, -2)
    scores = q @ k.transpose(-1, -2)
    idx = torch.arange(q.shape[-2], device=p.device)
    return (scores.argmax(-1) == idx).to(torch.float64).mean(-1)


def induction_memories(model, *, triggers: torch.Tensor, out_tokens: torch.Tensor, scale: float = 1.0
                       ) -> dict[str, torch.Tensor]:
    """The three memories of an induction head for ``model``'s frozen embeddings (see the module docstring), each
    (S, d, d) times ``scale``: W_K¹ = Σ_t p_{t+1} p_tᵀ, W_K² = Σ_{k ∈ triggers} w_E(k) (W_O¹ W_V¹ w_E(k))ᵀ,
    W_O² = Σ_{k ∈ out_tokens} W_U(k) (W_V² w_E(k))ᵀ."""
    p = model.p
    et, eo = model.w_E[:, triggers], model.w_E[:, out_tokens]
    A1 = model.W_O1 @ model.W_V1
    return {"W_K1": scale * memory(p[:, 1:], p[:, :-1]),
            "W_K2": scale * memory(et, et @ A1.transpose(-1, -2)),
            "W_O2": scale * memory(model.W_U[:, out_tokens], eo @ model.W_V2.transpose(-1, -2))}
