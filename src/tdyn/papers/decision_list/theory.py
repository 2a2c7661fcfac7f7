"""Exact population loss of the decision-list model, the reduced W-only flow, perfect classification.

* Enumeration over types (docs/reproductions/decision-lists.md#enumeration-over-types): the loss of a sequence
  depends only on its token counts, so the population loss is Σ_types P(type)·ℒ(representative sequence), over
  n-subsets (sampler B) or multisets (sampler A); chunked, vectorised, any token law μ.
* The exact (m+1)-dimensional W-only flow for uniform tokens, equal lists, W₀ = 0, V = cP
  (docs/reproductions/decision-lists.md#reduced-flow), including the 1/(L−m) metric factor on the shared
  out-of-list coordinate.
* The closed-form full-support margin test at V = cP (docs/reproductions/decision-lists.md#margin-test), and the
  three notions of docs/reproductions/decision-lists.md#perfect-classification.
* λ_max of the population Hessian by Hessian-vector products and power iteration
  (docs/reproductions/decision-lists.md#decision-listclaim2).
Time units follow the paper's Eqn 2 normalisation ((1/n)Σ_j per sequence, averaged over sequences).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import numpy as np
import torch
from scipy.integrate import solve_ivp

from tdyn.papers.decision_list.data import DecisionListTask, Sampler, check_sampler, labels
from tdyn.papers.decision_list.data import sample as dl_sample
from tdyn.papers.decision_list.model import DecisionListModel


# ----------------------------------------------------------------------------- sequence laws and types
def sequence_log_prob(s: torch.Tensor, mu: torch.Tensor, sampler: Sampler) -> torch.Tensor:
    """log P(ordered sequence s) under sampler A (i.i.d. μ) or B (successive sampling w/o replacement)."""
    lm = mu.log()[s]
    if sampler == "A":
        return lm.sum(-1)
    taken = torch.cumsum(mu[s], -1) - mu[s]
    return (lm - torch.log1p(-taken)).sum(-1)


@dataclasses.dataclass
class Types:
    """Representative sequences (sorted, T × n) of every type and their probabilities P(type)."""

    seqs: torch.Tensor
    prob: torch.Tensor

    def __len__(self) -> int:
        return self.seqs.shape[0]


def enumerate_types(task: DecisionListTask, n: int, sampler: Sampler) -> Types:
    """All n-subsets (B) or n-multisets (A) of [L] with their probabilities under μ
    (docs/reproductions/decision-lists.md#enumeration-over-types)."""
    check_sampler(sampler)
    ar = torch.arange(task.L)
    if sampler == "B":
        seqs = subsets(task.L, n)
    else:
        seqs = torch.combinations(ar, n, with_replacement=True) if n > 1 else ar[:, None]
    mu = task.mu
    if sampler == "A":
        cnt = (seqs[:, :, None] == seqs[:, None, :]).sum(-1).double()       # count of each position's token
        log_mult = math.lgamma(n + 1) - (torch.lgamma(cnt + 1) / cnt).sum(-1)
        logp = log_mult + sequence_log_prob(seqs, mu, "A")
    elif task.uniform:
        logp = torch.full((len(seqs),), -math.log(math.comb(task.L, n)), dtype=torch.float64)
    else:
        perms = torch.tensor(list(itertools.permutations(range(n))))
        logp = torch.logsumexp(sequence_log_prob(seqs[:, perms], mu, "B"), -1)
    return Types(seqs, logp.exp())


def combinations(L: int, r: int) -> torch.Tensor:
    """All r-subsets of [L] as sorted rows, in lexicographic order, (C(L, r), r) long. Built row by row
    from itertools (``torch.combinations`` materialises an Lʳ intermediate and overflows near r ≈ 29)."""
    if r == 0:
        return torch.zeros((1, 0), dtype=torch.long)
    flat = np.fromiter(itertools.chain.from_iterable(itertools.combinations(range(L), r)), dtype=np.int64,
                       count=math.comb(L, r) * r)
    return torch.from_numpy(flat.reshape(-1, r))


def subsets(L: int, n: int) -> torch.Tensor:
    """All n-subsets of [L] (sorted rows, (C(L, n), n)); enumerated through their complements, the
    (L − n)-subsets, when that is the smaller side (e.g. L = 30, n = 29: 30 complements)."""
    if not 0 <= n <= L:
        raise ValueError(f"n = {n} is not allowed; allowed: 0 <= n <= L = {L}")
    if L - n >= n:
        return combinations(L, n)
    comp = combinations(L, L - n)
    keep = torch.ones(len(comp), L, dtype=torch.bool)
    keep[torch.arange(len(comp))[:, None], comp] = False
    rows = torch.arange(L).expand(len(comp), L)[keep].reshape(len(comp), n)
    order = np.lexsort(rows.numpy().T[::-1])      # lexicographic, as the direct enumeration
    return rows[torch.from_numpy(order)]


def all_sequences(task: DecisionListTask, n: int, sampler: Sampler) -> Types:
    """Brute force: every ordered sequence in the support (Lⁿ for A; distinct tuples for B) with its law."""
    seqs = torch.cartesian_prod(*[torch.arange(task.L)] * n).reshape(-1, n)
    if sampler == "B":
        seqs = seqs[(seqs[:, :, None] != seqs[:, None, :]).sum((-1, -2)) == n * (n - 1)]
    return Types(seqs, sequence_log_prob(seqs, task.mu, sampler).exp())


def sampled_types(task: DecisionListTask, n: int, sampler: Sampler, N: int, gen: torch.Generator) -> Types:
    """A fixed Monte Carlo evaluation set (docs/reproductions/decision-lists.md#monte-carlo): N sampled sequences
    (rows sorted, which leaves the loss unchanged) with weight 1/N each; every function taking ``Types`` then gives
    the MC estimate."""
    s = dl_sample(task, N, n, sampler, gen).sort(-1).values
    return Types(s, torch.full((N,), 1.0 / N, dtype=torch.float64))


# ----------------------------------------------------------------------------- population loss
def population_loss(model: DecisionListModel, task: DecisionListTask, types: Types, *,
                    chunk: int = 65536, backward: bool = False) -> torch.Tensor:
    """F(W,V) = Σ_types P(type) ℒ(type), per member (S,). With ``backward`` each chunk's contribution is
    back-propagated immediately (grads accumulate in the parameters) and a detached loss is returned."""
    total = 0.0
    for i in range(0, len(types), chunk):
        s, p = types.seqs[i:i + chunk], types.prob[i:i + chunk]
        part = model.seq_loss(s, labels(task, s)) @ p.to(model.W.dtype)
        if backward:
            part.sum().backward()
            part = part.detach()
        total = total + part
    return total


@dataclasses.dataclass
class Classification:
    err_sup: torch.Tensor     # (S,) fraction of misclassified (type, query) pairs, strict argmax
    acc_pop: torch.Tensor     # (S,) probability that a random position is correct
    min_margin: torch.Tensor  # (S,) min over the support of z_y − max_{r≠y} z_r

    @property
    def perfect(self) -> torch.Tensor:
        return self.err_sup == 0


@torch.no_grad()
def position_margins(model: DecisionListModel, task: DecisionListTask, s: torch.Tensor) -> torch.Tensor:
    """z_y − max_{r≠y} z_r at every position: (S, B, n); > 0 means strictly correct."""
    z = model.logits(s)
    y = labels(task, s)[None, :, None, :].expand(z.shape[0], -1, 1, -1)
    zy = z.gather(2, y).squeeze(2)
    other = z.scatter(2, y, -torch.inf).amax(2)
    return zy - other


def classify(model: DecisionListModel, task: DecisionListTask, types: Types, chunk: int = 65536) -> Classification:
    """Err_sup, Acc_pop and the minimum margin over a full support
    (docs/reproductions/decision-lists.md#perfect-classification), by enumeration."""
    wrong = npairs = 0
    acc = 0.0
    mins = []
    for i in range(0, len(types), chunk):
        s, p = types.seqs[i:i + chunk], types.prob[i:i + chunk]
        mg = position_margins(model, task, s)
        first = torch.ones_like(s, dtype=torch.bool)
        first[:, 1:] = s[:, 1:] != s[:, :-1]          # one entry per (type, query): types are sorted
        ok = mg > 0
        wrong = wrong + (~ok & first).sum((1, 2))
        npairs += int(first.sum())
        acc = acc + ok.double().mean(-1) @ p
        mins.append(mg.amin((1, 2)))
    return Classification(wrong / npairs, acc, torch.stack(mins, -1).amin(-1))


# ----------------------------------------------------------------------------- closed-form margins at V = cP
def support_margins(list_scores: torch.Tensor, other_scores: torch.Tensor, L: int, n: int,
                    sampler: Sampler) -> torch.Tensor:
    """Per query, min over the full-support constraints of W[a_k,q] − W[t,q] − log N_max
    (docs/reproductions/decision-lists.md#margin-test).

    ``list_scores`` (Q, m) = W[a_1..a_m, q]; ``other_scores`` (Q, R) = W[t, q] for tokens t outside L_q
    (−inf entries are ignored). Perfect classification at V = cP (c > 0) ⟺ every returned value > 0.
    Equal list lengths m; returns +inf where no constraint exists."""
    ls, other = np.asarray(list_scores), np.asarray(other_scores)   # numpy: the flow's event calls it per step
    Q, m = ls.shape
    logn1 = math.log(n - 1) if (sampler == "A" and n >= 2) else 0.0   # pairs involving q
    logn2 = math.log(n - 2) if (sampler == "A" and n >= 3) else 0.0   # pairs not involving q
    best_other = other.max(-1) if other.shape[-1] else np.full(Q, -np.inf, dtype=ls.dtype)
    out = np.full(Q, np.inf, dtype=ls.dtype)
    for k in range(1, m + 1):
        if sampler == "B" and L - k + 1 < n:
            continue  # event k* = k impossible
        wk = ls[:, k - 1]
        if k == m:
            if n >= 2:
                out = np.minimum(out, wk - best_other - logn1)
            continue
        if n >= 2:
            out = np.minimum(out, wk - ls[:, m - 1] - logn1)
        if n >= 3:
            comp = np.concatenate([ls[:, k:m - 1], best_other[:, None]], -1).max(-1)
            out = np.minimum(out, wk - comp - logn2)
    return torch.from_numpy(out)


def full_support_margins(W: torch.Tensor, task: DecisionListTask, n: int, sampler: Sampler) -> torch.Tensor:
    """support_margins for a full W (L × L, one member) and the task's lists; (L,) per query."""
    if not task.equal_lengths:
        raise ValueError("the closed-form margin test needs equal list lengths; use classify()")
    q = torch.arange(task.L)
    list_scores = W[task.lists, q[:, None]]
    col = W.T.clone()
    col[q[:, None], task.lists] = -torch.inf
    return support_margins(list_scores, col, task.L, n, sampler)


# ----------------------------------------------------------------------------- reduced (m+1)-dim flow
@dataclasses.dataclass
class ReducedConfigs:
    """Configurations of one query's sequence (docs/reproductions/decision-lists.md#reduced-flow): slot counts (K,
    m + n) over list slots a_1..a_m then up to n out-of-list slots, log weights (sum to log 1/L incl. the c_q/n
    factor), the slot of a*, the number of distinct present tokens."""

    L: int
    n: int
    m: int
    sampler: str
    counts: torch.Tensor
    logw: torch.Tensor
    astar: torch.Tensor
    k: torch.Tensor

    # w-independent parts, computed once (the flow's right-hand side and events run 10⁵–10⁶ times)
    @functools.cached_property
    def slot_index(self) -> torch.Tensor:
        return torch.tensor(list(range(self.m)) + [self.m] * self.n)

    @functools.cached_property
    def present(self) -> torch.Tensor:
        return self.counts > 0

    @functools.cached_property
    def log_counts(self) -> torch.Tensor:
        """log c_t, clamped (finite) where a slot is empty."""
        return self.counts.clamp_min(1e-300).log()

    @functools.cached_property
    def log_absent(self) -> torch.Tensor:
        """log(L − k): the absent labels' share of the output softmax, (K, 1)."""
        return torch.log((self.L - self.k).double())[:, None]

    @functools.cached_property
    def weight(self) -> torch.Tensor:
        return self.logw.exp()

    @functools.cached_property
    def logc(self) -> torch.Tensor:
        """log c_t on present slots, −inf on empty ones."""
        return torch.where(self.present, self.log_counts, -torch.inf)

    @functools.cached_property
    def target(self) -> torch.Tensor:
        """(K, slots) bool: the slot of a*."""
        mask = torch.zeros_like(self.present)
        mask[torch.arange(len(mask)), self.astar] = True
        return mask

    @functools.cached_property
    def metric(self) -> torch.Tensor:
        """(m+1,) divisors of the gradient: 1 on the list slots, L − m on w_out (inf when L = m: no out
        tokens, the coordinate stays 0)."""
        out = torch.ones(self.m + 1, dtype=torch.float64)
        out[-1] = self.L - self.m if self.L > self.m else torch.inf
        return out

    @functools.cached_property
    def not_rival(self) -> torch.Tensor:
        """(K, slots) bool: the target's slot and empty slots."""
        return self.target | ~self.present

    @functools.cached_property
    def other_floor(self) -> torch.Tensor:
        """(K,) the largest non-target logit's floor: 0 when some label is absent (k < L), else −inf."""
        return torch.where(self.k < self.L, 0.0, -torch.inf).to(torch.float64)


def _partitions(r: int, maxpart: int | None = None):
    maxpart = r if maxpart is None else maxpart
    if r == 0:
        yield ()
        return
    for first in range(min(r, maxpart), 0, -1):
        for rest in _partitions(r - first, first):
            yield (first,) + rest


def reduced_configs(L: int, n: int, m: int, sampler: Sampler) -> ReducedConfigs:
    check_sampler(sampler)
    rows, logw = [], []
    if sampler == "B":
        for b in itertools.product((0, 1), repeat=m - 1):
            r = n - 1 - sum(b)
            if 0 <= r <= L - m:
                rows.append(list(b) + [1] + [1] * r + [0] * (n - r))
                logw.append(-math.log(L) + _lcomb(L - m, r) - _lcomb(L - 1, n - 1))
    else:
        for cl in itertools.product(range(n + 1), repeat=m):
            if cl[-1] < 1 or sum(cl) > n:
                continue
            for lam in _partitions(n - sum(cl)):
                if len(lam) > L - m:
                    continue
                mult = np.bincount(lam).tolist() if lam else []
                lw = (math.lgamma(n + 1) - sum(math.lgamma(x + 1) for x in cl + lam) - n * math.log(L)
                      + math.lgamma(L - m + 1) - math.lgamma(L - m - len(lam) + 1)
                      - sum(math.lgamma(x + 1) for x in mult) + math.log(cl[-1] / n))
                rows.append(list(cl) + list(lam) + [0] * (n - len(lam)))
                logw.append(lw)
    cnt = torch.tensor(rows, dtype=torch.float64)
    present = cnt[:, :m] > 0
    return ReducedConfigs(L, n, m, sampler, cnt, torch.tensor(logw, dtype=torch.float64),
                          present.to(torch.int8).argmax(-1), (cnt > 0).sum(-1))


def _lcomb(a: int, b: int) -> float:
    return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)


def _reduced_forward(w: torch.Tensor, cf: ReducedConfigs, c: float):
    """α (K, slots), the output log-partition's terms z = (cα on present slots, log(L − k)) and its lse."""
    logits = torch.where(cf.present, cf.log_counts + w.index_select(-1, cf.slot_index), -torch.inf)
    alpha = torch.softmax(logits, -1)
    z = torch.cat([torch.where(cf.present, c * alpha, -torch.inf), cf.log_absent], -1)
    return alpha, z, torch.logsumexp(z, -1)


def reduced_loss(w: torch.Tensor, cf: ReducedConfigs, c: float) -> torch.Tensor:
    """F_q(w) = Σ_configs weight·ℓ, ℓ = −cα_{a*} + log(Σ_present e^{cα_t} + (L − k))
    (docs/reproductions/decision-lists.md#reduced-flow)."""
    alpha, _, lse = _reduced_forward(w, cf, c)
    ell = -c * alpha.gather(-1, cf.astar[:, None]).squeeze(-1) + lse
    return ell @ cf.weight


def reduced_grad(w: torch.Tensor, cf: ReducedConfigs, c: float) -> torch.Tensor:
    """Per-coordinate gradient of the population loss: ∂F_q/∂w with the 1/(L−m) factor on w_out.

    Reverse mode of ``reduced_loss`` written out: the kernels autograd runs for it, in its order (so the
    result is bit-identical to ``torch.autograd.grad``; tested), without the engine's per-call cost. The
    flow calls it 10⁵–10⁶ times on tensors of a few dozen entries, where each op's dispatch is the cost,
    so it folds steps that leave every bit unchanged: the gather's backward
    adds −c·weight into g_α in place (x + (0 + v) = x + v), w[slot] is an ``index_select``, and the
    broadcast's backward accumulates with ``index_add_`` in the same order as ``index_put_``."""
    with torch.no_grad():
        alpha, z, lse = _reduced_forward(w, cf, c)
        g_z = cf.weight[:, None] * (z - lse[:, None]).exp()                 # logsumexp (∂(ell @ weight)/∂ell = weight)
        g_alpha = (torch.where(cf.present, g_z[:, :alpha.shape[-1]], 0.0) * c   # cat, where, c·α
                   ).scatter_add_(-1, cf.astar[:, None], (cf.weight * -c)[:, None])  # gather
        g_logits = torch.where(cf.present, torch._softmax_backward_data(g_alpha, alpha, -1, alpha.dtype), 0.0)
        g = w.new_zeros(w.shape, dtype=alpha.dtype).index_add_(0, cf.slot_index, g_logits.sum(0))  # w[slot]
        return g / cf.metric                                                # the 1/(L−m) metric factor on w_out


def reduced_margin(w: torch.Tensor | np.ndarray, cf: ReducedConfigs) -> float:
    """Min full-support margin for the reduced state (perfect ⟺ > 0)."""
    w = np.asarray(w)
    other = w[None, -1:] if cf.L > cf.m else w[None, :0]
    return float(support_margins(w[None, :cf.m], other, cf.L, cf.n, cf.sampler)[0])


def reduced_acc_pop(w: torch.Tensor, cf: ReducedConfigs) -> float:
    """Acc_pop of the reduced state: Σ_configs L·weight·1[target strictly largest log c_t + w_t]."""
    score = torch.where(cf.present, cf.log_counts + w[cf.slot_index], -torch.inf)
    tgt = score.gather(-1, cf.astar[:, None]).squeeze(-1)
    rest = score.scatter(-1, cf.astar[:, None], -torch.inf).amax(-1)
    return float(((tgt > rest).double() @ cf.weight) * cf.L)


def reduced_sample_correct(w: torch.Tensor, task: DecisionListTask, s: torch.Tensor) -> torch.Tensor:
    """For the reduced state w (W[a_k,q] = w_k, W[t,q] = w_out off the list) and V = cP: whether every
    position of each sequence s (N, n) is strictly correct (docs/reproductions/decision-lists.md#margin-test rule),
    (N,) bool."""
    lst = task.lists[s]                                              # (N, n_query, M)
    m = task.M
    hit = s[:, None, :, None] == lst[:, :, None, :]                  # (N, q, key, M)
    slot = torch.where(hit.any(-1), hit.to(torch.int8).argmax(-1), torch.full_like(s[:, None, :], m))
    cnt = (s[:, :, None] == s[:, None, :]).sum(-1).double()          # count of each key's token
    score = cnt.log()[:, None, :] + w[slot]                          # (N, q, key)
    k = torch.where(hit.any(-2), torch.arange(m), m).amin(-1)       # first present list slot per query
    is_tgt = slot == k[..., None]
    tgt = torch.where(is_tgt, score, -torch.inf).amax(-1)
    rest = torch.where(is_tgt, -torch.inf, score).amax(-1)
    return (tgt > rest).all(-1)


def gamma_pattern(L: int, n: int, m: int, sampler: Sampler) -> float:
    """Mass of the rarest multiplicity pattern: min over the reduced configurations of one query
    (docs/reproductions/decision-lists.md#reduced-flow: the counts of the list tokens and the multiplicity pattern
    of the out-of-list tokens under A; the presence pattern of a_1..a_{m−1} under B) of P(pattern)·c_q/n. A
    candidate γ for result (1)."""
    return float(reduced_configs(L, n, m, sampler).logw.min().exp())


def reduced_logit_margins(ws: torch.Tensor, cf: ReducedConfigs, c: float, chunk: int = 64) -> torch.Tensor:
    """Min over the full support of the logit margin z_y − max_{r≠y} z_r at V = cP, for each reduced state
    in ``ws`` (T, m+1): (T,). Per configuration the margin is c·(α_{a*} − max(α of the other present
    tokens, 0 when a label is absent)); strict perfection ⟺ > 0 (the same sign as ``support_margins``)."""
    ws = torch.as_tensor(ws, dtype=torch.float64).reshape(-1, cf.m + 1)
    out = []
    with torch.no_grad():   # the flow's κ events call it once per step on one state
        for i in range(0, len(ws), chunk):
            alpha = torch.softmax(cf.logc + ws[i:i + chunk].index_select(1, cf.slot_index)[:, None, :], -1)  # (t, K, slots)
            tgt = (alpha * cf.target).sum(-1)
            other = torch.where(cf.not_rival, -torch.inf, alpha).amax(-1)
            out.append((c * (tgt - torch.maximum(other, cf.other_floor))).amin(-1))
    return out[0] if len(out) == 1 else torch.cat(out)


def reduced_acc_pop_grid(ws: torch.Tensor, cf: ReducedConfigs, chunk: int = 64) -> torch.Tensor:
    """``reduced_acc_pop`` for every state of ``ws`` (T, m+1) at once: (T,)."""
    ws = torch.as_tensor(ws, dtype=torch.float64).reshape(-1, cf.m + 1)
    wt = cf.weight * cf.L
    out = []
    for i in range(0, len(ws), chunk):
        score = cf.logc + ws[i:i + chunk, cf.slot_index][:, None, :]
        tgt = torch.where(cf.target, score, -torch.inf).amax(-1)
        rest = torch.where(cf.target, -torch.inf, score).amax(-1)
        out.append((tgt > rest).double() @ wt)
    return torch.cat(out)


@dataclasses.dataclass
class SampleTable:
    """The w-independent part of ``reduced_sample_correct`` for a fixed sample, reduced to a table of
    required margins: one row per (target slot, target log count) that occurs, with, per slot s, the
    largest log count of a non-target key in slot s over those positions (−inf: none). Every position is
    correct ⟺ every row has tgt_logc + w[tgt_slot] > max_s (rest[s] + w[s]). At most m·n rows."""

    tgt_slot: torch.Tensor   # (U,)
    tgt_logc: torch.Tensor   # (U,)
    rest: torch.Tensor       # (U, m+1)


def sample_table(task: DecisionListTask, s: torch.Tensor) -> SampleTable:
    m = task.M
    lst = task.lists[s]                                              # (N, q, M)
    hit = s[:, None, :, None] == lst[:, :, None, :]                  # (N, q, key, M)
    slot = torch.where(hit.any(-1), hit.to(torch.int8).argmax(-1), torch.full_like(s[:, None, :], m))
    cnt = (s[:, :, None] == s[:, None, :]).sum(-1).double()          # count of each key's token
    logc = cnt.log()[:, None, :].expand_as(slot)
    k = torch.where(hit.any(-2), torch.arange(m), m).amin(-1)        # first present list slot per query
    is_tgt = slot == k[..., None]
    tgt_logc = torch.where(is_tgt, logc, -torch.inf).amax(-1)
    rest = torch.full((*slot.shape[:2], m + 1), -torch.inf, dtype=torch.float64)
    rest = rest.scatter_reduce(-1, slot.long(), torch.where(is_tgt, -torch.inf, logc), "amax")
    # positions with the same (target slot, target log count) merge into one row holding, per slot, the
    # largest rest: the same verdict, since x ↦ fl(x + w_s) is nondecreasing
    a, a_id = torch.unique(tgt_logc.reshape(-1), return_inverse=True)
    key = k.reshape(-1) * len(a) + a_id
    G = m * len(a)
    merged = torch.full((G, m + 1), -torch.inf, dtype=torch.float64).scatter_reduce(
        0, key[:, None].expand(-1, m + 1), rest.reshape(-1, m + 1), "amax")
    used = torch.nonzero(torch.bincount(key, minlength=G)).squeeze(-1)
    return SampleTable(used // len(a), a[used % len(a)], merged[used])


def sample_correct_grid(ws: torch.Tensor, tab: SampleTable) -> torch.Tensor:
    """Whether every position of every sample is strictly correct, for each state of ``ws`` (T, m+1): (T,)."""
    ws = torch.as_tensor(ws, dtype=torch.float64).reshape(-1, tab.rest.shape[1])
    tgt = tab.tgt_logc + ws[:, tab.tgt_slot]                          # (T, U)
    rest = (tab.rest[None] + ws[:, None, :]).amax(-1)                # (T, U)
    return (tgt > rest).all(-1)


@dataclasses.dataclass
class FlowResult:
    T_sup: float | None           # first time Err_sup = 0 (None: not reached by t_max)
    T_pop: dict[float, float | None]
    T_N: float | None             # first time all N fixed samples are correct (None: no samples / not reached)
    t: np.ndarray                 # dense time grid
    w: np.ndarray                 # (len(t), m+1)
    t_max: float
    T_kappa: dict[float, float | None] = dataclasses.field(default_factory=dict)  # first min logit margin >= κ
    margin: np.ndarray | None = None      # min full-support logit margin on the grid t
    w_scale_at_T_sup: float | None = None  # max |W| entry at T_sup (W₀ = 0: the size of the score differences)


def _first_time(sol, ts: np.ndarray, ok: np.ndarray, pred, fallback: float | None) -> float | None:
    """First grid time where pred holds, refined by bisection on the dense solution."""
    hit = np.nonzero(ok)[0]
    if not len(hit):
        return fallback
    j = hit[0]
    if j == 0:
        return 0.0
    lo, hi = ts[j - 1], ts[j]
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if pred(torch.from_numpy(sol.sol(mid))) else (mid, hi)
    return float(hi)


def solve_reduced_flow(L: int, n: int, m: int, sampler: Sampler, c: float, t_max: float,
                       eps: tuple[float, ...] = (1e-3,), grid: int = 400,
                       samples: tuple[DecisionListTask, torch.Tensor] | None = None,
                       kappas: tuple[float, ...] = ()) -> FlowResult:
    """Gradient flow on W (V = cP, W₀ = 0) in the reduced coordinates, float64; LSODA with events at
    full-support perfection (docs/reproductions/decision-lists.md#reduced-flow,
    docs/reproductions/decision-lists.md#margin-test) and at min logit margin >= κ for each κ in ``kappas``
    (T_sup(κ), docs/reproductions/decision-lists.md#perfect-classification); the run stops at the last of these.
    T_pop(ε) and T_N (on ``samples`` = (task, sequences)) by a grid search on the dense solution + bisection; both
    are <= T_sup."""
    cf = reduced_configs(L, n, m, sampler)

    def rhs(_, y):
        return -reduced_grad(torch.from_numpy(y), cf, c).numpy()

    def strict(_, y):
        return reduced_margin(y, cf)

    last = [None, None]   # the κ events are evaluated at the same y in turn: one margin computation

    def logit_margin(y):
        key = y.tobytes()
        if last[0] != key:
            last[:] = key, float(reduced_logit_margins(torch.from_numpy(y), cf, c)[0])
        return last[1]

    strict.terminal, strict.direction = not kappas, 1
    events = [strict]
    for kappa in kappas:
        def ev(_, y, kappa=kappa):
            return logit_margin(y) - kappa
        ev.terminal, ev.direction = kappa == max(kappas), 1
        events.append(ev)
    sol = solve_ivp(rhs, (0.0, t_max), np.zeros(m + 1), method="LSODA", rtol=1e-8, atol=1e-10,
                    events=events, dense_output=True)
    T_sup = float(sol.t_events[0][0]) if len(sol.t_events[0]) else None
    m0 = float(reduced_logit_margins(torch.zeros(m + 1, dtype=torch.float64), cf, c)[0])
    T_kappa = {kappa: (0.0 if m0 >= kappa else float(sol.t_events[i + 1][0]) if len(sol.t_events[i + 1]) else None)
               for i, kappa in enumerate(kappas)}
    t_end = float(sol.t[-1])
    ts = np.concatenate([[0.0], np.geomspace(max(t_end, 1e-12) * 1e-9, t_end, grid)]) if t_end > 0 else np.zeros(1)
    ws = sol.sol(ts).T if t_end > 0 else np.zeros((1, m + 1))
    wt = torch.from_numpy(np.ascontiguousarray(ws))
    acc = reduced_acc_pop_grid(wt, cf).numpy()
    T_pop = {e: _first_time(sol, ts, 1 - acc <= e, lambda w, e=e: 1 - reduced_acc_pop(w, cf) <= e, T_sup)
             for e in eps}
    T_N = None
    if samples is not None:
        tab = sample_table(*samples)
        pred = lambda w: bool(sample_correct_grid(w, tab)[0])  # noqa: E731
        T_N = _first_time(sol, ts, sample_correct_grid(wt, tab).numpy(), pred, T_sup)
    w_scale = None if T_sup is None else float(np.abs(sol.sol(T_sup)).max())
    return FlowResult(T_sup, T_pop, T_N, ts, ws, t_max, T_kappa, reduced_logit_margins(wt, cf, c).numpy(), w_scale)


# ----------------------------------------------------------------------------- Hessian
def _hvp_operator(model: DecisionListModel, task: DecisionListTask, types: Types):
    """(matvec, size): v ↦ ∇²F v over the flattened (W, V) of member 0, by double backprop."""
    params = [model.W, model.V]
    loss = population_loss(model, task, types).sum()
    grads = torch.autograd.grad(loss, params, create_graph=True)
    shapes = [p.shape for p in params]
    sizes = [p.numel() for p in params]

    def matvec(v):
        v = torch.as_tensor(np.asarray(v, dtype=np.float64).reshape(-1))
        parts = [x.reshape(sh) for x, sh in zip(torch.split(v, sizes), shapes)]
        hv = torch.autograd.grad(grads, params, parts, retain_graph=True)
        return torch.cat([h.reshape(-1) for h in hv]).numpy()

    return matvec, sum(sizes)


class HessianOperator:
    """∇²F over the flattened (W, V) of one member (member 0 of ``model``) in closed form, per (type, query
    position) (docs/reproductions/decision-lists.md#closed-form-gradients): the forward quantities (attention α,
    h = Xα, p, r = p − e_y, g̃ = V[:, s]ᵀ r, a = α ⊙ (g̃ − ᾱ·g̃)) are computed once, and each product is a few
    batched matmuls, with no autograd graph. With w the query column's key scores, U = V[:, s] and
    J = diag(α) − ααᵀ, ℓ(w, V) = −log softmax(U α)_y has

        ∂ℓ/∂w = J g̃,   ∂ℓ/∂V = r hᵀ,
        δ(∂ℓ/∂w) = D δw + J (δV[:, s]ᵀ r + Uᵀ δr),   D = diag(a) − a αᵀ − α aᵀ,
        δ(∂ℓ/∂V) = δr hᵀ + r (X J δw)ᵀ,   δr = (diag p − p pᵀ)(δV h + U J δw),

    weighted by P(type)/n and scattered onto W[s_i, s_j]. Tested against the autograd double-backward product
    and the dense Hessian (``tests/test_decision_list.py``)."""

    def __init__(self, model: DecisionListModel, task: DecisionListTask, types: Types):
        W, V = model.W.detach()[0], model.V.detach()[0]
        s = types.seqs.to(W.device)
        T, n = s.shape
        self.L, self.s, self.dtype = W.shape[-1], s, W.dtype
        y = labels(task, s)
        self.sk = s[:, :, None].expand(T, n, n)                     # key token of (type, key i, query j)
        self.sq = s[:, None, :].expand(T, n, n)                     # query token
        self.alpha = torch.softmax(W[self.sk, self.sq], dim=1)     # (T, n_key, n_query)
        self.U = V[:, s].permute(1, 0, 2)                           # (T, L, n_key): U = V[:, s]
        self.p = torch.softmax(self.U @ self.alpha, dim=1)          # (T, L, n_query)
        self.r = self.p.clone()
        self.r.scatter_add_(1, y[:, None, :], -torch.ones_like(y[:, None, :], dtype=W.dtype))
        g = self.U.transpose(1, 2) @ self.r                         # (T, n_key, n_query): g̃
        self.a = self.alpha * (g - (self.alpha * g).sum(1, keepdim=True))
        self.omega = (types.prob.to(W) / n)[:, None, None]          # weight of (type, query position)
        self.h = self._tokens(self.alpha)                           # (T, L, n_query): h = Xα
        self.size = 2 * self.L * self.L

    def _tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(T, n_key, n_query) over key positions → (T, L, n_query) over tokens: X x."""
        T, n, _ = x.shape
        return torch.zeros(T, self.L, n, dtype=x.dtype).scatter_add_(1, self.sk, x)

    def _J(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * (x - (self.alpha * x).sum(1, keepdim=True))

    def matvec_tensors(self, dW: torch.Tensor, dV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(∇²F (dW, dV)) as (W part, V part), each L × L."""
        dw = dW[self.sk, self.sq]                                   # (T, n_key, n_query)
        Jdw = self._J(dw)
        dz = dV @ self.h + self.U @ Jdw                             # (T, L, n_query)
        dr = self.p * (dz - (self.p * dz).sum(1, keepdim=True))
        Ddw = self.a * dw - self.a * (self.alpha * dw).sum(1, keepdim=True) - self.alpha * (self.a * dw).sum(1, keepdim=True)
        dU = dV[:, self.s].permute(1, 0, 2)                         # δV[:, s]
        gw = self.omega * (Ddw + self._J(dU.transpose(1, 2) @ self.r + self.U.transpose(1, 2) @ dr))
        HW = torch.zeros(self.L, self.L, dtype=self.dtype).index_put_((self.sk, self.sq), gw, accumulate=True)
        om = self.omega
        HV = torch.einsum("tlq,tmq->lm", om * dr, self.h) + torch.einsum("tlq,tmq->lm", om * self.r, self._tokens(Jdw))
        return HW, HV

    def matvec(self, v) -> np.ndarray:
        v = torch.as_tensor(np.asarray(v, dtype=np.float64).reshape(-1)).to(self.dtype)
        LL = self.L * self.L
        HW, HV = self.matvec_tensors(v[:LL].reshape(self.L, self.L), v[LL:].reshape(self.L, self.L))
        return torch.cat([HW.reshape(-1), HV.reshape(-1)]).double().numpy()


@dataclasses.dataclass
class BlockBound:
    """λ_max of the population Hessian over (W, V) bracketed by its per-query structure
    (docs/reproductions/decision-lists.md#hessian-blocks): ``lower`` = the largest eigenvalue of the W–W block,
    which is block-diagonal over the query columns W[:, q] (one L × L block per query; a principal submatrix, so
    λ_max ≥ it), ``upper`` = the largest eigenvalue of [[lower, β], [β, c_up]] with β ≥ ‖∇²_{WV} F‖ and
    c_up ≥ λ_max(∇²_{VV} F) (both bounded in closed form), so λ_max ≤ it. ``vector``: the top eigenvector of the
    W–W block, embedded in (W, V) (V part 0)."""

    lower: float
    upper: float
    beta: float
    c_up: float
    vector: np.ndarray

    @property
    def rel_width(self) -> float:
        return (self.upper - self.lower) / abs(self.lower) if self.lower else math.inf

    def with_beta(self, beta: float) -> "BlockBound":
        """The same bracket with another bound β on ‖∇²_{WV}F‖ (the upper end recomputed)."""
        return dataclasses.replace(self, beta=beta, upper=bracket_upper(self.lower, beta, self.c_up))


def hessian_blocks(model: DecisionListModel, task: DecisionListTask, types: Types) -> BlockBound:
    """The W–W blocks of ∇²F (member 0) in closed form, one per query q, and the bounds of :class:`BlockBound`
    (docs/reproductions/decision-lists.md#hessian-blocks).

    In token space a position with query q has attention α̃ = h (α summed over the key positions of each token),
    logits z = V α̃, output p, r = p − e_y, g = Vᵀ r, ã = α̃ ⊙ (g − α̃·g), J̃ = diag(α̃) − α̃α̃ᵀ and G̃ = V J̃, whose
    column t is α̃_t (V[:, t] − z). With weight ω = P(type)/n per (type, position),

        A_q = Σ_{(type, j): s_j = q} ω (G̃ᵀ Σ_p G̃ + diag(ã) − ã α̃ᵀ − α̃ ãᵀ),   Σ_p = diag p − ppᵀ,

    assembled as one Gram matrix per q (rows √(ω p_l) (G̃[l, :] − pᵀG̃), centred: no cancellation). ‖∇²_{WV}F‖ ≤ β = sqrt(Σ_q β_q²) with
    β_q = Σ ω (‖Σ_p G̃‖_F ‖h‖ + ‖r‖ ‖J̃‖_F) (one (type, j) maps δW[:, q] to (Σ_p G̃ δw) hᵀ + r (J̃ δw)ᵀ);
    λ_max(∇²_{VV}F) ≤ Σ ω (1 − ‖p‖²) ‖h‖² (each term Σ_p ⊗ hhᵀ is PSD with that trace)."""
    op = HessianOperator(model, task, types)
    L, dt = op.L, op.dtype
    V = model.V.detach()[0]
    T, n = op.s.shape
    N = T * n
    at = op.h.transpose(1, 2).reshape(N, L)                       # α̃ per (type, position)
    pt = op.p.transpose(1, 2).reshape(N, L)
    rt = op.r.transpose(1, 2).reshape(N, L)
    om = op.omega.expand(T, 1, n).reshape(N)
    q = op.s.reshape(N)
    z = at @ V.T                                                   # (N, L) logits
    g = rt @ V                                                     # (N, L): g = Vᵀ r
    a = at * (g - (at * g).sum(1, keepdim=True))
    m = pt @ V                                                     # (N, L): pᵀ V
    pz = (pt * z).sum(1, keepdim=True)
    # ‖Σ_p G̃‖_F²: column t is α̃_t (Σ_p V[:, t] − w), w = Σ_p z
    w = pt * (z - pz)
    p2 = pt * pt
    SV2 = p2 @ (V * V) - 2 * m * (p2 @ V) + m * m * p2.sum(1, keepdim=True)     # ‖Σ_p V[:, t]‖²
    wSV = (w * pt) @ V - m * (w * pt).sum(1, keepdim=True)                       # w · Σ_p V[:, t]
    col2 = (SV2 - 2 * wSV + (w * w).sum(1, keepdim=True)).clamp_min(0)
    S_F = ((at * at) * col2).sum(1).sqrt()
    s2 = (at * at).sum(1)
    J_F = (s2 - 2 * (at ** 3).sum(1) + s2 * s2).clamp_min(0).sqrt()
    hn, rn = at.norm(dim=1), rt.norm(dim=1)
    beta_q = torch.zeros(L, dtype=dt).index_add_(0, q, om * (S_F * hn + rn * J_F))
    c_up = float((om * (1 - (pt * pt).sum(1)) * hn * hn).sum())
    A = torch.zeros(L, L, L, dtype=dt)
    order = torch.argsort(q, stable=True)
    bounds = torch.searchsorted(q[order], torch.arange(L + 1))
    for qq in range(L):
        sel = order[bounds[qq]:bounds[qq + 1]]
        if len(sel) == 0:
            continue
        ats, ws = at[sel], om[sel]
        # G̃ᵀ Σ_p G̃ = Σ_l p_l (G̃_l − pᵀG̃)(G̃_l − pᵀG̃)ᵀ: rows centred under p (no cancellation)
        cen = (V[None] - m[sel][:, None, :]) - (z[sel] - pz[sel])[:, :, None]                    # (Nq, L, L)
        R = ((ws[:, None] * pt[sel]).sqrt()[:, :, None] * cen * ats[:, None, :]).reshape(-1, L)
        wa = ws[:, None] * a[sel]
        A[qq] = R.T @ R + torch.diag(wa.sum(0)) - wa.T @ ats - ats.T @ wa
    return block_bound(A, beta_q, c_up)


def bracket_upper(lower: float, beta: float, c_up: float) -> float:
    """The bracket's upper end: the largest eigenvalue of [[lower, β], [β, c_up]] (:class:`BlockBound`)."""
    mid, half = 0.5 * (lower + c_up), 0.5 * (lower - c_up)
    return max(lower, mid + math.sqrt(half * half + beta * beta))


def block_bound(A: torch.Tensor, beta_q: torch.Tensor, c_up: float) -> BlockBound:
    """The :class:`BlockBound` of the per-query W–W blocks ``A`` (L × L × L, symmetrised here), the per-query
    bounds ``beta_q`` on ‖∇²_{WV}F‖ and ``c_up`` ≥ λ_max(∇²_{VV}F)."""
    L = A.shape[-1]
    A = 0.5 * (A + A.transpose(1, 2))
    evals, evecs = torch.linalg.eigh(A)                            # per query block
    qstar = int(evals[:, -1].argmax())
    lower = float(evals[qstar, -1])
    beta = float(beta_q.norm())
    upper = bracket_upper(lower, beta, c_up)
    vec = torch.zeros(2, L, L, dtype=torch.float64)
    vec[0, :, qstar] = evecs[qstar, :, -1]
    return BlockBound(lower, upper, beta, c_up, vec.reshape(-1).numpy())


def dense_hessian(model: DecisionListModel, task: DecisionListTask, types: Types) -> torch.Tensor:
    """The full population Hessian over the flattened (W, V) (2L² × 2L²), one HVP per basis vector."""
    matvec, N = _hvp_operator(model, task, types)
    return torch.from_numpy(np.stack([matvec(np.eye(1, N, i)[0]) for i in range(N)], 1))


def top_hessian_eigenvalue(model: DecisionListModel, task: DecisionListTask, types: Types, *,
                           tol: float = 1e-12, v0: np.ndarray | None = None,
                           return_vector: bool = False, gen: torch.Generator | None = None,
                           closed_form: bool = False):
    """λ_max of ∇²F over (W, V) (one member): the largest *algebraic* eigenvalue, by Lanczos (ARPACK
    ``eigsh``, which='LA') on Hessian-vector products, run to convergence (relative ``tol``). ``v0``
    warm-starts it (e.g. the previous step's eigenvector); with ``return_vector`` returns (λ, vector);
    ``closed_form``: products by :class:`HessianOperator` instead of autograd double backprop.
    (100 power iterations, the earlier method, came out up to 1% low.)"""
    from scipy.sparse.linalg import LinearOperator, eigsh

    if closed_form:   # the closed-form product (HessianOperator): the same operator to 1e-16, no autograd graph
        op = HessianOperator(model, task, types)
        matvec, N = op.matvec, op.size
    else:
        matvec, N = _hvp_operator(model, task, types)
    if v0 is None:
        g = gen if gen is not None else torch.Generator().manual_seed(0)
        v0 = torch.randn(N, generator=g, dtype=torch.float64).numpy()
    if N <= 3:
        H = np.stack([matvec(np.eye(1, N, i)[0]) for i in range(N)], 1)
        w, U = np.linalg.eigh(0.5 * (H + H.T))
        lam, vec = float(w[-1]), U[:, -1]
    else:
        op = LinearOperator((N, N), matvec=matvec, dtype=np.float64)
        w, U = eigsh(op, k=1, which="LA", tol=tol, v0=v0, ncv=min(N, 20), maxiter=100 * N)
        lam, vec = float(w[0]), U[:, 0]
    return (lam, vec) if return_vector else lam
