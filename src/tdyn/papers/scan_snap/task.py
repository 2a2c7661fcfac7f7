"""The Scan and Snap task (Tian et al. 2023): the sequence-class distribution (``tdyn.papers.scan_snap.data``)
wired to the Y/Z model (``tdyn.papers.scan_snap.model``) with two parameter groups, Y (decoder, η_Y) and Z
(attention logits, η_Z). Config sections: ``data`` = :class:`ScanSnapDataConfig`, ``model`` =
:class:`YZConfig`.
"""

from __future__ import annotations

import torch

from tdyn.papers.scan_snap import data
from tdyn.papers.scan_snap.data import ScanSnapDataConfig  # noqa: F401  (the data section)
from tdyn.papers.scan_snap.kernels import key_bags, pack_support, support_decoder_applies
from tdyn.papers.scan_snap.model import YZConfig, YZModel, member_size
from tdyn.tasks.base import Member, Task, register_task
from tdyn.seeding import generator


class ScanSnapTask(Task):
    """The Y/Z model on a sequence-class distribution. A variant distribution subclasses this with its
    own ``data_config`` and ``build_distribution`` returning a :class:`~tdyn.papers.scan_snap.data.SequenceClasses`
    (see examples/shared_distinct_tokens.py); model, loss and probes then work unchanged."""

    data_config = data.ScanSnapDataConfig

    def build_distribution(self, data_cfg) -> data.SequenceClasses:
        return data.build(data_cfg)

    def __init__(self, cfg, members: list[Member]):
        self.data_cfg = self.data_config.model_validate(cfg.data)
        self.dist = self.build_distribution(self.data_cfg)
        mc = YZConfig.model_validate(cfg.model)
        self.model = YZModel(mc.model_copy(update={"M": self.dist.M}), S=len(members))
        self.model.reset_parameters([generator(m.seed, "init") for m in members], [m.init_scale for m in members])
        d = self.dist
        if mc.parameterization == "yz" and self._own_sampler():
            # Z[m, l] has a gradient only on the query rows m, Y[l, n] only on the rows of tokens the
            # attended vector can hold: the context tokens, and the query where it is a key or the residual
            keys = (d.table > 0).any(0).nonzero().flatten()
            if mc.include_query_key or mc.residual:
                keys = torch.cat([keys, d.query])
            self.grad_rows = {"Z": torch.unique(d.query), "Y": torch.unique(keys)}
        self.support_width = int((d.table > 0).sum(1).max())    # the widest class support
        self.facts = {"table": d.table, "query": d.query, "next_token": d.next_token,
                      "distinct": d.distinct, "common": d.common}

    def _own_sampler(self) -> bool:
        """Whether batches are this class's (``sample``, ``full_sample`` not overridden): then the tokens
        are the distribution's, which ``grad_rows`` and the one-pass :meth:`sample_streams` rely on."""
        return type(self).sample is ScanSnapTask.sample and type(self).full_sample is ScanSnapTask.full_sample

    @property
    def draws_on_device(self) -> bool:
        """Batches of this class's sampler are drawn and looked up on the generators' device."""
        return self._own_sampler()

    def sample(self, gen):
        """One training batch: :meth:`full_sample` with, where attention runs on the support, only the
        query column of x ([B, 1]): the keys enter through the support."""
        return self.full_sample(gen, context=self.model.cfg.include_query_key)

    def sample_streams(self, gens):
        """:meth:`sample` of each generator, stacked: drawn in one pass (:meth:`full_sample` of the list),
        or stream by stream where a subclass overrides ``sample`` or ``full_sample``."""
        if not self._own_sampler():
            return super().sample_streams(gens)
        return self.full_sample(gens, context=self.model.cfg.include_query_key)

    def probe_batch(self, gen):
        return self.full_sample(gen)

    def full_sample(self, gen, context: bool = True):
        """``(x, y, support)``: the tokens, the next tokens, and each sequence's distinct keys with the
        logs of their counts, computed here once per data stream, and, where the model decodes on the
        support, the support by key (:func:`~tdyn.papers.scan_snap.model.key_bags`). The keys and counts are packed from
        the sampler's counts per class support (:meth:`~tdyn.papers.scan_snap.data.SequenceClasses.sample_counts`,
        :func:`~tdyn.papers.scan_snap.model.pack_support`): ``(idx, count)`` equal to ``key_support(x)`` of the full x, the
        model getting ``(idx, log count)``. ``context=False``: x is only the query column (the same draws).
        ``gen`` a list of generators: their batches stacked on a leading axis, each the same as alone."""
        width = min(self.support_width, self.data_cfg.seq_len - 1)
        x, y, tokens, count = self.dist.sample_counts(self.data_cfg.batch_size, self.data_cfg.seq_len, gen, context)
        idx, count = pack_support(count.flatten(0, -2), tokens.flatten(0, -2), width)
        idx, count = idx.view(*y.shape, -1), count.view(*y.shape, -1)
        support = (idx, count.to(next(self.model.parameters()).dtype).log())   # log counts in the model's dtype
        if support_decoder_applies(self.model.cfg, self.dist.M, width):
            support = (*support, *key_bags(idx, self.dist.M))
        return x, y, support

    def loss(self, batch):
        x, y, support = batch
        return self.model.loss(x, y, support)


def _size(cfg) -> int:
    return member_size(cfg.typed_model(), cfg.typed_data().vocab_size)


@register_task("scan_snap", data.ScanSnapDataConfig, YZConfig,
               "Scan and Snap next-token prediction with the Y/Z model", size=_size)
def _build(cfg, members):
    return ScanSnapTask(cfg, members)


def yz_config(data_overrides: dict, *, steps: int = 100, lr_y: float = 1.0, lr_z: float = 1.0,
              optimizer: str = "sgd", momentum: float = 0.9, init: str = "zero", seeds=(0,)) -> dict:
    """A Y/Z run config: two optimizers (Y at η_Y, Z at η_Z), the authors' batch 128, length 128."""
    group = {"optimizer": optimizer} | ({"momentum": momentum} if optimizer == "sgd" else {})
    return {
        "task": "scan_snap",
        "data": dict(data_overrides),
        "model": {"init": init},
        "seeds": list(seeds),
        "optim": {"steps": steps, "groups": {"Y": {"params": ["Y"], "lr": lr_y} | group,
                                              "Z": {"params": ["Z"], "lr": lr_z} | group}},
        "checkpoint": {"schedule": "none", "steps": []},
    }
