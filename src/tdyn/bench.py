"""``tdyn bench``: speed of the canonical settings, measured in one process (never in tests).

Each paper area registers entries with :func:`register_bench`; an entry returns a dict of numbers
(seconds, rates, ratios). ``run`` writes ``bench.json`` with machine info and prints a table.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from pathlib import Path
from typing import Callable

from tdyn import runs
from tdyn.data.scan_snap import SYN_SMALL
from tdyn.registry import Registry
from tdyn.tasks.scan_snap import yz_config
from tdyn.train.trainer import train

#: The bench entries of this module, by name. Entries registered next to their reproductions (in the
#: experiments layer, above this one) are named by the caller: ``run(..., modules=...)``.
BENCHES: Registry[Callable[[bool], dict]] = Registry("bench", table={
    "scan_snap_single": "tdyn.bench",
    "scan_snap_ensemble32": "tdyn.bench",
})


def register_bench(name: str):
    """Decorator: ``fn(quick: bool) -> dict`` measured by ``tdyn bench`` under ``name``."""
    return BENCHES.decorator(name)


def timed_train(cfg: dict) -> float:
    """Wall seconds of one ``train`` call into a temporary directory."""
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        train(cfg, Path(d) / "r", progress=False)
        return time.perf_counter() - t0


@register_bench("scan_snap_single")
def _single(quick: bool) -> dict:
    """One Syn-Small run (Fig 4 left: batch 128, length 128)."""
    steps = 100 if quick else 500
    cfg = yz_config(SYN_SMALL, steps=steps)
    timed_train(yz_config(SYN_SMALL, steps=5))  # warm-up
    s = timed_train(cfg)
    return {"steps": steps, "seconds": s, "steps_per_s": steps / s}


@register_bench("scan_snap_ensemble32")
def _ensemble(quick: bool) -> dict:
    """S = 32 seeds as one ensemble vs the same 32 runs one at a time (Syn-Small, 100 steps)."""
    S, steps = 32, 100
    cfg = yz_config(SYN_SMALL, steps=steps, init="torch_default", seeds=range(S))
    ens = timed_train(cfg)
    one = [timed_train(yz_config(SYN_SMALL, steps=steps, init="torch_default", seeds=[s]))
           for s in range(4 if quick else S)]
    seq = sum(one) * S / len(one)
    return {"members": S, "steps": steps, "ensemble_s": ens, "one_member_s": sum(one) / len(one),
            "sequential_s": seq, "sequential_extrapolated": len(one) < S,
            "ensemble_over_one_member": ens / (sum(one) / len(one)), "speedup": seq / ens}


def run(out: str | Path, quick: bool = False, only: list[str] | None = None,
        modules: dict[str, str] | None = None) -> dict:
    """Measure ``only`` (default: every entry) and write ``out``. ``modules`` names the module that
    registers each further entry (the CLI passes the experiments layer's ``BENCH_MODULES``)."""
    for mod in dict.fromkeys((modules or {}).values()):
        importlib.import_module(mod)
    names = only or [*BENCHES.table, *(modules or {})]
    fns = {n: BENCHES.get(n) for n in names}
    result = {"machine": runs.machine_info(), "quick": quick, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    for n in names:
        t0 = time.perf_counter()
        result[n] = fns[n](quick)
        result[n]["bench_wall_s"] = time.perf_counter() - t0
        print(f"{n:<28} " + "  ".join(f"{k}={_fmt(v)}" for k, v in result[n].items()), flush=True)
    runs.write_json(Path(out), result)
    return result


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
