"""The public API's entry points with their arguments checked (issue 36) and their errors in Python's
words (issue 37): a wrong Python type given to ``tdyn.train``, ``tdyn.load_run``, ``tdyn.load_sweep`` or
``tdyn.load_config`` is a one-line :class:`~tdyn.errors.UserError` naming the function and the argument
(:func:`tdyn.errors.check_arg`, the one check every entry point uses), never a ``TypeError`` from deep
inside; an error the layers below word for the command line (``--force``, ``--resume``, ``--out``,
``--set``, ``--executor``, ``--workers``) names the keyword argument instead (:func:`python_words`;
``tdyn.sweep`` too). Each then calls the function it stands for, unchanged (``tdyn.train(..., resume=True)``: the resume path of ``tdyn run --resume``)."""

from __future__ import annotations

import functools
import inspect
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from pydantic import BaseModel

from tdyn import config as _config, runs
from tdyn.config import RunConfig
from tdyn.errors import SweepFailed, UserError, check_arg, check_path
from tdyn.runs.ownership import leftover
from tdyn.sweep import failure_line, run_sweep
from tdyn.train import trainer

if TYPE_CHECKING:
    import pandas

_path = check_path


#: Command-line words in the messages of the layers below → the keyword arguments of the Python API,
#: applied in order (the specific phrases first).
_WORDS = [
    (re.compile(r"output directory ('[^']*'|\"[^\"]*\") already exists and is not empty; use --force to overwrite or "
                r"--resume to continue it"),
     r"out \1 already exists and is not empty: pass force=True to train it again from step 0, or resume=True to "
     r"continue it"),
    (re.compile(r"use --force to overwrite"), "pass force=True to overwrite it"),
    (re.compile(r"--resume DIR\b"), "resume=True"),
    (re.compile(r"`?tdyn run --resume ([^`;]+)`?"), r"tdyn.train(config, '\1', resume=True)"),
    (re.compile(r"--set ('[^']*'|\S+)"), r"the override \1"),
    (re.compile(r"--executor '([^']*)'"), r"executor='\1'"),
    (re.compile(r"--executor (\w+)"), r"executor='\1'"),
    (re.compile(r"--workers (\S+?):"), r"workers=\1:"),
    (re.compile(r"--force\b"), "force=True"),
    (re.compile(r"--resume\b"), "resume=True"),
    (re.compile(r"--out\b"), "out"),
]


def python_words(message: str) -> str:
    """``message`` with the command line's flags replaced by the Python API's keyword arguments."""
    for pattern, repl in _WORDS:
        message = pattern.sub(repl, message)
    return message


def _speaks_python(fn):
    """Run ``fn``; a :class:`UserError` it raises keeps its class and gets its message in Python's words."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            if e.args and isinstance(e.args[0], str):
                e.args = (python_words(e.args[0]), *e.args[1:])
            raise
    return wrapper


def _config_source(fn: str, name: str, value: Any) -> Any:
    return check_arg(fn, name, value, dict, BaseModel, str, os.PathLike,
                     what="a config (a dict, a RunConfig, or a YAML/JSON file or config name)")


@_speaks_python
def train(config: dict | RunConfig | str | os.PathLike, out: str | os.PathLike, *,
          dirs: Sequence[str | os.PathLike] | None = None, force: bool = False,
          resume: bool = False, progress: bool = True) -> list[Path]:
    """Train every member of a run config into ``out``; return the member run directories.

    ``config``: a dict, a :class:`tdyn.RunConfig`, a YAML/JSON file or a packaged config's name
    (``"syn_small"``); its sections are those of ``tdyn config syn_small`` (docs/library.md). One member
    trains into ``out`` itself; an ensemble (several seeds, ``ensemble.lrs`` or ``ensemble.init_scales``)
    into ``out/<member>/`` with ``out/ensemble.json`` — or, with ``dirs``, into one directory per member
    (in member order: seeds × learning-rate sets × init scales), ``out`` keeping the manifest.

    ``out`` must be empty or absent, unless:

    * ``force=True``: a run tdyn wrote there is deleted (only tdyn's own files, checked one by one) and
      trained again from step 0;
    * ``resume=True``: the run in ``out``, started from this same config, continues from its newest intact
      checkpoint (a finished one is returned as it is) — the resume of ``tdyn run --resume`` — and an empty
      ``out`` is trained; a run of another config is refused;
    * both: continue the run if it was started from this config and can be resumed, else train it again
      from step 0 (what a re-run notebook cell usually wants).

    ``progress``: show a progress bar (tqdm; a widget in Jupyter). Errors are one-line
    :class:`tdyn.errors.UserError`\\ s naming the argument or file; ``out`` is locked while it trains."""
    fn = "tdyn.train"
    _config_source(fn, "config", config)
    _path(fn, "out", out)
    if dirs is not None:
        check_arg(fn, "dirs", dirs, list, tuple, what="a list of paths")
        for i, d in enumerate(dirs):
            _path(fn, f"dirs[{i}]", d)
        dirs = [Path(d) for d in dirs]
    check_arg(fn, "force", force, bool)
    check_arg(fn, "resume", resume, bool)
    check_arg(fn, "progress", progress, bool)
    cfg = config if isinstance(config, RunConfig) else _config.load_config(config)
    if not resume:
        return trainer.train(cfg, out, dirs=dirs, force=force, progress=progress)
    if force:
        return trainer.train_or_resume(cfg, out, dirs=dirs, progress=progress)
    out = Path(out)
    if leftover(out) is None:   # nothing there yet: train it
        return trainer.train(cfg, out, dirs=dirs, progress=progress)
    if not trainer.same_job(cfg, out):
        raise UserError(f"tdyn.train(): out {str(out)!r} holds another run than this config's (or a damaged one): "
                        f"pass force=True to train it again from step 0, or choose another out")
    if dirs is not None and (out / runs.ENSEMBLE).exists():
        have = [os.path.realpath(d) for d in runs.ensemble_dirs(out)]
        if [os.path.realpath(d) for d in dirs] != have:
            raise UserError(f"tdyn.train(): dirs differ from the member directories of the run in {str(out)!r} "
                            f"({', '.join(map(str, runs.ensemble_dirs(out)))}); resume=True continues that run "
                            f"where it is")
    return trainer.resume(out, progress=progress)


@_speaks_python
@functools.wraps(run_sweep)
def sweep(*args: Any, **kwargs: Any) -> dict[str, str]:
    # ``tdyn.sweep(spec, out, ...)``: :func:`tdyn.sweep.run_sweep` (its signature and docstring), its errors in
    # Python's words, and a sweep that leaves a run without a result raises SweepFailed instead of returning
    status = run_sweep(*args, **kwargs)
    out = inspect.signature(run_sweep).bind(*args, **kwargs).arguments["out"]
    line = failure_line(out, status, how="call tdyn.sweep again with the same spec and out to continue them")
    if line is not None:
        raise SweepFailed(f"tdyn.sweep: {line}", status, Path(out))
    return status


@_speaks_python
def load_run(path: str | os.PathLike) -> runs.Run:
    """The run in ``path`` as a :class:`tdyn.Run`: ``.df`` (its metrics, one row per evaluated step, a
    pandas DataFrame), ``.config`` and ``.meta`` (its ``config.json``, ``meta.json``), ``.status``,
    ``.steps()`` (the checkpointed steps), ``.params(step)`` / ``.param(name, step)`` (the member's tensors,
    no ensemble axis), ``.probe(key, step)`` (an array probe), ``.model(step)`` (the model rebuilt from
    the checkpoint; ``.member(0)`` for a PlainTask's plain module) and ``.task()``. ``step``: a checkpoint
    step or ``"final"`` (the default).

    ``path``: a run directory, or a job or sweep directory holding exactly one run (for several, use
    :func:`load_sweep` or ``load_run(path / member)``). Every file read is checked (a damaged or foreign
    one is a one-line error naming it)."""
    return runs.load_run(_path("tdyn.load_run", "path", path))


@_speaks_python
def load_sweep(path: str | os.PathLike) -> pandas.DataFrame:
    """Every run of a sweep, ensemble or run directory with its metrics, in one long pandas DataFrame: one
    row per (run, evaluated step), columns ``run`` (the run directory's name), ``seed``, the sweep's axes
    (e.g. ``optim.groups.all.lr``; for an ensemble the member's rates ``lr.<group>`` and ``init_scale``),
    ``status`` (``finished``, ``diverged``, ``failed``, …), ``step`` and every metric (``loss``,
    ``<probe>/<key>``, ``norm/<param>``; NaN where a step lacks it)::

        df = tdyn.load_sweep("runs/sw")
        df[df.step == df.step.max()].groupby("optim.groups.Y.lr")["loss"].mean()

    A run's checkpoints and model: :func:`load_run` on ``path / df.run[i]``."""
    return runs.load_sweep(_path("tdyn.load_sweep", "path", path))


@_speaks_python
def load_config(source: dict | RunConfig | str | os.PathLike, overrides: Sequence[str] | None = None) -> RunConfig:
    """A run config validated (a :class:`tdyn.RunConfig`) from a dict, a YAML/JSON file or a packaged config's
    name, after ``overrides`` (``"optim.steps=50"``, ``"seeds=[0,1]"``: the ``--set`` of the command line);
    a bad key or value is a one-line :class:`tdyn.errors.ConfigError` naming it."""
    _config_source("tdyn.load_config", "source", source)
    if overrides is not None:
        check_arg("tdyn.load_config", "overrides", overrides, list, tuple, what="a list of 'KEY.PATH=VALUE' strings")
        for i, o in enumerate(overrides):
            check_arg("tdyn.load_config", f"overrides[{i}]", o, str, what="a 'KEY.PATH=VALUE' string")
    return _config.load_config(source, None if overrides is None else list(overrides))
