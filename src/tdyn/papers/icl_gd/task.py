"""The ``icl_gd`` task (docs/reproductions/icl-gd.md): in-context linear regression (``tdyn.papers.icl_gd.data``)
with K layers of linear self-attention (``tdyn.papers.icl_gd.model``), loss ½ (ŷ − y_q)² averaged over the batch
(the authors' ``compute_loss``). Config sections: ``data`` = :class:`~tdyn.papers.icl_gd.data.ICLData`, ``model`` =
:class:`~tdyn.papers.icl_gd.model.LSAConfig`.

Init as the authors' (Haiku ``VarianceScaling(init_scale / K)``, truncated normal) from each member's ``init``
stream, times the member's init scale. The probe set is one fixed draw of ``probe_size`` sequences from
``probe_seed`` (the same for every member, as the authors' one evaluation key), and the task's facts hold the
gradient-descent reference on it: K steps of GD from W₀ = 0 at the optimal η*_K
(:func:`tdyn.papers.icl_gd.theory.optimal_eta`), its predictions and its sensitivities ∂ŷ/∂x_q.
"""

from __future__ import annotations

import torch

from tdyn.papers.icl_gd import data as icl
from tdyn.papers.icl_gd import kernels
from tdyn.papers.icl_gd import theory as th
from tdyn.papers.icl_gd.data import ICLData
from tdyn.papers.icl_gd.model import LSA, LSAConfig, member_size
from tdyn.seeding import generator
from tdyn.tasks.base import Member, Task, register_task

#: parameter names in the order the init draws them (the authors' Haiku modules: query, key, value, linear)
INIT_ORDER = ("W_Q", "W_K", "W_V", "P")


def gd_reference(E: torch.Tensor, y: torch.Tensor, dc: ICLData, layers: int) -> dict[str, torch.Tensor]:
    """K = ``layers`` steps of GD from W₀ = 0 at η*_K on the sequences E: η*_K, the predictions ``pred_gd`` (n,),
    the sensitivities ``sens_gd`` (n, d) (the GD weights), their loss on E and the loss of predicting 0 (float64)."""
    eta, _ = th.optimal_eta(layers, dc.d, dc.N, dc.x_max, dc.w_scale, dc.noise)
    pred, W = th.gd_steps(E.to(th.F64), float(eta), layers)
    y = y.to(th.F64)
    return {"eta_star": torch.tensor(float(eta), dtype=th.F64), "pred_gd": pred, "sens_gd": W,
            "loss_gd": (0.5 * (pred - y) ** 2).mean(), "loss_zero": (0.5 * y * y).mean()}


class ICLTask(Task):
    """K LSA layers on in-context linear regression (see the module docstring)."""

    def __init__(self, cfg, members: list[Member]):
        self.data = ICLData.model_validate(cfg.data)
        mc = LSAConfig.model_validate(cfg.model)
        self.dtype = dtype = torch.get_default_dtype()    # the run's dtype (build_task sets it while building)
        self.model = LSA(mc.model_copy(update={"D": self.data.d + 1, "dtype": dtype}), S=len(members))
        std = self.model.cfg.init_std()
        with torch.no_grad():
            for i, m in enumerate(members):
                g = generator(m.seed, "init")
                for name in INIT_ORDER:
                    p = getattr(self.model, name)
                    s = std * m.init_scale
                    w = torch.empty(p.shape[1:], dtype=torch.float64)
                    torch.nn.init.trunc_normal_(w, 0.0, s, -2 * s, 2 * s, generator=g)
                    p[i] = w.to(dtype)
        dc = self.data
        self.probe_set = icl.sample(dc.probe_size, dc.d, dc.N, generator(dc.probe_seed, "icl_gd/probe"),
                                    x_max=dc.x_max, w_scale=dc.w_scale, noise=dc.noise, dtype=dtype)
        self.facts = gd_reference(*self.probe_set, dc, mc.layers)

    def sample(self, gen):
        dc = self.data
        return icl.sample(dc.batch_size, dc.d, dc.N, gen, x_max=dc.x_max, w_scale=dc.w_scale, noise=dc.noise,
                          dtype=self.dtype)

    def sample_streams(self, gens):
        """:meth:`sample` of each generator, stacked: tokens E (S, B, N+1, D) as a view of one batch-last buffer
        (S, N+1, D, B), the layout ``kernels.loss_c`` reads without a copy, and y (S, B). The same values as
        stacking the samples (tested): each stream's draw is :meth:`sample`'s, copied once into its place."""
        dc = self.data
        S, B, T, D = len(gens), dc.batch_size, dc.N + 1, dc.d + 1
        Eb = torch.empty(S, T, D, B, dtype=self.dtype)
        ys = torch.empty(S, B, dtype=self.dtype)
        for s, g in enumerate(gens):
            E, y = self.sample(g)
            Eb[s].copy_(E.permute(1, 2, 0))
            ys[s] = y
        return Eb.permute(0, 3, 1, 2), ys

    def probe_batch(self, gen):
        """The fixed probe set (``gen``, the member's probe stream, is not used: every member sees one set)."""
        return self.probe_set

    def loss(self, batch):
        """½ mean over the batch of (ŷ − y_q)², per member: a speed path, equal to ``model.seq_loss`` to rounding
        (tested): ``kernels.loss_c`` (lsa.c, any K) on a CPU with a C compiler (``tdyn.native``); else
        ``kernels.predict`` for one layer (no per-sequence products), ``kernels.predict_deep`` (batched per-sequence
        products, hand-written gradient) for K ≥ 2 layers, separate or recurrent."""
        E, y = batch
        loss = kernels.loss_c(self.model, E, y)
        if loss is not None:
            return loss
        E = E.contiguous()     # sample_streams' batch-last view: the torch path's bits are those of stacked batches
        predict = kernels.predict if self.model.cfg.layers == 1 else kernels.predict_deep
        return 0.5 * ((predict(self.model, E) - y) ** 2).mean(-1)


def _size(cfg) -> int:
    mc = cfg.typed_model()
    return member_size(cfg.typed_data().d + 1, 1 if mc.tied else mc.layers)


@register_task("icl_gd", ICLData, LSAConfig,
               "in-context linear regression with K linear self-attention layers (von Oswald et al. 2023)", size=_size)
def _build(cfg, members):
    return ICLTask(cfg, members)


def icl_gd_config(*, layers: int = 1, tied: bool = True, seeds: list[int] = (0,), steps: int | None = None,
                  lrs: list[float] | None = None, batch_size: int = 2048, x_max: float = 1.0, probe_every: int = 100,
                  probe_size: int = 10000, data: dict | None = None) -> dict:
    """A run config of the ``icl_gd`` task with the authors' training setting for K = ``layers``
    (their ``constructed_token_setup.ipynb``): Adam (β = (0.9, 0.98), ε = 1e-8, no weight decay) at lr 1e-3
    (5e-4 for K > 3), gradient clipping to global norm 1e-3 (10 for K > 2), 5000 steps for tied (recurrent)
    layers and 50,000 otherwise (``steps`` overrides), batch 2048, float32; members = ``seeds`` × ``lrs``.
    Probes: the loss, the alignment with GD and the weight match every ``probe_every`` steps."""
    lr = 5e-4 if layers > 3 else 1e-3
    lrs = list(lrs or [lr])
    steps = steps if steps is not None else (5000 if tied or layers == 1 else 50000)
    return {"task": "icl_gd",
            "data": {"batch_size": batch_size, "x_max": x_max, "probe_size": probe_size} | dict(data or {}),
            "model": {"layers": layers, "tied": tied}, "seeds": list(seeds),
            "ensemble": {"lrs": [{"all": v} for v in lrs]} if len(lrs) > 1 else {},
            "optim": {"steps": steps, "grad_clip": 10.0 if layers > 2 else 1e-3,
                      "groups": {"all": {"params": ["W_K", "W_Q", "W_V", "P"], "optimizer": "adam", "lr": lrs[0],
                                         "betas": [0.9, 0.98], "eps": 1e-8}}},
            "probes": {"names": ["icl_gd.loss", "icl_gd.align", "icl_gd.weights"], "every": probe_every},
            "checkpoint": {"schedule": "none", "initial": False}, "dtype": "float32"}
