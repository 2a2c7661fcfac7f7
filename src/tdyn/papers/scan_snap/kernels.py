"""Speed kernels of the Y/Z model (``model.py``): the forward pass on each sample's key multiset instead of
every key position, a closed-form gradient of LN∘softmax, and the decoder on the attended vector's
support. Each computes what ``model.py``'s equations compute (tests/test_yz_support.py checks them
against the dense path); their timings are in benchmarks/README.md.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from tdyn.errors import UserError


def forward_on_support(model, x: torch.Tensor, support: tuple[torch.Tensor, ...], cache=None) -> torch.Tensor:
    """``model(x)`` (a :class:`~tdyn.papers.scan_snap.model.YZModel`) computed on the support:
    ``support = (idx, log_count[, order, counts, sample])``, each sample's distinct keys and the logs of
    their counts, [S, B, P] (``idx, count =`` :func:`key_support`, ``log_count = count.to(dtype).log()``
    in the parameters' dtype, −inf at the padding). Attention depends on the keys only through that
    multiset, so Xᵀb = softmax_l(Z[x_T, l] + log count_l) on the P support tokens: the same value with
    P ≈ 20 entries per sample in place of L − 1 = 127 (the task computes the support once per data
    stream; members sharing a stream share it). The keys being distinct, LN(Xᵀb) = b/‖b‖ there too
    (:func:`unit_softmax`). The three further entries, :func:`key_bags` of ``idx``, let the decoder
    multiply only the rows of Y on each sample's support where that is cheaper
    (:func:`support_decoder_applies`, :func:`support_decode`).

    ``cache``: a :class:`tdyn.models.activations.Cache` (or None) receiving the model's named activations
    (``YZModel.ACTIVATIONS``), each the dense tensor the model's equations define, computed from the support
    only where asked for (:func:`_record`); the output is the same with or without it."""
    cfg = model.cfg
    _, Y = model.logits_matrices()
    M = Y.shape[-1]
    keys, log_count = support[0], support[1]
    if not log_count.is_floating_point():
        raise TypeError("YZModel: support[1] must hold the logs of the key counts (a float tensor), "
                        f"not the counts ({log_count.dtype})")
    a = model._query_logits(x[..., -1], keys) + log_count
    b = unit_softmax(a) if cfg.normalize else torch.softmax(a, dim=-1)
    if len(support) > 2 and support_decoder_applies(cfg, M, keys.shape[-1]):
        logits = support_decode(b, keys, Y, support[2:5])
        if cache is not None:   # the decoder never forms the attended vector: scattered here where asked for
            _record(cache, model, x, keys, a, b, lambda: _dense(keys, b, M), logits)
        return logits
    u = model.with_query(torch.zeros(*keys.shape[:2], M, dtype=b.dtype, device=b.device).scatter_add_(2, keys, b), x)
    logits = u @ Y                                                                               # Xᵀb, LN'd; Eqn 2
    if cache is not None:
        _record(cache, model, x, keys, a, b, u, logits)
    return logits


def _dense(keys: torch.Tensor, values: torch.Tensor, M: int) -> torch.Tensor:
    """Values on each sample's support [S, B, P] scattered to the M tokens, [S, B, M]."""
    return torch.zeros(*keys.shape[:2], M, dtype=values.dtype, device=values.device).scatter_add_(2, keys, values)


def _record(cache, model, x: torch.Tensor, keys: torch.Tensor, a: torch.Tensor, b: torch.Tensor, attended,
            logits: torch.Tensor) -> None:
    """The named activations of :func:`forward_on_support`: ``context`` Xᵀb = softmax(a) scattered to the M
    tokens (Xᵀb sums the attention per token: e^{z_l}·count_l / Σ e^{z}·count on the support); ``attended``
    the decoder's input; ``scores`` and ``attention`` per key position by Eqn 1 from x's keys, which the
    support path never forms (a UserError where they are asked for and x holds only the query column, as
    the training batch does)."""
    M = logits.shape[-1]
    cache.put("context", lambda: _dense(keys, torch.softmax(a, dim=-1), M))
    cache.put("attended", attended)
    cache.put("logits", logits)
    if not (cache.wants("scores") or cache.wants("attention")):
        return
    if x.shape[-1] < 2:
        if cache.asked("scores") or cache.asked("attention"):
            raise UserError("YZModel: 'scores' and 'attention' are per key position and x holds only the query "
                            "column (the training batch: its keys enter through the support); capture on x with "
                            "its keys (the probe batch, or task.full_sample(gen))")
        return
    scores = model._query_logits(x[..., -1], x[..., :-1])                                      # Eqn 1, dense
    cache.put("scores", scores)
    cache.put("attention", lambda: torch.softmax(scores, dim=-1))


def key_support(x: torch.Tensor, M: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's distinct keys (all tokens but the last) and their counts: ``(idx, count)``,
    each [..., P] (``count`` int32) with ``idx`` increasing and padded with token 0 at count 0. ``P = width`` (an upper
    bound the caller knows, e.g. the widest class support, so batches stack) or the widest support in
    ``x``. Data only: no parameters, no gradient."""
    keys = x[..., :-1]
    flat = keys.reshape(-1, keys.shape[-1])
    count = torch.zeros(flat.shape[0], M, dtype=torch.int32, device=x.device).scatter_add_(
        1, flat, torch.ones(flat.shape, dtype=torch.int32, device=x.device))
    idx, count = pack_support(count, torch.arange(M, device=x.device).expand_as(count), width)
    return idx.view(*keys.shape[:-1], -1), count.view(*keys.shape[:-1], -1)


def pack_support(count: torch.Tensor, tokens: torch.Tensor, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The support of each row of a count table: ``count`` [N, C] (how often each column's token occurs)
    and ``tokens`` [N, C] (the columns' tokens, increasing along a row) → ``(idx, count)`` [N, P], the
    columns with a count, left-packed in column order, padded with token 0 at count 0. ``P = width`` or the
    most present columns in a row (more than ``width`` is a ValueError). :func:`key_support` packs a
    [B, M] histogram; the Scan and Snap task packs the sampler's counts per class support
    (``SequenceClasses.sample_counts``), the same tensors without the [B, M] histogram. On a GPU with ``width``
    given the count is not read back (a wait for the device; a row over ``width`` then fails in the scatter)."""
    present = count > 0
    if width is None or count.device.type == "cpu":
        n = int(present.sum(1).max())
        P = n if width is None else width
        if n > P:
            raise ValueError(f"pack_support: a sequence has {n} distinct keys, more than width {P}")
    else:
        P = width
    slot = torch.where(present, present.cumsum(1) - 1, P)        # absent columns to a discarded slot P
    N = count.shape[0]
    idx = torch.zeros(N, P + 1, dtype=torch.long, device=count.device).scatter_(1, slot, tokens)[:, :P]
    return idx, torch.zeros(N, P + 1, dtype=count.dtype, device=count.device).scatter_(1, slot, count)[:, :P]


class _UnitSoftmax(torch.autograd.Function):
    """u = b/‖b‖₂ for b = softmax(a) along the last axis, with the gradient in closed form: u_p = e_p/‖e‖
    (e = exp(a − max a): softmax's sum cancels), so ∂u_p/∂a_q = u_p(δ_pq − u_q²) and
    ∂L/∂a = u ⊙ (g − u⟨g, u⟩), three passes over [S, B, P] where autograd's chain through
    ``F.normalize`` and ``softmax`` takes about ten (benchmarks/README.md#measurements-behind-the-code). The forward is ``F.normalize(softmax(a))`` itself (its eps never acts: ‖b‖ ≥ 1/√P); the
    gradient equals autograd's to rounding (tests/test_yz_support.py). Entries at −inf (padding) get u = 0,
    gradient 0."""

    @staticmethod
    def forward(ctx, a):
        u = F.normalize(torch.softmax(a, dim=-1), dim=-1)
        ctx.save_for_backward(u)
        return u

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        return u * (g - u * (g * u).sum(-1, keepdim=True))


def unit_softmax(a: torch.Tensor) -> torch.Tensor:
    """softmax(a)/‖softmax(a)‖₂ along the last axis (LN of the attention on a sample's distinct keys)."""
    return _UnitSoftmax.apply(a)


# ---------------------------------------------------------------- the decoder on the attended vector's support


def support_decoder_applies(cfg, M: int, P: int) -> bool:
    """Whether :func:`support_decode` computes this model's decoder: the yz parameterisation with the
    plain attended vector (no residual query embedding, no query key), and supports of at most P keys
    small against M (3·P ≤ M: below that the dense matmul is as fast on CPU, see benchmarks/README.md)."""
    return cfg.parameterization == "yz" and not cfg.residual and not cfg.include_query_key and 3 * P <= M


def key_bags(idx: torch.Tensor, M: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The support transposed, for the decoder's gradient: ``(order, counts, sample)`` with ``order``
    [..., B·P] the support entries (flat over B, P) sorted by key (stable), ``counts`` [..., M] the
    entries per key and ``sample`` [..., B·P] the sample of each entry of ``order`` (``order // P``).
    Data only, computed once per data stream (members sharing a stream share it)."""
    flat = idx.reshape(*idx.shape[:-2], -1)
    order = torch.sort(flat, dim=-1, stable=True).indices
    counts = torch.zeros(*flat.shape[:-1], M, dtype=torch.long, device=flat.device).scatter_add_(-1, flat, torch.ones_like(flat))
    return order, counts, order // idx.shape[-1]


class _SupportDecoder(torch.autograd.Function):
    """logits_b = Σ_p u_bp Y[key_bp] for an attended vector given on its support (values u_p, keys):
    B·P·M multiply-adds instead of the dense B·M². The forward is an embedding bag (bags = samples, rows
    of Y), Y's gradient another (bags = keys, rows of the output gradient weighted by u: the support
    transposed, :func:`key_bags`), and u's gradient, each entry's dot product of its sample's output
    gradient with its row of Y, a sampled dense-dense product (:func:`support_dots`). Hand-written because
    autograd's embedding-bag backward zero-fills and scatters a dense gradient (benchmarks/README.md#measurements-behind-the-code) and torch has no ensemble axis for the table: members
    are stacked as one [S·M, M] table, member s's key k being row s·M + k."""

    @staticmethod
    def forward(ctx, u_p, Y, keys, order, counts, sample):
        S, B, P = u_p.shape
        M = Y.shape[-1]
        rows = _table_rows(keys, M)
        # detached: embedding_bag takes its no-autograd kernel only for a table that does not require grad
        logits = F.embedding_bag(rows.view(S * B, P), Y.detach().reshape(S * M, M), mode="sum",
                                 per_sample_weights=u_p.detach().reshape(S * B, P))
        ctx.save_for_backward(u_p, Y, keys, order, counts, sample)
        return logits.view(S, B, M)

    @staticmethod
    def backward(ctx, G):
        u_p, Y, keys, order, counts, sample = ctx.saved_tensors
        S, B, P = u_p.shape
        M = Y.shape[-1]
        dev = G.device
        du = dY = None
        if ctx.needs_input_grad[0]:
            du = support_dots(G, Y, keys)
        if ctx.needs_input_grad[1]:
            first = torch.arange(S, device=dev) * (B * P)                   # each member's first entry
            entry = (order + first[:, None]).view(-1)                       # entries by (member, key)
            offsets = (counts.cumsum(1) - counts + first[:, None]).view(-1)
            bag_rows = (sample + (torch.arange(S, device=dev) * B)[:, None]).view(-1)   # = entry // P
            dY = F.embedding_bag(bag_rows, G.reshape(S * B, M), offsets, mode="sum",
                                 per_sample_weights=u_p.reshape(-1).take(entry)).view(S, M, M)
        return du, dY, None, None, None, None


def support_dots(G: torch.Tensor, Y: torch.Tensor, keys: torch.Tensor, kernel: str | None = None) -> torch.Tensor:
    """⟨G[s, b], Y[s, keys[s, b, p]]⟩ for every support entry: [S, B, P] from G [S, B, M], Y [S, M, M].
    Three kernels give it, equal to rounding
    (tests/test_yz_support.py); ``kernel=None`` picks the fastest measured for the device and dtype:

    * ``"sddmm"`` (CPU, float32/64): ``torch.sparse.sampled_addmm`` of G and the stacked Yᵀ at the
      support's pattern (a CSR matrix [S·B, S·M]), the B·P·M multiply-adds only (the fastest of the three
      at Fig 6's sizes: benchmarks/README.md#measurements-behind-the-code);
    * ``"dots"``: ``_embedding_bag_per_sample_weights_backward``, one dot product per entry (what the
      embedding bag's own backward calls), for M ≥ 8·P elsewhere: each call has a fixed cost;
    * ``"dense"``: the full G Yᵀ [S, B, M] gathered at the keys."""
    S, B, P = keys.shape
    M = Y.shape[-1]
    if kernel is None:
        sddmm = G.device.type == "cpu" and G.dtype in (torch.float32, torch.float64)
        kernel = "sddmm" if sddmm else "dots" if M >= 8 * P else "dense"
    if kernel == "dense":
        return torch.bmm(G, Y.transpose(1, 2)).gather(2, keys)
    rows = _table_rows(keys, M)
    G, table = G.reshape(S * B, M).contiguous(), Y.reshape(S * M, M)
    if kernel == "dots":
        return torch.ops.aten._embedding_bag_per_sample_weights_backward(
            G, table, rows.view(-1), torch.arange(0, S * B * P, P, device=G.device),
            torch.arange(S * B, device=G.device).repeat_interleave(P), 0, -1).view(S, B, P)
    if kernel != "sddmm":
        raise ValueError(f"support_dots: unknown kernel {kernel!r}; allowed: sddmm, dots, dense")
    with warnings.catch_warnings():   # torch's "support is in beta" notice: this use is tested against the others
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)
        pattern = torch.sparse_csr_tensor(torch.arange(0, S * B * P + 1, P, device=G.device), rows.reshape(-1),
                                          torch.zeros(S * B * P, dtype=G.dtype, device=G.device),  # not empty: β·NaN = NaN even at β = 0
                                          size=(S * B, S * M), check_invariants=False)
        return torch.sparse.sampled_addmm(pattern, G, table.t(), beta=0.0).values().view(S, B, P)


def _table_rows(keys: torch.Tensor, M: int) -> torch.Tensor:
    """Member s's key k as row s·M + k of the members' stacked [S·M, M] table; keys [S, ...]."""
    S = keys.shape[0]
    return keys + (torch.arange(S, device=keys.device) * M).view(S, *(1,) * (keys.dim() - 1))


def support_decode(u_p: torch.Tensor, keys: torch.Tensor, Y: torch.Tensor,
                   bags: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Logits Σ_p u_p Y[keys_p], [S, B, M], for attended vectors on their supports ``keys`` [S, B, P]
    (values ``u_p``; padding entries have value 0) with ``bags`` = :func:`key_bags` of ``keys``."""
    return _SupportDecoder.apply(u_p, Y, keys, *bags)
