"""Training: the trainer (``tdyn.train.trainer``), ensemble optimizers, metric sinks.

This package is callable: ``tdyn.train(config, out)`` trains a run config (a dict, a
:class:`~tdyn.config.RunConfig`, or a YAML/JSON path) into ``out`` and returns the member run
directories — :func:`tdyn.train.trainer.train`, whose keywords it takes (``force``, ``progress``,
``dirs``). The trainer is imported on the first call, so ``import tdyn`` stays light.
"""

from tdyn.lazy import callable_package

callable_package(__name__, "tdyn.api:train")   # the arguments checked, then trainer.train
