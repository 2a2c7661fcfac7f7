"""Helpers shared by the Scan and Snap reproductions: the facts of a run's distribution, and the config table
through which a reproduction's judge reports the run config it trained without validating it again."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tdyn import runs
from tdyn.papers.scan_snap import data
from tdyn.papers.scan_snap.task import yz_config


def facts_of(run_config: dict) -> data.SequenceClasses:
    """The distribution of a run, from its config as written (``Run.config``): the run config is not validated again."""
    return data.build(data.ScanSnapDataConfig.model_validate(run_config["data"]))


def job_config(job: Path, run: runs.Run) -> dict:
    """The config a job was trained with, as validated then: its ``ensemble.json`` (a one-member job: ``run``'s own)."""
    return runs.read_ensemble(job)["config"] if (Path(job) / runs.ENSEMBLE).is_file() else run.config


def config_rows(ctx, configs: dict[str, dict]) -> list[dict]:
    """The ``config`` table: per trained name, ``--seed`` and the config (JSON in one cell)."""
    return [{"run": name, "seed": ctx.seed, "config": json.dumps(cfg)} for name, cfg in configs.items()]


def config_of(tables: dict, name: str) -> tuple[dict, int]:
    """(config, --seed) of ``name`` from the ``config`` table."""
    row = next(r for r in tables["config"] if r["run"] == name)
    return json.loads(row["config"]), row["seed"]


# ---------------------------------------------------------------- the Fig 6 sweep (fig6, fig11-12 and the bench)


@dataclasses.dataclass(frozen=True)
class SweepGrid:
    """The sweep's grid: #query panels × (η_Z, η_Y = ratio·η_Z) × seeds, and the training steps."""

    num_last: tuple[int, ...]
    etas_z: tuple[float, ...]
    ratios: tuple[float, ...]
    seeds: tuple[int, ...]
    steps: int = 100

    def with_options(self, options) -> "SweepGrid":
        """This grid with the grid options the user gave (a pydantic model, or None) in place."""
        given = {k: v for k, v in (options.model_dump() if options is not None else {}).items()
                 if v is not None and k in self.__dataclass_fields__}
        return dataclasses.replace(self, **{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


FIG6 = SweepGrid(num_last=(1, 3, 5, 10), etas_z=(0.5, 1.0, 2.0, 3.0), ratios=(1.0, 2.0, 5.0, 10.0),
                 seeds=tuple(range(1, 11)))
FIG6_QUICK = SweepGrid(num_last=(1, 3), etas_z=(0.5, 3.0), ratios=(1.0, 2.0, 10.0), seeds=(1, 2, 3))


def fig6_spec(grid: SweepGrid = FIG6) -> dict:
    """The sweep as a ``tdyn sweep`` spec: #query panels × zipped (η_Z, η_Y = ratio·η_Z) × seeds.

    The authors' command (docs/reproductions/scan-snap.md#the-authors-commands): Syn-Medium, SGD momentum 0.9,
    batch 128, length 128, 100 steps, PyTorch-default init. Each panel's 10 seeds × 16 learning-rate pairs train as
    two ensemble jobs of 5 seeds (the sweep's default ``job_members``, so two workers share the largest panel).
    Probes only at the start and the end, and only the final checkpoint (the analyses read only the final weights).
    """
    base = yz_config(data.syn_medium(grid.num_last[0]), steps=grid.steps, init="torch_default")
    base["probes"] = {"names": [], "every": grid.steps or 1}
    base["checkpoint"]["initial"] = False
    pairs = [(ez, ez * r) for ez in grid.etas_z for r in grid.ratios]
    return {"config": base,
            "axes": {"grid": {"data.num_last": list(grid.num_last)},
                     "zip": {"optim.groups.Z.lr": [p[0] for p in pairs], "optim.groups.Y.lr": [p[1] for p in pairs]}},
            "seeds": list(grid.seeds)}
