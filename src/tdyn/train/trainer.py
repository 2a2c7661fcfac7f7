"""The trainer: ensembles over seeds / learning rates / init scales on a leading axis, per-group
optimizers, freeze schedules, probes, atomic checkpoints, resume, divergence handling.

One *job* trains S members in one tensor program. Each member owns a run directory whose
``config.json`` trains that member alone to the same trajectory (to float tolerance), so sweeps
and analyses see one directory per run whatever the batching. A job with one member writes
straight into ``out``; with several, ``out/ensemble.json`` lists the member directories
``out/<member>/``.

A member's checkpoint holds its parameters (``param/<name>``), persistent buffers (``buffer/<name>``,
e.g. running statistics), optimizer state (``optim/...``), random streams (``rng/data`` and the task's
``member_generators()``) and array probes (``probe/...``), each without the ensemble axis.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import signal
import torch
from tqdm.auto import tqdm

import tdyn
from tdyn import native, runs
from tdyn.config import RunConfig, check_extras, load_config
from tdyn.errors import ConfigError, UserCodeError, UserError
from tdyn.probes import ProbeContext, get_probes
from tdyn.tasks import DTYPES, Member, build_task, get_task
from tdyn.tasks.base import stack_batches, tree_map
from tdyn.train.graphs import GraphedStep, Prefetch
from tdyn.train.optim import EnsembleOptimizer
from tdyn.seeding import generator
from tdyn.train.sinks import make_sinks
from tdyn.threads import release_memory, tune_allocator

_FLUSH_SECONDS = 10.0
#: Checkpoints and metrics are written behind, committed at most once per this many seconds (Job._save).
_COMMIT_SECONDS = 1.0
#: The measured scalars whose overflow (inf/NaN) is a divergence: parameter norms and update norms.
_NORMS = ("norm/", "update_norm/")
log = logging.getLogger(__name__)


def interactive() -> bool:
    """A progress bar where someone watches: a terminal, or a Jupyter kernel (tqdm.auto draws a widget)."""
    return sys.stderr.isatty() or "ipykernel" in sys.modules


class progress_bar(tqdm):
    """tdyn's progress bars: ``tqdm.auto`` without tqdm's monitor thread. tqdm starts that thread for every
    bar, a disabled one included, and it then lives as long as the process; a process with a second
    thread cannot fork its sweep workers safely, so it would spawn them (``tdyn.sweep.executors.
    start_method``: ~2 s more per pool here). The monitor only re-tunes ``miniters`` of a bar that
    stalls; tdyn's bars advance at a steady rate."""

    monitor_interval = 0


# ---------------------------------------------------------------- members and directories


def _member_grid(cfg: RunConfig):
    """Each member's (seed, learning rates by group, init scale) and what its name shows: the rates its
    ``ensemble.lrs`` entry sets (None: no ``ensemble.lrs``) and its init scale (None: no ``ensemble.init_scales``)."""
    base = {g: gc.lr for g, gc in cfg.optim.groups.items()}
    for seed in cfg.seeds:
        for lrs in cfg.ensemble.lrs or [{}]:
            for scale in cfg.ensemble.init_scales or [1.0]:
                yield seed, base | lrs, scale, (lrs if cfg.ensemble.lrs else None), (
                    scale if cfg.ensemble.init_scales else None)


def expand_members(cfg: RunConfig) -> list[Member]:
    """Members = seeds × lr sets × init scales, in that order; each named by :func:`tdyn.runs.run_name`
    (``optim.groups.Y.lr=0.001__init_scale=10__seed=0``), as a sweep names its runs."""
    members = [Member(seed, lrs, scale, runs.run_name(runs.member_axes(shown, shown_scale), seed))
               for seed, lrs, scale, shown, shown_scale in _member_grid(cfg)]
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ConfigError("seeds / ensemble.lrs / ensemble.init_scales: members repeat; each must be distinct")
    return members


def legacy_member_names(cfg: RunConfig) -> list[str]:
    """The names an older tdyn gave ``cfg``'s members (``seed0_lrY0.001_init10``), in member order: what a job
    it wrote records in its ``ensemble.json``, and what its runs' identities carry."""
    return [runs.legacy_member_name(seed, shown, shown_scale) for seed, _, _, shown, shown_scale in _member_grid(cfg)]


def recorded_members(cfg: RunConfig, members: list[Member], recorded: list[str], where: Path) -> list[Member]:
    """``members`` under the names a job's ``ensemble.json`` (``where``) records: this tdyn's, or an older tdyn's
    (:func:`legacy_member_names`; the job then continues under them, with a one-line notice, never renamed);
    any other list is a :class:`tdyn.runs.CorruptFile`."""
    if recorded == [m.name for m in members]:
        return members
    if recorded == legacy_member_names(cfg):
        global _legacy_noticed
        if not _legacy_noticed:
            _legacy_noticed = True
            log.warning("%s names its members as an older tdyn did (%s, ...): they keep those names "
                        "(new jobs name them %s, ...)", str(where), recorded[0], members[0].name)
        return [dataclasses.replace(m, name=r) for m, r in zip(members, recorded)]
    raise runs.CorruptFile(where, f"lists members {', '.join(recorded)}, but its config makes "
                                  f"{', '.join(m.name for m in members)}")


_legacy_noticed = False


def member_configs(cfg: RunConfig, members: list[Member]) -> list[dict]:
    """The configs that train each of ``members`` alone (the config is dumped once and copied as JSON:
    a pydantic dump per member would cost more than the copy)."""
    text = json.dumps(cfg.model_dump(mode="json"))
    out = []
    for m in members:
        d = json.loads(text)
        d["seeds"] = [m.seed]
        for g, lr in m.lrs.items():
            d["optim"]["groups"][g]["lr"] = lr
        d["ensemble"] = {"lrs": [], "init_scales": [m.init_scale] if cfg.ensemble.init_scales else []}
        out.append(d)
    return out


def member_config(cfg: RunConfig, m: Member) -> dict:
    """The config that trains member ``m`` alone."""
    return member_configs(cfg, [m])[0]


def member_dirs(out: Path, members: list[Member]) -> list[Path]:
    return [out] if len(members) == 1 else [out / m.name for m in members]


# ---------------------------------------------------------------- helpers


def to_device(batch: Any, device: str | torch.device) -> Any:
    """Every tensor of a batch (nested dicts, lists, tuples) on ``device``."""
    return tree_map(lambda t: t.to(device), batch)


def _select(batch: Any, index: torch.Tensor) -> Any:
    """Per-stream batches (leading axis: stream) indexed by member (``index``: each member's stream; where
    member i has stream i, the batches as they are)."""
    if torch.equal(index, torch.arange(len(index))):
        return batch
    on: dict[torch.device, torch.Tensor] = {}     # the index copied once per device, not once per tensor

    def pick(t: torch.Tensor) -> torch.Tensor:
        if t.device not in on:
            on[t.device] = index.to(t.device)
        return t.index_select(0, on[t.device])
    return tree_map(pick, batch)


class Steps:
    """A set of training steps held as arithmetic progressions (``range``) and listed steps, never
    materialised: ``every: 1`` over 10¹² steps costs nothing until iterated. ``in``, iteration in
    increasing order (each step once), ``|`` and :meth:`at_most` (an upper bound on the count)."""

    def __init__(self, ranges: tuple[range, ...] = (), listed=()):
        self.ranges = tuple(r for r in ranges if r.start < r.stop)   # not len(): a range past 2⁶³ has none
        self.listed = frozenset(listed)

    def __contains__(self, step: int) -> bool:
        return step in self.listed or any(step in r for r in self.ranges)

    def __iter__(self):
        last = None
        for s in heapq.merge(sorted(self.listed), *self.ranges):
            if s != last:
                yield s
                last = s

    def __or__(self, other: "Steps") -> "Steps":
        return Steps(self.ranges + other.ranges, self.listed | other.listed)

    def at_most(self) -> int:
        return len(self.listed) + sum(-(-(r.stop - r.start) // r.step) for r in self.ranges)


def checkpoint_schedule(cfg: RunConfig) -> Steps:
    T = cfg.optim.steps
    c = cfg.checkpoint
    steps = ({0} if c.initial else set()) | {s for s in c.steps if s < T}
    if c.schedule == "log" and T > 1:
        steps |= {min(T - 1, int(round(10 ** (i * math.log10(T - 1) / max(c.num - 1, 1))))) for i in range(c.num)}
    elif c.schedule == "linear":
        steps |= {int(round(i * T / c.num)) for i in range(c.num)}
    return Steps((range(0, T, c.every),) if c.every else (), {s for s in steps if 0 <= s < T})


def eval_steps(cfg: RunConfig) -> Steps:
    """The steps a member's metrics.jsonl has a record for: the probe grid, the listed probe steps, every
    checkpoint and the final step (a member that diverges stops at its divergence record)."""
    T = cfg.optim.steps
    grid = Steps((range(0, T, cfg.probes.every),) if cfg.probes.every else ())
    return grid | Steps((), {t for t in cfg.probes.steps if 0 <= t <= T} | {T}) | checkpoint_schedule(cfg)


#: The most checkpoints per member a config may ask for (each is a file of the member's whole state).
MAX_CHECKPOINTS = 100_000
#: What one member's parameter costs in memory, in parameter-sized tensors: the parameter, its gradient,
#: two optimizer moments (Adam's; SGD's momentum is one) and the update norms' copy.
_STATE_COPIES = 5


def available_memory(device: str) -> int:
    """Bytes free for new tensors on ``device``: MemAvailable on the host (or the free pages), the free
    memory of the current GPU."""
    if device == "cuda":
        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return ""


def check_resources(cfg: RunConfig, members: list[Member]) -> None:
    """Refuse, before anything is allocated or written, a run whose checkpoints would be too many, or
    whose model (its size per member from the task's ``size``, times the ensemble, with gradients and
    optimizer state) would not fit in the available memory: a one-line ConfigError with the estimate."""
    n_ckpt = checkpoint_schedule(cfg).at_most()
    if n_ckpt > MAX_CHECKPOINTS:
        raise ConfigError(f"checkpoint: the schedule asks for up to {n_ckpt:,} checkpoints per member (at most "
                          f"{MAX_CHECKPOINTS:,}); raise checkpoint.every or list checkpoint.steps")
    size = get_task(cfg.task).size
    if size is None:
        return
    per_member = size(cfg)
    need = per_member * len(members) * DTYPES[cfg.dtype].itemsize * _STATE_COPIES
    free = available_memory(cfg.device)
    if need > free:
        raise ConfigError(f"model too large: about {per_member:.3g} parameters per member × {len(members)} "
                          f"member(s) need an estimated {_bytes(need)} with gradients and optimizer state, but "
                          f"{_bytes(free)} of {cfg.device} memory is available; reduce the model, its vocabulary "
                          f"or the ensemble")


# ---------------------------------------------------------------- the job


def _code_of(task) -> str:
    """Whose code a task is, for a contract error: its class, module-qualified."""
    return f"{type(task).__module__}.{type(task).__qualname__}"


class Job:
    """S members trained together; see the module docstring."""

    def __init__(self, cfg: RunConfig, members: list[Member], dirs: list[Path], progress: bool = True,
                 resume_dir: Path | None = None):
        self.cfg, self.members, self.dirs, self.progress = cfg, members, dirs, progress
        self.resume_dir = resume_dir or (dirs[0] if len(dirs) == 1 else dirs[0].parent)
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise UserError("device = \"cuda\": CUDA is not available here; use device=cpu")
        self.device = torch.device(cfg.device)
        self.dtype = DTYPES[cfg.dtype]
        check_resources(cfg, members)
        check_extras(cfg)   # TensorBoard / W&B that log: asks for, before anything is written (a reproduction's jobs too)
        self.task = build_task(cfg, members)
        self.model = self.task.model.to(self.device)
        self.task.facts = self._to_device(self.task.facts)  # probes compare facts with parameters
        self.params = dict(self.model.named_parameters())
        # persistent buffers (running statistics) are per member state, checkpointed like parameters
        saved = self.model.state_dict(keep_vars=True)
        self.buffers = {n: b for n, b in self.model.named_buffers() if n in saved}
        S = len(members)
        for kind, tensors in (("parameter", self.params), ("buffer", self.buffers)):
            for n, p in tensors.items():
                if p.shape[:1] != (S,):
                    raise UserCodeError(f"task {cfg.task!r} ({_code_of(self.task)}): {kind} {n!r} has shape "
                                        f"{tuple(p.shape)}, without the ensemble axis of size {S} first (a model "
                                        f"written for one member trains through tdyn.tasks.PlainTask)")
        lrs = {g: torch.tensor([m.lrs[g] for m in members], dtype=torch.float64) for g in cfg.optim.groups}
        self.opt = EnsembleOptimizer(self.params, cfg.optim.groups, lrs, self.task.grad_rows, cfg.optim.steps)
        loose = set(self.params) - set(self.opt.group_of)
        if loose:
            raise ConfigError(f"optim.groups: parameter {sorted(loose)[0]!r} is in no group; "
                              f"parameters: {', '.join(self.params)}")
        for p in cfg.optim.freeze:
            if p not in self.params:
                raise ConfigError(f"optim.freeze: unknown parameter {p!r}; allowed: {', '.join(self.params)}")
        self.probes = get_probes(cfg.probes.names)
        # Data streams: members sharing a seed share a stream (and its batches).
        seeds = sorted({m.seed for m in members})
        self.stream_seeds = seeds
        self.stream_of = torch.tensor([seeds.index(m.seed) for m in members])
        if cfg.draw_on_device and not self.task.draws_on_device:
            raise ConfigError(f"draw_on_device = true: task {cfg.task!r} ({_code_of(self.task)}) draws its batches "
                              f"on the host only; set draw_on_device=false")
        self.gens = [generator(s, "data", self.device if cfg.draw_on_device else "cpu") for s in seeds]
        probe = stack_batches([self.task.probe_batch(generator(s, "probe")) for s in seeds])
        self.probe_batch = self._to_device(_select(probe, self.stream_of))
        self.active = torch.ones(S, dtype=torch.bool)
        self.records: list[list[dict]] = [[] for _ in members]
        self.ckpt_steps = checkpoint_schedule(cfg)
        self.eval_steps = eval_steps(cfg)
        self._stop = False
        self.writes = runs.GroupCommit(_COMMIT_SECONDS)       # checkpoints and metrics, written behind
        # each member's identity, written into its meta.json, checkpoints and metrics (computed once here;
        # resume sets those its run directories recorded: None for a run written before identities)
        self.member_cfgs = member_configs(cfg, members)
        self.identities: list[str | None] = [runs.make_identity(c, m.name) for m, c in zip(members, self.member_cfgs)]
        self._metrics = [runs.MetricsLines(ident) for ident in self.identities]
        self._off_schedule: list[tuple[Path, int]] | None = None   # an interrupted run's checkpoints, to remove
        self.graphed = None      # the step as CUDA graphs (config cuda_graph), the next batch drawn meanwhile
        self.prefetch = None
        if cfg.cuda_graph:
            self.graphed = GraphedStep(self)
        self._last_flush = time.monotonic()

    # ---- state

    def _to_device(self, batch):
        return to_device(batch, self.device)

    def _sample(self):
        drawn = self.prefetch.take() if self.prefetch is not None and self.prefetch.pending is not None \
            else self.task.sample_streams(self.gens)
        return self._to_device(_select(drawn, self.stream_of))

    def _data_state(self, stream: int) -> torch.Tensor:
        """Data stream ``stream``'s generator state at this step (before a prefetched draw of the next batch)."""
        pre = self.prefetch.states if self.prefetch is not None else None
        return pre[stream] if pre is not None else self.gens[stream].get_state()

    def _member_state(self, i: int, probes: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        t = {f"param/{n}": p.detach()[i] for n, p in self.params.items()}
        t |= {f"buffer/{n}": b[i] for n, b in self.buffers.items()}
        t |= {f"optim/{k}": v[i] for k, v in self.opt.state.items()}
        t["rng/data"] = self._data_state(int(self.stream_of[i]))
        t |= {f"rng/{k}": gens[i].get_state() for k, gens in self.task.member_generators().items()}
        t |= {f"probe/{k}": v[i] for k, v in probes.items()}
        return t

    def _check_member_state(self, i: int, ckpt: dict[str, torch.Tensor], path: Path) -> None:
        """``ckpt`` (read from ``path``) holds every tensor member ``i``'s state needs, shaped as here."""
        live = self._member_state(i, {})
        for k, ref in live.items():
            t = ckpt.get(k)
            if t is None:
                raise runs.CorruptFile(path, f"lacks {k!r}: not a checkpoint of this run's model")
            if t.shape != ref.shape or t.dtype != ref.dtype:
                raise runs.CorruptFile(path, f"holds {k!r} as {t.dtype} {list(t.shape)}, but this run's "
                                             f"model needs {ref.dtype} {list(ref.shape)}")

    def _load_member_state(self, i: int, ckpt: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, p in self.params.items():
                p[i].copy_(ckpt[f"param/{n}"])
            for n, b in self.buffers.items():
                b[i].copy_(ckpt[f"buffer/{n}"])
            for k, v in self.opt.state.items():
                v[i].copy_(ckpt[f"optim/{k}"])
        self.gens[int(self.stream_of[i])].set_state(ckpt["rng/data"])
        for k, gens in self.task.member_generators().items():
            gens[i].set_state(ckpt[f"rng/{k}"])

    def _save(self, step: int | str, probes: dict[str, torch.Tensor], interrupt: bool = False) -> None:
        """Every active member's checkpoint at ``step``. ``interrupt``: one off the schedule, for resuming;
        the first scheduled (or final) checkpoint after it removes it, so a resumed run's directory holds
        the checkpoints of the uninterrupted run (analyses list a run's checkpoint steps).

        Written behind (``self.writes``, a :class:`tdyn.runs.GroupCommit`): each checkpoint goes to a temp
        file now, and at most once per ``_COMMIT_SECONDS`` one flush makes every pending checkpoint and
        metrics file durable and then renames them into place, metrics first. A file thus appears under
        its name only once it is whole on disk: a kill never leaves a half-written file trusted, it loses
        at most the last window's checkpoints (temp files, removed on resume), and resume is exact from the
        newest committed one. A status change commits everything first (:meth:`_set_status`)."""
        meta = {"step": str(self.cfg.optim.steps if step == "final" else step)}
        for i, d in enumerate(self.dirs):
            if self.active[i]:
                ident = self.identities[i]
                self.writes.write(*runs.checkpoint_file(d, step, self._member_state(i, probes),
                                                        meta | {runs.IDENTITY: ident} if ident else meta))
        if not interrupt:
            if self._off_schedule is None:   # listed once: an interrupted save ends its run, so no more appear
                self._off_schedule = [(d, s) for d in self.dirs for s in runs.checkpoint_steps(d)
                                      if s not in self.ckpt_steps]
            for d, s in self._off_schedule:
                if step == "final" or s < step:
                    self.writes.remove(runs.checkpoint_path(d, s))   # once the checkpoints after it are in place
            self._off_schedule = [(d, s) for d, s in self._off_schedule if step != "final" and s >= step]
        if self.writes.due():
            self.writes.commit()

    def _flush(self) -> None:
        """Every member's metrics.jsonl, written behind: committed with the checkpoints (:meth:`_save`),
        with a status (:meth:`_set_status`), or at once by the periodic flush between checkpoints."""
        for d, rec, lines in zip(self.dirs, self.records, self._metrics):   # encoded by the commit, once
            self.writes.write(d / runs.METRICS, lambda d=d, rec=rec, lines=lines: lines.file(d, rec)[1])
        log.debug("metrics flushed (%d member(s))", len(self.dirs))
        self._last_flush = time.monotonic()

    def _set_status(self, members: list[int], status: str, message: str | None = None) -> None:
        """Members' meta.json: ``status`` (and ``message``), written together, after every pending
        checkpoint and metrics file is committed (a status never runs ahead of the files it speaks for)."""
        def meta(i: int) -> tuple[Path, bytes]:
            m = runs.read_meta(self.dirs[i]) | {"status": status, "message": message}
            if status != "running":
                m["ended"] = runs.now()
                m["seconds"] = self._spent(m.get("seconds"))
            return runs.json_file(self.dirs[i] / runs.META, m)
        t = time.perf_counter()
        self.writes.commit()
        if hasattr(self, "_seconds"):
            self._seconds["checkpoints"] += time.perf_counter() - t
        runs.atomic_write_many(meta(i) for i in members)

    def _spent(self, before) -> dict[str, float]:
        """The job's wall seconds in :meth:`run` (its members share them), split into probes (``_measure``),
        checkpoints (their writes, the final one included, the metrics flushed with them and the commits that
        make them durable) and the rest (training: sampling, the loss, backward, the optimizer, the loop); added
        to ``before``, a resumed run's earlier seconds."""
        if not hasattr(self, "_started"):
            return before
        wall = time.perf_counter() - self._started
        now = {"wall": wall, "probes": self._seconds["probes"], "checkpoints": self._seconds["checkpoints"],
               "training": wall - self._seconds["probes"] - self._seconds["checkpoints"]}
        if isinstance(before, dict) and all(isinstance(before.get(k), (int, float)) for k in now):
            now = {k: before[k] + v for k, v in now.items()}
        return {k: round(v, 3) for k, v in now.items()}

    # ---- measurements

    @torch.no_grad()
    def _measure(self, step: int, batch_probe) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Every probe at ``step``, with the model in eval mode (dropout off, running statistics such as
        BatchNorm's not updated) and back in its mode after: a probe that runs the forward pass leaves
        the training, its random streams and its checkpoints as they would be without it (docs/library.md)."""
        scalars, arrays = {}, {}
        shared: dict[str, Any] = {}     # one evaluation's statistics shared by its probes (ProbeContext.once)
        was = self.model.training
        self.model.eval()
        try:
            for name, fn in self.probes.items():
                ctx = ProbeContext(self.model, self.task, batch_probe, step, self.cfg.probes.options.get(name, {}),
                                   shared, self.records)
                for k, v in fn(ctx).items():
                    key = f"{name}/{k}"
                    (scalars if v.dim() == 1 else arrays)[key] = v.detach()
        finally:
            self.model.train(was)
        S = len(self.members)
        for n, p in self.params.items():
            scalars[f"norm/{n}"] = p.detach().reshape(S, -1).norm(dim=1)
        return scalars, arrays

    def check_losses(self, losses: torch.Tensor) -> None:
        """The task's ``loss()`` returned one loss per member."""
        S = len(self.members)
        if losses.shape != (S,):
            raise UserCodeError(f"task {self.cfg.task!r} ({_code_of(self.task)}): loss() must return one "
                                f"loss per member, shape [{S}], got {tuple(losses.shape)}")

    def _last_good(self, step: int) -> str:
        """Where a member whose state at ``step`` is the first bad one can be taken up again: its newest
        checkpoint before ``step``."""
        good = list(itertools.takewhile(lambda s: s < step, self.ckpt_steps))
        if not good:
            return "no good checkpoint exists (it diverges from its initial state: lower the learning rates or " \
                   "the init scale)"
        return f"last good checkpoint: step {good[-1]}"

    def _clip(self) -> None:
        clip = self.cfg.optim.grad_clip
        if clip is None:
            return
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        S = len(self.members)
        total = torch.stack([g.reshape(S, -1).pow(2).sum(1) for g in grads]).sum(0).sqrt()
        coef = (clip / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.view((-1,) + (1,) * (g.dim() - 1)).to(g))

    # ---- the loop

    def _request_stop(self, *_):
        self._stop = True

    def run(self, start: int = 0) -> None:
        tune_allocator()
        self._started = time.perf_counter()
        self._seconds = {"probes": 0.0, "checkpoints": 0.0}
        if self.graphed is not None:
            self.prefetch = Prefetch(self.task, self.gens, graph=self.cfg.draw_on_device)
        T = self.cfg.optim.steps
        S = len(self.members)
        self._last_flush = time.monotonic()
        old_handler = None
        try:
            if signal.getsignal(signal.SIGINT) is not stop_all:   # a sweep worker's handler stops this run too
                old_handler = signal.signal(signal.SIGINT, self._request_stop)
        except ValueError:  # not the main thread
            pass
        bar = progress_bar(total=T, initial=start, desc=self.cfg.task, unit="step", leave=False,
                   disable=not (self.progress and interactive()))
        sinks = make_sinks(self.cfg, self.dirs, [m.name for m in self.members],
                           member_configs(self.cfg, self.members) if self.cfg.log.wandb else [], start)
        log.info("training %s: %d member(s), steps %d..%d", self.cfg.task, S, start, T)
        try:
            for step in range(start, T + 1):
                if (self._stop or _STOP) and step < T:
                    self._flush()
                    self._save(step, {}, interrupt=True)
                    self._set_status([i for i in range(S) if self.active[i]], "interrupted",
                                     f"interrupted at step {step}; continue with: tdyn run --resume {self.resume_dir}")
                    raise KeyboardInterrupt
                evaluating = step in self.eval_steps
                t0 = time.perf_counter()
                scalars, arrays = self._measure(step, self.probe_batch) if evaluating else ({}, {})
                t1 = time.perf_counter()
                if step in self.ckpt_steps:
                    self._flush()  # metrics first: a checkpoint at t implies metrics for every step < t
                    self._save(step, arrays)
                self._seconds["probes"] += t1 - t0
                self._seconds["checkpoints"] += time.perf_counter() - t1
                batch = self._sample()
                frozen = {n for n, r in self.cfg.optim.freeze.items() if r.frozen(step)}
                self.opt.set_step(step)
                if evaluating:
                    scalars |= {f"lr/{g}": r for g, r in self.opt.rates().items()}
                last = step == T
                trains = not last and len(frozen) < len(self.params)
                graphed = trains and self.graphed is not None and self.graphed.applies(batch)
                if graphed:     # loss, backward and clipping replayed as a CUDA graph (tdyn.train.graphs)
                    losses = self.graphed.forward_backward(batch)
                    if self.prefetch is not None and step < T:
                        self.prefetch.start()    # the next batch, drawn while the device runs this step
                else:
                    with torch.set_grad_enabled(trains), \
                            torch.autocast(self.device.type, dtype=getattr(torch, self.cfg.autocast or "bfloat16"),
                                           enabled=self.cfg.autocast is not None):
                        losses = self.task.loss(batch)
                    self.check_losses(losses)
                host_losses = losses.detach().cpu()           # the step's one wait for a GPU's losses
                finite = torch.isfinite(host_losses)
                newly = self.active & ~finite
                before = {n: p.detach().clone() for n, p in self.params.items()} if evaluating and not last else None
                if graphed:
                    self.graphed.update(frozen, self.active & finite)
                elif not last and losses.requires_grad:
                    for p in self.params.values():
                        p.grad = None
                    torch.where(torch.isfinite(losses.detach()), losses, torch.zeros_like(losses)).sum().backward()
                    self._clip()
                    self.opt.step(frozen, self.active & finite)
                loss_vals = host_losses.tolist()
                if before is not None:
                    for n, p in self.params.items():
                        scalars[f"update_norm/{n}"] = (p.detach() - before[n]).reshape(S, -1).norm(dim=1)
                raw = {k: v.cpu().tolist() for k, v in scalars.items()}
                active = self.active.tolist()     # Python lists: cheaper than S tensor indexings per step
                # member -> (what diverged, whether the state at this step is still good: an update's overflow)
                why = {i: (f"loss = {loss_vals[i]}", False) for i, n in enumerate(newly.tolist()) if n}
                for k, v in raw.items():   # parameters or updates overflowing: diverged, even at a finite loss
                    if k.startswith(_NORMS):
                        for i, x in enumerate(v):
                            if active[i] and not math.isfinite(x) and (i not in why or why[i][1]):
                                why[i] = (f"{k} = {x}", k.startswith("update_norm/"))
                newly = torch.tensor([i in why for i in range(S)], dtype=torch.bool)
                sc = {k: [x if math.isfinite(x) else None for x in v] for k, v in raw.items()}
                for i in range(S) if why or evaluating else ():
                    if i in why:
                        self.records[i].append({"step": step, "loss": None, "diverged": True})
                        self._flush()   # the divergence record on disk before meta.json says diverged (a kill between)
                        self._set_status([i], "diverged", f"diverged at step {step}: {why[i][0]}; "
                                                          f"{self._last_good(step + why[i][1])}")
                    elif active[i] and evaluating:
                        self.records[i].append({"step": step, "loss": loss_vals[i]} | {k: v[i] for k, v in sc.items()})
                        for sink in sinks:
                            sink.log(i, self.records[i][-1])
                if evaluating and not bar.disable:
                    good = [x for x, a in zip(loss_vals, active) if a and math.isfinite(x)]
                    if good:
                        bar.set_postfix(loss=f"{min(good):.4g}" + (f"..{max(good):.4g}" if len(good) > 1 else ""),
                                        refresh=False)
                self.active &= ~newly
                if not self.active.any():
                    break
                t1 = time.perf_counter()
                if last:
                    self._save("final", arrays)
                elif time.monotonic() - self._last_flush > _FLUSH_SECONDS:
                    self._flush()
                    self.writes.commit()
                self._seconds["checkpoints"] += time.perf_counter() - t1
                bar.update(1)
            self._flush()
            self._set_status([i for i in range(S) if self.active[i]], "finished")
        finally:
            bar.close()
            if self.prefetch is not None:
                self.prefetch.close()
                self.prefetch = None
            for sink in sinks:
                sink.close()
            if old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
            release_memory()      # the steps' freed blocks, kept for reuse while training, back to the OS


# ---------------------------------------------------------------- stopping a whole process


_STOP = False   # set by stop_all(): every training in this process stops at its next step


def stop_all(*_) -> None:
    """Ask every training in this process, running or started later, to stop at its next step (an
    interrupt checkpoint, status "interrupted", KeyboardInterrupt): a sweep worker's SIGINT handler, so
    that after Ctrl-C the job it runs and the jobs already handed to it end at once."""
    global _STOP
    _STOP = True


# ---------------------------------------------------------------- entry points


def _prepare_out(out: Path, force: bool, locks: runs.Locks) -> None:
    runs.prepare_dir(out, force, clear=True, hint=" or --resume to continue it", locks=locks)


MANIFEST = runs.ENSEMBLE  # kept for callers of trainer.MANIFEST


def train(cfg: RunConfig | dict, out: str | Path, *, dirs: list[Path] | None = None, force: bool = False,
          progress: bool = True) -> list[Path]:
    """Train every member of ``cfg``; return the member run directories.

    By default members go to ``out`` (one member) or ``out/<member>/``; ``dirs`` places them
    anywhere (one per member, in member order: seeds × lr sets × init scales), with the job's
    manifest ``out/ensemble.json`` pointing at them (sweeps use this). ``out`` and every member
    directory are locked while the job trains (:class:`tdyn.runs.Locks`).
    """
    if not isinstance(cfg, RunConfig):
        cfg = load_config(cfg)
    out = Path(out)
    members = expand_members(cfg)
    explicit = dirs is not None
    dirs = [Path(d) for d in dirs] if explicit else member_dirs(out, members)
    if len(dirs) != len(members):
        raise UserError(f"{len(members)} members but {len(dirs)} run directories")
    if explicit:
        real = [os.path.realpath(d) for d in dirs]
        if len(set(real)) < len(real):
            same = next(d for d, r in zip(dirs, real) if real.count(r) > 1)
            raise UserError(f"dirs: {str(same)!r} is given to two members (one member per run directory)")
        given = dict(zip(real, dirs))   # a member inside another's directory: --force of the outer deletes it
        for r, d in zip(real, dirs):
            up, parent = r, os.path.dirname(r)
            while parent != up:
                up, parent = parent, os.path.dirname(parent)
                if up in given:
                    raise UserError(f"dirs: {str(d)!r} is inside {str(given[up])!r}, another member's run directory "
                                    f"(give each member a directory of its own, none inside another)")
    job = Job(cfg, members, dirs, progress, out)  # builds (and validates) before anything is written
    configs, idents = job.member_cfgs, job.identities
    with runs.Locks() as locks:
        if explicit:
            locks.acquire(out)
        for d in ([out] if not explicit else []) + (dirs if explicit else []):
            _prepare_out(d, force, locks)
        for d in dirs:
            if not locks.holds(d):
                locks.acquire(d)
        def files():   # the manifest, then each member's config and meta, written as one batch
            if explicit or len(members) > 1:
                yield runs.json_file(out / MANIFEST, {"config": cfg.model_dump(mode="json"),
                                                      "members": [m.name for m in members],
                                                      "dirs": [os.path.relpath(d, out) for d in dirs],
                                                      "identities": idents})
            for m, d, c, ident in zip(members, dirs, configs, idents):
                yield runs.json_file(d / runs.CONFIG, c)
                yield runs.json_file(d / runs.META, {
                    "tdyn_version": tdyn.__version__, "torch_version": torch.__version__,
                    "git_commit": runs.git_commit(), "native": native.status(), "identity": ident, "seed": m.seed,
                    "member": m.name, "lrs": m.lrs,
                    "init_scale": m.init_scale, "started": runs.now(), "ended": None, "status": "running",
                    "message": None})
        runs.atomic_write_many(files())
        _run_guarded(job, 0)
    return dirs


def _run_guarded(job: Job, start: int) -> None:
    try:
        job.run(start)
    except KeyboardInterrupt:
        try:                   # what is written behind is whole: kept (a kill, unlike this, loses it)
            job.writes.commit()
        except OSError as e:
            log.warning("could not commit the checkpoints of the interrupted job %s: %s", job.resume_dir, e)
        raise
    except Exception as e:
        try:                   # the records up to the failure are kept (best effort: the error is what matters)
            job._flush()
        except Exception:
            log.warning("could not write the metrics of the failed job %s", job.resume_dir)
        running = []
        for i, d in enumerate(job.dirs):
            try:
                if runs.read_meta(d)["status"] == "running":
                    running.append(i)
            except runs.CorruptFile:   # unreadable meta.json: left as it is, the others are marked
                pass
        job._set_status(running, "failed", f"{type(e).__name__}: {e}")
        raise


def check_done(run_dir: str | Path, cfg: RunConfig, status: str, *, tensors: bool = True) -> None:
    """A member whose meta.json says ``finished`` or ``diverged`` has the files of that result: no
    checkpoint at or past the config's last step, one metrics record per evaluated step (up to the
    divergence record), and for a finished run ``final.safetensors`` of the last step, intact. Anything
    else is a :class:`tdyn.runs.CorruptFile` naming the file, never a result. ``tensors=False`` reads
    only the final checkpoint's header (:func:`tdyn.runs.read_checkpoint_metadata`), not its tensors and
    their checksum: for runs whose files were verified or written moments before (a sweep job's check
    after training), which the page cache would return as they were."""
    d = Path(run_dir)
    T = cfg.optim.steps
    ident = runs.run_identity(d)   # its config.json is the one it trained with; each file below is its own
    ahead = [s for s in runs.checkpoint_steps(d) if s >= T]
    if ahead:
        raise runs.CorruptFile(d / runs.CONFIG, f"trains {T} steps, but {runs.CKPT_DIR}/ holds step {ahead[-1]}: "
                                                f"the config does not belong to these checkpoints")
    recs, problem = runs.scan_metrics(d, ident)
    if problem is not None:
        recs = runs.read_metrics(d)   # raises it (or, for a run with nothing written, no records)
    wanted = iter(eval_steps(cfg))
    have = [r["step"] for r in recs]
    if status == "diverged":
        if not recs or recs[-1].get("diverged") is not True:
            raise runs.CorruptFile(d / runs.METRICS, f"does not end with the divergence record its {runs.META} "
                                                     f"reports (status diverged)")
        wanted = itertools.chain(itertools.takewhile(lambda s: s < have[-1], wanted), have[-1:])
    want = list(itertools.islice(wanted, len(have) + 1))   # never more than the file could match
    if have != want:
        missing = sorted(set(want) - set(have))
        count = len(want) if len(want) <= len(have) else f"more than {len(have)}"
        raise runs.CorruptFile(d / runs.METRICS, f"holds {len(have)} records, not one per evaluated step ({count})"
                               + (f": step {missing[0]} is missing" if missing else "")
                               + f"; the run is not {status}")
    if status == "finished":
        final = runs.checkpoint_path(d, "final")
        if not final.exists():
            raise runs.CorruptFile(final, f"is missing, but {runs.META} says the run is finished")
        meta = runs.read_checkpoint(final)[1] if tensors else runs.read_checkpoint_metadata(final)
        runs.check_identity(final, meta, d, ident)
        runs.check_final_step(final, meta, d, steps=T)


def verified_status(run_dir: str | Path, *, tensors: bool = True) -> str:
    """A run's status, checked against its files when it claims a result (:func:`check_done`)."""
    status = runs.read_meta(run_dir)["status"]
    if status in runs.DONE:
        check_done(run_dir, runs.load_run_config(run_dir), status, tensors=tensors)
    return status


def same_job(cfg: RunConfig, out: str | Path) -> bool:
    """Whether ``out`` holds a job (ensemble or single run) started from exactly ``cfg`` (a damaged
    manifest or config is not the same job)."""
    out = Path(out)

    def same(raw) -> bool:   # compared after validation: keys added to the config format since get their defaults
        try:
            return load_config(raw).model_dump(mode="json") == want
        except UserError:
            return False

    try:
        if (out / MANIFEST).exists():
            want = cfg.model_dump(mode="json")
            return same(runs.read_ensemble(out)["config"])
        members = expand_members(cfg)
        if len(members) != 1 or not runs.is_run_dir(out):
            return False
        want = load_config(member_config(cfg, members[0])).model_dump(mode="json")
        return same(runs.read_config(out))
    except runs.CorruptFile:
        return False


def train_or_resume(cfg: RunConfig | dict, out: str | Path, *, dirs: list[Path] | None = None,
                    progress: bool = True) -> list[Path]:
    """Continue the job in ``out`` if it was started from this very config (finished members are kept,
    unfinished ones resume from their newest intact common checkpoint), else train it afresh, replacing
    its run directories (``dirs`` as for :func:`train`): also when its files are damaged beyond
    resuming (the repair). What ``reproduce --resume`` and every sweep job use."""
    if not isinstance(cfg, RunConfig):
        cfg = load_config(cfg)
    if same_job(cfg, out):
        try:
            return resume(out, progress=progress)
        except (runs.LockError, runs.ForeignFile):   # another's lock; another run's file: never trained over
            raise
        except UserError as e:   # nothing to resume from, or damaged: train it again
            (log.warning if isinstance(e, runs.CorruptFile) else log.info)("%s: %s; training it again", out, e)
    return train(cfg, out, dirs=dirs, force=True, progress=progress)


def resume(out: str | Path, *, progress: bool = True) -> list[Path]:
    """Continue a job from the newest checkpoint that is intact and common to all its unfinished members.

    Its files are checked first: finished and diverged members must hold their result
    (:func:`check_done`), an ensemble's member configs must match its manifest, and no checkpoint may lie
    at or past the last step. A checkpoint that fails its checksum (or is unreadable), or whose
    metrics are not intact up to it, is passed over for an older one, the metrics cut to match; with none
    left it is a :class:`tdyn.runs.CorruptFile` naming the newest. The job's directories are locked."""
    out = Path(out)
    manifest = (out / MANIFEST).exists()
    if not manifest and not runs.is_run_dir(out):
        raise UserError(f"{str(out)!r} is not a run directory (no {runs.CONFIG}/{runs.META} or {runs.ENSEMBLE})")
    with runs.Locks() as locks:
        locks.acquire(out)
        if manifest:
            ens = runs.read_ensemble(out)
            cfg_path = out / MANIFEST
            cfg = runs.config_from(ens["config"], cfg_path)
            dirs = runs.ensemble_dirs(out)
        else:
            cfg_path = out / runs.CONFIG
            cfg = runs.load_run_config(out)
            dirs = [out]
        members = expand_members(cfg)
        if manifest:   # an older tdyn's job continues under the names it recorded
            members = recorded_members(cfg, members, ens["members"], cfg_path)
        member_runs = [runs.Run(d) for d in dirs]
        for d in dirs:
            if not locks.holds(d):
                locks.acquire(d)
        statuses = [r.status for r in member_runs]
        if manifest:
            for m, d in zip(members, dirs):
                if runs.load_run_config(d).model_dump(mode="json") != load_config(member_config(cfg, m)).model_dump(mode="json"):
                    raise runs.CorruptFile(d / runs.CONFIG, f"is not member {m.name}'s config in {str(cfg_path)!r}")
        for d, s in zip(dirs, statuses):
            if s in runs.DONE:
                check_done(d, cfg, s)
        todo = [i for i, s in enumerate(statuses) if s not in runs.DONE]
        if not todo:
            return dirs
        T = cfg.optim.steps
        for i in todo:
            ahead = [s for s in member_runs[i].steps() if s >= T]
            if ahead:
                where = f"{dirs[i].name}/{runs.CKPT_DIR}/" if manifest else f"{runs.CKPT_DIR}/"
                raise runs.CorruptFile(cfg_path, f"trains {T} steps, but {where} holds step {ahead[-1]}: the config "
                                                 f"does not belong to these checkpoints")
        common = set.intersection(*(set(member_runs[i].steps()) for i in todo))
        if not common:
            raise UserError(f"{str(out)!r} has no checkpoint to resume from; start it again with --force")
        for i in todo:
            if not (dirs[i] / runs.METRICS).exists():
                raise runs.CorruptFile(dirs[i] / runs.METRICS, "is missing, but the run has checkpoints: it cannot be "
                                                               "resumed; start it again with --force")
        job = Job(cfg, members, dirs, progress, out)
        job.identities = [r.identity for r in member_runs]   # what each run recorded (None: an older tdyn's run)
        job._metrics = [runs.MetricsLines(ident) for ident in job.identities]
        for i in todo:   # every checkpoint the resumed run will keep is its own (headers only; damage: passed over below)
            for s in member_runs[i].steps():
                path = runs.checkpoint_path(dirs[i], s)
                try:
                    meta = runs.read_checkpoint_metadata(path)
                except runs.CorruptFile:
                    continue
                runs.check_identity(path, meta, dirs[i], job.identities[i])
        step, states, records, passed = _resume_point(job, todo, sorted(common, reverse=True))
        if passed:
            log.warning("resuming %s from step %d: passed over %d newer checkpoint(s) (a damaged checkpoint or "
                        "metrics line): %s", out, step, len(passed), passed[0])
        for d in dirs:  # temporary files left by a kill mid-write (never another live writer's)
            runs.remove_stale_temps(d)
        for i, (d, run) in enumerate(zip(dirs, member_runs)):
            if i in todo:
                job._load_member_state(i, states[i])
                job.records[i] = records[i]
                meta = run.meta
                meta.setdefault("resumed", []).append({"at": runs.now(), "from_step": step}
                                                      | ({"passed_over": passed} if passed else {}))
                meta["status"], meta["message"] = "running", None
                runs.write_json(d / runs.META, meta)
            else:
                job.active[i] = False
                job.records[i] = run.metrics
        _run_guarded(job, step)
    return dirs


def _resume_point(job: Job, todo: list[int], candidates: list[int]):
    """The newest of ``candidates`` (checkpoint steps, newest first) at which every unfinished member's
    checkpoint is intact and its metrics hold exactly the records of the evaluated steps before it:
    (step, states, records cut to it, the problems passed over)."""
    evals = list(itertools.takewhile(lambda s: s < candidates[0], job.eval_steps))
    scans = {i: runs.scan_metrics(job.dirs[i], job.identities[i]) for i in todo}
    for i in todo:   # another run's metrics: never resumed from, whichever checkpoint
        if isinstance(scans[i][1], runs.ForeignFile):
            raise scans[i][1]
    passed: list[runs.CorruptFile] = []
    for c in candidates:
        want = [s for s in evals if s < c]
        states, records = {}, {}
        try:
            for i in todo:
                recs, problem = scans[i]
                keep = [r for r in recs if r["step"] < c]
                if [r["step"] for r in keep] != want:
                    raise problem or runs.CorruptFile(job.dirs[i] / runs.METRICS,
                                                      f"lacks records before step {c} ({len(keep)} of {len(want)})")
                path = runs.checkpoint_path(job.dirs[i], c)
                states[i] = runs.load_checkpoint(job.dirs[i], c, job.identities[i])
                job._check_member_state(i, states[i], path)
                records[i] = keep
        except runs.ForeignFile:   # another run's checkpoint: resuming from it, or past it, is not this run
            raise
        except runs.CorruptFile as e:
            passed.append(e)
            continue
        return c, states, records, [str(e) for e in passed]
    first = passed[0]
    more = f" (and {len(passed) - 1} older checkpoint(s) unusable)" if len(passed) > 1 else ""
    raise runs.CorruptFile(first.path, f"{first.problem}{more}; no intact checkpoint to resume from — start it "
                                       f"again with --force")
