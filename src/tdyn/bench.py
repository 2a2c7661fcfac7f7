"""``tdyn bench``: speed of the canonical settings, measured in one process (never in tests).

Each paper registers entries with :func:`register_bench` in its ``bench`` module (named in its
manifest); an entry returns a dict of numbers (seconds, rates, ratios). This module holds what they
share (timing on the bench's device, training step rates, the plain-vs-hand-written comparison, the
reference matmul every figure is a ratio to); ``run`` writes ``bench.json`` with machine info and
prints a table.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from tdyn import runs
from tdyn.config import RunConfig, load_config
from tdyn.errors import UserError
from tdyn.registry import Registry
from tdyn.tasks import PlainTask, Task, build_task
from tdyn.train.optim import EnsembleOptimizer
from tdyn.seeding import generator
from tdyn.train.trainer import _COMMIT_SECONDS, expand_members, to_device, train

#: Every bench entry, by name: the core's (here) and each paper's, registered by its ``bench`` module
#: (named in its manifest).
BENCHES: Registry[Callable[[bool], dict]] = Registry("bench", table={"checkpoint_write": __name__},
                                                     papers="benches")


def register_bench(name: str):
    """Decorator: ``fn(quick: bool) -> dict`` measured by ``tdyn bench`` under ``name``."""
    return BENCHES.decorator(name)


#: the device the training entries run on (``tdyn bench --device``); :func:`timed_train` and
#: :func:`on_device` put it into the configs they train
DEVICE = "cpu"


def on_device(cfg: dict) -> dict:
    """``cfg`` with ``device`` set to the bench's :data:`DEVICE`."""
    return dict(cfg, device=DEVICE)


def seconds(fn: Callable[[], Any], n: int = 1) -> float:
    """Wall seconds of ``n`` calls of ``fn``, the bench device's queued work waited for before and after
    (on a GPU the host clock would otherwise time only the launches)."""
    wait = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    wait()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    wait()
    return time.perf_counter() - t0


def timed_train(cfg: dict) -> float:
    """Wall seconds of one ``train`` call into a temporary directory (on :data:`DEVICE`)."""
    cfg = on_device(cfg)
    with tempfile.TemporaryDirectory() as d:
        return seconds(lambda: train(cfg, Path(d) / "r", progress=False))


# ---------------------------------------------------------------- plain module (vmap) vs hand-written axis
#
# The shipped models carry the ensemble axis by hand; ``PlainTask`` trains a module written for one
# member under vmap. A paper's ``plain_vs_handwritten_*`` entry times one training step (forward, one
# backward, one optimizer step) of the same math both ways with :func:`compare`; the plain modules are
# written in the paper's bench module, for one member (tests/test_plain_module.py checks that they
# compute the hand-written models' losses).


def step_rate(task: Task, cfg: RunConfig, steps: int) -> float:
    """Training steps per second of ``task`` for ``cfg``'s members: forward, one backward, one
    optimizer step (``cfg.optim``), on one fixed batch (sampling is not timed); 3 warm-up steps."""
    members = expand_members(cfg)
    task.model.to(cfg.device)                      # before the optimizer's state is made like the parameters
    params = dict(task.model.named_parameters())
    lrs = {g: torch.tensor([m.lrs[g] for m in members], dtype=torch.float64) for g in cfg.optim.groups}
    opt = EnsembleOptimizer(params, cfg.optim.groups, lrs, task.grad_rows)
    active = torch.ones(len(members), dtype=torch.bool)
    batch = to_device(task.sample_streams([generator(m.seed, "data") for m in members]), cfg.device)

    def step():
        for p in params.values():
            p.grad = None
        task.loss(batch).sum().backward()
        opt.step(set(), active)

    for _ in range(3):
        step()
    return steps / seconds(step, steps)


def compare(cfg: Callable[[int], dict], plain: Callable[[Any, list], PlainTask], sizes: tuple[int, ...],
             steps: int, plain_groups: dict | None = None) -> dict:
    """Steps/s with S members (each of ``sizes``) of ``cfg(S)``'s task (hand-written axis) and of
    ``plain(cfg, members)`` under vmap; ``plain_groups`` names each optimizer group's parameters for
    the plain module."""
    out: dict[str, Any] = {"steps": steps}
    for S in sizes:
        raw = on_device(cfg(S))
        rc = load_config(raw)
        members = expand_members(rc)
        hand = step_rate(build_task(rc, members), rc, steps)
        if plain_groups:
            groups = {g: gc | {"params": plain_groups[g]} for g, gc in raw["optim"]["groups"].items()}
            rc = load_config(raw | {"optim": raw["optim"] | {"groups": groups}})
        vm = step_rate(plain(rc, members), rc, steps)
        out |= {f"S{S}_handwritten_steps_per_s": hand, f"S{S}_vmap_steps_per_s": vm, f"S{S}_vmap_over_handwritten": vm / hand}
    return out


def reference_matmul(n: int = 1024, seconds: float = 1.0, device: str = "cpu") -> dict:
    """This machine's fp32 matmul throughput (GFLOP/s, n×n @ n×n, at 1 thread and at the current
    thread count): the unit every bench figure can be divided by, so results taken on different
    machines compare as ratios."""
    if device == "cuda":
        a, b = torch.randn(4 * n, 4 * n, device="cuda"), torch.randn(4 * n, 4 * n, device="cuda")
        a @ b
        torch.cuda.synchronize()
        k, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            k += 1
        torch.cuda.synchronize()
        return {"gflops_cuda_fp32": 2 * (4 * n) ** 3 * k / (time.perf_counter() - t0) / 1e9,
                "cuda_device": torch.cuda.get_device_name()}
    a, b = torch.randn(n, n), torch.randn(n, n)
    threads = torch.get_num_threads()
    out = {}
    for t in dict.fromkeys((1, threads)):
        torch.set_num_threads(t)
        a @ b
        k, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            k += 1
        out[f"gflops_{t}_thread{'s' if t > 1 else ''}"] = 2 * n ** 3 * k / (time.perf_counter() - t0) / 1e9
    torch.set_num_threads(threads)
    return out


def one_thread_step(cfg: dict, steps: int, draws: int) -> dict:
    """Seconds of one training step (the trainer's, over ``steps`` steps) and of one batch draw (mean of ``draws``)
    of the run config ``cfg``, on one torch thread: tdyn's side of a comparison with an authors' single-threaded
    code."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rc = load_config(cfg)
        task = build_task(rc, expand_members(rc))
        step = 1.0 / step_rate(task, rc, steps)
        g = torch.Generator().manual_seed(0)
        draw = seconds(lambda: task.sample(g), draws) / draws
    finally:
        torch.set_num_threads(threads)
    return {"train_step_s": step, "sample_s": draw}


def timed_run(cmd: list[str], what: str, *, env: dict | None = None, cwd: str | None = None,
              timeout: float = 600) -> tuple[float, Any]:
    """Wall seconds of the program ``cmd`` (environment: this one plus ``env``) and its completed process (text
    stdout and stderr). A non-zero exit is a UserError naming ``what`` and the last line it wrote to stderr."""
    import os
    import subprocess

    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                       timeout=timeout)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"{what} failed (exit {r.returncode}): {tail[:300]}")
    return wall, r


def per_step_by_difference(wall_of: Callable[[int], float], steps: int, base: int) -> dict:
    """Seconds per step of a program that does not time its own steps: ``wall_of(n)`` (its wall for n steps) at
    ``base`` and at ``base + steps``, their difference over ``steps`` (start-up, compilation and the first ``base``
    steps cancel)."""
    short, long = wall_of(base), wall_of(base + steps)
    return {"steps": steps, "s_per_step": (long - short) / steps, "wall_short_s": short, "wall_long_s": long}


def wall_python(code: str, reps: int) -> float:
    import statistics
    import subprocess
    import sys

    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def usage() -> tuple:
    import resource

    return tuple(resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def usage_delta(before: tuple, after: tuple) -> dict:
    """Page faults and CPU seconds (user, system) spent between two :func:`usage` calls, this process
    and its (waited-for) children together: allocation churn shows up as minor faults and system time."""
    f = lambda k: sum(getattr(a, k) - getattr(b, k) for a, b in zip(after, before))  # noqa: E731
    return {"minor_faults": int(f("ru_minflt")), "user_s": f("ru_utime"), "sys_s": f("ru_stime")}


# ---------------------------------------------------------------- checkpoints


def _checkpoint_steps(S: int, n: int, behind: bool) -> tuple[float, int]:
    """Seconds of ``n`` checkpoint steps of ``S`` members at a cadence of two steps, written as the
    trainer writes them (each member's metrics.jsonl, two records longer, then its checkpoint), and the
    number of commits: ``behind``, through one :class:`tdyn.runs.GroupCommit` committed at most once
    per the trainer's window; else each step's files made durable before training goes on (every
    metrics.jsonl encoded whole, then one ``atomic_write_many`` each for the metrics and the checkpoints:
    the trainer before its write-behind)."""
    gen = torch.Generator().manual_seed(0)
    state = {f"{kind}/{p}": torch.randn(34, 34, generator=gen) for kind in ("param", "optim/momentum") for p in "YZ"}
    state["rng/data"] = gen.get_state()
    record = {"loss": 0.5, "norm/Y": 1.0, "norm/Z": 2.0, "update_norm/Y": 0.01, "update_norm/Z": 0.02}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / f"m{i}" for i in range(S)]
        records: list[list[dict]] = [[] for _ in dirs]
        lines = [runs.MetricsLines() for _ in dirs]
        writes, commits = runs.GroupCommit(_COMMIT_SECONDS), 0
        t0 = time.perf_counter()
        for k in range(n):
            for rec in records:
                rec += [{"step": 2 * k - 1} | record, {"step": 2 * k} | record] if k else [{"step": 0} | record]
            ckpts = [runs.checkpoint_file(d, 2 * k, state, {"step": str(2 * k)}) for d in dirs]
            if behind:
                for d, rec, ls in zip(dirs, records, lines):   # as Job._flush: encoded by the commit
                    writes.write(d / runs.METRICS, lambda d=d, rec=rec, ls=ls: ls.file(d, rec)[1])
                for f in ckpts:
                    writes.write(*f)
                if writes.due():
                    writes.commit()
                    commits += 1
            else:
                runs.atomic_write_many(runs.metrics_file(d, rec) for d, rec in zip(dirs, records))
                runs.atomic_write_many(ckpts)
                commits += 2
        if len(writes):
            writes.commit()
            commits += 1
        return time.perf_counter() - t0, commits


@register_bench("checkpoint_write")
def _checkpoint_write(quick: bool) -> dict:
    """Amortised cost of one member's checkpoint (atomic, checksummed) on a dense schedule (every two
    steps), for a member of Syn-Small's size (Y, Z and their momenta 34 × 34 float32, the data RNG's
    5056 bytes) and 1 or 32 members: written behind in group commits (the trainer) against made
    durable at every checkpoint step (the trainer before its write-behind). Only the writing is timed
    (serialising, checksums, metrics.jsonl, files, syncs), never the training."""
    n = 100 if quick else 500
    out: dict[str, Any] = {"checkpoint_steps": n}
    for S in (1, 32):
        m = n if S == 1 else max(n // 5, 20)
        for name, behind in (("synced", False), ("behind", True)):
            s, commits = _checkpoint_steps(S, m, behind)
            out |= {f"S{S}_{name}_ms_per_member": 1e3 * s / (m * S), f"S{S}_{name}_commits": commits}
        out[f"S{S}_speedup"] = out[f"S{S}_synced_ms_per_member"] / out[f"S{S}_behind_ms_per_member"]
    return out


#: the keys of every result :func:`run` writes: a JSON object holding them is a bench result (tdyn bench's own)
RESULT_KEYS = ("machine", "quick", "date", "device", "torch_threads", "reference_matmul")


def check_replaceable(out: Path) -> None:
    """``out`` may be written: it does not exist, or it is a result ``tdyn bench`` wrote (recognised by its
    content: a JSON object with every one of :data:`RESULT_KEYS`). Anything else — a user's JSON, another file,
    a directory, one that cannot be read — is one line naming it, before anything is measured (``--force``
    replaces only a bench result)."""
    if not out.exists() and not out.is_symlink():
        return
    why = None
    if out.is_dir():
        why = "is a directory"
    else:
        try:
            obj = runs.read_json(out)
        except runs.CorruptFile as e:
            why = f"is not a bench result ({e.problem})"
        else:
            if not isinstance(obj, dict) or not all(k in obj for k in RESULT_KEYS):
                why = "is a JSON file that tdyn bench did not write (not a bench result)"
    if why:
        raise UserError(f"--out {str(out)!r} {why}: the bench replaces only its own results, even with --force; "
                        f"choose another --out")


def run(out: str | Path, quick: bool = False, only: list[str] | None = None, device: str = "cpu") -> dict:
    """Measure ``only`` (default: every entry, the core's and the papers') and write ``out``, which must be new
    or a bench result (:func:`check_replaceable`: a user's file in its place is refused before measuring).
    ``device="cuda"``: the training entries train on the GPU (entries that measure CPU-only work, the
    start-up and exact population computations, run as on CPU) and the reference matmul is the GPU's."""
    global DEVICE
    check_replaceable(Path(out))
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: CUDA is not available here")
    DEVICE = device
    names = only or [*BENCHES.table]
    fns = {n: BENCHES.get(n) for n in names}
    out = Path(out)
    # The entries' temporary run directories live beside ``out`` (the filesystem the user writes runs
    # to), not in the system temp directory: on this project's machine creating a file in /tmp costs
    # ~1 ms against ~0.03 ms elsewhere on the same disk, which would be measured as training time.
    out.resolve().parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".tdyn-bench-", dir=out.resolve().parent))
    result = {"machine": runs.machine_info(), "quick": quick, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "device": device, "torch_threads": torch.get_num_threads(), "scratch_dir": str(scratch.parent),
              "reference_matmul": reference_matmul() | (reference_matmul(device="cuda") if device == "cuda" else {})}
    print("reference_matmul             " + "  ".join(f"{k}={_fmt(v)}" for k, v in result["reference_matmul"].items()))
    old_tempdir, tempfile.tempdir = tempfile.tempdir, str(scratch)
    try:
        for n in names:
            t0, u0 = time.perf_counter(), usage()
            result[n] = fns[n](quick)
            result[n]["bench_wall_s"] = time.perf_counter() - t0
            result[n]["usage"] = usage_delta(u0, usage())
            print(f"{n:<28} " + "  ".join(f"{k}={_fmt(v)}" for k, v in result[n].items() if k != "usage"), flush=True)
    finally:
        tempfile.tempdir = old_tempdir
        shutil.rmtree(scratch, ignore_errors=True)
    runs.write_json(out, result)
    return result


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
