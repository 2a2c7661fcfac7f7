"""Training: the trainer (``tdyn.train.trainer``), ensemble optimizers, seeding and threads.

This package is callable: ``tdyn.train(config, out)`` trains a run config (a dict, a
:class:`~tdyn.config.RunConfig`, or a YAML/JSON path) into ``out`` and returns the member run
directories — :func:`tdyn.train.trainer.train`, whose keywords it takes (``force``, ``progress``,
``dirs``). The trainer is imported on the first call, so ``import tdyn`` stays light.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, config: Any, out: str | Path, **kw: Any) -> list[Path]:
        from tdyn.train.trainer import train

        return train(config, out, **kw)


sys.modules[__name__].__class__ = _CallablePackage
