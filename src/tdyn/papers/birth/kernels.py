"""The model's speed path (tested equal to ``model.py``'s equations in tests/test_birth.py;
docs/reproductions/birth.md#speed).

Both attention layers through ``torch.nn.functional.scaled_dot_product_attention`` (causal, scale 1/√d: the same
softmax(x_tᵀ W_K x_s / √d) as :meth:`~tdyn.papers.birth.model.MemoryTransformer.attention`, fused, without the
T × T probabilities kept for the backward pass), with each layer's value and output maps folded into one d × d
product (W_O W_V) applied once to the attended vectors instead of twice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tdyn.papers.birth.model import MemoryTransformer, _bmm


def logits(model: MemoryTransformer, z: torch.Tensor) -> torch.Tensor:
    """ξ (S, B, T, N), equal to ``model(z)``."""
    x = model.embed(z)
    a1 = F.scaled_dot_product_attention(x, _bmm(x, model.W_K1), x, is_causal=True)      # Σ_s β¹_ts x_s
    h1 = x + _bmm(a1, model.W_O1 @ model.W_V1)
    a2 = F.scaled_dot_product_attention(h1, _bmm(h1, model.W_K2), h1, is_causal=True)   # Σ_s β²_ts h¹_s
    h2 = h1 + _bmm(a2, model.W_O2 @ model.W_V2)
    if model.cfg.final_ffn:
        h2 = h2 + _bmm(h2, model.W_F)
    return _bmm(h2, model.W_U)


def masked_ce(xi: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per member (S,): the mean cross-entropy of logits ξ (S, B, T, N) against y (S, B, T) over the positions of
    ``mask`` (S, B, T) (NaN for a member with none)."""
    ce = F.cross_entropy(xi.flatten(0, -2), y.flatten(), reduction="none").view(y.shape)
    m = mask.to(ce.dtype)
    return (ce * m).sum((1, 2)) / m.sum((1, 2))
