"""Helpers shared by the Scan and Snap reproductions: the facts of a run's distribution, a run's final
weights and learning rates (read through :class:`tdyn.runs.Run`)."""

from __future__ import annotations

from pathlib import Path

import torch

from tdyn import runs
from tdyn.papers.scan_snap import data


def _facts(cfg) -> data.SequenceClasses:
    return data.build(data.ScanSnapDataConfig.model_validate(cfg.data))


def _final(run_dir: Path, name: str = "Z") -> torch.Tensor:
    return runs.Run(run_dir).params("final")[name].double()


def _lrs(run_dir: Path) -> tuple[float, float]:
    lrs = runs.Run(run_dir).lrs
    return lrs["Y"], lrs["Z"]
