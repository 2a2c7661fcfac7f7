"""Seed derivation: one user seed gives independent, named random streams (init, data, probe), and
:func:`global_rng`, which lets code written against torch's global RNG draw from one of them."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def global_rng(gen: torch.Generator):
    """Draw torch's global random numbers (of ``gen``'s device) from ``gen`` inside the block.

    The global state is saved, replaced by ``gen``'s, and restored on exit; ``gen`` receives the
    advanced state. Code that draws from the global RNG (``nn.Linear`` init, ``nn.Dropout``) thus
    draws exactly what it would after ``torch.manual_seed`` with ``gen``'s seed, and the caller's
    global stream is untouched. (A ``torch.Generator`` and the global generator of the same device
    share one algorithm, so their states are interchangeable.)
    """
    dev = gen.device
    if dev.type == "cpu":
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(gen.get_state())
            try:
                yield
            finally:
                gen.set_state(torch.get_rng_state())
        return
    mod = getattr(torch, dev.type)
    idx = dev.index if dev.index is not None else mod.current_device()
    with torch.random.fork_rng(devices=[idx], device_type=dev.type):
        mod.set_rng_state(gen.get_state(), idx)
        try:
            yield
        finally:
            gen.set_state(mod.get_rng_state(idx))
