"""Decision-list data (paper §I.B; docs/reproductions/decision-lists.md#samplers-delta-and-gamma): the seeded task,
samplers A/B, labels, δ and γ.

A task is a permutation π of [L] and, for every token a, a list L_a = (a_1, …, a_m = a). The label of a
position holding a is π(a_k*) with k* the first list index whose token is present in the sequence.
Lists are stored padded to M columns by repeating a (the last entry is always present, so padding never
changes the first present entry).

Samplers (docs/reproductions/decision-lists.md#samplers, not specified by the paper): "A" draws n i.i.d. tokens
from the token law μ; "B" draws n distinct tokens (successive sampling without replacement from μ, by Gumbel
top-k).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import numpy as np
import torch

from tdyn.errors import ConfigError

Sampler = Literal["A", "B"]
SAMPLERS = ("A", "B")


@dataclasses.dataclass(frozen=True)
class DecisionListTask:
    """π (``perm[a] = π(a)``), padded lists ``lists[a] = (a_1..a_m, a, …)`` of width M, lengths m_a, token law μ."""

    L: int
    M: int
    perm: torch.Tensor      # (L,) long
    lists: torch.Tensor     # (L, M) long
    lengths: torch.Tensor   # (L,) long
    mu: torch.Tensor        # (L,) float64, sums to 1

    @property
    def uniform(self) -> bool:
        return bool(torch.allclose(self.mu, torch.full_like(self.mu, 1.0 / self.L)))

    @property
    def equal_lengths(self) -> bool:
        return bool((self.lengths == self.M).all())

    @property
    def P(self) -> torch.Tensor:
        """Permutation matrix with P e_a = e_{π(a)} (float64)."""
        P = torch.zeros(self.L, self.L, dtype=torch.float64)
        P[self.perm, torch.arange(self.L)] = 1.0
        return P


def check_sampler(sampler: str) -> None:
    if sampler not in SAMPLERS:
        raise ConfigError(f"sampler = {sampler!r} is not allowed; allowed: A, B")


def make_task(L: int, M: int, seed: int, *, equal_lengths: bool = True, zipf: float = 0.0) -> DecisionListTask:
    """Seeded task (docs/reproductions/decision-lists.md#samplers): uniform π; list prefixes drawn without
    replacement from [L]∖{a}; m_a = M (default) or m_a ~ Unif{1..M}; μ ∝ (rank+1)^(−zipf) over a random token order
    (zipf = 0: uniform)."""
    if not 1 <= M <= L:
        raise ConfigError(f"M = {M} is not allowed; allowed: 1 <= M <= L = {L}")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(L)
    prefix = _list_prefixes(rng, L, M - 1)
    lengths = np.full(L, M) if equal_lengths else rng.integers(1, M + 1, size=L)
    col = np.arange(M)[None, :]
    lists = np.where(col < (lengths[:, None] - 1), np.concatenate([prefix, np.zeros((L, 1), int)], 1), np.arange(L)[:, None])
    mu = (np.arange(L) + 1.0) ** (-zipf)
    mu = mu[rng.permutation(L)]
    mu /= mu.sum()
    return DecisionListTask(L, M, torch.as_tensor(perm), torch.as_tensor(lists), torch.as_tensor(lengths),
                            torch.as_tensor(mu, dtype=torch.float64))


def _list_prefixes(rng: np.random.Generator, L: int, k: int, chunk_elems: int = 1 << 22) -> np.ndarray:
    """Row a: the first k entries of a random order of [L] ∖ {a}, (L, k) — the order that sorts row a of
    one L × L draw of uniform keys, key a pushed last. Only the k smallest keys are needed: a partition
    (O(L)) and a sort of k keys per row instead of a full O(L log L) argsort, with the keys drawn in row
    chunks of about ``chunk_elems`` (the same stream as the one L × L draw), so memory is O(chunk), not
    O(L²). Equal to the full argsort whenever a row's k smallest keys are distinct."""
    rows = max(1, chunk_elems // L)
    out = np.empty((L, k), dtype=np.int64)
    for i in range(0, L, rows):
        keys = rng.random((min(rows, L - i), L))
        r = np.arange(len(keys))
        keys[r, i + r] = 2.0
        if k == 0:
            continue
        part = np.argpartition(keys, k - 1, axis=1)[:, :k]      # k <= L - 1: key a (2.0) is never needed
        order = np.argsort(np.take_along_axis(keys, part, 1), axis=1)
        out[i:i + len(keys)] = np.take_along_axis(part, order, 1)
    return out


def sample(task: DecisionListTask, N: int, n: int, sampler: Sampler, gen: torch.Generator) -> torch.Tensor:
    """N sequences of n tokens, shape (N, n), long."""
    check_sampler(sampler)
    if sampler == "A":
        return torch.multinomial(task.mu.expand(N, -1), n, replacement=True, generator=gen)
    if n > task.L:
        raise ConfigError(f"n = {n} is not allowed for sampler B; allowed: n <= L = {task.L}")
    # Gumbel top-k = ordered sampling without replacement from μ: row i takes the n largest keys
    # g = log μ − log(−log u) over its L uniforms u. The uniforms are drawn in row chunks (the same stream
    # as one N × L draw; memory O(chunk)). With uniform μ the keys increase with u, so only a row's
    # n + 8 largest u can win and only those keys are computed (the same keys, ordered the same).
    log_mu, rows = task.mu.log(), max(1, (1 << 22) // task.L)
    few = task.uniform and n + 8 < task.L
    out = []
    for i in range(0, max(N, 1), rows):
        u = torch.rand(min(rows, N - i), task.L, generator=gen, dtype=torch.float64)
        cand = u.topk(n + 8, dim=1).indices if few else torch.arange(task.L).expand_as(u)
        u = u.gather(1, cand).clamp_min(1e-300) if few else u.clamp_min(1e-300)
        g = log_mu[cand] - (-u.log()).log()
        out.append(cand.gather(1, g.topk(n, dim=1).indices))
    return torch.cat(out)


def determining_index(task: DecisionListTask, s: torch.Tensor) -> torch.Tensor:
    """k* − 1 for every position: the first list index of L_{s_j} whose token is present in s. (..., n)."""
    present = torch.zeros(*s.shape[:-1], task.L, dtype=torch.bool, device=s.device)
    present.scatter_(-1, s, True)
    lst = task.lists.to(s.device)[s]                                   # (..., n, M)
    hit = present.unsqueeze(-2).expand(*s.shape, task.L).gather(-1, lst)  # (..., n, M)
    return hit.to(torch.int8).argmax(-1)


def labels(task: DecisionListTask, s: torch.Tensor) -> torch.Tensor:
    """Labels y_j = π(a_k*) (paper §I.B), same shape as s."""
    k = determining_index(task, s)
    det = task.lists.to(s.device)[s].gather(-1, k.unsqueeze(-1)).squeeze(-1)
    return task.perm.to(s.device)[det]


def event_probs(L: int, n: int, m: int, sampler: Sampler) -> np.ndarray:
    """p(k | q) = P(k* = k | s_j = q) for k = 1..m (docs/reproductions/decision-lists.md#delta-and-gamma closed
    forms; equal lists, uniform tokens)."""
    check_sampler(sampler)
    k = np.arange(1, m + 1)
    if sampler == "A":
        p = (1 - (k - 1) / L) ** (n - 1) - (1 - k / L) ** (n - 1)
        p[-1] = (1 - (m - 1) / L) ** (n - 1)
        return p
    tot = math.comb(L - 1, n - 1)
    p = np.array([math.comb(L - 1 - kk, n - 2) / tot if n >= 2 else 0.0 for kk in k[:-1]] +
                 [math.comb(L - m, n - 1) / tot], dtype=float)
    return p


def delta_gamma(L: int, n: int, m: int, sampler: Sampler) -> dict:
    """δ = min_k p(k|q), γ = min_k p(q) p(k|q) with p(q) = 1/L
    (docs/reproductions/decision-lists.md#delta-and-gamma). ``positive`` flags δ > 0."""
    p = event_probs(L, n, m, sampler)
    delta = float(p.min())
    return {"delta": delta, "gamma_joint": delta / L, "positive": delta > 0}
