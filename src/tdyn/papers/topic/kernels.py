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

Distinct (document, id) rows (``distinct_rows``): at layer 0 a query's attention, its A V and (one layer, identity
decoder) its log-probabilities depend only on its document and its id, and ≈ 80% of the selected queries are
MASK: a training batch's ≈ 750 selected rows per member hold ≈ 190 distinct pairs, its 6,080 positions (layer 0's
queries under a later layer) ≈ 1,260 (means over 30 batches of the full data). The forwards of ``selected_query_loss`` and ``distinct_rows_mix`` run once per pair
and look the rows up (the same numbers: row-wise operations and a product's rows); their backwards run on every
row as before, with the rows' A and log-probabilities looked up, so the gradients' sums over rows (V's Aᵀ dH,
the score table's embedding backward) add the same terms in the same order. A later layer's input repeats its
rows by the same pairs, so its keys and values (``distinct_rows_affine``) are products on one row per pair,
looked up, with the backward over every position.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F


def lookup(X: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """X[s, idx[s, r]] for X [S, N, d] and idx [S, R] -> [S, R, d] (``model.rows``' lookup)."""
    S, N, d = X.shape
    offset = (torch.arange(S, device=idx.device) * N).view(S, 1)
    return F.embedding(idx + offset, X.reshape(S * N, d))


class DistinctRows(NamedTuple):
    """The distinct (document, id) pairs among R query rows of each member [S, R] (``distinct_rows``), U per
    member at most: ``ids``, ``docs`` [S, U] (each member's pairs in ascending order, its last ones repeated
    pairs of no row where it has fewer than U), ``row_of`` [S, R] (a row's pair) and ``first`` [S, U] (the first
    row of each pair)."""

    ids: torch.Tensor
    docs: torch.Tensor
    row_of: torch.Tensor
    first: torch.Tensor


def distinct_rows(docs: torch.Tensor, ids: torch.Tensor, B: int, n_ids: int) -> DistinctRows:
    """The distinct (document, id) pairs of the rows ``docs``, ``ids`` [S, R] (documents < ``B``, ids <
    ``n_ids``) of each member."""
    S, R = ids.shape
    key = docs * n_ids + ids
    present = torch.zeros(S, B * n_ids, dtype=torch.bool, device=key.device).scatter_(1, key, True)
    U = int(present.sum(1).max())
    pairs = torch.argsort((~present).to(torch.uint8), dim=-1, stable=True)[:, :U]    # each member's pairs first
    row_of = torch.gather(present.cumsum(1) - 1, 1, key)
    first = torch.full((S, U), R, device=key.device).scatter_reduce_(
        1, row_of, torch.arange(R, device=key.device).expand(S, R), "amin").clamp_(max=R - 1)
    return DistinctRows(pairs % n_ids, torch.div(pairs, n_ids, rounding_mode="floor"), row_of, first)


def _attention_rows(T: torch.Tensor, M: torch.Tensor, rows: DistinctRows, scale: float) -> torch.Tensor:
    """A = softmax(T[id]/scale + M[doc]) per distinct pair [S, U, N] (the rows' equations (2), (3))."""
    return torch.softmax(lookup(T, rows.ids) / scale + lookup(M, rows.docs), dim=-1)


def _attention_backward(dA: torch.Tensor, A: torch.Tensor, ids: torch.Tensor, scale: float,
                        n_ids: int) -> torch.Tensor:
    """T's gradient from the rows' dA [S, R, N] as the rows' autograd computes it: the softmax's backward, the
    division by ``scale``'s, the lookup's (``lookup``: the embedding backward of the rows' ids [S, R])."""
    S = A.shape[0]
    dX = torch._softmax_backward_data(dA, A, A.dim() - 1, A.dtype) / scale   # the add passes it to T[id]/scale
    offset = (torch.arange(S, device=ids.device) * n_ids).view(S, 1)
    return torch.ops.aten.embedding_dense_backward(dX, ids + offset, S * n_ids, -1, False).view(S, n_ids, -1)


class _DistinctRowsLogProbs(torch.autograd.Function):
    """log softmax(H), H = A V, A = softmax(T[id]/scale + M[doc]), on the R selected rows of each member
    (``selected_query_loss``): the forward once per distinct (document, query id) pair (``rows``), looked up for
    the rows; the backward on the R rows as the rows' autograd computes it (their A and log-probabilities the
    pairs' looked up), V's gradient Aᵀ dH on the P rows of the padded layout (``slots``: each row's place in it;
    rows at no slot zero), T's by the embedding backward of the rows' ids [S, R]."""

    @staticmethod
    def forward(ctx, T: torch.Tensor, M: torch.Tensor, V: torch.Tensor, rows: DistinctRows, ids: torch.Tensor,
                slots: torch.Tensor, P: int, scale: float) -> torch.Tensor:
        A_d = _attention_rows(T, M, rows, scale)                                                   # (2), (3)
        logp = lookup(torch.log_softmax(torch.bmm(A_d, V), dim=-1), rows.row_of)                  # (4), (5): W_dec = I
        ctx.save_for_backward(A_d, V, rows.row_of, ids, slots, logp)
        ctx.P, ctx.scale, ctx.n_ids = P, scale, T.shape[1]
        return logp

    @staticmethod
    def backward(ctx, dlogp: torch.Tensor):
        A_d, V, row_of, ids, slots, logp = ctx.saved_tensors
        S, R, d = logp.shape
        N = A_d.shape[-1]
        dH = torch._log_softmax_backward_data(dlogp.reshape(S * R, d), logp.reshape(S * R, d), 1,
                                              logp.dtype).view(S, R, d)
        A = lookup(A_d, row_of)
        dT = dV = None
        if ctx.needs_input_grad[0]:
            dT = _attention_backward(dH.bmm(V.transpose(1, 2)), A, ids, ctx.scale, ctx.n_ids)
        if ctx.needs_input_grad[2]:
            rows = (slots + torch.arange(S, device=slots.device)[:, None] * ctx.P).reshape(-1)   # in [S·P]
            A_p = A.new_zeros(S * ctx.P, N).index_copy_(0, rows, A.reshape(S * R, N)).view(S, ctx.P, N)
            dH_p = dH.new_zeros(S * ctx.P, d).index_copy_(0, rows, dH.reshape(S * R, d))
            dV = A_p.transpose(1, 2).bmm(dH_p.view(S, ctx.P, d))
        return dT, None, dV, None, None, None, None, None


def selected_query_loss(score_table: torch.Tensor, M: torch.Tensor, value_table: Callable[[], torch.Tensor],
                        tokens: torch.Tensor, labels: torch.Tensor, scale: float) -> torch.Tensor:
    """The cross-entropy loss [S] over the selected positions (labels ≥ 0) of a one-layer, one-head model in
    vocabulary form with the identity decoder, as ``TopicTransformer.data_loss`` (module docstring): from the
    score table Q Kᵀ [S, V, V] (rows: query id), the mask term log c [S, B, V] and ``value_table()`` (V = E W_Vᵀ
    + b_V per id, [S, V, d]; called after the score table, where the model computes it)."""
    S, B, L = tokens.shape
    sel = labels >= 0
    n_q = max(int(sel.sum(-1).max()), 1)
    q_pos = torch.argsort((~sel).to(torch.uint8), dim=-1, stable=True)[..., :n_q]   # selected first
    sel, y = torch.gather(sel, 2, q_pos), torch.gather(labels, 2, q_pos).clamp(min=0)
    q_ids = torch.gather(tokens, 2, q_pos)
    flat = sel.reshape(S, B * n_q)
    R = max(int(flat.sum(1).max()), 1)
    slots = torch.argsort((~flat).to(torch.uint8), dim=-1, stable=True)[:, :R]       # the selected rows first
    ids = torch.gather(q_ids.reshape(S, -1), 1, slots)                               # each row's query id
    rows = distinct_rows(torch.div(slots, n_q, rounding_mode="floor"), ids, B, score_table.shape[1])
    logp = _DistinctRowsLogProbs.apply(score_table, M, value_table(), rows, ids, slots, B * n_q, scale)  # (2)–(5)
    per = F.nll_loss(logp.reshape(S * R, -1), torch.gather(y.reshape(S, -1), 1, slots).reshape(-1),
                     reduction="none").view(S, R)                                              # cross-entropy
    per = per.new_zeros(S, B * n_q).scatter(1, slots, per).view(S, B, n_q)
    return (per * sel).sum((1, 2)) / sel.sum((1, 2)).clamp(min=1)


class _DistinctRowsMix(torch.autograd.Function):
    """H = A V, A = softmax(T[id]/scale + M[doc]), at R query rows [S, R, d] of a layer in vocabulary form with one
    head (``distinct_rows_mix``): the forward once per distinct (document, id) pair (``rows``), looked up for
    the rows; the backward on the R rows as the rows' autograd computes it (their A the pairs' looked up)."""

    @staticmethod
    def forward(ctx, T: torch.Tensor, M: torch.Tensor, V: torch.Tensor, rows: DistinctRows, ids: torch.Tensor,
                scale: float) -> torch.Tensor:
        A_d = _attention_rows(T, M, rows, scale)                                                   # (2), (3)
        ctx.save_for_backward(A_d, V, rows.row_of, ids)
        ctx.scale, ctx.n_ids = scale, T.shape[1]
        return lookup(torch.bmm(A_d, V), rows.row_of)                                            # (4)

    @staticmethod
    def backward(ctx, dH: torch.Tensor):
        A_d, V, row_of, ids = ctx.saved_tensors
        A = lookup(A_d, row_of)
        dT = dV = None
        if ctx.needs_input_grad[0]:
            dT = _attention_backward(dH.bmm(V.transpose(1, 2)), A, ids, ctx.scale, ctx.n_ids)
        if ctx.needs_input_grad[2]:
            dV = A.transpose(1, 2).bmm(dH)
        return dT, None, dV, None, None, None


def distinct_rows_mix(T: torch.Tensor, M: torch.Tensor, V: torch.Tensor, rows: DistinctRows, ids: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """softmax(T[id]/scale + M[doc]) V at the query rows with ids ``ids`` [S, R] (their pairs: ``rows``), for the
    score table T [S, V, N] (query id, key), the mask term M [S, B, N] and the values V [S, N, d]: [S, R, d], the
    numbers of the rows' lookup, softmax and product (``model.Input.scores``, ``mix``; tested bit-equal)."""
    return _DistinctRowsMix.apply(T, M, V, rows, ids, scale)


class _DistinctRowsAffine(torch.autograd.Function):
    """E Wᵀ + b at every position of a layer's input E [S, B, L, d] whose rows repeat by ``rows`` (``row_of``
    over the B·L positions): the product on one row per pair, looked up; the backward as the product over every
    position computes it."""

    @staticmethod
    def forward(ctx, E: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, rows: DistinctRows) -> torch.Tensor:
        S, B, L, d = E.shape
        out = lookup(E.reshape(S, -1, d), rows.first) @ W.transpose(1, 2)
        if b is not None:
            out = out + b.view(S, 1, -1)
        ctx.save_for_backward(E, W)
        ctx.has_bias = b is not None
        return lookup(out, rows.row_of).view(S, B, L, -1)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        E, W = ctx.saved_tensors
        S, B, L, d = E.shape
        d_out = W.shape[1]
        dE = dW = db = None
        if ctx.needs_input_grad[0]:
            dE = g.reshape(S, -1, d_out).bmm(W).view(S, B, L, d)
        if ctx.needs_input_grad[1]:
            dW = E.reshape(S, -1, d).transpose(1, 2).bmm(g.reshape(S, -1, d_out)).transpose(1, 2)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g.sum_to_size(S, 1, 1, d_out).view(S, d_out)
        return dE, dW, db, None


def distinct_rows_affine(E: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, rows: DistinctRows) -> torch.Tensor:
    """``model.affine(E, W, b)`` for E [S, B, L, d] whose B·L rows repeat as ``rows`` says (the input of a layer
    after the first: its rows are functions of the document and the layer-0 id), the product on the distinct
    rows (a product's rows do not depend on how many rows it has, with this BLAS: tested bit-equal)."""
    return _DistinctRowsAffine.apply(E, W, b, rows)


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
