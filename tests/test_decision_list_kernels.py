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


@pytest.mark.parametrize("L,n,M,sampler", [(6, 3, 2, "A"), (8, 3, 2, "B"), (9, 7, 3, "B"), (10, 4, 3, "A")])
def test_kernel_blocks_by_chunks_of_queries_equal_all_at_once(L, n, M, sampler, monkeypatch):
    """The kernel works on a few queries' rows at a time (``_CHUNK_ROWS``): one query per chunk gives the same
    blocks' bracket as all rows at once (to rounding: the products see other row counts) and as the reference,
    the cheap and the exact β included (the bracket made wide by a small c)."""
    task = dl.make_task(L, M, seed=1)
    types = th.enumerate_types(task, n, sampler)
    model = _model(L, 1.0, 3 * task.P, seed=L)
    whole = kernels.hessian_blocks(model, task, types)
    monkeypatch.setattr(kernels, "_CHUNK_ROWS", 1)
    split = kernels.hessian_blocks(model, task, types)
    ref = th.hessian_blocks(model, task, types)
    for new in (whole, split):
        assert new.lower == pytest.approx(ref.lower, rel=1e-12) and new.c_up == pytest.approx(ref.c_up, rel=1e-12)
        assert new.beta <= ref.beta * (1 + 1e-8)
    assert split.beta == pytest.approx(whole.beta, rel=1e-12) and split.upper == pytest.approx(whole.upper, rel=1e-12)


@pytest.mark.parametrize("L,nq,seed", [(3, 3, 0), (8, 8, 1), (40, 40, 2), (40, 40, 3)])
def test_block_bound_by_eigenvalues_alone_equals_the_reference(L, nq, seed):
    """``kernels._block_bound`` (every block's eigenvalues by eigvalsh, the top block's eigenvector alone) against
    ``theory.block_bound`` (eigh of every block) on drawn non-symmetric blocks (both symmetrise) whose top eigenvalues
    lie in different blocks: lower and upper to 1e-13 relative (LAPACK's eigenvalue-only and eigenvector paths round
    differently: measured ≤ 2e-15), β and c_up equal, the vector the same up to sign (simple top eigenvalue:
    |cos| to 1e-10) and an eigenvector of the symmetrised top block (residual ≤ 1e-12·‖A‖)."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(nq, L, L, generator=g, dtype=torch.float64) * torch.rand(nq, 1, 1, generator=g, dtype=torch.float64)
    beta_q = torch.rand(nq, generator=g, dtype=torch.float64)
    ref, new = th.block_bound(A, beta_q, 0.7), kernels._block_bound(A, beta_q, 0.7)
    assert new.lower == pytest.approx(ref.lower, rel=1e-13) and new.upper == pytest.approx(ref.upper, rel=1e-13)
    assert new.beta == ref.beta and new.c_up == ref.c_up
    assert abs(float(np.dot(new.vector, ref.vector))) == pytest.approx(1.0, abs=1e-10)
    S = 0.5 * (A + A.transpose(1, 2))
    vec = torch.from_numpy(new.vector).view(2, L, L)[0]
    q = int(vec.abs().sum(0).argmax())
    assert torch.allclose(S[q] @ vec[:, q], new.lower * vec[:, q], rtol=0, atol=1e-12 * float(S[q].norm()))


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


# ---------------------------------------------------------------- the token-space loss, its gradient, classification
EPS = float(torch.finfo(torch.float64).eps)


def _members(L: int, task, scales: list[tuple[float, float]], seed: int = 0) -> DecisionListModel:
    """An ensemble (S = len(scales)) with W = w·N(0, 1), V = c·P + N(0, 1) per member."""
    g = torch.Generator().manual_seed(seed)
    model = DecisionListModel(DecisionListModelConfig(L), S=len(scales))
    with torch.no_grad():
        for i, (w, c) in enumerate(scales):
            model.W[i] = w * torch.randn(L, L, generator=g, dtype=torch.float64)
            model.V[i] = c * task.P + torch.randn(L, L, generator=g, dtype=torch.float64)
    return model


def _grads(model, loss_fn, go):
    model.W.grad = model.V.grad = None
    loss = loss_fn()
    (loss * go).sum().backward()
    out = loss.detach().clone(), model.W.grad.clone(), model.V.grad.clone()
    model.W.grad = model.V.grad = None
    return out


def _close(new, ref, tol):
    assert float((new - ref).abs().max()) <= tol * float(ref.abs().max()), float((new - ref).abs().max() / ref.abs().max())


LOSS_CASES = [(L, n, M, s) for (L, n, M), s in itertools.product(
    [(6, 3, 2), (8, 3, 2), (10, 4, 3), (9, 7, 3), (12, 11, 2), (16, 4, 3)], ["A", "B"]) if not (s == "A" and L > 10)]


@pytest.mark.parametrize("L,n,M,sampler", LOSS_CASES)
def test_token_loss_and_gradient_equal_the_model(L, n, M, sampler):
    """``kernels.population_loss`` (one row per (type, query token), closed-form backward) against
    ``theory.population_loss`` and its autograd gradient, members at W = 0 / 0.5 / 3 × N(0, 1) and c = 0 … 10⁶, with
    the members' upstream gradients 1, 0.5, 0 (the trainer's mask of a diverged member). Tolerance: 1e-13 of the
    largest entry, plus n·ε·max|V| — the rounding of logits z = V α̃ of size up to max|V| (the two paths sum them in
    other orders; at W = 0 the loss depends on O(1) differences of logits of size c/n, measured ≤ 1.3e-11 relative at
    c = 10⁶ against the bound's 6.7e-10)."""
    _loss_and_gradient_against_autograd(L, n, M, sampler, itertools.product([0.0, 0.5, 3.0], [0.0, 3.0, 1e3, 1e6]))


def _loss_and_gradient_against_autograd(L, n, M, sampler, cells):
    """Three members at each (W scale w, c) of ``cells``, upstream gradients 1, 0.5, 0: ``kernels.population_loss``'s
    loss and gradients against ``theory.population_loss`` under autograd, to 1e-13 + n·ε·max|V| (see above)."""
    task = dl.make_task(L, M, seed=1)
    types = th.enumerate_types(task, n, sampler)
    for w, c in cells:
        model = _members(L, task, [(w, c), (w, c), (w, c)], seed=L + int(c))
        go = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
        ref = _grads(model, lambda: th.population_loss(model, task, types), go)
        new = _grads(model, lambda: kernels.population_loss(model, task, types), go)
        tol = 1e-13 + n * EPS * float(model.V.detach().abs().max())
        for a, b in zip(new, ref):
            _close(a, b, tol)


@pytest.mark.parametrize("forced", ["counts_by_member", "alpha_together"])
@pytest.mark.parametrize("L,n,M,sampler", [(8, 3, 2, "B"), (9, 7, 3, "A"), (9, 7, 3, "B"), (12, 11, 2, "B")])
def test_token_loss_and_gradient_equal_the_model_on_both_sides_of_the_size_switches(L, n, M, sampler, forced,
                                                                                      monkeypatch):
    """The trainer's forms are chosen by size (``_COUNT_FORM_ELEMS``, ``_MEMBER_ELEMS``), and at the sizes of
    test_token_loss_and_gradient_equal_the_model each case takes one side only (b = 1 never member by member). Here
    the thresholds are forced to 0 (count-row forward where b = 0, every gradient member by member, b = 1's scatter
    form included) or out of reach (α̃ forms, all members at once): the same check against autograd, same tolerance."""
    monkeypatch.setattr(kernels, "_COUNT_FORM_ELEMS", 0 if forced == "counts_by_member" else 1 << 62)
    monkeypatch.setattr(kernels, "_MEMBER_ELEMS", 0 if forced == "counts_by_member" else 1 << 62)
    monkeypatch.setattr(kernels, "_LAST", [None])                # no forward cached under the other thresholds
    _loss_and_gradient_against_autograd(L, n, M, sampler, [(0.0, 3.0), (0.5, 1e3), (3.0, 1e6)])


@pytest.mark.parametrize("sampler", ["A", "B"])
def test_token_loss_equals_brute_force_over_every_sequence(sampler):
    """The token-space loss over the enumerated types equals the model's loss summed over every ordered sequence of
    the support with its probability (``theory.all_sequences``), and so does its gradient."""
    L, n, M = 6, 3, 2
    task = dl.make_task(L, M, seed=3)
    model = _members(L, task, [(1.0, 3.0), (0.2, 20.0)], seed=5)
    go = torch.ones(2, dtype=torch.float64)
    new = _grads(model, lambda: kernels.population_loss(model, task, th.enumerate_types(task, n, sampler)), go)
    brute = th.all_sequences(task, n, sampler)
    ref = _grads(model, lambda: th.population_loss(model, task, brute), go)
    for a, b in zip(new, ref):
        _close(a, b, 1e-13)


def test_token_loss_on_monte_carlo_types_and_classification():
    """Monte Carlo types (sorted samples with repeats, weight 1/N): loss, gradient and classification as the model's."""
    L, n, M = 8, 5, 3
    task = dl.make_task(L, M, seed=2)
    types = th.sampled_types(task, n, "A", 300, torch.Generator().manual_seed(0))
    model = _members(L, task, [(1.0, 5.0), (0.1, 50.0)], seed=7)
    go = torch.ones(2, dtype=torch.float64)
    for a, b in zip(_grads(model, lambda: kernels.population_loss(model, task, types), go),
                    _grads(model, lambda: th.population_loss(model, task, types), go)):
        _close(a, b, 1e-13)
    ref, new = th.classify(model, task, types), kernels.classify(model, task, types)
    assert torch.equal(new.err_sup, ref.err_sup)
    assert torch.allclose(new.acc_pop, ref.acc_pop, rtol=1e-13, atol=0)
    assert torch.allclose(new.min_margin, ref.min_margin, rtol=1e-12, atol=0)


@pytest.mark.parametrize("L,n,M,sampler", LOSS_CASES)
def test_token_classification_equals_the_model(L, n, M, sampler):
    """``kernels.classify`` (a row's margin z_y − max_{l≠y} z_l stands for its positions) against
    ``theory.classify``: Err_sup equal, Acc_pop to 1e-13, the minimum margin to n·ε·max|V| (the logits' rounding);
    the shared forward's logits are left bit for bit as they were (the label's entry leaves the max in place), and the
    minimum margin is exactly that of a copy with the label's entry at −inf."""
    task = dl.make_task(L, M, seed=1)
    types = th.enumerate_types(task, n, sampler)
    model = _members(L, task, [(0.0, 3.0), (0.5, 1e3), (3.0, 1e6), (0.0, 1e6)], seed=L)
    fw = kernels.token_forward(model, task, types)
    z = fw.z.clone()
    ref, new = th.classify(model, task, types), kernels.classify(model, task, types)
    assert torch.equal(new.err_sup, ref.err_sup)
    assert torch.allclose(new.acc_pop, ref.acc_pop, rtol=1e-13, atol=0)
    tol = n * EPS * model.V.detach().flatten(1).abs().amax(1)
    assert ((new.min_margin - ref.min_margin).abs() <= tol).all()
    assert kernels.token_forward(model, task, types) is fw and torch.equal(fw.z, z)
    y = fw.rows.y.view(1, -1, 1).expand(len(z), -1, 1)
    margins = z.gather(2, y)[..., 0] - z.scatter(2, y, -torch.inf).amax(2)
    assert torch.equal(new.min_margin, torch.where(fw.rows.valid, margins, torch.inf).amin(1))


def test_token_forward_is_shared_while_the_parameters_are_unchanged():
    """The probes of one evaluation and the training step at the same iterate share one forward; an update (in place,
    or a replaced tensor) computes a new one; the loss's backward is first order only."""
    L, n, M = 8, 3, 2
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, "B")
    model = _members(L, task, [(0.5, 3.0), (0.5, 3.0)])
    a = kernels.token_forward(model, task, types)
    assert kernels.token_forward(model, task, types) is a
    with torch.no_grad():
        model.W[1, 0, 0] += 1e-3
    b = kernels.token_forward(model, task, types)
    assert b is not a and not torch.equal(b.z[1], a.z[1]) and torch.equal(b.z[0], a.z[0])
    model.V.data = model.V.data.clone() * 2
    assert kernels.token_forward(model, task, types) is not b
    loss = kernels.population_loss(model, task, types).sum()
    gW, = torch.autograd.grad(loss, model.W, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(gW.sum(), model.W)


def test_token_paths_fall_back_to_the_reference_where_exp_could_underflow():
    """A W column spanning more than SPAN_MAX: loss, gradient and classification are the reference's, bit for bit."""
    L, n, M = 6, 3, 2
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, "B")
    model = _members(L, task, [(1.0, 3.0)])
    with torch.no_grad():
        model.W[0, 0, 1] = kernels.SPAN_MAX + 100
    go = torch.ones(1, dtype=torch.float64)
    for a, b in zip(_grads(model, lambda: kernels.population_loss(model, task, types), go),
                    _grads(model, lambda: th.population_loss(model, task, types), go)):
        assert torch.equal(a, b)
    ref, new = th.classify(model, task, types), kernels.classify(model, task, types)
    assert all(torch.equal(x, y) for x, y in ((ref.err_sup, new.err_sup), (ref.acc_pop, new.acc_pop),
                                              (ref.min_margin, new.min_margin)))


@pytest.mark.parametrize("L,n,M,sampler", LOSS_CASES)
def test_token_forward_by_count_rows_equals_the_alpha_form(L, n, M, sampler):
    """The forward without α̃ (z = C_q diag(f_q) Vᵀ / Z per query) against the form through α̃ (z = α̃ Vᵀ), three
    different members (W = 0 / 0.5 / 3 × N(0, 1), c = 3 … 10⁶): Z and α̃ (computed on demand) to 4L·ε relative, z and
    zs to 4L·ε·max|V| (sums of L products in another order), exp(zs) and Σ exp(zs) to that times their size, the loss to
    1e-13 of its size plus n·ε·max|V| (as test_token_loss_and_gradient_equal_the_model)."""
    task = dl.make_task(L, M, seed=1)
    types = th.enumerate_types(task, n, sampler)
    model = _members(L, task, [(0.0, 3.0), (0.5, 1e3), (3.0, 1e6)], seed=L)
    W, V = model.W.detach(), model.V.detach()
    R = kernels._Rows.of(task, types, L, W.dtype)
    new, ref = kernels._forward_counts(W, V, R), kernels._forward_alpha(W, V, R)
    assert new.at_ is None                                  # the training step never forms α̃
    for i in range(3):
        vmax = float(V[i].abs().max())
        zt = 4 * L * EPS * vmax
        assert float((new.Z[i] - ref.Z[i]).abs().max()) <= 4 * L * EPS * float(ref.Z[i].abs().max())
        assert float((new.at[i] - ref.at[i]).abs().max()) <= 4 * L * EPS
        assert float((new.z[i] - ref.z[i]).abs().max()) <= zt
        assert float((new.zs[i] - ref.zs[i]).abs().max()) <= 2 * zt
        assert float((new.e[i] - ref.e[i]).abs().max()) <= 2 * zt + 4 * EPS
        assert float((new.se[i] - ref.se[i]).abs().max()) <= L * (2 * zt + 4 * EPS) * float(ref.se[i].max())
        assert abs(float(new.losses[i] - ref.losses[i])) <= 1e-13 * abs(float(ref.losses[i])) + n * EPS * vmax


@pytest.mark.parametrize("L,n,M,sampler", [c for c in LOSS_CASES if c[1] <= c[0] // 2])
def test_gradient_by_count_rows_equals_the_alpha_form(L, n, M, sampler):
    """Small subsets (c = e, the tokens present): the gradient read off M_q = Σ_rows∈q (ρ/Z) cᵀ (one product) against
    the form through α̃ (Σ ρ α̃ᵀ and Vᵀρ per row), both at the same forward, upstream gradients 1, 0.5, 0: to
    1e-13 of the largest entry. The trainer's path takes the forms by size (``_COUNT_FORM_ELEMS``,
    ``_MEMBER_ELEMS``); test_token_loss_and_gradient_equal_the_model checks it against autograd on both sides of
    them (L = 16, n = 4, 3 members: count rows, member by member; the smaller cases: α̃)."""
    task = dl.make_task(L, M, seed=1)
    types = th.enumerate_types(task, n, sampler)
    model = _members(L, task, [(0.0, 3.0), (0.5, 1e3), (3.0, 30.0)], seed=L + 1)
    W, V = model.W.detach(), model.V.detach()
    R = kernels._Rows.of(task, types, L, W.dtype)
    assert not R.b
    go = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    fw = kernels._forward_counts(W, V, R)
    rho, gbar = kernels._rho(fw, go)
    new = kernels._grad_counts(fw, rho.clone(), gbar.clone())
    assert fw.at_ is None                                   # the count form never forms α̃
    ref = kernels._grad_alpha(fw, rho, gbar)
    for a, b in zip(new, ref):
        _close(a, b, 1e-13)
    assert torch.equal(new[0][2], torch.zeros(L, L, dtype=torch.float64))


@pytest.mark.parametrize("by_member", [False, True])
@pytest.mark.parametrize("L,n,M", [(8, 3, 2), (9, 7, 3)])
def test_members_of_an_ensemble_train_as_if_alone(L, n, M, by_member, monkeypatch):
    """An ensemble member's loss and gradient are those of the same parameters trained alone (S = 1), to 4ε of the
    largest entry: MKL's products round by the operands' alignment (a member's view of the ensemble's tensors starts
    32 bytes off a cache line: 1 ulp in ∂F/∂V at c = 10⁴). Both count forms: n ≤ L/2 and n close to L; at these
    sizes the forms of small members (all members at once), and with the size switches forced to 0 the count-row
    forward and the member-by-member gradient of large ones."""
    if by_member:
        monkeypatch.setattr(kernels, "_COUNT_FORM_ELEMS", 0)
        monkeypatch.setattr(kernels, "_MEMBER_ELEMS", 0)
    monkeypatch.setattr(kernels, "_LAST", [None])
    task = dl.make_task(L, M, seed=4)
    types = th.enumerate_types(task, n, "B")
    model = _members(L, task, [(0.5, 3.0), (2.0, 1e4), (0.1, 1e6)], seed=9)
    go = torch.tensor([1.0, 0.25, 2.0], dtype=torch.float64)
    together = _grads(model, lambda: kernels.population_loss(model, task, types), go)
    for i in range(3):
        one = _members(L, task, [(0.0, 0.0)])
        with torch.no_grad():
            one.W[0], one.V[0] = model.W[i], model.V[i]
        alone = _grads(one, lambda: kernels.population_loss(one, task, types), go[i:i + 1])
        for a, b in zip(together, alone):
            _close(a[i], b[0], 4 * EPS)


@pytest.mark.parametrize("forced", ["counts_by_member", "alpha_together", "by_size"])
@pytest.mark.parametrize("L,n,M,sampler", [(8, 3, 2, "B"), (9, 7, 3, "A"), (9, 7, 3, "B"), (16, 4, 3, "B")])
def test_a_frozen_parameter_leaves_the_others_gradient_bit_for_bit(L, n, M, sampler, forced, monkeypatch):
    """``population_loss(..., frozen=(name,))``: the frozen parameter's ``.grad`` stays None and the other's gradient
    (and the loss) is the one of the full backward bit for bit, in every form of the kernels (count rows or α̃, member
    by member or all at once, b = 0 and b = 1), so a run with W or V frozen trains the same bits as when both gradients
    were formed. The W part alone is also checked: it is needed when V is frozen (decision-list/claim2's W-only runs)."""
    if forced != "by_size":
        monkeypatch.setattr(kernels, "_COUNT_FORM_ELEMS", 0 if forced == "counts_by_member" else 1 << 62)
        monkeypatch.setattr(kernels, "_MEMBER_ELEMS", 0 if forced == "counts_by_member" else 1 << 62)
    monkeypatch.setattr(kernels, "_LAST", [None])
    task = dl.make_task(L, M, seed=4)
    types = th.enumerate_types(task, n, sampler)
    model = _members(L, task, [(0.5, 3.0), (2.0, 1e4), (0.0, 1e6)], seed=9)
    go = torch.tensor([1.0, 0.25, 2.0], dtype=torch.float64)
    loss, dW, dV = _grads(model, lambda: kernels.population_loss(model, task, types), go)
    for frozen, want in ((("W",), dV), (("V",), dW)):
        model.W.grad = model.V.grad = None
        part = kernels.population_loss(model, task, types, frozen=frozen)
        (part * go).sum().backward()
        assert torch.equal(part.detach(), loss)
        (got_frozen, got) = (model.W.grad, model.V.grad) if frozen == ("W",) else (model.V.grad, model.W.grad)
        assert got_frozen is None
        assert torch.equal(got, want)
    model.W.grad = model.V.grad = None


@pytest.mark.parametrize("forced", ["counts", "alpha"])
@pytest.mark.parametrize("L,n,M,sampler", [(8, 3, 2, "B"), (9, 7, 3, "B"), (16, 4, 3, "B")])
def test_a_forward_at_the_same_W_reuses_its_attention_bit_for_bit(L, n, M, sampler, forced, monkeypatch):
    """``token_forward`` after a step that moved V only takes f, Z (and α̃) from the last forward: every tensor of the
    new forward equals a forward computed from scratch at (W, V) bit for bit, and the attention side is the last one's
    own tensors; a step that moved W computes it again."""
    monkeypatch.setattr(kernels, "_COUNT_FORM_ELEMS", 0 if forced == "counts" else 1 << 62)
    monkeypatch.setattr(kernels, "_LAST", [None])
    task = dl.make_task(L, M, seed=4)
    types = th.enumerate_types(task, n, sampler)
    model = _members(L, task, [(0.5, 3.0), (2.0, 1e3)], seed=3)
    first = kernels.token_forward(model, task, types)
    first.at                                                     # a probe formed α̃ (the count form: on first use)
    with torch.no_grad():
        model.V += 1e-3 * torch.randn(model.V.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    second = kernels.token_forward(model, task, types)
    assert second is not first and second.f is first.f and second.Z is first.Z and second.at_ is first.at_
    R = second.rows
    fresh = kernels._compute_forward(model.W.detach(), model.V.detach(), R)
    for name in ("W", "V", "f", "Z", "z", "zs", "e", "se"):
        assert torch.equal(getattr(second, name), getattr(fresh, name)), name
    assert torch.equal(second.at, fresh.at)
    with torch.no_grad():
        model.W += 1e-3
    third = kernels.token_forward(model, task, types)
    assert third.f is not second.f and not torch.equal(third.f, second.f)


@pytest.mark.parametrize("L,n,M,sampler,S,queries", [
    (L, n, M, s, S, q) for (L, n, M, s, S), q in itertools.product(
        [(9, 7, 3, "B", 3), (12, 11, 2, "B", 2), (10, 4, 3, "B", 2), (8, 5, 3, "A", 2)], [1, 2, 3])] + [(40, 38, 3, "B", 1, 2)])
def test_forward_and_gradient_by_queries_are_the_whole_rows_bit_for_bit(L, n, M, sampler, S, queries, monkeypatch):
    """The α̃ forward and b = 1's member gradient a few queries at a time (``_CHUNK_ELEMS`` forced to 0, chunks of 1–3
    queries) against the same over all rows at once (forced out of reach): every tensor of the forward and both
    gradients (also each alone, as with a frozen parameter) equal bit for bit, at W = 0 and at drawn W, c up to 4·10⁷
    (decision-list/claim2's L = 40, n = 38 included: the size the chunks are for)."""
    task = dl.make_task(L, M, seed=2)
    types = th.enumerate_types(task, n, sampler)
    for w, c in ((0.7, 4e7),) if L == 40 else ((0.0, 1e6), (0.7, 4e7), (2.0, 30.0)):
        model = _members(L, task, [(w, c)] * S, seed=L + int(w * 10))
        W, V = model.W.detach(), model.V.detach()
        R = kernels._Rows.of(task, types, L, W.dtype)
        monkeypatch.setattr(kernels, "_CHUNK_ELEMS", 1 << 62)
        ref = kernels._forward_alpha(W, V, R)
        go = torch.linspace(0.5, 1.5, S, dtype=torch.float64)
        ref_g = [kernels._population_grad(ref, go, need) for need in ((True, True), (True, False), (False, True))]
        monkeypatch.setattr(kernels, "_CHUNK_ELEMS", 0)
        monkeypatch.setattr(kernels, "_CHUNK_QUERIES", queries)
        new = kernels._forward_alpha(W, V, R)
        for name in ("W", "V", "f", "Z", "at_", "z", "zs", "e", "se"):
            assert torch.equal(getattr(new, name), getattr(ref, name)), name
        for need, want in zip(((True, True), (True, False), (False, True)), ref_g):
            got = kernels._population_grad(new, go, need)
            for a, b in zip(got, want):
                assert (a is None and b is None) or torch.equal(a, b)
        again = kernels._forward_alpha(W, V + 1.0, R, kernels._AtW(new.W, new.f, new.Z, new.at_))
        fresh = kernels._forward_alpha(W, V + 1.0, R)
        assert all(torch.equal(getattr(again, x), getattr(fresh, x)) for x in ("z", "zs", "e", "se"))
        # the classification from the margins the chunks took: the same as from the logits
        assert new.zo is not None and ref.zo is None
        cls = []
        for fw in (ref, new):
            monkeypatch.setattr(kernels, "_LAST", [fw])
            cls.append(kernels.classify(model, task, types))
        assert all(torch.equal(getattr(cls[0], x), getattr(cls[1], x)) for x in ("err_sup", "acc_pop", "min_margin"))
        assert torch.equal(new.z, ref.z) and torch.equal(new.member(S - 1).zo, new.zo[S - 1:])


def test_exp_nonpositive_is_exp_with_subnormals_flushed():
    x = torch.tensor([0.0, -1.0, -700.0, -708.0, -708.5, -745.0, -1e6, -torch.inf], dtype=torch.float64)
    want = torch.where(x >= -708.0, torch.exp(x), torch.zeros_like(x))
    assert torch.equal(kernels.exp_nonpositive(x), want)
    assert torch.equal(kernels.exp_nonpositive(x[:3]), torch.exp(x[:3]))
    assert kernels.exp_nonpositive(torch.tensor([-1e6, torch.nan, 0.0], dtype=torch.float64))[1].isnan()   # NaN stays


# ---------------------------------------------------------------- the dense closed-form Hessian, λ on the probe's path
@pytest.mark.parametrize("L,n,M,sampler", [(6, 3, 2, "A"), (6, 3, 2, "B"), (7, 5, 2, "B")])
def test_dense_closed_form_hessian_equals_autograd(L, n, M, sampler):
    """``kernels.dense_hessian`` at the model's logits (``model_forward``) against ``theory.dense_hessian`` (one
    double-backprop HVP per basis vector): 1e-13 of its Frobenius norm (measured ≤ 1.5e-14 over W up to
    3 × N(0, 1) and c up to 10⁶); at the token-space logits within n·ε·max|V| (their rounding)."""
    task = dl.make_task(L, M, seed=1)
    types = th.enumerate_types(task, n, sampler)
    for w, c in ((0.0, 1e6), (1.0, 3.0), (3.0, 1e3)):
        model = _model(L, w, c * task.P, seed=L + int(w))
        H = th.dense_hessian(model, task, types)
        H = 0.5 * (H + H.T)
        Hm = kernels.dense_hessian(kernels.model_forward(model, task, types))
        assert float((Hm - H).norm()) <= 1e-13 * float(H.norm())
        Ht = kernels.dense_hessian(kernels.token_forward(model, task, types))
        assert float((Ht - H).norm()) <= (1e-13 + n * EPS * float(model.V.detach().abs().max())) * float(H.norm())


@pytest.mark.parametrize("L,n,M,c", [(10, 9, 2, 1e9), (10, 9, 2, 4e7), (40, 38, 3, 4e7)])
def test_probe_lambda_at_the_token_space_logits(L, n, M, c):
    """The probe measures λ_max at the training loss's token-space logits, the plan's λ_max(0) (and the dense autograd
    Hessian) at the model's: the two differ by the logits' rounding only, ≤ ε·max|z| relative (here at W = 0, where
    p is least peaked and λ most sensitive to z; measured 0.1–0.15 of it). At result (2)'s L = 40, c = 4·10⁷
    (z ≈ 10⁶) that is ≤ 2.4e-10, inside the η check's 1e-9; both brackets are certified (width ≤ 1e-10)."""
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, "B")
    model = _model(L, 0.0, c * task.P, seed=3)
    fm, ft = kernels.model_forward(model, task, types), kernels.token_forward(model, task, types)
    bm = kernels.hessian_blocks(model, task, types, fw=fm)
    bt = kernels.hessian_blocks(model, task, types, fw=ft)
    assert bm.rel_width <= 1e-10 and bt.rel_width <= 1e-10
    assert abs(bt.lower - bm.lower) <= EPS * float(ft.z.abs().max()) * bm.lower


def test_probe_lambda_dense_path_at_the_token_space_logits():
    """The dense path (2L² ≤ DENSE_MAX) at the token-space logits against the model's (the default): within ε·max|z|."""
    from tdyn.papers.decision_list.probes import lambda_max

    L, n, M = 6, 5, 2
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, "B")
    for w, c in ((0.0, 1e3), (1.0, 1e6)):
        model = _model(L, w, c * task.P, seed=3)
        lam_m, up_m, how = lambda_max(model, task, types)
        fw = kernels.token_forward(model, task, types)
        lam_t, up_t, _ = lambda_max(model, task, types, fw)
        assert how == "dense" and lam_m == up_m and lam_t == up_t
        assert abs(lam_t - lam_m) <= EPS * float(fw.z.abs().max()) * abs(lam_m)


@pytest.mark.parametrize("L,n,M,sampler,c,w", [(6, 3, 2, "B", 3.0, 1.0), (6, 3, 2, "A", 3.0, 1.0), (8, 4, 3, "B", 50.0, 1.0),
                                               (7, 3, 2, "A", 1e3, 1.0), (8, 7, 2, "B", 1e4, 1.0), (9, 7, 3, "B", 10.0, 3.0),
                                               (10, 9, 2, "B", 1e6, 1.0), (10, 9, 2, "B", 1e7, 0.3), (9, 7, 3, "B", 4e7, 0.5),
                                               (10, 9, 2, "B", 1e6, 0.0), (8, 3, 2, "B", 1.0, 0.0), (9, 7, 3, "A", 1e8, 2.0)])
@pytest.mark.parametrize("by_columns", [False, True])
def test_cheap_upper_bound_is_above_the_dense_lambda_max(L, n, M, sampler, c, w, by_columns):
    """``kernels.lambda_upper`` ≥ λ_max of the dense closed-form Hessian at the same (token-space) logits and ≥ the
    block bracket's upper end, on both samplers (b = 0 and b = 1 rows), c from 1 to 10⁸ (p peaked: the expanded
    second moment cancels to a few ulps of c², covered by its rounding slack) and W = 0 (uniform attention); its trace
    by the two products and by the column split V = cP + E (``by_columns``, valid for any V). (That it
    is tight enough to skip steps: the probe test below; along claim2's L = 40 paths it is 2–4× λ_max after the
    first steps, benchmarks/README.md.)"""
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, sampler)
    model = _model(L, w, c * task.P, seed=L + int(w))
    fw = kernels.token_forward(model, task, types)
    lam = float(torch.linalg.eigvalsh(kernels.dense_hessian(fw))[-1])
    bb = kernels.hessian_blocks(model, task, types, fw=fw)
    up = kernels.lambda_upper(fw, by_columns)
    assert up >= lam and up >= bb.upper
    if by_columns:     # the per-query form: ≥ λ_max and ≥ the column split it bounds term by term (to rounding)
        uq = kernels.lambda_upper(fw, per_query=True)
        assert uq >= lam and uq >= bb.upper and uq >= up * (1 - 1e-8)   # (the column split adds slack for its cancellations)
    if by_columns:     # the block bracket's upper end with its cheap β: ≥ the refined one, ≥ λ_max (to its rounding)
        bu = kernels.block_upper(fw)
        assert bu >= bb.upper and lam <= bu * (1 + 1e-13)
        R = fw.rows
        A, beta_q, c_up, _ = kernels._block_chunk(fw, R)
        assert bu == kernels._block_bound(A, beta_q, c_up).upper or len(kernels._chunks(R)) > 1


def _hessian_runs(tmp_path, max_only: bool, steps: int = 60):
    """Two members (η = 1/λ_max(0) and 0.3/λ_max(0)) of L = 8 GD from V₀ = cP + E, λ_max at every step (``every`` 1)."""
    from tdyn.papers.decision_list.analysis import lambda_max0
    from tdyn.papers.decision_list.task import decision_list_config
    from tdyn.runs import Run
    from tdyn.train.trainer import train

    geo = {"L": 8, "n": 3, "M": 2, "task_seed": 0, "seeds": [0], "steps": steps,
           "model": {"c": 30.0, "V_noise": 1.0, "V_noise_seed": 11}}
    lam0 = lambda_max0(decision_list_config(**geo, lrs=[1.0]))
    cfg = decision_list_config(**geo, lrs=[1.0 / lam0, 0.3 / lam0], hessian_every=1, hessian_max_only=max_only)
    cfg["checkpoint"] = {"schedule": "none"}
    return [Run(d).arrays() for d in train(cfg, tmp_path / f"max_only{int(max_only)}", progress=False)]


@pytest.mark.parametrize("dense", [True, False])
def test_hessian_probe_max_only_records_the_same_running_maximum(tmp_path, dense, monkeypatch):
    """With ``max_only`` the λ_max probe skips the exact value where the cheap bound is below the member's largest
    recorded value: the running maximum of ``lambda_max_upper`` is bit-identical to the exact run's at every step
    (so is every max over the steps before k* that result (2)'s table reads), every exact value it records is the
    exact run's, every skipped step records a bound ≥ the exact run's value there, and some steps are skipped. Both
    branches: the dense Hessian's (L = 8: products, block bracket, dense) and, with DENSE_MAX forced to 0, the large
    L's (per-query bound, products, then blocks or Lanczos: decision-list/claim2's inside runs)."""
    from tdyn.papers.decision_list import probes

    if not dense:
        monkeypatch.setattr(probes, "DENSE_MAX", 0)
    exact, fast = _hessian_runs(tmp_path, False), _hessian_runs(tmp_path, True)
    skipped = 0
    for a, b in zip(exact, fast):
        ua, ub = a["decision_list.hessian/lambda_max_upper"], b["decision_list.hessian/lambda_max_upper"]
        la, lb = a["decision_list.hessian/lambda_max"], b["decision_list.hessian/lambda_max"]
        assert not np.isnan(ua).any() and not np.isnan(ub).any()
        assert np.array_equal(np.maximum.accumulate(ua), np.maximum.accumulate(ub))
        took = ~np.isnan(lb)
        assert np.array_equal(la[took], lb[took]) and np.array_equal(ua[took], ub[took])
        assert (ub[~took] >= ua[~took]).all()
        skipped += int((~took).sum())
    assert skipped > 0


def test_hessian_probe_max_only_takes_the_block_bracket_before_the_dense_hessian(tmp_path, monkeypatch):
    """Where the dense Hessian decides λ_max (2L² ≤ DENSE_MAX), a step whose trace bound is not below the running
    maximum tries the block bracket's upper end (``kernels.block_upper``) before the dense Hessian: fewer dense
    Hessians than without it, and the same records wherever the exact value is taken, the same running maximum."""
    calls = {"n": 0}
    dense = kernels.dense_hessian

    def counted(fw):
        calls["n"] += 1
        return dense(fw)

    monkeypatch.setattr(kernels, "dense_hessian", counted)
    with_bracket = _hessian_runs(tmp_path / "a", True)
    n_with = calls["n"]
    calls["n"] = 0
    monkeypatch.setattr(kernels, "block_upper", lambda fw: float("inf"))
    without = _hessian_runs(tmp_path / "b", True)
    assert n_with < calls["n"]
    for a, b in zip(with_bracket, without):
        ua, ub = a["decision_list.hessian/lambda_max_upper"], b["decision_list.hessian/lambda_max_upper"]
        la, lb = a["decision_list.hessian/lambda_max"], b["decision_list.hessian/lambda_max"]
        assert np.array_equal(np.maximum.accumulate(ua), np.maximum.accumulate(ub))
        took = ~np.isnan(la)
        assert np.array_equal(la[took], lb[took])


def test_hessian_probe_max_only_reads_the_running_maximum_from_the_records():
    """The running maximum is the largest finite ``lambda_max_upper`` of each member's records so far (None and NaN
    passed over; a member with none has no entry), so a new run, with no records, starts with none."""
    from types import SimpleNamespace

    from tdyn.papers.decision_list.probes import _recorded_max

    key = "decision_list.hessian/lambda_max_upper"
    hist = [[{"step": 0, key: 2.0}, {"step": 1, key: None}, {"step": 2, key: 5.0}, {"step": 3, key: 4.0}],
            [{"step": 0, "loss": None, "diverged": True}], [{"step": 0, key: float("nan")}, {"step": 1, key: 1.5}]]
    assert _recorded_max(SimpleNamespace(history=hist)) == {0: 5.0, 2: 1.5}
    assert _recorded_max(SimpleNamespace(history=[[], []])) == {}
    # records that grew since the last evaluation: the new ones count; new lists (a resumed run) are read afresh
    hist[0].append({"step": 4, key: 7.0})
    hist[1].append({"step": 1, key: 0.5})
    assert _recorded_max(SimpleNamespace(history=hist)) == {0: 7.0, 1: 0.5, 2: 1.5}
    assert _recorded_max(SimpleNamespace(history=[list(h[:1]) for h in hist])) == {0: 2.0}


def test_hessian_probe_max_only_resumed_after_an_interrupt_is_the_uninterrupted_run(tmp_path, monkeypatch):
    """A ``max_only`` run stopped at step 25 and resumed records what the run never stopped records, bit for bit:
    the steps it skips and the values it records (the running maximum comes back with the records)."""
    import tdyn
    from tdyn.papers.decision_list.analysis import lambda_max0
    from tdyn.papers.decision_list.task import decision_list_config
    from tdyn.probes import PROBES, probe
    from tdyn.runs import Run
    from tdyn.train import trainer

    stop_at = {"step": 25}

    @probe("dl_test.stopper")
    def stopper(ctx):
        if ctx.step == stop_at["step"]:
            trainer.stop_all()
        return {}

    geo = {"L": 8, "n": 3, "M": 2, "task_seed": 0, "seeds": [0], "steps": 60,
           "model": {"c": 30.0, "V_noise": 1.0, "V_noise_seed": 11}}
    lam0 = lambda_max0(decision_list_config(**geo, lrs=[1.0]))
    cfg = decision_list_config(**geo, lrs=[1.0 / lam0, 0.3 / lam0], hessian_every=1, hessian_max_only=True)
    cfg["checkpoint"] = {"schedule": "linear", "num": 12}
    cfg["probes"] = dict(cfg["probes"], names=list(cfg["probes"]["names"]) + ["dl_test.stopper"])
    monkeypatch.setattr(trainer, "_STOP", False)
    try:
        with pytest.raises(KeyboardInterrupt):
            tdyn.train(cfg, tmp_path / "r", progress=False)
        trainer._STOP = False
        stop_at["step"] = -1
        dirs = tdyn.train(cfg, tmp_path / "r", resume=True, progress=False)
        refs = tdyn.train(cfg, tmp_path / "ref", progress=False)
    finally:
        PROBES.unregister("dl_test.stopper")
    drop = lambda m: [{k: v for k, v in r.items() if k != "wall"} for r in m]      # noqa: E731
    skipped = 0
    for d, ref in zip(dirs, refs):
        a, b = Run(d), Run(ref)
        assert a.meta["resumed"][0]["from_step"] == 26      # the stop lands after step 25's update
        assert drop(a.metrics) == drop(b.metrics)
        skipped += sum(r.get("decision_list.hessian/lambda_max") is None for r in b.metrics
                       if r["step"] > a.meta["resumed"][0]["from_step"])
    assert skipped > 0      # the resumed part skips steps: the running maximum came back


@pytest.mark.parametrize("L,n,M,c,method", [(8, 3, 2, 5.0, "dense"), (16, 15, 2, 1e9, "blocks"),
                                             (20, 19, 2, 1e5, "lanczos")])
def test_lambda_max0_is_the_probes_lambda_and_the_random_start_lanczos(L, n, M, c, method):
    """λ_max(0), which η = f/λ_max(0) divides by, is measured as the λ_max probe measures every later step (each of
    its three methods here) and equals a Lanczos from a random start (what the plan used before) to 1e-12."""
    from tdyn.papers.decision_list import probes
    from tdyn.papers.decision_list.analysis import initial_model, lambda_max0
    from tdyn.papers.decision_list.task import decision_list_config

    cfg = decision_list_config(L=L, n=n, M=M, task_seed=0, seeds=[0], steps=1, lrs=[1.0],
                               model={"c": c, "V_noise": 1.0, "V_noise_seed": 3})
    model, task = initial_model(cfg)
    lam, _, how = probes.lambda_max(model, task.dist, task.types)
    assert how == method and lambda_max0(cfg) == lam
    ref = th.top_hessian_eigenvalue(model, task.dist, task.types, gen=torch.Generator().manual_seed(0))
    assert lam == pytest.approx(ref, rel=1e-12)


def test_lambda_max0_on_the_pool_equals_one_after_another(monkeypatch):
    """The plan's λ_max(0) of several configs on a pool of two workers (whatever this machine's cores): the same
    numbers, bit for bit, as serial calls in this process with the workers' threads (the dense Hessian's products
    round by the thread count)."""
    from tdyn.papers.decision_list.analysis import lambda_max0, lambda_max0_all
    from tdyn.papers.decision_list.task import decision_list_config
    from tdyn.sweep import executors

    monkeypatch.setattr(executors, "default_workers", lambda: 2)

    cfgs = [decision_list_config(L=L, n=3, M=2, task_seed=0, seeds=[s], steps=1, lrs=[1.0],
                                 model={"c": 5.0, "V_noise": 1.0, "V_noise_seed": s}) for L, s in ((6, 0), (8, 1), (7, 2))]
    assert lambda_max0_all(cfgs) == [executors._call_with_threads(lambda_max0, (cfg,)) for cfg in cfgs]  # same threads


@pytest.mark.parametrize("L,n,M,sampler,c,w", [(6, 3, 2, "A", 3.0, 1.0), (8, 7, 2, "B", 1e4, 1.0), (10, 9, 2, "B", 1e6, 0.0),
                                               (9, 7, 3, "B", 4e7, 0.5)])
def test_cheap_upper_bound_terms_by_brute_force(L, n, M, sampler, c, w):
    """The bound's per-query terms against brute force over (row, l, t): T_q equals Σ_rows∈q ω Σ_t α̃_t² Σ_l p_l
    (X[l, t] − X[ŷ, t])², X = V − z1ᵀ (the second moment about ŷ, summed term by term) to its rounding slack, and it is
    ≥ the trace of block q's Gauss–Newton part (the dense W–W block less its diag ã − ãα̃ᵀ − α̃ãᵀ part); the column
    split's T_q is ≥ that second moment; D_q ≥ λ_max of that part (in both forms; equal to rounding: the column split's
    sums of α̃² are taken in token space)."""
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, sampler)
    model = _model(L, w, c * task.P, seed=L + int(w))
    fw = kernels.token_forward(model, task, types)
    T_q, D_q, _, _ = kernels._upper_terms(fw)
    T_c, D_c, _, _ = kernels._upper_terms(fw, by_columns=True)
    R, V = fw.rows, fw.V[0].detach()
    at, z, p, om = fw.at[0], fw.z[0], fw.p()[0], R.omega
    G = R.G
    X = V[None] - z[:, :, None]                                   # (row, l, t)
    yh = z.argmax(1)
    Xy = X[torch.arange(len(X)), yh]                               # (row, t)
    second = (p[:, :, None] * (X - Xy[:, None, :]) ** 2).sum(1)   # (row, t)
    brute = (om * (at * at * second).sum(1, keepdim=True)).view(L, G).sum(1)
    slack = 2 * (G + L * L + 3 * L + 16) * EPS / 2 * float(V.abs().max()) ** 2 * 8
    assert torch.allclose(T_q, brute, rtol=1e-9, atol=slack)
    assert (T_c >= brute * (1 - 1e-12)).all()                    # the column split bounds the same second moment
    H = kernels.dense_hessian(fw)
    ar = torch.arange(L)
    Aq = H[:L * L, :L * L].reshape(L, L, L, L)[:, ar, :, ar]      # (q, t, u): block q
    g = (p - torch.nn.functional.one_hot(R.y, L).to(p)) @ V
    a = at * (g - (at * g).sum(1, keepdim=True))
    wa, atq = (om * a).view(L, G, L), at.view(L, G, L)
    Dq = torch.diag_embed(wa.sum(1)) - wa.transpose(1, 2) @ atq - atq.transpose(1, 2) @ wa
    GN = Aq - Dq
    assert (torch.diagonal(GN, dim1=1, dim2=2).sum(1) <= T_q * (1 + 1e-9)).all()
    top = torch.linalg.eigvalsh(0.5 * (Dq + Dq.transpose(1, 2)))[:, -1]
    assert (top <= D_q * (1 + 1e-9)).all() and (top <= D_c * (1 + 1e-9)).all()
    assert torch.allclose(D_c, D_q, rtol=1e-12, atol=0)           # the same bound, ‖α̃‖² summed in token space
