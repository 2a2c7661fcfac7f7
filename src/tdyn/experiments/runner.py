"""Running reproductions: one (``tdyn reproduce NAME``) or every registered one
(``tdyn reproduce --all``) into ``DIR/<slug(name)>/`` followed by the report page ``DIR/index.html``."""

from __future__ import annotations

import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from tdyn import runs
from tdyn.errors import UserError
from tdyn.experiments.common import write_results
from tdyn.experiments.registry import Experiment, ReproduceContext, all_experiments
from tdyn.report.html import build_index, metadata, slug
from tdyn.runs import REPRODUCE as MANIFEST, prepare_dir  # noqa: F401  (prepare_dir: used by the CLI)


def run_reproduction(exp: Experiment, ctx: ReproduceContext) -> dict[str, Any]:
    """Run one reproduction into ``ctx.out`` and write its ``results.json`` (with run time and options)."""
    t0 = time.time()
    results = exp.reproduce(ctx)
    results.setdefault("experiment", exp.name)
    results["quick"] = ctx.quick
    for c in results.get("claims", []):  # every verdict carries its setting: quick ones are labelled as such
        c["quick"] = ctx.quick
    results["wall_seconds"] = round(time.time() - t0, 2)
    write_results(ctx.out, results)
    return results


def reproduce_all(out: str | Path, *, seed: int = 0, quick: bool = False, overrides: list[str] | None = None,
                  device: str = "cpu", progress: bool = True, force: bool = False,
                  names: list[str] | None = None) -> tuple[Path, list[str]]:
    """Run every registered reproduction (or ``names``) into ``out/<slug>/``, going on past failures
    (a failed one gets a ``results.json`` with its error and traceback), then write ``out/index.html``.

    Returns the page's path and the names of the reproductions that failed.
    """
    out = Path(out)
    exps = [e for e in all_experiments().values() if names is None or e.name in names]
    prepare_dir(out, force)
    manifest = {"seed": seed, "quick": quick, "overrides": list(overrides or []), "device": device,
                "started": runs.now(), "ended": None, "metadata": metadata(), "reproductions": []}
    for i, exp in enumerate(exps):
        sub = out / slug(exp.name)
        if sub.exists():  # only with force: no stale figures or tables of an earlier run in the page
            shutil.rmtree(sub)
        sub.mkdir()
        entry = {"name": exp.name, "dir": sub.name, "status": "running"}
        manifest["reproductions"].append(entry)
        runs.write_json(out / MANIFEST, manifest)
        print(f"[{i + 1}/{len(exps)}] {exp.name}", flush=True)
        ctx = ReproduceContext(out=sub, seed=seed, quick=quick, overrides=list(overrides or []), device=device,
                               progress=progress)
        t0 = time.time()
        try:
            results = run_reproduction(exp, ctx)
            verdicts = [c.get("verdict") for c in results.get("claims", [])]
            entry["status"] = "finished"
            print(f"    {len(verdicts)} claim{'s' * (len(verdicts) != 1)}: " + ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))
                  + (" — quick settings" if quick else "") + f" ({results['wall_seconds']:.1f}s)", flush=True)
        except KeyboardInterrupt:  # the page still shows what finished
            entry["status"] = "interrupted"
            runs.write_json(out / MANIFEST, manifest)
            print(f"report so far: {build_index(out)}", flush=True)
            raise
        except Exception as e:  # recorded in the page; the other reproductions still run
            entry["status"] = "failed"
            write_results(sub, {"experiment": exp.name, "claims": [], "quick": quick, "seed": seed,
                                "wall_seconds": round(time.time() - t0, 2), "error": f"{type(e).__name__}: {e}",
                                "traceback": traceback.format_exc()})
            print(f"    FAILED: {type(e).__name__}: {e}", flush=True)
        entry["wall_seconds"] = round(time.time() - t0, 2)
    manifest["ended"] = runs.now()
    runs.write_json(out / MANIFEST, manifest)
    return build_index(out), [e["name"] for e in manifest["reproductions"] if e["status"] == "failed"]
