"""Scan and Snap's sequence-class distribution (Tian et al. 2023 §3.2; docs/reproductions/scan-snap.md#data).

Class k (next token n_k, query m = ψ(n_k)) draws its L−1 context tokens i.i.d. from P(l|n_k),
supported on the global commons, its query group's commons and its own distinct tokens. Token ids
follow the authors' ``Dataset2`` layout, in consecutive blocks: global commons; per-query commons
(block m); distinct tokens (block k); query ids; next-token ids.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence

import torch
from pydantic import Field, model_validator

from tdyn.errors import ConfigError
from tdyn.schema import Strict


class ScanSnapDataConfig(Strict):
    """Defaults are Syn-Small (docs/reproductions/scan-snap.md#syn-small-and-syn-medium); the authors' YAML
    defaults are overridden by every paper run."""

    num_last: int = Field(2, ge=1)
    num_next_per_last: int = Field(1, ge=1)
    num_common: int = Field(10, ge=0)
    num_common_per_last: int = Field(0, ge=0)
    num_unique_per_next: int = Field(10, ge=1)
    common_unnormalized_prob: float = Field(1.0, gt=0)
    unique_unnormalized_min: float = Field(0.1, gt=0)
    unique_unnormalized_max: float = Field(1.0, gt=0)
    seq_len: int = Field(128, ge=2)
    batch_size: int = Field(128, ge=1)

    @property
    def vocab_size(self) -> int:
        """M: global commons, per-query commons, distinct tokens, query ids, next-token ids."""
        K = self.num_last * self.num_next_per_last
        return (self.num_common + self.num_last * self.num_common_per_last + K * self.num_unique_per_next
                + self.num_last + K)

    @model_validator(mode="after")
    def _check(self):
        if self.unique_unnormalized_max < self.unique_unnormalized_min:
            raise ConfigError(f"data.unique_unnormalized_max = {self.unique_unnormalized_max}: must be >= "
                              f"data.unique_unnormalized_min = {self.unique_unnormalized_min}")
        return self


SYN_SMALL: dict = {"num_last": 2, "num_next_per_last": 1, "num_common_per_last": 0}


def syn_medium(num_last: int) -> dict:
    """Syn-Medium with ``num_last`` queries and 2 next tokens each (Figs 6, 11, 12)."""
    return {"num_last": num_last, "num_next_per_last": 2, "num_common_per_last": 0}


@dataclasses.dataclass
class SequenceClasses:
    """The distribution's facts: M, K, the [K, M] table P(l|n), ψ, and the token-id blocks."""

    M: int
    K: int
    table: torch.Tensor           # [K, M] float64, P(l | class k)
    query: torch.Tensor           # [K] query token id of class k (ψ)
    next_token: torch.Tensor      # [K] next-token id of class k
    group: torch.Tensor           # [K] query group m of class k
    distinct: torch.Tensor        # [K, M] bool, class k's distinct tokens
    common: torch.Tensor          # [M] bool, tokens in the support of more than one class
    num_contextual: int           # ids below this are context tokens (commons + distincts)

    def __post_init__(self):
        # The CDF is 1 from each class's last token of positive probability on: its cumulative sum can end
        # an ulp below 1 (e.g. ten masses of 0.1), and a draw u in that gap must not land on a later token
        # of probability 0.
        self.cdf = self.table.cumsum(1)
        M = self.table.shape[1]
        last = M - 1 - (self.table > 0).flip(1).to(torch.int8).argmax(1)
        self.cdf[torch.arange(M) >= last[:, None]] = 1.0
        self.inverse_cdf = InverseCDF(self.cdf)
        self._on: dict[torch.device, tuple] = {}

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, InverseCDF]:
        """``(query, next_token, inverse_cdf)`` on ``device`` (the generators' device: batches drawn with a CUDA
        generator are looked up on the GPU, config ``draw_on_device``); the host's are these objects themselves."""
        if device.type == "cpu":
            return self.query, self.next_token, self.inverse_cdf
        if device not in self._on:
            self._on[device] = (self.query.to(device), self.next_token.to(device), self.inverse_cdf.to(device))
        return self._on[device]

    def sample(self, batch_size: int, seq_len: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``: x [B, L] with the query at position L−1, y [B] the next-token ids.

        Classes are uniform; the L−1 context tokens are drawn i.i.d. from the [K, M] table by
        inverse CDF: one uniform per token, looked up exactly as ``searchsorted(cdf[class], u,
        right=True)`` (:class:`InverseCDF`).
        """
        x, y, _, _ = self._draw(batch_size, seq_len, gen)
        return x, y

    def sample_counts(self, batch_size: int, seq_len: int, gen: torch.Generator | Sequence[torch.Generator],
                      context: bool = True):
        """:meth:`sample` (the same draws) with each sequence's context counted over its class's support:
        ``(x, y, tokens, count)``, ``tokens`` [B, W] the support of each sample's class (its CDF's step
        points, increasing, padded with M−1) and ``count`` [B, W] (int32) how often each occurs in the
        sequence. ``tdyn.papers.scan_snap.model.pack_support(count, tokens, width)`` turns this into exactly
        ``key_support(x, M, width)`` (tested) without a [B, M] histogram (~2x faster per batch here).
        ``context=False``: x is only the query column [B, 1] (the context tokens are not written out;
        the draws and the counts are the same).

        ``gen`` a sequence of G generators: G batches, each what ``gen[i]`` alone gives, stacked on a
        leading axis [G, B, ...] (bit for bit, tested). Only the draws are per generator; the lookup and
        the counting run once over all G·B sequences (an ensemble's data streams)."""
        x, y, cls, at = self._draw(batch_size, seq_len, gen, context)
        inv = self._tables(cls.device)[2]
        W = inv.width
        N = cls.numel()
        col = at + ((torch.arange(N, device=cls.device) - cls.view(-1)) * W).view(at.shape[:-1] + (1,))   # b·W + j
        count = torch.zeros(N * W, dtype=torch.int32, device=cls.device).index_add_(
            0, col.view(-1), torch.ones(col.numel(), dtype=torch.int32, device=cls.device)).view(*cls.shape, W)
        return x, y, inv.tokens.view(-1, W).index_select(0, cls.view(-1)).view(*cls.shape, W), count

    def _draw(self, batch_size: int, seq_len: int, gen: torch.Generator | Sequence[torch.Generator],
              context: bool = True):
        """(x, y, class [B], each context token's flat index in :class:`InverseCDF`'s rows [B, L−1]);
        x without its context columns unless ``context``. Generators ``gen`` [G]: a leading axis G on each. The
        draws and the lookup run on the generators' device (one device for all)."""
        one = isinstance(gen, torch.Generator)
        gens = [gen] if one else list(gen)
        dev = gens[0].device
        query, next_token, inv = self._tables(dev)
        cls = torch.empty(len(gens), batch_size, dtype=torch.long, device=dev)
        u = torch.empty(len(gens), batch_size, seq_len - 1, dtype=torch.float64, device=dev)
        for g, c, v in zip(gens, cls, u):      # per generator: its class draws, then its uniforms
            torch.randint(self.K, (batch_size,), generator=g, out=c)
            torch.rand(batch_size, seq_len - 1, generator=g, dtype=torch.float64, out=v)
        if one:
            cls, u = cls[0], u[0]
        at = inv.lookup(cls, u)
        x = query[cls].unsqueeze(-1)
        if context:
            x = torch.cat([inv.tokens.take(at), x], dim=-1)
        return x, next_token[cls], cls, at


class InverseCDF:
    """``torch.searchsorted(cdf[k], u, right=True).clamp(max=M−1)`` for rows k of a [K, M] CDF and u in
    [0, 1) (``torch.rand``'s range), bit for bit (tested), in O(1) per draw instead of a binary search
    (the sampler's main cost). Why it is exact:

    * the answer, the first j with cdf[k, j] > u, is a point where row k's CDF steps up, or M−1 (whose
      value is set to 1 > u): each row keeps only those points (``tokens``, increasing; ``values``,
      their CDF), and the answer is row k's token p for p = #{values ≤ u};
    * p is found from u's bucket b of [0, 1) in N = 2^10 equal buckets (u·N is exact): the
      #{values < b/N} first values of the row are certainly ≤ u, and at most ``window`` values lie in
      one bucket, so p = that + #{the next ``window`` values ≤ u} (float64 comparisons, exact). Where a
      bucket would hold more than 8 values, N grows (up to 2^16), so a lookup stays a few passes.

    Rows are stored flat, ``width`` = (most points in a row) + ``window`` each, padded with token M−1 and
    value +inf, so a lookup never leaves its row. Hand-written: torch has no such lookup."""

    def __init__(self, cdf: torch.Tensor):
        K, M = cdf.shape
        prev = torch.cat([torch.full((K, 1), -1.0, dtype=cdf.dtype), cdf[:, :-1]], 1)
        steps = cdf != prev
        steps[:, -1] = True
        points = [steps[k].nonzero().flatten() for k in range(K)]
        for bits in (10, 12, 14, 16):
            self.buckets = 1 << bits
            edges = torch.arange(self.buckets + 1, dtype=cdf.dtype) / self.buckets
            below = [torch.searchsorted(cdf[k, j], edges) for k, j in enumerate(points)]    # #{values < edge}
            self.window = max(int((c[1:] - c[:-1]).max()) for c in below)
            if self.window <= 8:
                break
        self.width = W = max(len(j) for j in points) + self.window
        tokens = torch.full((K, W), M - 1, dtype=torch.long)
        values = torch.full((K, W), float("inf"), dtype=cdf.dtype)
        for k, j in enumerate(points):
            tokens[k, :len(j)] = j
            values[k, :len(j)] = cdf[k, j]
        self.tokens, self.values = tokens.view(-1), values.view(-1)
        # bucket b of row k → the flat index of its first candidate
        self.start = (torch.stack([c[:-1] for c in below]) + (torch.arange(K) * W)[:, None]).view(-1)

    def to(self, device: torch.device) -> InverseCDF:
        """A copy whose tables live on ``device`` (the same lookup, run there)."""
        out = copy.copy(self)
        out.tokens, out.values, out.start = self.tokens.to(device), self.values.to(device), self.start.to(device)
        return out

    def lookup(self, cls: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """For classes ``cls`` [...] and uniforms ``u`` [..., T] in [0, 1): each draw's flat index into
        ``tokens`` (the drawn token is ``tokens.take(index)``). Gathers by ``index_select`` on the flat
        tables (faster than ``take``)."""
        def at_(table, index):
            return table.index_select(0, index.view(-1)).view(index.shape)
        at = at_(self.start, (u * self.buckets).long().add_((cls * self.buckets).unsqueeze(-1)))
        for _ in range(self.window):
            at += at_(self.values, at) <= u
        return at


def build(cfg: ScanSnapDataConfig) -> SequenceClasses:
    """The token-id layout and P(l|n) table of the authors' ``Dataset2``."""
    n_last, n_next = cfg.num_last, cfg.num_next_per_last
    K = n_last * n_next
    off_group = cfg.num_common
    off_distinct = off_group + n_last * cfg.num_common_per_last
    off_query = off_distinct + K * cfg.num_unique_per_next
    off_next = off_query + n_last
    M = cfg.vocab_size
    assert M == off_next + K
    group = torch.arange(K) // n_next
    weights = torch.zeros(K, M, dtype=torch.float64)
    weights[:, :cfg.num_common] = cfg.common_unnormalized_prob
    uniq = torch.linspace(cfg.unique_unnormalized_min, cfg.unique_unnormalized_max, cfg.num_unique_per_next,
                          dtype=torch.float64)
    distinct = torch.zeros(K, M, dtype=torch.bool)
    for k in range(K):
        g0 = off_group + int(group[k]) * cfg.num_common_per_last
        weights[k, g0:g0 + cfg.num_common_per_last] = cfg.common_unnormalized_prob
        d0 = off_distinct + k * cfg.num_unique_per_next
        weights[k, d0:d0 + cfg.num_unique_per_next] = uniq
        distinct[k, d0:d0 + cfg.num_unique_per_next] = True
    table = weights / weights.sum(1, keepdim=True)
    common = (table > 0).sum(0) > 1
    return SequenceClasses(M=M, K=K, table=table, query=off_query + group, next_token=off_next + torch.arange(K),
                           group=group, distinct=distinct, common=common, num_contextual=off_query)
