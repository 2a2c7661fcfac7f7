"""tdyn: training dynamics of one-layer transformers — the data, models and runs of three papers, and the
machinery to train, probe and sweep your own (docs/library.md; the command line: ``tdyn --help``).

    tdyn.train(config, out)          train a run config (force=True / resume=True for an existing out)
    tdyn.sweep(spec, out)            run (or continue) a sweep: run name → status
    tdyn.load_run(dir)               a run: .df (metrics DataFrame), .model(step), .config, .meta
    tdyn.load_sweep(dir)             every run of a sweep or ensemble: one long DataFrame
    tdyn.load_config(config)         a run config validated (a dict, a YAML/JSON file or a packaged name)
    tdyn.register_task(name, ...)    your task: tdyn.Task (ensemble axis) or tdyn.PlainTask (any nn.Module)
    tdyn.probe(name)                 your probe: fn(tdyn.ProbeContext) -> {key: tensor [S] or [S, ...]}
    tdyn.plugins.add([module])       your module, imported by sweep workers too
    tdyn.models, tdyn.data, tdyn.theory    the papers' models, distributions and closed forms

help(tdyn.train), help(tdyn.ProbeContext), … for each; dir(tdyn) lists the names (each imported on first
use, so ``import tdyn`` stays light). ``tdyn list`` shows the reproductions, packaged configs, tasks and
probes; ``tdyn config NAME`` prints a config to start from. Guides: docs/library.md (your own task, probe
and sweep; notebooks), docs/usage.md (commands, configs, sweeps), README.md (what reproduces).
"""

from __future__ import annotations

from tdyn import papers as _papers  # noqa: F401  (the old module paths of moved modules still import)
from tdyn.lazy import exports

__version__ = "0.1.0"

# no ``__all__``: help(tdyn) stays this page (pydoc documents every name of an ``__all__`` in full), and
# dir(tdyn) lists the names for completion
_names, __getattr__, __dir__ = exports(__name__, {
    "Task": ".tasks.base", "PlainTask": ".tasks.base", "Member": ".tasks.base", "register_task": ".tasks.base",
    "Stacked": ".models.stacked", "probe": ".probes", "ProbeContext": ".probes",
    "Paper": ".manifest", "Reproduction": ".manifest",
    "RunConfig": ".config", "load_config": ".api",
    "Run": ".runs", "load_run": ".api", "load_sweep": ".api",   # tdyn.api: the arguments checked first
    # subpackages (``tdyn.train`` and ``tdyn.sweep`` are callable: train a config, run a sweep)
    "train": ".", "sweep": ".", "models": ".", "data": ".", "theory": ".", "runs": ".", "plugins": ".",
})
