"""Helpers shared by the Scan and Snap reproductions: the facts of a run's distribution, and the config table
through which a reproduction's judge reports the run config it trained without validating it again."""

from __future__ import annotations

import json
from pathlib import Path

from tdyn import runs
from tdyn.papers.scan_snap import data


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
