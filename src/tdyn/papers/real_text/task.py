"""The corpus LM task (Scan and Snap §8, App G): the PyTorch tutorial's causal LM (``tdyn.papers.real_text.model``)
on bptt windows of an offline real-text corpus (``tdyn.papers.real_text.data``). Config sections: ``data`` =
:class:`CorpusLMData`, ``model`` = :class:`tdyn.papers.real_text.model.LMConfig`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from tdyn.papers.real_text import data as corpora
from tdyn.papers.real_text.model import CausalLM, LMConfig, member_size
from tdyn.schema import Strict
from tdyn.tasks.base import Member, Task, register_task
from tdyn.seeding import derive_seed, generator

#: Shim (issue 13): the model section's old name; one config type per model now.
CorpusLMModel = LMConfig


class CorpusLMData(Strict):
    corpus: Literal["wiki", "bbc", "fixture"] = "wiki"
    vocab_size: int | None = Field(None, ge=2)   # None = every training-split word
    min_freq: int = Field(1, ge=1)
    split_seed: int = 0
    bptt: int = Field(35, ge=2)
    batch_size: int = Field(20, ge=1)
    probe_windows: int = Field(20, ge=1)         # fixed validation windows for probes


class CorpusLMTask(Task):
    """Next-token prediction on bptt windows of a corpus's token stream.

    ``sample`` draws ``batch_size`` windows at uniform random offsets of the training stream (the
    tutorial walks 20 fixed columns in order; random windows keep members' streams independent).
    ``probe_batch`` is ``probe_windows`` evenly spaced windows of the validation stream.
    """

    def __init__(self, cfg, members: list[Member]):
        self.dc = CorpusLMData.model_validate(cfg.data)
        tok = corpora.load_tokens(self.dc.corpus, seed=self.dc.split_seed,
                                  vocab=corpora.VocabSettings(max_size=self.dc.vocab_size, min_freq=self.dc.min_freq))
        self.train_tokens = torch.from_numpy(np.asarray(tok.train, dtype=np.int64))
        self.val_tokens = torch.from_numpy(np.asarray(tok.val, dtype=np.int64))
        mc = LMConfig.model_validate(cfg.model)
        self.model = CausalLM(mc.model_copy(update={"V": len(tok.vocab), "max_len": self.dc.bptt}), S=len(members))
        self.model.reset_parameters([generator(m.seed, "init") for m in members], [m.init_scale for m in members])
        self.model.dropout_gens = [torch.Generator(cfg.device).manual_seed(derive_seed(m.seed, "dropout"))
                                   for m in members]
        self.facts = {"vocab_size": len(tok.vocab), "provenance": tok.meta}

    def _windows(self, stream: torch.Tensor, starts: torch.Tensor):
        idx = starts[:, None] + torch.arange(self.dc.bptt + 1)
        w = stream[idx]
        return w[:, :-1], w[:, 1:]

    def sample(self, gen):
        n = len(self.train_tokens) - self.dc.bptt - 1
        return self._windows(self.train_tokens, torch.randint(0, n, (self.dc.batch_size,), generator=gen))

    def probe_batch(self, gen):
        n = len(self.val_tokens) - self.dc.bptt - 1
        return self._windows(self.val_tokens, torch.linspace(0, n, self.dc.probe_windows).long())

    def loss(self, batch):
        x, y = batch
        return self.model.loss(x, y)

    def member_generators(self):
        return {"dropout": self.model.dropout_gens}


def _size(cfg) -> int:
    """Without data.vocab_size the vocabulary is the corpus's (bounded by it): the layers alone."""
    return member_size(cfg.typed_model(), cfg.typed_data().vocab_size or 0)


@register_task("corpus_lm", CorpusLMData, LMConfig, "tutorial causal LM on an offline real-text corpus", size=_size)
def _build_lm(cfg, members):
    return CorpusLMTask(cfg, members)
