"""Seed derivation: one user seed gives independent, named random streams (init, data, probe)."""

from __future__ import annotations

import hashlib

import torch


def derive_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for ``stream`` derived from ``seed`` (stable across platforms and versions)."""
    digest = hashlib.sha256(f"tdyn:{seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(seed: int, stream: str, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` for ``stream`` of ``seed``."""
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(seed, stream))
    return g
