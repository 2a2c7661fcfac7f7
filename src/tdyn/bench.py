"""``tdyn bench``: speed of the canonical settings, measured in one process (never in tests).

Each paper area registers entries with :func:`register_bench`; an entry returns a dict of numbers
(seconds, rates, ratios). ``run`` writes ``bench.json`` with machine info and prints a table.
"""

from __future__ import annotations

import importlib
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from tdyn import runs
from tdyn.config import RunConfig, load_config
from tdyn.data import scan_snap
from tdyn.data.lda import NUM_SPECIAL, LdaDataConfig
from tdyn.data.scan_snap import SYN_SMALL
from tdyn.errors import UserError
from tdyn.registry import Registry
from tdyn.tasks import PlainTask, Task, build_task
from tdyn.tasks.lda_mlm import QUICK_DATA, dataset, lda_config
from tdyn.tasks.scan_snap import yz_config
from tdyn.train.optim import EnsembleOptimizer
from tdyn.train.seeding import generator
from tdyn.train.trainer import expand_members, to_device, train

#: The bench entries of this module, by name. Entries registered next to their reproductions (in the
#: experiments layer, above this one) are named by the caller: ``run(..., modules=...)``.
BENCHES: Registry[Callable[[bool], dict]] = Registry("bench", table={
    "scan_snap_single": "tdyn.bench",
    "scan_snap_ensemble32": "tdyn.bench",
    "plain_vs_handwritten_yz": "tdyn.bench",
    "plain_vs_handwritten_topic": "tdyn.bench",
    "startup": "tdyn.bench",
    "allocation": "tdyn.bench",
})


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


# ---------------------------------------------------------------- plain module (vmap) vs hand-written axis
#
# The shipped models carry the ensemble axis by hand; ``PlainTask`` trains a module written for one
# member under vmap. The two entries below time one training step (forward, one backward, one
# optimizer step) of the same math both ways. The plain modules are written here, for one member;
# tests/test_plain_module.py checks that they compute the hand-written models' losses.


class PlainYZ(nn.Module):
    """The Y/Z model of ``tdyn.models.yz`` (parameterisation ``yz``, LN(x) = x/‖x‖, the query not a key)
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


class PlainTopicAttention(nn.Module):
    """The topic transformer of ``tdyn.models.topic`` in the E4 setting (one-hot embeddings, one layer,
    one head, trained W_Q, W_K, W_V with biases, identity decoder) for one member: tokens [B, L] ids,
    keys [B, L] visible keys, q_pos [B, n_q] query positions -> logits [B, n_q, V]. The attention in
    position form (softmax over the L keys), each projection E Wᵀ + b computed on the |V| table rows
    and then looked up, the fixed maps W_E = I and W_dec = I multiplied. The hand-written model runs
    the same math in vocabulary form (``models.topic.Input``: the score table, softmax over the ids
    with log-multiplicities, identities not multiplied), so the bench's ratio holds that algorithmic
    difference as well as vmap's."""

    def __init__(self, V: int):
        super().__init__()
        self.W_Q, self.W_K, self.W_V = nn.Linear(V, V), nn.Linear(V, V), nn.Linear(V, V)
        self.register_buffer("W_E", torch.eye(V), persistent=False)
        self.register_buffer("W_dec", torch.eye(V), persistent=False)

    def forward(self, tokens: torch.Tensor, keys: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
        rows = lambda lin: lin(self.W_E)[tokens]  # noqa: E731                  E Wᵀ + b  [B, L, V]
        Q = torch.gather(rows(self.W_Q), 1, q_pos[..., None].expand(-1, -1, self.W_E.shape[1]))
        scores = Q @ rows(self.W_K).transpose(1, 2) / math.sqrt(Q.shape[-1])     # [B, n_q, L]
        scores = scores.masked_fill(~keys[:, None, :], torch.finfo(scores.dtype).min)
        return (torch.softmax(scores, dim=-1) @ rows(self.W_V)) @ self.W_dec.T   # W_dec H


class PlainTopicTask(PlainTask):
    """Masked LM on LDA documents with :class:`PlainTopicAttention` (cross-entropy on the selected
    positions). The query positions are chosen outside vmap (their number is data-dependent), for all
    members at once, as ``TopicTransformer.data_loss`` does."""

    def __init__(self, cfg, members):
        self.data_cfg = LdaDataConfig.model_validate(cfg.data)
        self.ds = dataset(self.data_cfg)
        super().__init__(cfg, members)

    def make_model(self) -> nn.Module:
        return PlainTopicAttention(self.data_cfg.vocab_size)

    def sample(self, gen):
        return self.ds.sample(gen)

    def loss(self, batch):
        sel = batch["labels"] >= 0                                                   # [S, B, L]
        n_q = max(int(sel.sum(-1).max()), 1)
        q_pos = torch.argsort((~sel).to(torch.uint8), dim=-1, stable=True)[..., :n_q]
        return self.model.map(self.member_loss, {
            "tokens": batch["tokens"], "keys": batch["keys"], "q_pos": q_pos, "sel": torch.gather(sel, 2, q_pos),
            "y": torch.gather(batch["labels"], 2, q_pos).clamp(min=0)})

    def member_loss(self, model, b):
        per = F.cross_entropy(model(b["tokens"], b["keys"], b["q_pos"]).transpose(1, 2), b["y"], reduction="none")
        return (per * b["sel"]).sum() / b["sel"].sum().clamp(min=1)


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


def _compare(cfg: Callable[[int], dict], plain: Callable[[Any, list], PlainTask], sizes: tuple[int, ...],
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


@register_bench("plain_vs_handwritten_yz")
def _plain_yz(quick: bool) -> dict:
    """Y/Z model, Syn-Small (batch 128, length 128), S = 1 and 20 members: the hand-written ensemble
    axis (``models.yz.YZModel``) vs :class:`PlainYZ` under vmap (``PlainTask``), steps/s of one
    training step (SGD, momentum)."""
    return _compare(lambda S: yz_config(SYN_SMALL, seeds=range(S)), PlainYZTask, (1, 20), 20 if quick else 100)


@register_bench("plain_vs_handwritten_topic")
def _plain_topic(quick: bool) -> dict:
    """Topic model, E4 (topic/two-stage: trained attention and value, identity decoder), batch 40,
    S = 1 and 8 members: the hand-written axis (``models.topic.TopicTransformer``) vs
    :class:`PlainTopicAttention` under vmap, steps/s of one training step (Adam)."""
    model = {"attention": "trained", "value": "trained", "decoder": "identity", "init": "small_uniform"}
    names = [f"{w}__{k}" for w in ("W_Q", "W_K", "W_V") for k in ("weight", "bias")]
    return _compare(lambda S: lda_config(model, data=QUICK_DATA, seeds=range(S)), PlainTopicTask, (1, 8),
                    5 if quick else 25, {"all": names})


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
    out["python_import_torch_s"] = _wall_python("import torch", 1 if quick else 3)
    out["python_import_torch_gc_frozen_s"] = _wall_python("import gc, torch; gc.freeze()", 1 if quick else 3)
    return out


@register_bench("allocation")
def _allocation(quick: bool) -> dict:
    """Allocation churn: a Fig 6-sized job (Syn-Medium with 10 last tokens, M = 240, 16 members, 50
    steps, 20 if quick; one thread) trained in a child
    process with glibc's default allocator settings (``TDYN_MALLOPT=0``: every freed block above
    the mmap threshold goes back to the OS and is page-faulted in again the next step) and with
    :func:`tdyn.train.threads.tune_allocator` (the default): wall seconds, minor page faults and
    system CPU seconds of each child. (The optimizer's own temporaries live in preallocated buffers
    either way; see :class:`tdyn.train.optim.EnsembleOptimizer`.)"""
    import os
    import subprocess
    import sys

    code = ("from tdyn.bench import timed_train; from tdyn.tasks.scan_snap import yz_config; "
            "from tdyn.data.scan_snap import syn_medium; "
            f"print(timed_train(yz_config(syn_medium(10), steps={20 if quick else 50}, init='torch_default', "
            "seeds=range(16))))")
    out = {}
    for label, flag in (("glibc_default", "0"), ("tuned", "1")):
        u0 = _usage()
        r = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                           env=dict(os.environ, TDYN_MALLOPT=flag, TDYN_THREADS="1"))
        out[label] = {"train_s": float(r.stdout.split()[-1]), **_usage_delta(u0, _usage())}
    out["fault_ratio"] = out["glibc_default"]["minor_faults"] / max(1, out["tuned"]["minor_faults"])
    return out


def _wall_python(code: str, reps: int) -> float:
    import statistics
    import subprocess
    import sys

    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _usage() -> tuple:
    import resource

    return tuple(resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def _usage_delta(before: tuple, after: tuple) -> dict:
    """Page faults and CPU seconds (user, system) spent between two :func:`_usage` calls, this process
    and its (waited-for) children together: allocation churn shows up as minor faults and system time."""
    f = lambda k: sum(getattr(a, k) - getattr(b, k) for a, b in zip(after, before))  # noqa: E731
    return {"minor_faults": int(f("ru_minflt")), "user_s": f("ru_utime"), "sys_s": f("ru_stime")}


def run(out: str | Path, quick: bool = False, only: list[str] | None = None,
        modules: dict[str, str] | None = None, device: str = "cpu") -> dict:
    """Measure ``only`` (default: every entry) and write ``out``. ``modules`` names the module that
    registers each further entry (the CLI passes the experiments layer's ``BENCH_MODULES``).
    ``device="cuda"``: the training entries train on the GPU (entries that measure CPU-only work, the
    start-up and exact population computations, run as on CPU) and the reference matmul is the GPU's."""
    global DEVICE
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: CUDA is not available here")
    DEVICE = device
    for mod in dict.fromkeys((modules or {}).values()):
        importlib.import_module(mod)
    names = only or [*BENCHES.table, *(modules or {})]
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
            t0, u0 = time.perf_counter(), _usage()
            result[n] = fns[n](quick)
            result[n]["bench_wall_s"] = time.perf_counter() - t0
            result[n]["usage"] = _usage_delta(u0, _usage())
            print(f"{n:<28} " + "  ".join(f"{k}={_fmt(v)}" for k, v in result[n].items() if k != "usage"), flush=True)
    finally:
        tempfile.tempdir = old_tempdir
        shutil.rmtree(scratch, ignore_errors=True)
    runs.write_json(out, result)
    return result


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
