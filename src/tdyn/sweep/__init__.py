"""``tdyn sweep``: expand a spec into runs, batch them into ensemble jobs, run the jobs on an
executor, survive failures and killed workers, and summarise the finished runs.

Layout of a sweep directory: ``sweep.json`` (spec and each run's status), one run directory per
run ``DIR/<run name>/``, job manifests ``DIR/.jobs/<job>/ensemble.json``, and ``summary.csv``.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import concurrent.futures as cf
import numpy as np
import torch
from pydantic import ValidationError
from tqdm.auto import tqdm

from tdyn import runs
from tdyn.errors import ConfigError, UserError
from tdyn.lazy import callable_package
from tdyn.schema import format_validation_error
from tdyn.runs import write_csv
from tdyn.sweep.executors import make_executor
from tdyn.sweep.spec import JobPlan, SlurmOptions, SweepSpec, load_spec, plan
from tdyn.train import trainer
from tdyn.train.threads import cli_threads

JOBS = ".jobs"
log = logging.getLogger(__name__)


# ``tdyn.sweep(spec, out, **kw)`` is :func:`run_sweep` (spec: a dict, a SweepSpec or a YAML/JSON path)
callable_package(__name__, "tdyn.sweep:run_sweep")


def run_job(job_dir: str, config: dict, run_dirs: list[str]) -> dict[str, str]:
    """Train (or resume, or skip) one ensemble job; return each run's status. Safe to call again
    after any interruption: finished runs are kept, unfinished ones continue from checkpoints."""

    job_dir, dirs = Path(job_dir), [Path(d) for d in run_dirs]
    torch.set_num_threads(cli_threads())   # every executor's worker trains with the driver's --threads
    t0 = time.perf_counter()
    return _run_job(job_dir, config, dirs) | {BUSY: [os.getpid(), time.perf_counter() - t0]}


BUSY = "__busy__"   # run_job's (worker pid, seconds busy) entry, popped by run_sweep


def _run_job(job_dir: Path, config: dict, dirs: list[Path]) -> dict[str, str]:

    def statuses():
        return {d.name: (runs.read_meta(d)["status"] if runs.is_run_dir(d) else "pending") for d in dirs}

    st = statuses()
    if all(s in ("finished", "diverged") for s in st.values()):
        return st
    try:
        trainer.train_or_resume(config, job_dir, dirs=dirs, progress=False)
    except Exception as e:  # the sweep goes on; the job's unfinished runs are marked failed
        return {k: (v if v in ("finished", "diverged") else "failed") for k, v in statuses().items()} \
            | {"error": f"{type(e).__name__}: {e}"}
    return statuses()


def _record(out: Path, spec: SweepSpec, jobs: list[JobPlan], status: dict[str, str], errors: dict[str, str],
            busy: dict[int, float] | None = None) -> None:
    runs.write_json(out / runs.SWEEP, {
        "spec": spec.model_dump(mode="json"),
        "runs": [{"name": r.name, "axes": r.axes, "seed": r.seed, "job": j.id, "status": status.get(r.name, "pending"),
                  **({"error": errors[j.id]} if j.id in errors else {})} for j in jobs for r in j.runs],
        "worker_busy_seconds": {str(k): round(v, 3) for k, v in (busy or {}).items()},
    })


def job_cost(job: JobPlan) -> tuple:
    """Largest-first order of a sweep's jobs: members × steps, then the job's own numeric axis values
    (larger values — more queries, a longer sequence, a wider model — usually mean more work). Only an
    order: the pool runs the largest jobs first so no worker is left with two of them at the end."""
    axes = [v for k, v in sorted(job.runs[0].axes.items()) if isinstance(v, (int, float)) and not k.endswith(".lr")]
    return (len(job.runs) * job.config["optim"]["steps"], *axes)


def run_sweep(spec_source: str | Path | dict | SweepSpec, out: str | Path, *, executor: str = "local",
              workers: int | None = None, address: str | None = None, progress: bool = True,
              executor_obj: Any = None, slurm: dict[str, Any] | None = None) -> dict[str, str]:
    """Run (or continue) a sweep into ``out``; returns run name → status. ``slurm``: Slurm resources
    (fields of :class:`~tdyn.sweep.spec.SlurmOptions`) over the spec's ``slurm:`` section."""
    spec = spec_source if isinstance(spec_source, SweepSpec) else load_spec(spec_source)
    out = Path(out)
    if slurm:
        try:
            spec = spec.model_copy(update={"slurm": SlurmOptions.model_validate(spec.slurm.model_dump() | slurm)})
        except ValidationError as e:
            raise ConfigError(format_validation_error(e, SlurmOptions, "slurm")) from None
    if (out / runs.SWEEP).exists():
        # the same sweep = the same runs: compared after validation (keys added since get defaults),
        # leaving out the Slurm resources (a re-run may ask for more time)
        def runs_of(d):
            return {k: v for k, v in d.items() if k != "slurm"}

        try:
            old = SweepSpec.model_validate(runs.read_json(out / runs.SWEEP)["spec"]).model_dump(mode="json")
        except ValidationError:
            old = None
        if old is None or runs_of(old) != runs_of(spec.model_dump(mode="json")):
            raise UserError(f"{str(out)!r} holds a different sweep; choose another --out")
    jobs = plan(spec)

    ex = executor_obj or make_executor(executor, workers=workers, address=address, folder=str(out / ".submitit"),
                                       slurm=spec.slurm.submitit_parameters())
    out.mkdir(parents=True, exist_ok=True)   # only once spec, plan and executor are valid
    status: dict[str, str] = {}
    errors: dict[str, str] = {}
    args = {j.id: (str(out / JOBS / j.id), j.config, [str(out / r.name) for r in j.runs])
            for j in sorted(jobs, key=job_cost, reverse=True)}
    busy: dict[int, float] = {}
    _record(out, spec, jobs, status, errors)

    bar = tqdm(total=len(jobs), desc="sweep jobs",
               disable=not (progress and trainer.interactive()))
    pending = dict(args)
    try:
        while pending:
            futures = {ex.submit(run_job, *a): jid for jid, a in pending.items()}
            log.info("sweep %s: %d job(s) submitted to %s", out, len(futures), getattr(ex, "name", type(ex).__name__))
            broken = False
            for fut in cf.as_completed(futures):
                jid = futures[fut]
                try:
                    res = fut.result()
                except cf.process.BrokenProcessPool:
                    broken = True
                    continue
                except Exception as e:  # the executor lost the job for good
                    res = {"error": f"{type(e).__name__}: {e}"}
                pid, secs = res.pop(BUSY, (None, 0.0))
                if pid is not None:
                    busy[pid] = busy.get(pid, 0.0) + secs
                if "error" in res:
                    errors[jid] = res.pop("error")
                    log.warning("sweep job %s failed: %s", jid, errors[jid])
                else:
                    log.info("sweep job %s: %s", jid, ", ".join(f"{k} {v}" for k, v in res.items()))
                status.update(res)
                pending.pop(jid)
                bar.update(1)
                _record(out, spec, jobs, status, errors, busy)
            if broken:  # a pool process was killed: rebuild the pool, resume the unfinished jobs
                if not getattr(ex, "retry_broken", False):
                    raise RuntimeError("executor broke")
                ex.reset()
    finally:
        bar.close()
        if executor_obj is None:
            ex.shutdown()
    _record(out, spec, jobs, status, errors, busy)
    summarize(out)
    return status


def final_metrics(run_dir: Path) -> dict[str, float]:
    """The last evaluation's scalar metrics of a run."""
    m = runs.read_metrics(run_dir)
    return {k: v for k, v in (m[-1] if m else {}).items() if isinstance(v, (int, float)) and k != "step"}


def summarize(out: str | Path) -> Path:
    """``summary.csv``: one row per cell (axes, count, mean and sample std of each final metric)."""

    out = Path(out)
    sweep = runs.read_json(out / runs.SWEEP)
    cells: dict[str, dict] = {}
    for r in sweep["runs"]:
        key = repr(sorted(r["axes"].items()))
        c = cells.setdefault(key, {"axes": r["axes"], "values": {}, "count": 0})
        if r["status"] != "finished":
            continue
        c["count"] += 1
        for k, v in final_metrics(out / r["name"]).items():
            c["values"].setdefault(k, []).append(v)
    axis_cols = list(next(iter(cells.values()))["axes"]) if cells else []
    metric_cols = sorted({k for c in cells.values() for k in c["values"]})
    rows = []
    for c in cells.values():
        row = dict(c["axes"]) | {"count": c["count"]}
        for k in metric_cols:
            v = np.array(c["values"].get(k, []), dtype=float)
            row[f"{k}_mean"] = float(v.mean()) if len(v) else math.nan
            row[f"{k}_std"] = float(v.std(ddof=1)) if len(v) > 1 else math.nan
        rows.append(row)
    cols = axis_cols + ["count"] + [f"{k}_{s}" for k in metric_cols for s in ("mean", "std")]
    return write_csv(out / runs.SUMMARY, rows, cols)


def plot_metric(summary_csv: str | Path, metric: str, x: str, curve: str, path: str | Path, panel: str | None = None):
    """Plot ``metric`` (mean ± std) against axis ``x``, one curve per value of ``curve`` (and one
    panel per value of ``panel``), from a ``summary.csv``."""
    import matplotlib.pyplot as plt

    from tdyn.report import style

    style.apply()
    rows = list(csv.DictReader(Path(summary_csv).open()))
    panels = sorted({r[panel] for r in rows}, key=_num) if panel else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2), squeeze=False)
    for ax, pv in zip(axes[0], panels):
        sub = [r for r in rows if panel is None or r[panel] == pv]
        for cv in sorted({r[curve] for r in sub}, key=_num):
            pts = sorted(((_num(r[x]), float(r[f"{metric}_mean"]), float(r[f"{metric}_std"] or "nan"))
                          for r in sub if r[curve] == cv))
            xs, ys, es = zip(*pts)
            ax.errorbar(xs, ys, yerr=[0 if math.isnan(e) else e for e in es], marker="o", capsize=2, label=f"{curve}={cv}")
        ax.set_xlabel(x)
        ax.set_ylabel(metric)
        if pv is not None:
            ax.set_title(f"{panel}={pv}")
        ax.legend()
    style.save(fig, path)
    return Path(path)


def _num(s: str):
    try:
        return float(s)
    except (TypeError, ValueError):
        return s
