"""Probe of the corpus LM task (``tdyn.papers.real_text.task``): validation loss, attention entropy per
layer (docs/reproductions/real-text.md#causal-attention-entropy) and every layer's attention map on probe window 0."""

from __future__ import annotations

import torch

from tdyn.papers.real_text.model import attention_entropy
from tdyn.probes import ProbeContext, probe


@probe("corpus_lm.attention")
def _lm_probe(ctx: ProbeContext) -> dict[str, torch.Tensor]:
    """Validation loss, attention entropy per layer (docs/reproductions/real-text.md#causal-attention-entropy), and
    every layer's map of probe window 0."""
    x, y = ctx.batch
    model = ctx.model
    was = model.training
    model.eval()
    logits, attns = model(x)
    model.train(was)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 2), y.flatten(), reduction="none")
    out = {"val_loss": ce.view(x.shape[0], -1).mean(1)}
    out |= {f"entropy_layer{i}": attention_entropy(A) for i, A in enumerate(attns)}
    out["maps"] = torch.stack([A[:, 0] for A in attns], 1)   # [S, L, T, T]
    return out
