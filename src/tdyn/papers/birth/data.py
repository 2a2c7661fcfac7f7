"""The bigram language with triggers of Bietti et al. 2023 (docs/reproductions/birth.md#data).

Each sequence z_1 … z_{T+1} over a vocabulary of N tokens is drawn as the authors' ``ihead_data.Dataset.gen_seq``
draws it:

* K trigger tokens q_1 … q_K: fixed for every sequence (``fixed_triggers``, the authors' ``fixed_special_toks``:
  the K most frequent tokens of the unigram law π_u) or drawn per sequence from π_u without replacement, over the
  whole vocabulary or (``triggers``, tdyn's: the authors' code has no such option) over its first ⌊0.75 N⌋ tokens
  (``"train"``) or the rest (``"test"``), the output split applied to triggers, for held-out triggers;
* one output token o_k per trigger and per sequence, uniform over the output pool (the whole vocabulary; the first
  ⌊0.75 N⌋ tokens for ``outputs="train"``, the rest for ``outputs="test"``, the authors' ``train_test`` split;
  or from the trigger's bigram conditional π_b(·|q_k) for ``outputs="bigram"``, their ``bigram_outs``);
* z_1 ~ π_u, then z_{t+1} = o_k when z_t = q_k, else z_{t+1} ~ π_b(·|z_t).

The model reads x = z_{1..T} and predicts y = z_{2..T+1}. ``occ[t]`` is the authors' ``outputs_seq`` counter: 0 where
z_t is no trigger, else how many times the trigger z_t has occurred up to t (1: first occurrence, whose next token
cannot be known from the context; ≥ 2: the in-context bigrams an induction head predicts).

The bigram statistics π_u, π_b (:func:`tables`): ``"tinyshakespeare"`` (default) are the character unigram and
bigram counts of tiny Shakespeare as the authors' ``data/prepare.py`` counts them, shipped with tdyn as
``tinyshakespeare_counts.json`` (65 characters; read from the authors' ``data/meta.pkl``, no download at run time);
``"dirichlet"`` is a synthetic stand-in: π_u and every row of π_b drawn from a symmetric Dirichlet(α) of
``dirichlet_seed`` over ``vocab`` tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from importlib import resources
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from tdyn.schema import Strict

#: the shipped counts (docs/reproductions/birth.md#data)
COUNTS_FILE = "tinyshakespeare_counts.json"
#: the authors' train/test split of the output tokens: the first 75 % of the vocabulary for training
TRAIN_FRACTION = 0.75


class BirthData(Strict):
    """The run config's ``data`` section of the ``birth`` task."""

    bigrams: Literal["tinyshakespeare", "dirichlet"] = Field(
        "tinyshakespeare", description="the global bigram law: tiny Shakespeare's character counts (the authors') "
                                       "or a synthetic Dirichlet one")
    vocab: int = Field(65, ge=4, le=4096, description="N for bigrams = dirichlet (tinyshakespeare: 65, fixed)")
    dirichlet_alpha: float = Field(0.1, gt=0, description="α of the synthetic Dirichlet(α) rows")
    dirichlet_seed: int = Field(0, description="seed of the synthetic bigram law (one law for every member)")
    k: int = Field(5, ge=0, le=64, description="K, trigger tokens per sequence (the authors' data_args.k)")
    fixed_triggers: bool = Field(True, description="the K most frequent tokens for every sequence (the authors' "
                                                   "fixed_special_toks); false: drawn per sequence from π_u")
    outputs: Literal["uniform", "train", "test", "bigram"] = Field(
        "uniform", description="output tokens: uniform over the vocabulary, over its first 75 % (train) or last "
                               "25 % (test), or from the trigger's bigram conditional")
    ood_outputs: Literal["none", "test", "bigram"] = Field(
        "none", description="a second probe set whose output tokens come from this pool (held-out outputs)")
    triggers: Literal["all", "train", "test"] = Field(
        "all", description="with fixed_triggers false: the pool triggers are drawn from, the whole vocabulary or its "
                           "first 75 % (train) or last 25 % (test) (tdyn's; held-out triggers)")
    ood_triggers: Literal["none", "test"] = Field(
        "none", description="a second probe set whose triggers come from the last 25 % of the vocabulary (held-out "
                            "triggers; needs triggers = train)")
    T: int = Field(256, ge=2, le=8192, description="sequence length (the authors' seq_length)")
    batch_size: int = Field(512, ge=1, le=1 << 20, description="sequences per training step")
    loss_on: Literal["outputs", "all"] = Field(
        "outputs", description="the training loss on positions with occ ≥ 2 (the authors' loss_head_only) or on "
                               "every position")
    probe_size: int = Field(512, ge=1, le=1 << 16, description="sequences of the fixed probe set (the authors' "
                                                                "test batch: 512 from rng 0)")
    probe_seed: int = Field(0, description="seed of the probe set, the same for every member")

    @model_validator(mode="after")
    def _check(self):
        N = 65 if self.bigrams == "tinyshakespeare" else self.vocab
        if self.k > N:
            raise ValueError(f"k = {self.k} triggers: more than the vocabulary's N = {N} tokens")
        if self.outputs in ("train", "test") and int(TRAIN_FRACTION * N) in (0, N):
            raise ValueError(f"outputs = {self.outputs!r}: N = {N} tokens leave an empty train or test pool")
        if self.fixed_triggers and (self.triggers != "all" or self.ood_triggers != "none"):
            raise ValueError(f"data.triggers = {self.triggers!r}, data.ood_triggers = {self.ood_triggers!r}: a "
                             "trigger pool needs data.fixed_triggers = false (triggers drawn per sequence)")
        if self.ood_triggers != "none" and self.triggers != "train":
            raise ValueError(f"data.ood_triggers = {self.ood_triggers!r} holds out the last 25 % of the tokens only "
                             f"when training triggers come from the first 75 % (data.triggers = 'train', not "
                             f"{self.triggers!r})")
        for pool in {self.triggers, "test" if self.ood_triggers != "none" else "all"}:
            lo, hi = output_pool(N, "uniform" if pool == "all" else pool)
            if self.k > hi - lo:
                raise ValueError(f"data.k = {self.k} triggers: more than the {hi - lo} tokens of the trigger pool "
                                 f"{pool!r} (N = {N})")
        return self


@dataclasses.dataclass(frozen=True)
class Tables:
    """π_u (N,), π_b (N, N) rows summing to 1, float64; ``chars``: the tokens' characters ('' if synthetic)."""
    unigram: torch.Tensor
    bigram: torch.Tensor
    chars: str

    @property
    def N(self) -> int:
        return self.unigram.shape[0]


@functools.lru_cache(maxsize=1)
def _counts() -> dict:
    return json.loads(resources.files("tdyn.papers.birth").joinpath(COUNTS_FILE).read_text(encoding="utf-8"))


def tables(dc: BirthData) -> Tables:
    """The global unigram and bigram laws of the config (see the module docstring)."""
    if dc.bigrams == "tinyshakespeare":
        c = _counts()
        uni = torch.tensor(c["unigrams"], dtype=torch.float64)
        big = torch.tensor(c["bigrams"], dtype=torch.float64)
        return Tables(uni / uni.sum(), big / big.sum(1, keepdim=True), c["chars"])

    rows = torch.from_numpy(np.random.default_rng(dc.dirichlet_seed).dirichlet(
        np.full(dc.vocab, dc.dirichlet_alpha), size=dc.vocab + 1))
    rows = rows / rows.sum(-1, keepdim=True)
    return Tables(rows[0], rows[1:], "")


def triggers_fixed(tb: Tables, k: int) -> torch.Tensor:
    """The K most frequent tokens (the authors' ``marginal.argsort()[N − K:]``, in that order), (K,)."""
    return tb.unigram.argsort()[tb.N - k:]


def output_pool(N: int, outputs: str) -> tuple[int, int]:
    """[lo, hi) of the tokens an output is drawn from uniformly (``outputs`` uniform / train / test)."""
    n_train = int(TRAIN_FRACTION * N)
    return {"uniform": (0, N), "train": (0, n_train), "test": (n_train, N)}[outputs]


def sample(n: int, T: int, tb: Tables, k: int, gen: torch.Generator, *, fixed_triggers: bool = True,
           outputs: str = "uniform", triggers: str = "all") -> dict[str, torch.Tensor]:
    """``n`` sequences: ``x`` (n, T) tokens z_1..z_T, ``y`` (n, T) the next tokens z_2..z_{T+1}, ``occ`` (n, T) the
    trigger-occurrence counter (int64), ``q`` (n, K) the triggers and ``o`` (n, K) their outputs: :func:`draws`
    from ``gen``, then :func:`chain`."""
    return chain(draws(n, T, tb, k, gen, fixed_triggers=fixed_triggers, outputs=outputs, triggers=triggers), tb)


def draws(n: int, T: int, tb: Tables, k: int, gen: torch.Generator, *, fixed_triggers: bool = True,
          outputs: str = "uniform", triggers: str = "all") -> dict[str, torch.Tensor]:
    """The random numbers of :func:`sample`'s ``n`` sequences, drawn from ``gen`` in this order: the triggers ``q``
    (n, K) (when not fixed: Gumbel top-K of log π_u, which is sampling without replacement ∝ π_u; ``triggers`` train
    / test: restricted to that pool of :func:`output_pool`, i.e. ∝ π_u on the pool), the outputs ``o`` (n, K), the
    first tokens ``z1`` (n,) ~ π_u, then ``u`` (n, T) uniforms for the chain (inverse CDF of π_b(·|z_t))."""
    N = tb.N
    if k and fixed_triggers:
        q = triggers_fixed(tb, k).expand(n, k)
    elif k:
        gumbel = -torch.log(-torch.log(torch.rand(n, N, generator=gen, dtype=torch.float64)))
        logp = tb.unigram.log()
        if triggers != "all":
            lo, hi = output_pool(N, triggers)
            if k > hi - lo:
                raise ValueError(f"k = {k} triggers: more than the {hi - lo} tokens of the trigger pool {triggers!r}")
            logp = torch.full_like(logp, -math.inf)
            logp[lo:hi] = tb.unigram[lo:hi].log()
        q = (logp + gumbel).topk(k, dim=1).indices
    else:
        q = torch.zeros(n, 0, dtype=torch.long)
    if outputs == "bigram":
        cdf = tb.bigram.cumsum(1)[q]                                  # (n, K, N)
        u = torch.rand(n, k, 1, generator=gen, dtype=torch.float64)
        o = (u > cdf).sum(-1).clamp_max(N - 1)
    else:
        lo, hi = output_pool(N, outputs)
        o = torch.randint(lo, hi, (n, k), generator=gen)
    z1 = torch.searchsorted(tb.unigram.cumsum(0), torch.rand(n, generator=gen, dtype=torch.float64)).clamp_max(N - 1)
    u = torch.rand(n, T, generator=gen, dtype=torch.float64)
    return {"q": q.clone(), "o": o, "z1": z1, "u": u}


def chain(dr: dict[str, torch.Tensor], tb: Tables) -> dict[str, torch.Tensor]:
    """The sequences of :func:`draws`' numbers ``dr`` (rows independent, so the draws of several generators
    concatenated give their sequences concatenated): z_{t+1} = o_k when z_t = q_k, else the inverse CDF of
    π_b(·|z_t) at u_t; ``occ`` counts each trigger's occurrences. The loop over t in NumPy (exact comparisons and
    integer counts: the same bits as the same loop in torch, at a tenth of its per-step overhead)."""
    q, o, u = dr["q"].numpy(), dr["o"].numpy(), dr["u"].numpy()
    n, T = u.shape
    N = tb.N
    out_of = np.full((n, N), -1, dtype=np.int64)      # out_of[b, v] = the output of token v in sequence b (−1: none)
    np.put_along_axis(out_of, q, o, 1)
    cdf_b = tb.bigram.cumsum(1).numpy()
    z = np.empty((n, T + 1), dtype=np.int64)
    z[:, 0] = dr["z1"].numpy()
    occ = np.zeros((n, T), dtype=np.int64)
    seen = np.zeros((n, N), dtype=np.int64)
    rows = np.arange(n)
    for t in range(T):
        last = z[:, t]
        forced = out_of[rows, last]
        is_trig = forced >= 0
        seen[rows, last] += is_trig
        occ[:, t] = np.where(is_trig, seen[rows, last], 0)
        nxt = np.minimum((u[:, t, None] > cdf_b[last]).sum(1), N - 1)
        z[:, t + 1] = np.where(is_trig, forced, nxt)
    z = torch.from_numpy(z)
    return {"x": z[:, :T].clone(), "y": z[:, 1:].clone(), "occ": torch.from_numpy(occ), "q": dr["q"],
            "o": dr["o"]}
