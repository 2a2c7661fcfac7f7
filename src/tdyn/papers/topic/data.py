"""Topic-model documents and masked-LM corruption (Li, Li & Risteski 2023; docs/reproductions/topic.md#setting).

* ``lda``: the authors' generator (docs/reproductions/topic.md#lda-generator): T topics with disjoint uniform
  blocks of v words (topic t = words {vt, …, vt+v−1}), θ ~ Dirichlet(α·1_T), length N uniform on
  {min_len..max_len}, per word z ~ Cat(θ), w ~ Uniform(block z).
* ``theory``: the idealised generator (docs/reproductions/topic.md#theory-generator): τ uniform on {1..tau_max}
  topics drawn without replacement, each word's topic uniform among them.

Documents are padded arrays ``words [n, N_max]`` (−1 beyond ``lengths``). Sequences are
``[START, w₁+4, …, w_N+4, END]`` right-padded with PAD (docs/reproductions/topic.md#vocabulary-and-sequences). MLM
corruption follows ``dataset.py`` lines 160–199 (docs/reproductions/topic.md#masked-lm-corruption), vectorised over
the batch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from tdyn.errors import ConfigError, UserError
from tdyn.schema import Strict

PAD, MASK, START, END = 0, 1, 2, 3
NUM_SPECIAL = 4
IGNORE = -100


class LdaDataConfig(Strict):
    """Defaults are the authors' notebook and YAML (docs/reproductions/topic.md#lda-generator,
    docs/reproductions/topic.md#masked-lm-corruption, docs/reproductions/topic.md#training-defaults)."""

    generator: Literal["lda", "theory"] = "lda"
    num_topics: int = Field(10, ge=1)
    words_per_topic: int = Field(10, ge=1)
    alpha: float = Field(0.1, gt=0)
    tau_max: int = Field(3, ge=1)                 # theory generator only
    min_len: int = Field(100, ge=1)
    max_len: int = Field(150, ge=1)
    num_train: int = Field(10_000, ge=1)
    num_dev: int = Field(10_000, ge=1)
    num_test: int = Field(10_000, ge=1)
    data_seed: int = 0                            # documents and static masks (the authors': unseeded)
    mask_prob: float = Field(0.15, ge=0, le=1)
    mask_correct_prob: float = Field(0.1, ge=0, le=1)
    mask_random_prob: float = Field(0.1, ge=0, le=1)
    masking: Literal["static", "dynamic"] = "static"
    attend_to_selected: bool = False
    max_select_tries: int = Field(100, ge=1)
    batch_size: int = Field(40, ge=1)
    probe_docs: int = Field(200, ge=1)            # dev documents the probes read (docs/reproductions/topic.md#two-stage-measurement)

    @model_validator(mode="after")
    def _check(self):
        if self.max_len < self.min_len:
            raise ConfigError(f"data.max_len = {self.max_len}: must be >= data.min_len = {self.min_len}")
        if self.mask_correct_prob + self.mask_random_prob > 1:
            raise ConfigError("data.mask_correct_prob + data.mask_random_prob: must be <= 1")
        if self.generator == "theory" and self.tau_max > self.num_topics:
            raise ConfigError(f"data.tau_max = {self.tau_max}: must be <= data.num_topics = {self.num_topics}")
        return self

    @property
    def num_words(self) -> int:
        return self.num_topics * self.words_per_topic

    @property
    def vocab_size(self) -> int:
        return self.num_words + NUM_SPECIAL

    @property
    def seq_len(self) -> int:
        return self.max_len + 2


# ---------------------------------------------------------------- documents


def generate_documents(cfg: LdaDataConfig, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` documents: (words [n, max_len] int64 with −1 padding, lengths [n])."""
    T, v = cfg.num_topics, cfg.words_per_topic
    lengths = rng.integers(cfg.min_len, cfg.max_len + 1, size=n)
    pos = np.arange(cfg.max_len)
    if cfg.generator == "lda":
        theta = rng.dirichlet(np.full(T, cfg.alpha), size=n)                     # θ ~ Dir(α)
        cdf = np.cumsum(theta, axis=1)
        cdf[:, -1] = 1.0
        u = rng.random((n, cfg.max_len))
        z = (u[:, :, None] >= cdf[:, None, :]).sum(-1)                             # z ~ Cat(θ), inverse CDF
    else:
        tau = rng.integers(1, cfg.tau_max + 1, size=n)
        perm = np.argsort(rng.random((n, T)), axis=1)                              # topics without replacement
        pick = (rng.random((n, cfg.max_len)) * tau[:, None]).astype(np.int64)      # uniform among the τ
        z = np.take_along_axis(perm, pick, axis=1)
    words = z * v + rng.integers(0, v, size=(n, cfg.max_len))                     # w ~ Uniform(block z)
    words[pos[None, :] >= lengths[:, None]] = -1
    return words.astype(np.int64), lengths.astype(np.int64)


def to_sequences(words: np.ndarray, lengths: np.ndarray, seq_len: int) -> torch.Tensor:
    """[START, w+4 …, END] right-padded with PAD to ``seq_len``
    (docs/reproductions/topic.md#vocabulary-and-sequences): int64 [n, seq_len]."""
    n, m = words.shape
    ids = np.full((n, seq_len), PAD, dtype=np.int64)
    ids[:, 0] = START
    ids[:, 1:m + 1] = np.where(words >= 0, words + NUM_SPECIAL, PAD)
    ids[np.arange(n), lengths + 1] = END
    return torch.from_numpy(ids)


def write_documents(path: str | Path, words: np.ndarray, lengths: np.ndarray) -> None:
    """The authors' file format: one line ``"w1 … wN END"`` per document (docs/reproductions/topic.md#lda-generator)."""
    lines = [" ".join(map(str, words[i, :lengths[i]].tolist())) + " END\n" for i in range(len(lengths))]
    Path(path).write_text("".join(lines))


def read_documents(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read the authors' format back into (words, lengths)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"data file {str(p)!r} does not exist")
    docs = []
    for k, line in enumerate(p.read_text().splitlines()):
        toks = line.split()
        if not toks or toks[-1] != "END":
            raise UserError(f"{p}:{k + 1}: a document line must end with END")
        docs.append([int(t) for t in toks[:-1]])
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    words = np.full((len(docs), max(lengths, default=0)), -1, dtype=np.int64)
    for i, d in enumerate(docs):
        words[i, :len(d)] = d
    return words, lengths


# ---------------------------------------------------------------- masked-LM corruption


@dataclasses.dataclass
class MlmBatch:
    """A corrupted batch: ``tokens`` (model input), ``labels`` (original id at selected positions,
    −100 elsewhere), ``keys`` (bool: visible as an attention key), all [..., B, L]."""

    tokens: torch.Tensor
    labels: torch.Tensor
    keys: torch.Tensor

    def as_dict(self) -> dict[str, torch.Tensor]:
        return dataclasses.asdict(self)


def corrupt(ids: torch.Tensor, cfg: LdaDataConfig, gen: torch.Generator, vocab_size: int) -> MlmBatch:
    """BERT corruption as ``dataset.py`` 160–199 (docs/reproductions/topic.md#masked-lm-corruption), for a batch
    ``ids`` [B, L].

    Select positions with r < p_m among non-PAD/START/END tokens (rows with no selection are redrawn,
    up to ``max_select_tries``); replace a selected token by MASK (prob 1−p_c−p_r), a uniform id over
    all ``vocab_size`` ids, specials included (p_r), or keep it (p_c). Keys: non-PAD positions, minus
    the selected ones unless ``attend_to_selected``.
    """
    eligible = (ids != PAD) & (ids != START) & (ids != END)
    selected = torch.zeros_like(eligible)
    todo = torch.ones(ids.shape[0], dtype=torch.bool)
    for _ in range(cfg.max_select_tries):                      # redraw only rows with nothing selected
        r = torch.rand(ids.shape, generator=gen)
        selected = torch.where(todo[:, None], (r < cfg.mask_prob) & eligible, selected)
        todo = ~selected.any(1) & eligible.any(1)
        if not todo.any() or cfg.mask_prob == 0:
            break
    u = torch.rand(ids.shape, generator=gen)
    rand_ids = torch.randint(0, vocab_size, ids.shape, generator=gen)
    p_mask = 1 - cfg.mask_correct_prob - cfg.mask_random_prob
    tokens = torch.where(selected & (u < p_mask), MASK, ids)
    tokens = torch.where(selected & (u >= p_mask) & (u < 1 - cfg.mask_correct_prob), rand_ids, tokens)
    labels = torch.where(selected, ids, IGNORE)
    keys = (ids != PAD) & (~selected if not cfg.attend_to_selected else torch.ones_like(selected))
    return MlmBatch(tokens, labels, keys)


# ---------------------------------------------------------------- the dataset


class LdaDataset:
    """Train/dev/test documents drawn from ``data_seed`` (and static masks,
    docs/reproductions/topic.md#masked-lm-corruption)."""

    def __init__(self, cfg: LdaDataConfig):
        self.cfg = cfg
        rng = np.random.default_rng(np.random.SeedSequence([cfg.data_seed, 0x1DA]))
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        self.splits: dict[str, torch.Tensor] = {}
        self.masked: dict[str, MlmBatch] = {}
        for split, n in (("train", cfg.num_train), ("dev", cfg.num_dev), ("test", cfg.num_test)):
            w, lengths = generate_documents(cfg, n, rng)
            self.splits[split] = to_sequences(w, lengths, cfg.seq_len)
            self.masked[split] = corrupt(self.splits[split], cfg, gen, cfg.vocab_size)   # static masks

    def sample(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        """A training batch of ``batch_size`` distinct documents: static masks as drawn at build,
        or (``masking: dynamic``) masks redrawn with ``gen``."""
        idx = torch.randperm(self.cfg.num_train, generator=gen)[:self.cfg.batch_size]
        if self.cfg.masking == "static":
            m = self.masked["train"]
            return {"tokens": m.tokens[idx], "labels": m.labels[idx], "keys": m.keys[idx]}
        return corrupt(self.splits["train"][idx], self.cfg, gen, self.cfg.vocab_size).as_dict()

    def probe_batch(self) -> dict[str, torch.Tensor]:
        """The first ``probe_docs`` dev documents: masked (for the dev loss) and clean (all word
        keys visible, for the attention statistics;
        docs/reproductions/topic.md#attention-statistic-of-the-authors-code uses mask_prob = 0)."""
        n = min(self.cfg.probe_docs, self.cfg.num_dev)
        m = self.masked["dev"]
        clean = self.splits["dev"][:n]
        return {"tokens": m.tokens[:n], "labels": m.labels[:n], "keys": m.keys[:n],
                "clean_tokens": clean, "clean_keys": clean != PAD}
