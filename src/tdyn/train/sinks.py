"""Where else the metric stream goes: TensorBoard and Weights & Biases, fed from the very records that
go to ``metrics.jsonl`` (one record per member and evaluated step), switched on by the run config's
``log`` section. Both are optional extras (``pip install tensorboard`` / ``wandb``: ``config.install_hint``),
imported only when switched on; ``metrics.jsonl`` stays the record tdyn itself reads.

* TensorBoard: one event directory per member, ``<run dir>/tensorboard/`` (``tensorboard --logdir
  DIR``); a resumed run purges the events after its resume step, so curves do not double back.
* W&B: one run per member, offline by default (``wandb sync <run dir>/wandb/offline-run-*`` uploads
  it later); ``log.wandb_mode: online`` needs a login and the network.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tdyn import runs
from tdyn.config import install_hint
from tdyn.errors import UserError

runs.own(trees=("tensorboard", "wandb"))   # what the sinks write into a run directory: --force may clear them


class TensorBoardSink:
    def __init__(self, dirs: list[Path], start: int):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError(f"log.tensorboard: true needs TensorBoard: {install_hint('tensorboard')}") from None
        self.writers = [SummaryWriter(log_dir=str(d / "tensorboard"), purge_step=start if start else None)
                        for d in dirs]

    def log(self, i: int, record: dict[str, Any]) -> None:
        step = record["step"]
        for k, v in record.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                self.writers[i].add_scalar(k, v, step)

    def flush(self) -> None:
        for w in self.writers:
            w.flush()

    def close(self) -> None:
        for w in self.writers:
            w.close()


class WandbSink:
    def __init__(self, dirs: list[Path], names: list[str], configs: list[dict], mode: str, project: str):
        try:
            import wandb
        except ImportError:
            raise UserError(f"log.wandb: true needs wandb: {install_hint('wandb')}") from None
        self.runs = [wandb.init(project=project, name=n, dir=str(d), config=c, mode=mode, reinit="create_new")
                     for d, n, c in zip(dirs, names, configs)]

    def log(self, i: int, record: dict[str, Any]) -> None:
        vals = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float)) and v is not None}
        self.runs[i].log(vals, step=record["step"])

    def flush(self) -> None:
        pass

    def close(self) -> None:
        for r in self.runs:
            r.finish()


def make_sinks(cfg, dirs: list[Path], names: list[str], configs: list[dict], start: int) -> list:
    """The sinks the run config's ``log`` section switches on (none by default)."""
    sinks = []
    if cfg.log.tensorboard:
        sinks.append(TensorBoardSink(dirs, start))
    if cfg.log.wandb:
        sinks.append(WandbSink(dirs, names, configs, cfg.log.wandb_mode, cfg.log.wandb_project))
    return sinks
