"""Scan and Snap's sequence-class distribution (Tian et al. 2023 §3.2; docs/reproductions/scan-snap.md#data).

Class k (next token n_k, query m = ψ(n_k)) draws its L−1 context tokens i.i.d. from P(l|n_k),
supported on the global commons, its query group's commons and its own distinct tokens. Token ids
follow the authors' ``Dataset2`` layout, in consecutive blocks: global commons; per-query commons
(block m); distinct tokens (block k); query ids; next-token ids.
"""

from __future__ import annotations

import dataclasses

import torch
from pydantic import Field

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
        self.cdf = self.table.cumsum(1)
        self.cdf[:, -1] = 1.0

    def sample(self, batch_size: int, seq_len: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``: x [B, L] with the query at position L−1, y [B] the next-token ids.

        Classes are uniform; the L−1 context tokens are drawn i.i.d. from the [K, M] table by
        inverse CDF (one uniform per token, one ``searchsorted`` for the whole batch).
        """
        cls = torch.randint(self.K, (batch_size,), generator=gen)
        u = torch.rand(batch_size, seq_len - 1, generator=gen, dtype=torch.float64)
        ctx = torch.searchsorted(self.cdf[cls], u, right=True).clamp_(max=self.M - 1)
        x = torch.cat([ctx, self.query[cls, None]], dim=1)
        return x, self.next_token[cls]


def build(cfg: ScanSnapDataConfig) -> SequenceClasses:
    """The token-id layout and P(l|n) table of the authors' ``Dataset2``."""
    n_last, n_next = cfg.num_last, cfg.num_next_per_last
    K = n_last * n_next
    off_group = cfg.num_common
    off_distinct = off_group + n_last * cfg.num_common_per_last
    off_query = off_distinct + K * cfg.num_unique_per_next
    off_next = off_query + n_last
    M = off_next + K
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
