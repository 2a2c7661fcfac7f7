"""Reading run directories as a user does: :class:`Run` (config, meta, metrics as records, arrays or a
DataFrame, checkpoints by step, parameters, the model rebuilt), :func:`load_run` and
:func:`load_sweep` (every run of a sweep or job, metrics in one long table). Apart from the records
because it builds tasks and models.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from tdyn.errors import UserError
from tdyn.runs.checkpoints import checkpoint_steps, params_of
from tdyn.runs.names import CONFIG, META, SWEEP
from tdyn.runs.records import (is_run_dir, job_dirs, load_checkpoint, load_run_config, read_config, read_meta, read_metrics, read_sweep,
                               run_identity)
from tdyn.tasks import Member, build_task


class Run:
    """One run directory, read: ``config``, ``meta``, ``metrics`` (records, or ``arrays()`` /
    ``frame()``), checkpoints by step, and the model rebuilt from a checkpoint.

    Everything that reads run directories (trainer resume, sweep, report, analyses) goes through
    this class or the functions of :mod:`tdyn.runs`, so the format has one owner. ``identity``: the run's
    (:mod:`tdyn.runs.identity`), read and checked against its config when the Run is made; every
    checkpoint and the metrics it reads are checked to be this run's.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not is_run_dir(self.path):
            raise UserError(f"{str(self.path)!r} is not a run directory (no {CONFIG}/{META})")
        self.identity = run_identity(self.path)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @functools.cached_property
    def config(self) -> dict:
        return read_config(self.path)

    @property
    def meta(self) -> dict:  # not cached: the status changes while a run trains
        return read_meta(self.path)

    @property
    def status(self) -> str:
        return self.meta["status"]

    @property
    def seed(self) -> int:
        return self.meta["seed"]

    @property
    def lrs(self) -> dict[str, float]:
        """The learning rate of each parameter group."""
        return {g: v["lr"] for g, v in self.config["optim"]["groups"].items()}

    @property
    def metrics(self) -> list[dict]:
        return read_metrics(self.path)

    def arrays(self, *keys: str) -> dict[str, "np.ndarray"]:
        """Metrics as arrays keyed by name (``step`` included); a record missing a key gives NaN."""
        recs = self.metrics
        keys = keys or tuple(dict.fromkeys(k for r in recs for k in r))
        return {k: np.array([r.get(k, np.nan) for r in recs], dtype=np.float64) for k in keys}

    def frame(self):
        """Metrics as a pandas DataFrame, one row per evaluated step (NaN where a step lacks a metric)."""
        import pandas as pd   # a dependency of tdyn; imported on first use (``import tdyn`` stays light)

        return pd.DataFrame.from_records(self.metrics)

    @property
    def df(self):
        """The metrics, one row per evaluated step: always a pandas DataFrame (:meth:`frame`)."""
        return self.frame()

    def steps(self) -> list[int]:
        """Steps with a checkpoint (the final state is ``checkpoint("final")``)."""
        return checkpoint_steps(self.path)

    def checkpoint(self, step: int | str = "final") -> dict[str, torch.Tensor]:
        return load_checkpoint(self.path, step, self.identity)

    def params(self, step: int | str = "final") -> dict[str, torch.Tensor]:
        """This member's model parameters at ``step`` (no ensemble axis)."""
        return params_of(self.checkpoint(step))

    def param(self, name: str, step: int | str = "final") -> torch.Tensor:
        return self.params(step)[name]

    def probe(self, key: str, step: int | str = "final") -> torch.Tensor:
        """An array probe ``<probe>/<key>`` saved at ``step``."""
        return self.checkpoint(step)[f"probe/{key}"]

    def task(self):
        """The run's task built from its config (one member; no weights loaded), on the CPU whatever device
        it trained on: analysis reads checkpoints, which hold CPU tensors, and may run where no GPU is."""
        cfg = load_run_config(self.path).model_copy(update={"device": "cpu"})
        lrs = {g: gc.lr for g, gc in cfg.optim.groups.items()}
        scale = (cfg.ensemble.init_scales or [1.0])[0]
        return build_task(cfg, [Member(cfg.seeds[0], lrs, scale, self.path.name)])

    def model(self, step: int | str = "final") -> torch.nn.Module:
        """The model rebuilt from its config (ensemble axis of size 1) with the weights of ``step``."""
        model = self.task().model
        ckpt = self.checkpoint(step)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(ckpt[f"param/{name}"].to(p.dtype).reshape(p.shape))  # the model's ensemble axis has size 1
            for name, b in model.named_buffers():
                if f"buffer/{name}" in ckpt:   # persistent buffers (running statistics)
                    b.copy_(ckpt[f"buffer/{name}"].to(b.dtype).reshape(b.shape))
        return model


def load_run(path: str | Path) -> Run:
    """The run in ``path``: a run directory, or a job / sweep directory that holds exactly one run
    (an ensemble of several: use :func:`load_sweep`, or ``load_run(path / member)``)."""
    path = Path(path)
    if is_run_dir(path):
        return Run(path)
    dirs = job_dirs(path)
    if len(dirs) != 1:
        raise UserError(f"{str(path)!r} holds {len(dirs)} runs, not one; use tdyn.load_sweep({str(path)!r}) "
                        f"or load_run on one of {', '.join(d.name for d in dirs[:4])}")
    return Run(dirs[0])


def load_sweep(path: str | Path):
    """Every run of a sweep, ensemble or run directory with its metrics in one long table: one row per
    (run, evaluated step) with columns ``run``, ``seed``, the sweep's axes (or the member's learning
    rates ``lr.<group>`` and ``init_scale``), ``status``, ``step`` and every metric: always a pandas
    DataFrame (pandas is a dependency of tdyn)."""
    import pandas as pd

    path = Path(path)
    dirs = job_dirs(path)
    if not dirs:
        raise UserError(f"{str(path)!r} holds no run directory")
    axes = {r["name"]: r["axes"] for r in read_sweep(path)["runs"]} if (path / SWEEP).exists() else {}
    rows = []
    for d in dirs:
        run = Run(d)
        meta = run.meta
        info = {"run": d.name if d != path else path.name, "seed": meta.get("seed")}
        info |= axes.get(d.name) or {f"lr.{g}": v for g, v in (meta.get("lrs") or {}).items()} | \
            {"init_scale": meta.get("init_scale")}
        info["status"] = meta.get("status")
        rows += [info | r for r in run.metrics]
    return pd.DataFrame.from_records(rows)
