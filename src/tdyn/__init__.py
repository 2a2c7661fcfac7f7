"""tdyn: training dynamics of one-layer transformers (Li-Li-Risteski 2023, Tian et al. 2023, decision lists).

The public API (imported lazily, so ``import tdyn`` and ``tdyn list`` stay light; see docs/library.md):

* ``tdyn.Task`` (a model with a leading ensemble axis) and ``tdyn.PlainTask`` (any ``nn.Module``, stacked
  into an ensemble by ``tdyn.Stacked``), ``tdyn.Member``, ``tdyn.register_task``: the task contract and
  its registry (``tdyn.tasks.base``); ``tdyn.probe``: the probe decorator (``tdyn.probes``);
* ``tdyn.train(config, out)``: train a run config into ``out`` → member run directories;
* ``tdyn.sweep(spec, out)``: run (or continue) a sweep → run name → status;
* ``tdyn.load_run(dir)`` → :class:`tdyn.runs.Run` (``.df``: the metrics as a DataFrame when pandas is
  installed, else a dict of arrays; ``.model(step)``: the model rebuilt from a checkpoint);
  ``tdyn.load_sweep(dir)``: every run of a sweep or ensemble directory, metrics in one long table;
* the papers' models, distributions and theory by name: ``tdyn.models`` (``YZModel``,
  ``TopicTransformer``, ``DecisionListModel``, …), ``tdyn.data``, ``tdyn.theory``.
"""

from __future__ import annotations

from tdyn import papers as _papers  # noqa: F401  (the old module paths of moved modules still import)
from tdyn.lazy import exports

__version__ = "0.1.0"

__all__, __getattr__, __dir__ = exports(__name__, {
    "Task": ".tasks.base", "PlainTask": ".tasks.base", "Member": ".tasks.base", "register_task": ".tasks.base",
    "Stacked": ".models.stacked", "probe": ".probes", "ProbeContext": ".probes",
    "Paper": ".manifest", "Reproduction": ".manifest",
    "RunConfig": ".config", "load_config": ".api",
    "Run": ".runs", "load_run": ".api", "load_sweep": ".api",   # tdyn.api: the arguments checked first
    # subpackages (``tdyn.train`` and ``tdyn.sweep`` are callable: train a config, run a sweep)
    "train": ".", "sweep": ".", "models": ".", "data": ".", "theory": ".", "runs": ".", "plugins": ".",
})
