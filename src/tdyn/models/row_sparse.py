"""Row-sparse gradients of ensemble parameters: the gradient of a parameter [S, N, ...] that is non-zero
only on a few rows of axis 1, the same rows for every member, handed to autograd as a sparse COO tensor
(sparse dims: member, row; dense dims: the rest) instead of a zero-filled dense tensor. A model's custom
backward builds one with :func:`row_grad`; the optimizer reads it back with :func:`row_block`
(:class:`tdyn.train.optim.EnsembleOptimizer` updates only those rows and their momentum)."""

from __future__ import annotations

import torch


def row_grad(values: torch.Tensor, rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """The gradient [S, n_rows, ...] whose rows ``rows`` (increasing, distinct, [R]) hold ``values``
    [S, R, ...] for every member and every other row is zero: a coalesced sparse COO tensor."""
    S, R = values.shape[:2]
    member = torch.arange(S, device=values.device).repeat_interleave(R)
    index = torch.stack([member, rows.to(values.device).repeat(S)])
    return torch.sparse_coo_tensor(index, values.reshape(S * R, *values.shape[2:]),
                                   (S, n_rows, *values.shape[2:]), is_coalesced=True, check_invariants=False)


def row_block(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(rows [R], values [S, R, ...])`` of a gradient made by :func:`row_grad` (the values a view);
    None for a dense tensor or a sparse one of another pattern."""
    if not g.is_sparse or g.sparse_dim() != 2:     # (autograd's copy into .grad drops the coalesced flag)
        return None
    S, index, values = g.shape[0], g._indices(), g._values()
    if values.shape[0] % S:
        return None
    R = values.shape[0] // S
    rows = index[1, :R]
    block = index.view(2, S, R)
    if not (bool((rows[1:] > rows[:-1]).all()) and torch.equal(block[1], rows.expand(S, R))
            and torch.equal(block[0], torch.arange(S, device=index.device)[:, None].expand(S, R))):
        return None
    return rows, values.view(S, R, *values.shape[1:])
