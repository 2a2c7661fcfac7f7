"""Reproductions of the papers' figures and tables, one module per paper area.

Importing this package imports every submodule so that their ``register`` calls run.
"""

import importlib
import pkgutil

for _m in pkgutil.iter_modules(__path__):
    if _m.name != "registry":
        importlib.import_module(f"{__name__}.{_m.name}")
