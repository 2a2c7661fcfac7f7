"""``tdyn sweep``: expand a spec into runs, batch them into ensemble jobs, run the jobs on an
executor, survive failures and killed workers, and summarise the finished runs.

Layout of a sweep directory: ``sweep.json`` (spec and each run's status), one run directory per
run ``DIR/<run name>/``, job manifests ``DIR/.jobs/<job>/ensemble.json``, and ``summary.csv``.
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import concurrent.futures as cf
from concurrent.futures.process import BrokenProcessPool
import numpy as np
import torch
from pydantic import ValidationError

from tdyn import runs
from tdyn.errors import ConfigError, UserError, check_arg, check_path
from tdyn.lazy import callable_package
from tdyn.schema import format_validation_error
from tdyn.runs import write_csv
from tdyn.config import check_extras, validate_config
from tdyn.probes import PROBES
from tdyn.sweep.executors import check_gpus_per_job, make_executor, start_method
from tdyn.tasks import TASKS
from tdyn.sweep.spec import JobPlan, SlurmOptions, SweepSpec, load_spec, plan, with_overrides
from tdyn.train import trainer
from tdyn.threads import cli_threads

log = logging.getLogger(__name__)
SUBMITIT = ".submitit"   # the slurm executor's folder in a sweep directory (submitit's own files)


# ``tdyn.sweep(spec, out, **kw)`` is :func:`run_sweep` (spec: a dict, a SweepSpec or a YAML/JSON path), its
# errors in the Python API's words (tdyn.api.sweep)
callable_package(__name__, "tdyn.api:sweep")


def run_job(job_dir: str, config: dict, run_dirs: list[str], progress: bool = False) -> dict[str, str]:
    """Train (or resume, or skip) one ensemble job; return each run's status (and ``"error"`` when it
    failed). Safe to call again after any interruption: finished runs are kept, unfinished ones continue
    from checkpoints. Never raises: whatever goes wrong, in training or around it (making directories,
    reading damaged files, the thread setting), fails the job's unfinished runs with the error."""

    t0 = time.perf_counter()
    dirs = [Path(d) for d in run_dirs]
    try:
        torch.set_num_threads(cli_threads())   # every executor's worker trains with the driver's --threads
        res = _run_job(Path(job_dir), config, dirs, progress)
    except Exception as e:
        res = _failed(dirs, e)
    return res | {BUSY: [os.getpid(), time.perf_counter() - t0]}


BUSY = "__busy__"   # run_job's (worker pid, seconds busy) entry, popped by run_sweep
MAX_LOST = 3        # a job whose worker process dies this often is failed (the pool is rebuilt each time)


def run_statuses(dirs: list[Path], *, tensors: bool = True) -> dict[str, str]:
    """Each run's status read from its directory and checked against its files
    (:func:`tdyn.train.trainer.verified_status`; ``tensors=False`` right after a job trained or resumed
    them: the final checkpoints' headers only): ``pending`` where no run was started, ``damaged``
    where the files cannot be read or contradict the status (a damaged run is never counted finished)."""
    st = {}
    for d in dirs:
        try:
            st[d.name] = trainer.verified_status(d, tensors=tensors) if runs.is_run_dir(d) else "pending"
        except Exception:
            st[d.name] = "damaged"
    return st


def _failed(dirs: list[Path], error: BaseException | str) -> dict[str, str]:
    """The job's runs after ``error``: a run holding its result keeps it, every other one is failed."""
    msg = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return {n: (s if s in runs.DONE else "failed") for n, s in run_statuses(dirs).items()} | {"error": msg}


def _run_job(job_dir: Path, config: dict, dirs: list[Path], progress: bool = False) -> dict[str, str]:
    st = run_statuses(dirs)
    if all(s in runs.DONE for s in st.values()):
        return st
    try:   # a damaged run is repaired here: resumed from an intact checkpoint, or trained again
        trainer.train_or_resume(config, job_dir, dirs=dirs, progress=progress)
    except Exception as e:  # the sweep goes on; the job's unfinished runs are marked failed
        return _failed(dirs, e)
    st = run_statuses(dirs, tensors=False)   # just written or verified: each final checkpoint's header, not its tensors again
    bad = [n for n, s in st.items() if s not in runs.DONE]
    if bad:   # training returned, yet a run holds no result: never reported as one
        return _failed(dirs, f"run {bad[0]} is {st[bad[0]]} after training")
    return st


def identities(jobs: list[JobPlan], *, legacy: bool = False) -> dict[str, str]:
    """Each planned run's name → the identity (:mod:`tdyn.runs.identity`) its job's trainer gives it;
    ``legacy``: the one an older tdyn's trainer gave it (its member named ``seed0_lrY0.001``, not
    ``optim.groups.Y.lr=0.001__seed=0``: :func:`tdyn.train.trainer.legacy_member_names`), which its files carry."""
    ids = {}
    for j in jobs:
        cfg = trainer.load_config(j.config)
        members = trainer.expand_members(cfg)
        names = trainer.legacy_member_names(cfg) if legacy else [m.name for m in members]
        for r, n, c in zip(j.runs, names, trainer.member_configs(cfg, members)):
            ids[r.name] = runs.make_identity(c, n)
    return ids


def keep_recorded_names(out: Path, jobs: list[JobPlan]) -> None:
    """A sweep continued in ``out`` keeps the run names its ``sweep.json`` records (each run found by its axes and
    seed): a sweep an older tdyn wrote, whose names differ from this tdyn's, continues under its own, never
    renamed or trained twice (a one-line notice says so)."""
    def key(axes, seed):
        return json.dumps(axes, sort_keys=True), seed

    recorded = {key(r["axes"], r.get("seed")): r["name"] for r in runs.read_sweep(out)["runs"]}
    kept = []
    for j in jobs:
        for r in j.runs:
            name = recorded.get(key(r.axes, r.seed))
            if name is not None and name != r.name:
                kept.append((name, r.name))
                r.name = name
    if kept:
        log.warning("sweep %s names %d run(s) as an older tdyn did (%s, ...): they keep those names (new sweeps "
                    "name them %s, ...)", str(out), len(kept), kept[0][0], kept[0][1])


def check_runs(out: Path, ids: dict[str, str], legacy: dict[str, str] | None = None) -> dict[str, str]:
    """Before a sweep trains again in ``out``: every run directory there holds the run the sweep expects
    under its name (its identity ``ids``, or the one an older tdyn gave it, ``legacy``), with its config as the
    run wrote it and, for a run with a result, its final checkpoint and metrics its own (headers and first line
    only). A run of another cell or another sweep, or a file of another run, is a ForeignFile (exit 2) naming
    both; damage is left to the job's repair; a run recorded with a result whose directory is gone is named in a
    warning and trained again. Returns each run's identity as found (``ids``, or the older form its files carry)."""
    legacy = legacy or {}
    owner = {v: k for k, v in ids.items()} | {v: k for k, v in legacy.items()}
    old = {r["name"]: r["status"] for r in runs.read_sweep(out)["runs"]} if (out / runs.SWEEP).exists() else {}
    found_ids = dict(ids)
    for name, want in ids.items():
        d = out / name
        if not runs.is_run_dir(d):
            if old.get(name) in runs.DONE:
                log.warning("sweep run %s is missing (sweep.json recorded it %s): training it again", d, old[name])
            continue
        try:
            found = runs.run_identity(d)
            if found is not None and found == legacy.get(name):   # an older tdyn's run: its identity as written
                found_ids[name] = want = found
            if found is not None and found != want:
                whose = f"run {owner[found]!r} of this sweep" if found in owner else "a run of another sweep or config"
                raise runs.ForeignFile(d, f"holds {whose} ({found}), not run {name!r} ({want}) that the sweep "
                                          f"expects there: run directories swapped or copied; move it back, or "
                                          f"choose another --out")
            if found is not None and runs.read_meta(d)["status"] in runs.DONE:
                problem = runs.scan_metrics(d, found)[1]   # its first record's identity (damage: the job's)
                if isinstance(problem, runs.ForeignFile):
                    raise problem
                final = runs.checkpoint_path(d, "final")
                if final.exists():
                    runs.check_identity(final, runs.read_checkpoint_metadata(final), d, found)
        except runs.ForeignFile:
            raise
        except runs.CorruptFile:   # damaged: the job repairs it
            continue
    return found_ids


def _settle(dirs: list[str], ids: dict[str, str], want: dict[str, str]) -> None:
    """After a job came back: a run recorded under an older tdyn's identity that its job trained afresh (a
    repair) now carries this tdyn's (``want``), which ``ids`` (sweep.json's record) takes."""
    for d in map(Path, dirs):
        if ids.get(d.name) == want.get(d.name):
            continue
        try:
            if runs.is_run_dir(d) and runs.run_identity(d) == want[d.name]:
                ids[d.name] = want[d.name]
        except runs.CorruptFile:
            pass


def _record(out: Path, spec: SweepSpec, jobs: list[JobPlan], status: dict[str, str], errors: dict[str, str],
            busy: dict[int, float] | None = None, ids: dict[str, str] | None = None) -> None:
    ids = ids or {}
    runs.write_json(out / runs.SWEEP, {
        "spec": spec.model_dump(mode="json"),
        "runs": [{"name": r.name, "axes": r.axes, "seed": r.seed, "job": j.id, "status": status.get(r.name, "pending"),
                  **({runs.IDENTITY: ids[r.name]} if r.name in ids else {}),
                  **({"error": errors[j.id]} if j.id in errors else {})} for j in jobs for r in j.runs],
        "worker_busy_seconds": {str(k): round(v, 3) for k, v in (busy or {}).items()},
    })


def job_cost(job: JobPlan) -> tuple:
    """Largest-first order of a sweep's jobs: members × steps, then the job's own numeric axis values
    (larger values — more queries, a longer sequence, a wider model — usually mean more work). Only an
    order: the pool runs the largest jobs first so no worker is left with two of them at the end."""
    axes = [v for k, v in sorted(job.runs[0].axes.items()) if isinstance(v, (int, float)) and not k.endswith(".lr")]
    return (len(job.runs) * job.config["optim"]["steps"], *axes)


def run_sweep(spec_source: str | Path | dict | SweepSpec, out: str | Path, *, overrides: list[str] | None = None,
              executor: str = "local", workers: int | None = None, address: str | None = None,
              gpus_per_job: float | None = None, progress: bool = True, executor_obj: Any = None,
              slurm: dict[str, Any] | None = None) -> dict[str, str]:
    """Run (or continue) a sweep into ``out``; returns every planned run's name → status (``finished``,
    ``diverged``: both hold a result). Through ``tdyn.sweep`` a sweep that leaves any run without a result
    (``failed``: its job raised or was lost, the error in ``sweep.json``; ``pending``: never ran) raises
    :class:`tdyn.errors.SweepFailed` naming those runs and the first error, its ``.status`` holding every run's
    status; ``tdyn.sweep.run_sweep`` itself returns the statuses (the command line prints them and exits 1).
    Run it again with the same spec to continue: finished runs are kept, unfinished ones resume.

    ``spec_source``: a dict, a :class:`~tdyn.sweep.spec.SweepSpec`, a YAML/JSON file or a packaged spec's
    name (``"syn_small_lr"``; ``tdyn config syn_small_lr`` prints one). Its keys (docs/usage.md#sweeps):

    * ``base`` (a run config file, packaged config or reproduction name) or ``config`` (a run config inline);
    * ``set``: overrides applied to it, ``["optim.steps=50", ...]``;
    * ``axes``: ``grid`` ({key: [values]}, every combination), ``zip`` ({key: [values]}, taken together)
      and ``random`` (``n`` samples, ``seed``, ``params``: {key: {kind: uniform | loguniform | choice,
      low, high, values}}); a learning rate is the key ``optim.groups.<group>.lr``, an init scale
      ``init_scale``;
    * ``seeds``: every cell runs each (default ``[0]``); ``job_members``: the most members per ensemble job;
      ``slurm``: the Slurm resources of :class:`~tdyn.sweep.spec.SlurmOptions`.

    ``overrides``: ``["optim.steps=50", ...]`` applied to the spec's base config (``tdyn sweep SPEC --set``),
    each replacing the spec's own ``set:`` entry for that key; a key a sweep axis varies is refused.

    Runs that differ only in seed, learning rates or init scale train together as one ensemble job.
    ``executor``: ``"local"`` (a process pool of ``workers``, default the cores divided by the torch
    threads), ``"inline"`` (the jobs one after another in this process: a notebook's own tasks and probes,
    which a spawned worker cannot import), ``"ray"`` (``address``: a cluster, default a local Ray;
    ``gpus_per_job``: Ray's ``num_gpus`` of each job, e.g. 0.25) or ``"slurm"`` (``slurm``: resources over the spec's ``slurm:`` section; the
    jobs go out as one job array, each requeued and resumed when preempted); ``executor_obj``: an executor
    object to use instead (tests). Optional packages (TensorBoard or W&B for the configs' ``log``, Ray,
    submitit) are checked before any job starts. ``progress``: a progress bar over every member's steps, with
    the latest losses (read from the runs' ``metrics.jsonl``). ``out`` is locked while the sweep runs (a second
    sweep on it is refused naming the first). Read the results with :func:`tdyn.load_sweep` (a DataFrame) and
    ``out/summary.csv``::

        status = tdyn.sweep({"base": "syn_small", "axes": {"grid": {"optim.groups.Y.lr": [1.0, 3.0]}},
                             "seeds": [0, 1]}, "runs/sw", workers=2)
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise UserError("tdyn.sweep was called while a sweep worker started: a spawned worker runs the top level of "
                        "your script again; put the call under `if __name__ == \"__main__\":`")
    fn = "tdyn.sweep"
    check_path(fn, "out", out)
    check_arg(fn, "executor", executor, str)
    if workers is not None:
        check_arg(fn, "workers", workers, int, what="an int or None")
    check_arg(fn, "progress", progress, bool)
    if slurm is not None:
        check_arg(fn, "slurm", slurm, dict, what="a dict of Slurm options or None")
    if overrides is not None:
        check_arg(fn, "overrides", overrides, list, tuple, what="a list of 'KEY.PATH=VALUE' strings")
        for i, o in enumerate(overrides):
            check_arg(fn, f"overrides[{i}]", o, str, what="a 'KEY.PATH=VALUE' string")
    if gpus_per_job is not None:
        check_arg(fn, "gpus_per_job", gpus_per_job, int, float, what="a number of GPUs or None")
        check_gpus_per_job(gpus_per_job)
    spec = spec_source if isinstance(spec_source, SweepSpec) else load_spec(spec_source)
    if overrides:
        spec = with_overrides(spec, list(overrides))
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
            old = SweepSpec.model_validate(runs.read_sweep(out)["spec"]).model_dump(mode="json")
        except ValidationError as e:
            raise runs.CorruptFile(out / runs.SWEEP, f"holds a spec this tdyn cannot read "
                                   f"({format_validation_error(e, SweepSpec, 'spec')}): damaged, or another "
                                   f"tdyn version's; choose another --out") from None
        if runs_of(old) != runs_of(spec.model_dump(mode="json")):
            raise UserError(f"{str(out)!r} holds a different sweep; choose another --out")
    else:
        _refuse_foreign(out)
    jobs = plan(spec)
    if (out / runs.SWEEP).exists():   # its runs keep the names it recorded (an older tdyn's, too)
        keep_recorded_names(out, jobs)
    for j in jobs:   # TensorBoard / W&B where a config logs to them: missing, refused before any job starts
        check_extras(validate_config(j.config))

    if executor_obj is None and executor == "local":
        _check_importable(jobs)
    ex = executor_obj or make_executor(executor, workers=workers, address=address, folder=str(out / SUBMITIT),
                                       slurm=spec.slurm.submitit_parameters(), gpus_per_job=gpus_per_job)
    try:
        with runs.Locks() as locks:
            locks.acquire(out)   # one sweep per directory; made only once spec, plan and executor are valid
            if not (out / runs.SWEEP).exists():
                _refuse_foreign(out)     # again, now that no other tdyn writes it
            if executor == "slurm":
                runs.record(out, SUBMITIT)   # submitit's folder there is tdyn's (for --force)
            want = identities(jobs)
            legacy = identities(jobs, legacy=True) if (out / runs.SWEEP).exists() else None
            ids = check_runs(out, want, legacy)
            return _run(spec, jobs, out, ex, progress, ids, want)
    finally:
        if executor_obj is None:
            ex.shutdown()


def _check_importable(jobs: list[JobPlan]) -> None:
    """A task or probe registered by code in an interactive ``__main__`` (a notebook's cells: no file) exists
    only in this process: a spawned pool worker cannot import it (a Jupyter kernel runs threads, so the local
    pool spawns, :func:`~tdyn.sweep.executors.start_method`). Refused with the fix, before any job starts."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__file__", None) or start_method() != "spawn":
        return
    for j in jobs:
        cfg = j.config
        named = [("task", TASKS, cfg["task"])] + [("probe", PROBES, p) for p in cfg["probes"]["names"]]
        for kind, reg, name in named:
            origin = reg._origins.get(name)
            if origin and origin[0] == "__main__":
                raise UserError(f"{kind} {name!r} is defined in this notebook, which the local pool's workers "
                                f"(spawned: this process runs threads) cannot import; pass executor='inline' (the "
                                f"jobs trained here, one after another: runs differing only in seed, learning rate "
                                f"or init scale are one job anyway), or move it into a module and "
                                f"tdyn.plugins.add it")


def _refuse_foreign(out: Path) -> None:
    """A sweep writes into a new or empty directory, or continues its own (``sweep.json``): never into a user's
    directory, a run's or a reproduction's, which it would mix its runs and summary into. A sweep stopped
    before its sweep.json may have left its .jobs/ and .submitit/, checked by runs' rules for them."""
    first = runs.ownership.leftover(out, (runs.JOBS, SUBMITIT))
    if first is not None:
        raise UserError(f"--out {str(out)!r} is not empty and holds no sweep (it holds {first.name!r}): a sweep "
                        f"writes into a new directory or continues its own; choose another --out")


def _run(spec: SweepSpec, jobs: list[JobPlan], out: Path, ex: Any, progress: bool,
         ids: dict[str, str] | None = None, want: dict[str, str] | None = None) -> dict[str, str]:
    status: dict[str, str] = {}
    errors: dict[str, str] = {}
    args = {j.id: (str(out / runs.JOBS / j.id), j.config, [str(out / r.name) for r in j.runs])
            for j in sorted(jobs, key=job_cost, reverse=True)}
    busy: dict[int, float] = {}
    lost: dict[str, int] = {}          # job → times its worker died under it
    seen: dict[str, set[str]] = {}     # job → the dead workers (pid@host) already counted
    _record(out, spec, jobs, status, errors, ids=ids)

    bar = trainer.progress_bar(total=sum(len(j.runs) * j.config["optim"]["steps"] for j in jobs), desc="sweep",
                               unit="step", disable=not (progress and trainer.interactive()))
    watch = None if bar.disable else Progress(out, jobs, bar)
    pending = dict(args)

    def done(jid: str, res: dict) -> None:
        pid, secs = res.pop(BUSY, (None, 0.0))
        if pid is not None:
            busy[pid] = busy.get(pid, 0.0) + secs
        if "error" in res:
            errors[jid] = res.pop("error")
            # what the worker could not say (a lost job) is read from the runs' directories
            on_disk = _failed([Path(d) for d in args[jid][2]], errors[jid])
            res = {k: v for k, v in on_disk.items() if k != "error"} | res
            log.info("sweep job %s failed: %s", jid, errors[jid])   # said once, at the end (failure_line)
        else:
            log.info("sweep job %s: %s", jid, ", ".join(f"{k} {v}" for k, v in res.items()))
        status.update(res)
        for d in args[jid][2]:   # every run of a job that came back has a status
            status.setdefault(Path(d).name, "failed")
        if ids is not None and want is not None:
            _settle(args[jid][2], ids, want)
        pending.pop(jid)
        if watch is not None:
            watch.job_done(jid, status)
        _record(out, spec, jobs, status, errors, busy, ids)

    try:
        while pending:
            many = getattr(ex, "submit_many", None)
            if many is not None:   # one submission (a Slurm job array)
                futures = dict(zip(many(run_job, list(pending.values())), pending))
            elif getattr(ex, "inline", False):   # trained here: the trainer's own bar shows each job's steps
                futures = {ex.submit(run_job, *a, watch is not None): jid for jid, a in pending.items()}
            else:
                futures = {ex.submit(run_job, *a): jid for jid, a in pending.items()}
            log.info("sweep %s: %d job(s) submitted to %s", out, len(futures), getattr(ex, "name", type(ex).__name__))
            broken = []
            for fut in _completed(futures, watch, ex):
                jid = futures[fut]
                try:
                    res = fut.result()
                except BrokenProcessPool:   # a pool process died: this job's, or another's
                    broken.append(jid)
                    continue
                except Exception as e:  # the executor lost the job for good
                    res = {"error": f"the executor lost it: {type(e).__name__}: {e}"}
                done(jid, res)
            if broken:  # rebuild the pool and resume the unfinished jobs; one that keeps dying is failed
                if not getattr(ex, "retry_broken", False):
                    raise RuntimeError("executor broke")
                for jid in _lost_jobs(broken, args, seen):
                    lost[jid] = lost.get(jid, 0) + 1
                    if lost[jid] >= MAX_LOST:
                        done(jid, {"error": f"lost {MAX_LOST} times: the worker process running it died (killed, "
                                            f"out of memory, or it could not start: a script that calls tdyn.sweep "
                                            f"must do so under `if __name__ == \"__main__\":`); re-run the sweep to "
                                            f"continue it"})
                ex.reset()
    except BaseException:   # Ctrl-C (or an error here): stop the workers' jobs, then record what they left
        stop = getattr(ex, "stop", None)
        if stop is not None:
            stop()          # queued jobs cancelled; running ones save an interrupt checkpoint and end
        for a in pending.values():
            status.update({n: s for n, s in run_statuses([Path(d) for d in a[2]], tensors=False).items()
                           if s in runs.DONE})
        _record(out, spec, jobs, status, errors, busy, ids)
        raise
    finally:
        bar.close()
    _record(out, spec, jobs, status, errors, busy, ids)
    summarize(out)
    return {r.name: status.get(r.name, "pending") for j in jobs for r in j.runs}


#: How often (seconds, at least) the progress bar reads the runs' metrics files; the poll's own cost is kept
#: under ~2% of the driver's time by stretching it (Progress.poll).
POLL_SECONDS = 0.5


def _completed(futures: dict, watch: "Progress | None", ex: Any = None):
    """``cf.as_completed(futures)``; with a progress bar, the runs' progress is read between completions. An
    inline executor's jobs are trained here, one at a time, as they are asked for."""
    if getattr(ex, "inline", False):
        for f in futures:
            ex.run(f)
            yield f
        return
    if watch is None:
        yield from cf.as_completed(futures)
        return
    left = set(futures)
    while left:
        done, left = cf.wait(left, timeout=watch.interval, return_when=cf.FIRST_COMPLETED)
        yield from done
        watch.poll([futures[f] for f in left])


class Progress:
    """The sweep's progress bar over every member's steps (the sum, over the planned runs, of the last step each
    has recorded; a run with a result counts whole) and the latest losses of the runs training.

    Read from the runs' own ``metrics.jsonl``, which every executor's workers write anyway (a local pool, Ray
    and Slurm alike, on the shared filesystem a multi-node sweep needs): nothing is sent back and the training
    loop is unchanged. The driver stats the metrics files of the jobs not yet back (at most every
    ``POLL_SECONDS``, less often when stat-ing many files takes longer) and reads the last line of those
    that changed. It advances as the trainer writes its metrics: at every checkpoint and at least every 10 s
    (the trainer's flush)."""

    def __init__(self, out: Path, jobs: list[JobPlan], bar: Any):
        self.bar = bar
        self.steps = {r.name: j.config["optim"]["steps"] for j in jobs for r in j.runs}
        self.runs = {j.id: [r.name for r in j.runs] for j in jobs}
        self.files = {n: out / n / runs.METRICS for n in self.steps}
        self.seen: dict[str, tuple[int, int]] = {}
        self.at = dict.fromkeys(self.steps, 0)
        self.loss: dict[str, float] = {}
        self.jobs_done = 0
        self.interval = POLL_SECONDS
        self.poll(list(self.runs))     # a continued sweep starts where its runs are

    def _last(self, name: str) -> None:
        f = self.files[name]
        try:
            st = f.stat()
        except OSError:
            return
        if self.seen.get(name) == (st.st_size, st.st_mtime_ns):
            return
        self.seen[name] = (st.st_size, st.st_mtime_ns)
        try:
            with open(f, "rb") as fh:
                fh.seek(max(0, st.st_size - 65536))
                lines = fh.read().splitlines()
            rec = json.loads(lines[-1]) if lines else {}
        except (OSError, ValueError):
            return      # being replaced, or damaged: the next poll (or the job's end) says
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            self.at[name] = min(rec["step"], self.steps[name])
            loss = rec.get("loss")
            if isinstance(loss, (int, float)) and math.isfinite(loss):
                self.loss[name] = float(loss)

    def poll(self, job_ids: list[str]) -> None:
        t0 = time.perf_counter()
        for jid in job_ids:
            for n in self.runs[jid]:
                self._last(n)
        self.interval = max(POLL_SECONDS, 50 * (time.perf_counter() - t0))
        self._show()

    def job_done(self, jid: str, status: dict[str, str]) -> None:
        """A job came back: its runs with a result count whole; the others where their metrics stop."""
        self.jobs_done += 1
        for n in self.runs[jid]:
            self._last(n)
            if status.get(n) in runs.DONE:
                self.at[n] = self.steps[n]
            self.loss.pop(n, None)
        self._show()

    def _show(self) -> None:
        self.bar.n = sum(self.at.values())
        post = {"jobs": f"{self.jobs_done}/{len(self.runs)}"}
        if self.loss:
            lo, hi = min(self.loss.values()), max(self.loss.values())
            post["loss"] = f"{lo:.4g}" + (f"..{hi:.4g}" if hi != lo else "")
        self.bar.set_postfix(post, refresh=False)
        self.bar.refresh()


def failure_line(out: str | Path, status: dict[str, str],
                 how: str = "re-run the same command to continue them") -> str | None:
    """The one line that says a sweep did not finish (None when every run holds a result): how many runs are
    not finished and which (the first three), the first failed job's error (the cause: a full disk, a task's
    error), how many jobs failed besides it, where every error is (sweep.json) and ``how`` to continue."""
    left = [n for n, s in status.items() if s not in runs.DONE]
    if not left:
        return None
    out = Path(out)
    errors = [(r.get("job", r["name"]), r["error"]) for r in runs.read_sweep(out)["runs"] if r.get("error")]
    errors = list(dict(errors).items())   # one per job (its runs share it)
    first = f": job {errors[0][0]} failed: {errors[0][1]}" if errors else ""
    more = f" ({len(errors) - 1} more job(s) failed)" if len(errors) > 1 else ""
    names = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    return (f"{len(left)} of {len(status)} run(s) not finished ({names}){first}{more}; errors in "
            f"{out / runs.SWEEP}; {how}")


def _lost_jobs(broken: list[str], args: dict[str, tuple], seen: dict[str, set[str]]) -> list[str]:
    """Which of the jobs a broken pool returned were running in a worker that died: those whose job
    directory's lock names a dead process not counted before (a worker killed mid-job leaves its lock
    file). When none does (a worker died before taking a lock), all of them count, so that a job killing
    every worker it gets cannot keep the sweep going round forever."""
    struck = []
    for jid in broken:
        holder = runs.lock_holder(Path(args[jid][0]))
        if holder and runs.holder_gone(holder) and holder not in seen.setdefault(jid, set()):
            seen[jid].add(holder)
            struck.append(jid)
    return struck or list(broken)


def final_metrics(run_dir: Path) -> dict[str, float]:
    """The last evaluation's scalar metrics of a run."""
    m = runs.read_metrics(run_dir)
    return {k: v for k, v in (m[-1] if m else {}).items() if isinstance(v, (int, float)) and k != "step"}


def summarize(out: str | Path) -> Path:
    """``summary.csv``: one row per cell (axes, count, mean and sample std of each final metric). Every run
    directory is first checked to hold the run sweep.json expects under its name (:func:`tdyn.runs.sweep_dirs`:
    a swapped or foreign run, or a finished run's missing directory, is exit 2 naming it)."""

    out = Path(out)
    sweep = runs.read_sweep(out)
    runs.sweep_dirs(out)
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


def __getattr__(name: str) -> Any:
    """``tdyn.sweep.plot_metric``, the old home of :func:`tdyn.report.plots.plot_metric` (drawing is the
    report layer's), still imports."""
    if name == "plot_metric":
        from tdyn.report.plots import plot_metric
        return plot_metric
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
