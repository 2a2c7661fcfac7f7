"""The public API's entry points with their arguments checked (issue 36): a wrong Python type given to
``tdyn.train``, ``tdyn.load_run``, ``tdyn.load_sweep`` or ``tdyn.load_config`` is a one-line
:class:`~tdyn.errors.UserError` naming the function and the argument (:func:`tdyn.errors.check_arg`, the one
check every entry point uses), never a ``TypeError`` from deep inside. Each then calls the function it
stands for, unchanged."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tdyn import config, runs
from tdyn.errors import check_arg, check_path
from tdyn.train import trainer

_path = check_path


def _config_source(fn: str, name: str, value: Any) -> Any:
    return check_arg(fn, name, value, dict, BaseModel, str, os.PathLike,
                     what="a config (a dict, a RunConfig, or a YAML/JSON file or config name)")


def train(config: Any, out: Any, *, dirs: Any = None, force: Any = False, progress: Any = True) -> list[Path]:
    """``tdyn.train(config, out)``: :func:`tdyn.train.trainer.train` with its arguments checked."""
    fn = "tdyn.train"
    _config_source(fn, "config", config)
    _path(fn, "out", out)
    if dirs is not None:
        check_arg(fn, "dirs", dirs, list, tuple, what="a list of paths")
        for i, d in enumerate(dirs):
            _path(fn, f"dirs[{i}]", d)
    check_arg(fn, "force", force, bool)
    check_arg(fn, "progress", progress, bool)
    return trainer.train(config, out, dirs=None if dirs is None else list(dirs), force=force, progress=progress)


def load_run(path: Any):
    """``tdyn.load_run(dir)``: :func:`tdyn.runs.load_run` with its argument checked."""
    return runs.load_run(_path("tdyn.load_run", "path", path))


def load_sweep(path: Any):
    """``tdyn.load_sweep(dir)``: :func:`tdyn.runs.load_sweep` with its argument checked."""
    return runs.load_sweep(_path("tdyn.load_sweep", "path", path))


def load_config(source: Any, overrides: Any = None):
    """``tdyn.load_config(source, overrides)``: :func:`tdyn.config.load_config` with its arguments checked."""
    _config_source("tdyn.load_config", "source", source)
    if overrides is not None:
        check_arg("tdyn.load_config", "overrides", overrides, list, tuple, what="a list of 'KEY.PATH=VALUE' strings")
        for i, o in enumerate(overrides):
            check_arg("tdyn.load_config", f"overrides[{i}]", o, str, what="a 'KEY.PATH=VALUE' string")
    return config.load_config(source, None if overrides is None else list(overrides))
