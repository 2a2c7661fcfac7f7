"""The ``birth`` task (docs/reproductions/birth.md): the bigram language with triggers
(``tdyn.papers.birth.data``) read by the simplified two-layer transformer (``tdyn.papers.birth.model``), trained
with the cross-entropy of the next token on the positions of ``data.loss_on`` (the authors' ``loss_head_only``:
the output tokens from their second occurrence on, occ ≥ 2; or every position). Config sections: ``data`` =
:class:`~tdyn.papers.birth.data.BirthData`, ``model`` = :class:`~tdyn.papers.birth.model.BirthModelConfig`.

Each member draws its matrices from its ``init`` stream in :data:`~tdyn.papers.birth.model.INIT_ORDER` (frozen and
trained alike, so a member's embeddings depend on its seed only); the member's init scale multiplies the trained
ones. The probe set is one fixed draw of ``probe_size`` sequences from ``probe_seed`` (the authors' one test
batch), with a second set whose outputs come from the held-out pool when ``ood_outputs`` is set, and one whose
triggers come from the held-out pool when ``ood_triggers`` is set (keys ``*_ood`` and ``*_tood``).
"""

from __future__ import annotations

import math

import torch

from tdyn.papers.birth import data as bd
from tdyn.papers.birth import kernels
from tdyn.papers.birth.data import BirthData
from tdyn.papers.birth.model import INIT_ORDER, BirthModelConfig, MemoryTransformer, member_size
from tdyn.seeding import generator
from tdyn.tasks.base import Member, Task, register_task


def loss_mask(occ: torch.Tensor, loss_on: str) -> torch.Tensor:
    """The positions the training loss reads: occ ≥ 2 (``outputs``) or every one (``all``)."""
    return occ >= 2 if loss_on == "outputs" else torch.ones_like(occ, dtype=torch.bool)


def init_member(model: MemoryTransformer, i: int, seed: int, scale: float = 1.0) -> None:
    """Member ``i``'s matrices from stream ``init`` of ``seed``: w_E, p ~ N(0, 1), every other U(±1/√d) (PyTorch's
    ``nn.Embedding`` / ``nn.Linear`` defaults, which the authors keep); ``scale`` multiplies the trained ones."""
    g = generator(seed, "init")
    bound = 1.0 / math.sqrt(model.cfg.d)
    with torch.no_grad():
        for name in INIT_ORDER:
            t = getattr(model, name, None)
            if t is None:
                continue
            w = torch.empty(t.shape[1:], dtype=torch.float64)
            if name in ("w_E", "p"):
                w.normal_(0.0, 1.0, generator=g)
            else:
                w.uniform_(-bound, bound, generator=g)
            if name in model.cfg.trained:
                w = w * scale
            t[i] = w.to(t.dtype)


class BirthTask(Task):
    """The simplified two-layer transformer on the bigram language with triggers (see the module docstring)."""

    def __init__(self, cfg, members: list[Member]):
        self.data = dc = BirthData.model_validate(cfg.data)
        mc = BirthModelConfig.model_validate(cfg.model)
        self.tables = tb = bd.tables(dc)
        self.dtype = dtype = torch.get_default_dtype()
        self.model = MemoryTransformer(mc.model_copy(update={"N": tb.N, "T": dc.T, "dtype": dtype}), S=len(members))
        for i, m in enumerate(members):
            init_member(self.model, i, m.seed, m.init_scale)
        N = tb.N
        #: the tokens the W_K² recall runs over: the fixed triggers, or every token of the trigger pool
        lo, hi = bd.output_pool(N, "uniform" if dc.triggers == "all" else dc.triggers)
        self.triggers = bd.triggers_fixed(tb, dc.k) if dc.fixed_triggers else torch.arange(lo, hi)
        #: the tokens the W_O² recall runs over: the training output pool (the authors' range(n_train_toks))
        lo, hi = bd.output_pool(N, "train" if dc.outputs == "train" else "uniform")
        self.out_tokens = torch.arange(lo, hi)
        g = generator(dc.probe_seed, "birth/probe")
        self.probe_set = self._draw(dc.probe_size, g, dc.outputs)
        if dc.ood_outputs != "none":
            ood = self._draw(dc.probe_size, g, dc.ood_outputs)
            self.probe_set |= {f"{k}_ood": v for k, v in ood.items()}
        if dc.ood_triggers != "none":
            tood = self._draw(dc.probe_size, g, dc.outputs, triggers=dc.ood_triggers)
            self.probe_set |= {f"{k}_tood": v for k, v in tood.items()}
        #: the held-out trigger tokens (a second W_K² recall runs over them), if any
        self.triggers_ood = (torch.arange(*bd.output_pool(N, dc.ood_triggers)) if dc.ood_triggers != "none"
                             else None)
        self.facts = {"triggers": self.triggers, "triggers_ood": self.triggers_ood, "out_tokens": self.out_tokens,
                      "bigram": tb.bigram.to(dtype), "unigram": tb.unigram.to(dtype)}

    def _draw(self, n: int, gen: torch.Generator, outputs: str, triggers: str | None = None
              ) -> dict[str, torch.Tensor]:
        dc = self.data
        b = bd.sample(n, dc.T, self.tables, dc.k, gen, fixed_triggers=dc.fixed_triggers, outputs=outputs,
                      triggers=triggers or dc.triggers)
        return {"x": b["x"], "y": b["y"], "occ": b["occ"]}

    def sample(self, gen):
        return self._draw(self.data.batch_size, gen, self.data.outputs)

    def sample_streams(self, gens):
        """``sample(g)`` of every generator stacked (S_streams, B, T): each stream's numbers drawn from its own
        generator as ``sample`` draws them, then one chain over all their rows (``data.chain``: rows are
        independent, so the same bits as one chain per stream)."""
        dc, n = self.data, self.data.batch_size
        dr = [bd.draws(n, dc.T, self.tables, dc.k, g, fixed_triggers=dc.fixed_triggers, outputs=dc.outputs,
                       triggers=dc.triggers) for g in gens]
        b = bd.chain({k: torch.cat([d[k] for d in dr]) for k in dr[0]}, self.tables)
        return {k: b[k].view(len(gens), n, dc.T) for k in ("x", "y", "occ")}

    def probe_batch(self, gen):
        """The fixed probe set (``gen``, the member's probe stream, is not used: every member sees one set)."""
        return self.probe_set

    def loss(self, batch):
        """Mean cross-entropy per member over the positions of ``loss_on``: the fused speed path
        (``kernels.masked_loss``, its backward by hand), equal to ``masked_ce(model(x), …)`` and its gradients
        (tested)."""
        return kernels.masked_loss(self.model, batch["x"], batch["y"], loss_mask(batch["occ"], self.data.loss_on))


def _size(cfg) -> int:
    return member_size(BirthModelConfig.model_validate(cfg.model))


@register_task("birth", BirthData, BirthModelConfig,
               "bigram language with triggers, two-layer attention-only transformer (Bietti et al. 2023)", size=_size)
def _build(cfg, members):
    return BirthTask(cfg, members)


def birth_config(*, seeds: list[int] = (0,), steps: int = 1000, lr: float = 0.03, lrs: list[float] | None = None,
                 d: int = 256, T: int = 256, batch_size: int = 512, k: int = 5, final_ffn: bool = False,
                 loss_on: str = "outputs", probe_every: int = 10, probe_size: int = 512,
                 data: dict | None = None) -> dict:
    """A run config of the ``birth`` task with the authors' README setting (``ihead_basic_main.py max_iters=1000
    loss_head_only=True data_args.k=5 data_args.fixed_special_toks=True optim_args.use_sgd=True
    optim_args.learning_rate=0.03 optim_args.weight_decay=1e-4 optim_args.batch_size=512 model_args.final_ffn=False
    model_args.freeze_embeddings=True model_args.freeze_output=True model_args.dim=256``): SGD with momentum 0.9 and
    weight decay 1e-4 on W_K¹, W_K², W_O² (and W_F), float32; members = ``seeds`` × ``lrs``. Probes: the memory
    recalls and the in-context measures every ``probe_every`` steps."""
    params = ["W_K1", "W_K2", "W_O2"] + (["W_F"] if final_ffn else [])
    lrs = list(lrs or [lr])
    return {"task": "birth",
            "data": {"T": T, "batch_size": batch_size, "k": k, "loss_on": loss_on, "probe_size": probe_size}
            | dict(data or {}),
            "model": {"d": d, "final_ffn": final_ffn}, "seeds": list(seeds),
            "ensemble": {"lrs": [{"all": v} for v in lrs]} if len(lrs) > 1 else {},
            "optim": {"steps": steps,
                      "groups": {"all": {"params": params, "optimizer": "sgd", "lr": lrs[0], "momentum": 0.9,
                                         "weight_decay": 1e-4}}},
            "probes": {"names": ["birth.memory", "birth.icl"], "every": probe_every},
            "checkpoint": {"schedule": "none", "initial": False}, "dtype": "float32"}
