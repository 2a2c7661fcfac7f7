"""tdyn: training dynamics of one-layer transformers (Li-Li-Risteski 2023, Tian et al. 2023, decision lists).

The public API (imported lazily, so ``import tdyn`` and ``tdyn list`` stay light; see docs/library.md):

* ``tdyn.Task``, ``tdyn.Member``, ``tdyn.register_task``: the task contract and its registry
  (``tdyn.tasks.base``); ``tdyn.probe``: the probe decorator (``tdyn.probes``);
* ``tdyn.train(config, out)``: train a run config into ``out`` → member run directories;
* ``tdyn.sweep(spec, out)``: run (or continue) a sweep → run name → status;
* ``tdyn.load_run(dir)`` → :class:`tdyn.runs.Run` (``.df``: the metrics as a DataFrame when pandas is
  installed, else a dict of arrays; ``.model(step)``: the model rebuilt from a checkpoint);
  ``tdyn.load_sweep(dir)``: every run of a sweep or ensemble directory, metrics in one long table;
* the papers' models, distributions and theory by name: ``tdyn.models`` (``YZModel``,
  ``TopicTransformer``, ``DecisionListModel``, …), ``tdyn.data``, ``tdyn.theory``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Task": "tdyn.tasks.base", "Member": "tdyn.tasks.base", "register_task": "tdyn.tasks.base",
    "probe": "tdyn.probes", "ProbeContext": "tdyn.probes",
    "RunConfig": "tdyn.config", "load_config": "tdyn.config",
    "Run": "tdyn.runs", "load_run": "tdyn.runs", "load_sweep": "tdyn.runs",
    "train": None, "sweep": None, "models": None, "data": None, "theory": None, "runs": None,
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tdyn' has no attribute {name!r}")
    mod = _LAZY[name]
    if mod is None:                     # a subpackage (tdyn.train and tdyn.sweep are callable)
        return importlib.import_module(f"tdyn.{name}")
    return getattr(importlib.import_module(mod), name)


def __dir__() -> list[str]:
    return __all__
