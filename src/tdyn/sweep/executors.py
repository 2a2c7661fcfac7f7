"""Executors behind one interface: ``submit(fn, *args) -> future`` (``.result()`` blocks).

* ``local`` (default): a process pool sized to the cores (:func:`default_workers`);
* ``inline``: the jobs one after another in this process (a notebook's own tasks: :class:`InlineExecutor`);
* ``ray``: Ray tasks on ``address`` (or a local Ray instance); a task whose worker dies is retried; each task
  asks for ``num_gpus`` GPUs (``--gpus-per-job``: a fraction shares one GPU between several small jobs);
* ``slurm``: submitit (``AutoExecutor`` on a Slurm cluster; ``local`` for its local executor, named explicitly:
  where no Slurm is found, ``--executor slurm`` is refused, never run on submitit's local executor unasked).
  A sweep's jobs go out as one Slurm job array (``submit_many``: submitit's ``map_array``), each a
  ``submitit.helpers.Checkpointable`` (:func:`requeueable`): preempted or timed out, it is requeued with the
  same arguments and resumes from its runs' last checkpoints.

An executor may have ``submit_many(fn, calls) -> [future]`` (one submission for many calls); the sweep uses it
where it exists, else ``submit`` per call.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import multiprocessing as mp
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable

import torch
from tqdm.std import TqdmDefaultWriteLock

from tdyn import plugins
from tdyn.config import install_hint
from tdyn.errors import UserError
from tdyn.threads import cli_threads
from tdyn.train.trainer import progress_bar, stop_all


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this process when its parent dies (``PR_SET_PDEATHSIG``), so a sweep
    killed with SIGKILL leaves no pool worker training on; a parent that died before this ran (the worker
    was still starting) is caught by the ``getppid`` check. Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)




def _init_worker(parent: int) -> None:
    """A pool worker's start: ``_die_with_parent``; its own lock for tdyn's progress bars (a forked
    worker shares its parent's, and killed while holding it would stall every later bar); and
    ``gc.freeze()``: the objects the worker begins with (a forked worker's are its parent's, shared
    copy-on-write) move to the collector's permanent generation, so its collections neither traverse
    them nor copy their pages; SIGINT (Ctrl-C reaches the whole process group) asks the training in the
    worker, and any it starts later, to stop at its next step (:func:`~tdyn.train.trainer.stop_all`)."""
    global IN_WORKER
    IN_WORKER = True
    gc.freeze()
    progress_bar.set_lock(TqdmDefaultWriteLock())
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, stop_all)   # Ctrl-C: the job here checkpoints and ends; no traceback from the pool's queue


START_METHODS = ("auto", "spawn")   # $TDYN_START_METHOD


def start_method() -> str:
    """How the local pool starts its workers: ``fork`` where that is safe, else ``spawn``.

    A forked worker starts in milliseconds with torch and tdyn already imported; a spawned one imports
    them again (seconds, paid by every sweep and pool: benchmarks/README.md#measurements-behind-the-code). Forking is
    allowed under the conditions PyTorch's own DataLoader workers rely on: Linux, no CUDA device here (a
    child forked after the CUDA driver started, which asking for the device count already does, cannot
    use it; on a CPU-only build this costs nothing), one intra-op torch thread here and in the workers (the child
    never enters an OpenMP pool the parent started), and no other Python thread running (whose locks the
    child would inherit held); and Python < 3.12, which counts every OS thread (numpy's BLAS threads
    included) and deprecates forking any process that has one. Otherwise, or with
    ``TDYN_START_METHOD=spawn``, spawn. Either way a worker computes the same bits (tests/test_sweep.py)."""
    chosen = os.environ.get("TDYN_START_METHOD", "auto") or "auto"
    if chosen not in START_METHODS:
        raise UserError(f"TDYN_START_METHOD={chosen!r}: allowed: {', '.join(START_METHODS)}")
    one_thread = cli_threads() == 1 and torch.get_num_threads() == 1
    cuda = torch.cuda.is_initialized() or torch.cuda.is_available()
    safe = (sys.platform.startswith("linux") and sys.version_info < (3, 12) and not cuda and one_thread
            and threading.active_count() == 1)
    return "fork" if safe and chosen == "auto" else "spawn"


#: whether this process is a local pool's worker (set by its initializer): a pool it starts by default then has
#: one worker, so pools inside pools (a reproduction's jobs under ``reproduce --all --jobs N``) do not
#: oversubscribe the cores
IN_WORKER = False


def default_workers() -> int:
    """The local pool's default size: one worker per core, each with ``cli_threads()`` torch threads
    (so ``TDYN_THREADS=2`` on 2 cores is one worker, not two oversubscribed ones); 1 inside a pool's worker."""
    return 1 if IN_WORKER else max(1, (os.cpu_count() or 1) // cli_threads())


def process_pool(workers: int) -> cf.ProcessPoolExecutor:
    return cf.ProcessPoolExecutor(workers, mp_context=mp.get_context(start_method()),
                                  initializer=_init_worker, initargs=(os.getpid(),))


def terminate(pool: cf.ProcessPoolExecutor, grace: float = 0.0) -> None:
    """Stop a pool: cancel what has not started, then end the workers computing (their calls are lost).
    With ``grace``, first ask their jobs to stop (SIGINT, on POSIX only: elsewhere ``os.kill`` terminates,
    and the console's Ctrl-C reached them): a training saves an interrupt checkpoint and ends at its next
    step, one handed to a worker at its first; workers still alive ``grace`` seconds later are terminated."""
    procs = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs if grace > 0 and os.name == "posix" else ():
        if p.is_alive() and p.pid is not None:
            try:
                os.kill(p.pid, signal.SIGINT)
            except OSError:
                pass
    end = time.monotonic() + grace
    for p in procs:
        if grace > 0:
            p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.terminate()


class LocalExecutor:
    name = "local"
    # A killed pool process breaks the whole pool: the sweep driver rebuilds it and resubmits.
    retry_broken = True

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or default_workers())
        self._pool: cf.ProcessPoolExecutor | None = None

    def _ensure(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            # threads: run_job sets the driver's --threads in every executor's worker
            self._pool = process_pool(self.workers)
        return self._pool

    def submit(self, fn: Callable, *args: Any):
        return self._ensure().submit(fn, *args)

    def reset(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def pids(self) -> list[int]:
        return list(self._pool._processes) if self._pool is not None else []

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def stop(self, grace: float = 60.0) -> None:
        """After an interrupt: the queued jobs cancelled, the running ones asked to stop and given ``grace``
        seconds (:func:`terminate`; a re-run of the sweep resumes from their checkpoints either way)."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            terminate(pool, grace)


class InlineExecutor:
    """The jobs trained in this process, one after another, each when the sweep waits for it (``executor=
    "inline"``): for a notebook, whose tasks and probes live in its cells, which a spawned pool worker cannot
    import (a Jupyter kernel runs threads, so the local pool spawns). A sweep whose runs differ only in seed,
    learning rates or init scale is one ensemble job anyway; Ctrl-C interrupts the training here as it does
    ``tdyn.train`` (an interrupt checkpoint: the same call continues it)."""

    name = "inline"
    retry_broken = False
    inline = True

    def submit(self, fn: Callable, *args: Any) -> cf.Future:
        f: cf.Future = cf.Future()
        f.call = (fn, args)    # run by run(f), in this thread
        return f

    def run(self, f: cf.Future) -> None:
        fn, args = f.call
        if f.set_running_or_notify_cancel():
            try:
                f.set_result(_call_with_threads(fn, args))
            except Exception as e:
                f.set_exception(e)

    def shutdown(self) -> None:
        pass


def _call_with_threads(fn: Callable, args: tuple) -> Any:
    """``fn(*args)`` with the driver's torch intra-op threads (``cli_threads``; restored after)."""
    old = torch.get_num_threads()
    torch.set_num_threads(cli_threads())
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(old)


def pool_map(fn: Callable, calls: list[tuple], *, workers: int | None = None,
             cost: list[float] | None = None) -> list:
    """``[fn(*args) for args in calls]``, each call computed with the driver's torch threads
    (``cli_threads``) by a local pool of ``workers`` processes (default: :func:`default_workers`) when
    there are two or more of each, else in this process: the same bits either way. The pool takes the
    calls costliest first (``cost``: one estimate per call, longest-processing-time order, so the last
    call to finish is a small one). Results come back in the order of ``calls``; an exception in a call
    (or an interrupt) stops the pool at once and is raised here. ``fn`` must be importable (a
    module-level function): a spawned worker is a fresh interpreter (``start_method``)."""
    workers = min(max(1, workers or default_workers()), len(calls))
    if workers < 2:
        return [_call_with_threads(fn, args) for args in calls]
    order = sorted(range(len(calls)), key=lambda i: -(cost[i] if cost is not None else 0.0))
    pool = process_pool(workers)
    try:
        futures = {i: pool.submit(_call_with_threads, fn, calls[i]) for i in order}
        cf.wait(futures.values(), return_when=cf.FIRST_EXCEPTION)
        for i in range(len(calls)):      # a call failed: its error now, not after the calls before it
            if futures[i].done() and futures[i].exception() is not None:
                raise futures[i].exception()
        out = [futures[i].result() for i in range(len(calls))]
    except BaseException:
        terminate(pool)
        raise
    pool.shutdown(wait=True)
    return out


class RayExecutor:
    name = "ray"
    retry_broken = False

    def __init__(self, address: str | None = None, num_cpus: int | None = None, max_retries: int = 3,
                 num_gpus: float | None = None):
        check_gpus_per_job(num_gpus)
        try:
            import ray
        except ImportError:
            raise UserError(f"--executor ray needs Ray, which is not installed here: {install_hint('ray')}") from None
        self.ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            env = {plugins.ENV: os.environ[plugins.ENV]} if os.environ.get(plugins.ENV) else {}
            # joining a cluster (address): its CPUs are its own — num_cpus only sizes a local Ray
            ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False, log_to_driver=False,
                     ignore_reinit_error=True, runtime_env={"env_vars": env} if env else None)
        self.max_retries = max_retries
        self.num_gpus = num_gpus
        self._remotes: dict[Callable, Any] = {}

    def remote(self, fn: Callable) -> Any:
        """``fn`` as a Ray remote function: one CPU, ``num_gpus`` GPUs (Ray's fractional GPUs: 0.25 lets four
        jobs share one GPU, each seeing it as its CUDA device), retried ``max_retries`` times if its worker dies."""
        remote = self._remotes.get(fn)
        if remote is None:
            opts = {"max_retries": self.max_retries, "num_cpus": 1}
            if self.num_gpus:
                opts["num_gpus"] = self.num_gpus
            remote = self._remotes[fn] = self.ray.remote(**opts)(fn)
        return remote

    def submit(self, fn: Callable, *args: Any):
        return self.remote(fn).remote(*args).future()

    def shutdown(self) -> None:
        if self._owns:
            self.ray.shutdown()


def check_gpus_per_job(gpus: float | None) -> None:
    """``--gpus-per-job``: what Ray accepts as ``num_gpus`` (a fraction of one GPU, or whole GPUs)."""
    if gpus is None:
        return
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not gpus > 0 or (gpus > 1 and gpus != int(gpus)):
        raise UserError(f"--gpus-per-job {gpus!r}: must be a fraction of one GPU (0 < x <= 1, e.g. 0.25: four jobs "
                        f"share a GPU) or a whole number of GPUs")


_REQUEUEABLE: type | None = None


def requeueable(fn: Callable) -> Any:
    """``fn`` as a ``submitit.helpers.Checkpointable`` callable (made on first use: submitit is optional): when
    Slurm preempts the job or its time runs out, submitit calls its ``checkpoint(*args)``, which resubmits the
    same callable with the same arguments (Checkpointable's own), and requeues the job. ``fn`` (the sweep's
    ``run_job``) resumes every unfinished run of the job from its newest intact checkpoint, so a requeued job
    finishes with the bits of an uninterrupted one (tests/test_sweep.py simulates a preemption on submitit's
    local executor)."""
    global _REQUEUEABLE
    if _REQUEUEABLE is None:
        import submitit

        class Requeueable(submitit.helpers.Checkpointable):
            """A sweep job that Slurm may preempt: requeued with the same arguments, it resumes."""

            def __init__(self, fn: Callable):
                self.fn = fn

            def __call__(self, *args: Any) -> Any:
                return self.fn(*args)

        _REQUEUEABLE = Requeueable
    return _REQUEUEABLE(fn)


def slurm_available() -> bool:
    """Whether Slurm's commands are here: submitit submits with ``sbatch`` and detects Slurm by ``srun``."""
    return shutil.which("sbatch") is not None and shutil.which("srun") is not None


class SlurmExecutor:
    name = "slurm"
    retry_broken = False

    def __init__(self, folder: str, cluster: str | None = None, **params: Any):
        if cluster is None and not slurm_available():   # submitit's AutoExecutor would run the jobs here instead
            raise UserError("--executor slurm: Slurm is not available here (no sbatch or srun on PATH); run the sweep "
                            "on a Slurm login node, or here with --executor local (or ray)")
        try:
            import submitit
        except ImportError:
            raise UserError(f"--executor slurm needs submitit, which is not installed here: "
                            f"{install_hint('slurm')}") from None
        self.ex = submitit.AutoExecutor(folder=folder, cluster=cluster)
        if params:
            self.ex.update_parameters(**params)
        self._waiter = cf.ThreadPoolExecutor(8)  # turns submitit jobs into concurrent futures
        self.jobs: list = []                     # the submitit jobs submitted (tests: their ids, their logs)

    def submit(self, fn: Callable, *args: Any):
        job = self.ex.submit(requeueable(fn), *args)
        self.jobs.append(job)
        return self._waiter.submit(job.result)

    def submit_many(self, fn: Callable, calls: list[tuple]) -> list:
        """Every call as one task of one Slurm job array (submitit's ``map_array``; on submitit's local executor,
        one job each), each requeued with its arguments when preempted (:func:`requeueable`)."""
        if not calls:
            return []
        jobs = self.ex.map_array(requeueable(fn), *zip(*calls))
        self.jobs += jobs
        return [self._waiter.submit(j.result) for j in jobs]

    def shutdown(self) -> None:
        self._waiter.shutdown(wait=True)


def make_executor(name: str, *, workers: int | None = None, address: str | None = None,
                  folder: str | None = None, slurm_cluster: str | None = None, slurm: dict | None = None,
                  gpus_per_job: float | None = None):
    """``slurm``: submitit parameters (``SlurmOptions.submitit_parameters()``) for ``name = "slurm"``;
    ``gpus_per_job``: Ray's ``num_gpus`` of each job (``name = "ray"`` only)."""
    if workers is not None and workers < 1:
        raise UserError(f"--workers {workers}: must be at least 1")
    if gpus_per_job is not None and name != "ray":
        raise UserError(f"--gpus-per-job goes with --executor ray (Ray's num_gpus per job); with --executor {name} "
                        + ("give --slurm-gpus (GPUs per Slurm job)" if name == "slurm" else
                           "a job uses the device its config names"))
    if name == "local":
        return LocalExecutor(workers)
    if name == "inline":
        return InlineExecutor()
    if name == "ray":
        return RayExecutor(address, num_cpus=workers, num_gpus=gpus_per_job)
    if name == "slurm":
        return SlurmExecutor(folder or ".submitit", cluster=slurm_cluster, **(slurm or {}))
    raise UserError(f"--executor {name!r}: allowed: local, inline, ray, slurm")
