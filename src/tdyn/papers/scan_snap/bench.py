"""``tdyn bench`` entries of Scan and Snap: one Syn-Small run, an ensemble of 32 against 32 single
runs, the hand-written ensemble axis against :class:`PlainYZ` under vmap, the light commands' start-up,
the allocator's churn on a Fig 6-sized job, and the Fig 6 sweep. Timings and their history:
benchmarks/README.md."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tdyn import bench, runs
from tdyn.bench import compare, on_device, usage, usage_delta, wall_python, register_bench, timed_train
from tdyn.config import validate_config
from tdyn.papers.scan_snap import data as scan_snap
from tdyn.papers.scan_snap.data import SYN_SMALL
from tdyn.papers.scan_snap.analysis import FIG6, fig6_spec
from tdyn.papers.scan_snap.task import yz_config
from tdyn.sweep import run_sweep
from tdyn.sweep.executors import start_method
from tdyn.sweep.spec import load_spec, plan
from tdyn.tasks import PlainTask
from tdyn.train.trainer import expand_members, member_config, train


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


class PlainYZ(nn.Module):
    """The Y/Z model of ``tdyn.papers.scan_snap.model`` (parameterisation ``yz``, LN(x) = x/‖x‖, the query not a key)
    for one member: x [B, L] token ids -> logits [B, M] = LN(Xᵀ softmax(Z[x_T, x_t]))ᵀ Y."""

    def __init__(self, M: int):
        super().__init__()
        self.Y = nn.Parameter(torch.zeros(M, M))
        self.Z = nn.Parameter(torch.zeros(M, M))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keys = x[:, :-1]
        b = torch.softmax(torch.gather(self.Z[x[:, -1]], 1, keys), dim=-1)        # [B, L-1]
        Xb = torch.zeros(x.shape[0], self.Y.shape[0], dtype=b.dtype, device=b.device).scatter_add(1, keys, b)
        return F.normalize(Xb, dim=-1) @ self.Y


class PlainYZTask(PlainTask):
    """Scan and Snap with :class:`PlainYZ` (zero init, as Syn-Small)."""

    def __init__(self, cfg, members):
        self.data_cfg = scan_snap.ScanSnapDataConfig.model_validate(cfg.data)
        self.dist = scan_snap.build(self.data_cfg)
        super().__init__(cfg, members)

    def make_model(self) -> nn.Module:
        return PlainYZ(self.dist.M)

    def sample(self, gen):
        return self.dist.sample(self.data_cfg.batch_size, self.data_cfg.seq_len, gen)

    def member_loss(self, model, batch):
        x, y = batch[:2]      # the hand-written task's batches also carry each sequence's key support
        return F.cross_entropy(model(x), y)


@register_bench("plain_vs_handwritten_yz")
def _plain_yz(quick: bool) -> dict:
    """Y/Z model, Syn-Small (batch 128, length 128), S = 1 and 20 members: the hand-written ensemble
    axis (``models.yz.YZModel``) vs :class:`PlainYZ` under vmap (``PlainTask``), steps/s of one
    training step (SGD, momentum)."""
    return compare(lambda S: yz_config(SYN_SMALL, seeds=range(S)), PlainYZTask, (1, 20), 20 if quick else 100)


@register_bench("startup")
def _startup(quick: bool) -> dict:
    """Whole-process wall seconds (median of 3, 1 if quick) of the light commands (`tdyn list`,
    `tdyn --help`, `tdyn config scan-snap/fig4`, which import no torch) and of one Syn-Small run as a
    process (`tdyn run syn_small`, the packaged config: 100 steps, one member); for reference, a process
    that only imports torch, as it is and with ``gc.freeze()`` after the import (what tdyn's commands do:
    the interpreter's final collection then skips torch's objects)."""
    import statistics
    import subprocess
    import sys

    def wall(*args: str) -> float:
        ts = []
        for _ in range(1 if quick else 3):
            with tempfile.TemporaryDirectory() as d:
                argv = [a.replace("{OUT}", str(Path(d) / "r")) for a in args]
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "tdyn", *argv], check=True, capture_output=True)
                ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    out = {"list_s": wall("list"), "help_s": wall("--help"), "config_s": wall("config", "scan-snap/fig4")}
    out["syn_small_run_process_s"] = wall("run", "syn_small", "--out", "{OUT}", "--quiet")
    out["python_import_torch_s"] = wall_python("import torch", 1 if quick else 3)
    out["python_import_torch_gc_frozen_s"] = wall_python("import gc, torch; gc.freeze()", 1 if quick else 3)
    return out


@register_bench("allocation")
def _allocation(quick: bool) -> dict:
    """Allocation churn: a Fig 6-sized job (Syn-Medium with 10 last tokens, M = 240, 16 members, 50
    steps, 20 if quick; one thread) trained in a child
    process with glibc's default allocator settings (``TDYN_MALLOPT=0``: every freed block above
    the mmap threshold goes back to the OS and is page-faulted in again the next step) and with
    :func:`tdyn.threads.tune_allocator` (the default): wall seconds, minor page faults and
    system CPU seconds of each child. (The optimizer's own temporaries live in preallocated buffers
    either way; see :class:`tdyn.train.optim.EnsembleOptimizer`.)"""
    import os
    import subprocess
    import sys

    code = ("from tdyn.bench import timed_train; from tdyn.papers.scan_snap.task import yz_config; "
            "from tdyn.papers.scan_snap.data import syn_medium; "
            f"print(timed_train(yz_config(syn_medium(10), steps={20 if quick else 50}, init='torch_default', "
            "seeds=range(16))))")
    out = {}
    for label, flag in (("glibc_default", "0"), ("tuned", "1")):
        u0 = usage()
        r = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                           env=dict(os.environ, TDYN_MALLOPT=flag, TDYN_THREADS="1"))
        out[label] = {"train_s": float(r.stdout.split()[-1]), **usage_delta(u0, usage())}
    out["fault_ratio"] = out["glibc_default"]["minor_faults"] / max(1, out["tuned"]["minor_faults"])
    return out


def _loop_seconds(cfg: dict) -> float:
    """The training loop's seconds of one job (its meta.json's ``seconds.training``: sampling, loss, backward,
    the optimizer, a graph's warm-up and capture; not the job's set-up, probes or checkpoints)."""
    with tempfile.TemporaryDirectory() as d:
        dirs = train(on_device(cfg), Path(d) / "r", progress=False)
        return runs.read_meta(dirs[0])["seconds"]["training"]


#: an entry's key suffix per set of config options turned on (on CUDA every set is measured; on a CPU the first)
_TAGS = {(): "", ("cuda_graph",): "_graph", ("cuda_graph", "draw_on_device"): "_graph_device"}


@register_bench("scan_snap_member_steps")
def _member_steps(quick: bool) -> dict:
    """Syn-Small member-steps per second of the training loop (issue 35 item 6): ensembles of S members over
    learning rates (one data stream; η_Y = η_Z from 0.1 to 10) and over seeds (S data streams), the eager step
    and, on CUDA, the step replayed as CUDA graphs (``cuda_graph``), also with the batches drawn on the GPU
    (``draw_on_device``: other random streams than the host's)."""
    steps = 100 if quick else 400
    modes = tuple(_TAGS) if bench.DEVICE == "cuda" else ((),)
    out: dict = {"steps": steps}
    for S in (1, 16, 64):
        for kind in ("lrs", "seeds"):
            if S == 1 and kind == "seeds":
                continue
            cfg = yz_config(SYN_SMALL, steps=steps, init="torch_default", seeds=range(S) if kind == "seeds" else (0,))
            cfg["probes"] = {"names": [], "every": steps}
            if kind == "lrs" and S > 1:
                cfg["ensemble"] = {"lrs": [{"Y": 10 ** (2 * i / (S - 1) - 1), "Z": 10 ** (2 * i / (S - 1) - 1)}
                                           for i in range(S)]}
            for keys in modes:
                c = dict(cfg, **{k: True for k in keys})
                _loop_seconds(dict(c, optim=dict(c["optim"], steps=5)))    # warm-up (allocator, kernels)
                sec = _loop_seconds(c)
                out[f"S{S}_{kind}{_TAGS[keys]}"] = {"loop_s": sec, "member_steps_per_s": S * steps / sec}
    return out


def _jobs_training_s(sweep: Path) -> float:
    """The sweep's training loops, summed over its jobs (each job's members share its meta.json ``seconds``)."""
    total = 0.0
    for job in sorted((sweep / ".jobs").iterdir()):
        first = runs.ensemble_dirs(job)[0]
        total += runs.read_meta(first)["seconds"]["training"]
    return total


def _cpu_s(before: tuple) -> float:
    """User + system CPU seconds since ``before`` (:func:`tdyn.bench.usage`), this process and its waited-for children."""
    d = usage_delta(before, usage())
    return d["user_s"] + d["sys_s"]


@register_bench("fig6_sweep")
def _fig6_sweep(quick: bool) -> dict:
    """The Fig 6 sweep (640 runs) with ``tdyn sweep`` (batched into ensemble jobs on the local pool: 8 on the CPU,
    4 on CUDA, one per panel; the median of 3 sweeps, each into a fresh directory, 1 if ``quick`` or on CUDA) vs
    the same runs trained one at a time in this process (``quick`` and on CUDA: extrapolated from a few runs
    per job). On CUDA also the sweep with its steps replayed as CUDA graphs (``cuda_graph``), and so with its batches
    drawn on the GPU (``draw_on_device``; other random streams, so other batches than the host's). Beside each wall
    time, the CPU seconds it took (user + system, this process and its joined pool workers: ``cpu_s``): a
    machine shared with other jobs preempts the workers and inflates the walls (benchmarks/README.md, issue 35
    eighteenth session: 18-51 s walls of one code in one window), far less the CPU seconds. (The entry's
    ``usage``, which ``tdyn bench`` records for every entry, sums the sweeps and the one-at-a-time runs.)"""
    import statistics

    spec = fig6_spec(FIG6)
    spec["config"] = on_device(spec["config"])
    cuda = spec["config"]["device"] == "cuda"
    method = start_method()   # how the sweep's pool starts its workers here (forked or spawned)
    out: dict = {}
    for keys in tuple(_TAGS) if cuda else ((),):
        sp = dict(spec, config=dict(spec["config"], **{k: True for k in keys}))
        sweeps = []     # (wall seconds, workers' busy seconds, the jobs' training seconds, CPU seconds) of each sweep
        for _ in range(1 if quick or cuda else 3):
            with tempfile.TemporaryDirectory() as d:
                u0, t0 = usage(), time.perf_counter()
                run_sweep(sp, Path(d) / "sweep", progress=False, workers=1 if cuda else None)   # workers joined
                wall, cpu = time.perf_counter() - t0, _cpu_s(u0)
                sweeps.append((wall, sorted(
                    runs.read_json(Path(d) / "sweep" / runs.SWEEP)["worker_busy_seconds"].values(), reverse=True),
                    _jobs_training_s(Path(d) / "sweep"), cpu))
        batched = statistics.median(w for w, _, _, _ in sweeps)
        busy, training = next((b, t) for w, b, t, _ in sweeps if w == batched)
        tag = _TAGS[keys]
        out |= {f"batched_s{tag}": batched, f"batched_s_each{tag}": [w for w, _, _, _ in sweeps],
                f"worker_busy_s{tag}": busy, f"training_s{tag}": training, f"jobs{tag}": len(plan(load_spec(sp))),
                f"cpu_s{tag}": statistics.median(c for _, _, _, c in sweeps),
                f"cpu_s_each{tag}": [c for _, _, _, c in sweeps]}
    seq, seq_cpu, timed, total_runs = 0.0, 0.0, 0, 0
    # quick, or on a GPU (where one run is bound by kernel launches, alike across a job's members, and 640
    # of them would take minutes of a lent device): a few runs per job, extrapolated
    few = quick or cuda
    for job in plan(load_spec(spec)):
        cfg = validate_config(job.config)
        members = expand_members(cfg)
        total_runs += len(members)
        picked = members[:: max(1, len(members) // 3)] if few else members
        u0 = usage()
        t = sum(timed_train(member_config(cfg, m)) for m in picked)
        timed += len(picked)
        seq += t * len(members) / len(picked)
        seq_cpu += _cpu_s(u0) * len(members) / len(picked)
    batched = out["batched_s"]
    return {"runs": total_runs, **out, "start_method": method, "sequential_s": seq, "sequential_cpu_s": seq_cpu,
            "ratio": seq / batched, "cpu_ratio": seq_cpu / out["cpu_s"],
            "sequential_runs_timed": timed, "sequential_extrapolated": timed < total_runs,
            "under_2_min": batched < 120}
