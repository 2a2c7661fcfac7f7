"""The decision-list speed kernels equal the code they replace (``tdyn.papers.decision_list.kernels``).

``kernels.hessian_blocks`` (the per-query W–W blocks in token space) against the dense autograd Hessian (the same
checks as ``theory.hessian_blocks`` passes in tests/test_decision_list.py) and against ``theory.hessian_blocks``
itself on enumerated (samplers A and B, repeated tokens included) and Monte Carlo types.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from tdyn.papers.decision_list import data as dl
from tdyn.papers.decision_list import kernels
from tdyn.papers.decision_list import theory as th
from tdyn.papers.decision_list.model import DecisionListModel, DecisionListModelConfig


def _model(L: int, W_scale: float, V: torch.Tensor, seed: int = 1) -> DecisionListModel:
    g = torch.Generator().manual_seed(seed)
    model = DecisionListModel(DecisionListModelConfig(L))
    with torch.no_grad():
        model.W[0] = W_scale * torch.randn(L, L, generator=g, dtype=torch.float64)
        model.V[0] = V + torch.randn(L, L, generator=g, dtype=torch.float64)
    return model


@pytest.mark.parametrize("L,n,M,sampler,c,w", [(6, 3, 2, "B", 3.0, 1.0), (6, 3, 2, "A", 3.0, 1.0), (8, 4, 3, "B", 50.0, 1.0),
                                               (7, 3, 2, "A", 1e3, 1.0), (8, 7, 2, "B", 1e4, 1.0), (9, 7, 3, "B", 10.0, 1.0),
                                               (10, 9, 2, "B", 1e6, 1.0), (10, 9, 2, "B", 1e7, 0.3), (9, 7, 3, "B", 4e7, 0.5),
                                               (10, 9, 2, "B", 1e6, 0.0)])
def test_kernel_blocks_vs_dense_hessian(L, n, M, sampler, c, w):
    """lower = the largest eigenvalue of the dense W–W block (1e-12 relative); λ_max of the dense Hessian inside
    [lower, upper]; β ≥ ‖∇²_WV F‖₂ and c_up ≥ λ_max(∇²_VV F); the returned vector's Rayleigh quotient is lower.
    The large-c cases are result (2)'s regime, where p is peaked: a kernel that formed Σ_l p_l V[l]V[l]ᵀ and
    subtracted m mᵀ was off by 5e-11 (c = 1e6) to 5e-9 (c = 4e7, W ≠ 0) here; W = 0 checks that the logits
    round as the model's (token-space logits were off by 3e-12 there)."""
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, sampler)
    model = _model(L, w, c * task.P)
    H = th.dense_hessian(model, task, types)
    H = 0.5 * (H + H.T)
    LL = L * L
    lam = float(torch.linalg.eigvalsh(H)[-1])
    bb = kernels.hessian_blocks(model, task, types)
    assert bb.lower == pytest.approx(float(torch.linalg.eigvalsh(H[:LL, :LL])[-1]), rel=1e-12)
    assert bb.lower <= lam * (1 + 1e-13) and lam <= bb.upper * (1 + 1e-13)
    assert bb.beta >= float(torch.linalg.matrix_norm(H[:LL, LL:], 2)) * (1 - 1e-12)
    assert bb.c_up >= float(torch.linalg.eigvalsh(H[LL:, LL:])[-1]) - 1e-14
    v = torch.from_numpy(bb.vector)
    assert float(v @ H @ v) == pytest.approx(bb.lower, rel=1e-12)


CASES = [(L, n, M, s, scale) for (L, n, M), s, scale in itertools.product(
    [(6, 3, 2), (8, 3, 2), (10, 4, 3), (9, 7, 3), (30, 29, 2)], ["A", "B"], [0.1, 1.0, 3.0])
    if not (s == "A" and L > 10)]


@pytest.mark.parametrize("L,n,M,sampler,scale", CASES)
def test_kernel_blocks_equal_reference(L, n, M, sampler, scale):
    """Against ``theory.hessian_blocks``: lower and c_up to 1e-12 relative (measured ≤ 2.2e-14 over these cases);
    β (and so upper) to 1e-8: a type whose attention sits on one token has ‖Σ_p G̃‖_F = 0 exactly, and the square
    root of either path's rounding residue there (≈ 1e-17) reaches 1e-9 (measured ≤ 5.9e-10)."""
    task = dl.make_task(L, M, seed=1)
    types = th.enumerate_types(task, n, sampler)
    model = _model(L, scale, 3 * task.P, seed=L + int(10 * scale))
    ref, new = th.hessian_blocks(model, task, types), kernels.hessian_blocks(model, task, types)
    assert new.lower == pytest.approx(ref.lower, rel=1e-12)
    assert new.c_up == pytest.approx(ref.c_up, rel=1e-12)
    assert new.beta == pytest.approx(ref.beta, rel=1e-8)
    assert new.upper == pytest.approx(ref.upper, rel=1e-8)
    assert abs(float(np.dot(new.vector, ref.vector))) == pytest.approx(1.0, abs=1e-8)


def test_kernel_blocks_on_monte_carlo_types_and_after_the_rows_are_cached():
    """Monte Carlo types (sorted samples with repeats, weight 1/N): the same as the reference; a second call with
    other parameters (the rows come from the cache) too."""
    L, n, M = 8, 5, 3
    task = dl.make_task(L, M, seed=2)
    types = th.sampled_types(task, n, "A", 300, torch.Generator().manual_seed(0))
    for seed in (1, 2):
        model = _model(L, 1.0, 5 * task.P, seed=seed)
        ref, new = th.hessian_blocks(model, task, types), kernels.hessian_blocks(model, task, types)
        assert new.lower == pytest.approx(ref.lower, rel=1e-12) and new.c_up == pytest.approx(ref.c_up, rel=1e-12)


def test_kernel_blocks_fall_back_to_the_reference_where_exp_would_underflow():
    """A W column spanning more than 300 (f fᵀ / Z² could underflow): the reference path, bit for bit."""
    L, n, M = 6, 4, 2
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, "B")
    model = _model(L, 1.0, 3 * task.P)
    with torch.no_grad():
        model.W[0, 0, 1] = 400.0
    ref, new = th.hessian_blocks(model, task, types), kernels.hessian_blocks(model, task, types)
    assert (new.lower, new.upper, new.beta, new.c_up) == (ref.lower, ref.upper, ref.beta, ref.c_up)
