"""Speed paths of the topic model, each tested equal to ``tdyn.papers.topic.model``'s equations bit for bit
(tests/test_topic_speed_paths.py).

``selected_query_loss``: the masked-LM loss of a one-layer, one-head model in vocabulary form computed on the
selected query rows only. ``TopicTransformer.data_loss`` pads every document's selected positions to the batch's
largest count (n_q) and runs equations (3)–(5) on all B·n_q rows, ≈ 40% of them padding that the loss multiplies
by 0. Here the attention, A V, the logits and the cross-entropy run on the selected rows of each member (row by
row the same operations, so the same numbers); the two reductions over rows are made in the padded layout as
before: the loss's sum over [B, n_q] and V's gradient Aᵀ dH over the B·n_q rows (the rows without a selected
query zero, whose terms were ±0 before). The rows of a matrix product do not depend on how many rows it has
with this BLAS (a property of the library, tested bit-equal at the full batch in tests/test_topic_speed_paths.py);
its sums over rows do depend on their order and grouping, hence the padded layout there.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def lookup(X: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """X[s, idx[s, r]] for X [S, N, d] and idx [S, R] -> [S, R, d] (``model.rows``' lookup)."""
    S, N, d = X.shape
    offset = (torch.arange(S, device=idx.device) * N).view(S, 1)
    return F.embedding(idx + offset, X.reshape(S * N, d))


class _SelectedRowsMix(torch.autograd.Function):
    """H = A V for the selected rows A [S, R, N] of the padded layout [S, P, N] (``slots`` [S, R]: each row's
    place in it): forward and A's gradient on the R rows, V's gradient Aᵀ dH on the P rows as the padded
    product computes it (rows at no slot zero)."""

    @staticmethod
    def forward(ctx, A: torch.Tensor, V: torch.Tensor, slots: torch.Tensor, P: int) -> torch.Tensor:
        ctx.save_for_backward(A, V, slots)
        ctx.P = P
        return torch.bmm(A, V)

    @staticmethod
    def backward(ctx, dH: torch.Tensor):
        A, V, slots = ctx.saved_tensors
        dA = dV = None
        if ctx.needs_input_grad[0]:
            dA = dH.bmm(V.transpose(1, 2))
        if ctx.needs_input_grad[1]:
            S, R, N = A.shape
            rows = (slots + torch.arange(S, device=slots.device)[:, None] * ctx.P).reshape(-1)   # in [S·P]
            A_p = A.new_zeros(S * ctx.P, N).index_copy_(0, rows, A.reshape(S * R, N)).view(S, ctx.P, N)
            dH_p = dH.new_zeros(S * ctx.P, dH.shape[-1]).index_copy_(0, rows, dH.reshape(S * R, -1))
            dV = A_p.transpose(1, 2).bmm(dH_p.view(S, ctx.P, -1))
        return dA, dV, None, None


def selected_query_loss(score_table: torch.Tensor, M: torch.Tensor, value_table: Callable[[], torch.Tensor],
                        tokens: torch.Tensor, labels: torch.Tensor, scale: float) -> torch.Tensor:
    """The cross-entropy loss [S] over the selected positions (labels ≥ 0) of a one-layer, one-head model in
    vocabulary form with the identity decoder, as ``TopicTransformer.data_loss`` (module docstring): from the
    score table Q Kᵀ [S, V, V] (rows: query id), the mask term log c [S, B, V] and ``value_table()`` (V = E W_Vᵀ
    + b_V per id, [S, V, d]; called after the attention, where the model computes it)."""
    S, B, L = tokens.shape
    sel = labels >= 0
    n_q = max(int(sel.sum(-1).max()), 1)
    q_pos = torch.argsort((~sel).to(torch.uint8), dim=-1, stable=True)[..., :n_q]   # selected first
    sel, y = torch.gather(sel, 2, q_pos), torch.gather(labels, 2, q_pos).clamp(min=0)
    q_ids = torch.gather(tokens, 2, q_pos)
    flat = sel.reshape(S, B * n_q)
    R = max(int(flat.sum(1).max()), 1)
    slots = torch.argsort((~flat).to(torch.uint8), dim=-1, stable=True)[:, :R]       # the selected rows first
    scores = lookup(score_table, torch.gather(q_ids.reshape(S, -1), 1, slots)) / scale          # (2), (3)
    A = torch.softmax(scores + lookup(M, torch.div(slots, n_q, rounding_mode="floor")), dim=-1)  # (3)
    H = _SelectedRowsMix.apply(A, value_table(), slots, B * n_q)                                   # (4); (5): W_dec = I
    per = F.cross_entropy(H.reshape(-1, H.shape[-1]), torch.gather(y.reshape(S, -1), 1, slots).reshape(-1),
                          reduction="none").view(S, R)
    per = per.new_zeros(S, B * n_q).scatter(1, slots, per).view(S, B, n_q)
    return (per * sel).sum((1, 2)) / sel.sum((1, 2)).clamp(min=1)


class _QueryRowsAffine(torch.autograd.Function):
    """Q = (E W_Qᵀ + b_Q) at the query positions of a layer that reads positions (``model.Input`` with no ids:
    the layers after the first): the product on the query rows only, its backward in the layout of the
    product over every position (``query_rows_affine``)."""

    @staticmethod
    def forward(ctx, E: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, pos: torch.Tensor) -> torch.Tensor:
        S, B, L, d = E.shape
        n, d_out = pos.shape[-1], W.shape[1]
        E_q = torch.gather(E, 2, pos[..., None].expand(S, B, n, d))
        out = (E_q.reshape(S, -1, d) @ W.transpose(1, 2)).reshape(S, B, n, d_out)
        if b is not None:
            out = out + b.view(S, 1, 1, -1)
        ctx.save_for_backward(E, W, pos)
        ctx.has_bias = b is not None
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        E, W, pos = ctx.saved_tensors
        S, B, L, d = E.shape
        n, d_out = pos.shape[-1], W.shape[1]
        dE = dW = db = None
        if ctx.needs_input_grad[0]:        # the rows at the queries (the other rows of the padded product are 0)
            rows = g.reshape(S, -1, d_out).bmm(W).view(S, B, n, d)
            dE = rows.new_zeros(S, B, L, d).scatter_add_(2, pos[..., None].expand(S, B, n, d), rows)
        if ctx.needs_input_grad[1] or ctx.has_bias and ctx.needs_input_grad[2]:
            full = g.new_zeros(S, B, L, d_out).scatter_add_(2, pos[..., None].expand(S, B, n, d_out), g)
            if ctx.needs_input_grad[1]:    # Eᵀ dQ over every position, as the padded product's backward sums it
                dW = E.reshape(S, -1, d).transpose(1, 2).bmm(full.reshape(S, -1, d_out)).transpose(1, 2)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                db = full.sum_to_size(S, 1, 1, d_out).view(S, d_out)
        return dE, dW, db, None


def query_rows_affine(E: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, pos: torch.Tensor) -> torch.Tensor:
    """(E Wᵀ + b)[s, b, pos[s, b, i]] for E [S, B, L, d] (every position), W [S, d_out, d], b [S, d_out] and the
    query positions ``pos`` [S, B, n] (distinct in each document): ``model.at_positions(model.affine(E, W, b), pos)``
    with the product on the B·n query rows instead of all B·L (a product's rows do not depend on how many rows
    it has, with this BLAS: tested bit-equal). Backward: E's gradient on the query rows (zero elsewhere, as the padded product's), W's and b's
    gradients summed over every position in the padded layout (sums over rows depend on their grouping)."""
    return _QueryRowsAffine.apply(E, W, b, pos)
