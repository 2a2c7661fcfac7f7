"""The training step as CUDA graphs (config ``cuda_graph: true``, device cuda; issue 35 item 6).

The papers' small models are bound by kernel launches on a GPU: a Syn-Small step is ~40 tiny kernels, each
costing more to launch than to run. Here the step's loss, backward and gradient clipping are captured once as
one graph, and the optimizer's update (SGD groups, once per set of frozen parameters) as another, then
replayed each step: the same kernels on the same memory, so the same bits as the eager step (the GPU check
in benchmarks/gpu_graphs.py compares them). What stays on the host: drawing the batch (copied into the
graph's static input tensors; with ``draw_on_device`` the draw is a third graph, owning the data generators'
states), the one wait for the step's losses, the divergence rule (a step with a
non-finite loss or an inactive member takes the eager, masked update), probes and checkpoints.

Graph-safe by construction: shapes are static (a batch whose shapes or dtypes differ from the captured one
trains eagerly, said once), the parameters and optimizer state are updated in place, and the gradients are
the graph's own tensors (rebound to ``p.grad`` before each update). Not graph-safe, so refused or eager:
a task drawing random numbers on the host during its loss (``member_generators``: a graph would replay one
draw), Adam's host-side step counts (Adam groups update eagerly), and a capture that fails (e.g. a loss
that reads a value back to the host): one log line, then the eager step for the rest of the run.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

from tdyn.errors import ConfigError
from tdyn.tasks.base import leaves, stack_batches, tree_map

log = logging.getLogger(__name__)

#: threads drawing the next batch (:class:`Prefetch`): 0, in the loop's own thread right after the step's graph
#: is launched (the draw overlaps the device's work, with no thread); 1, on one background thread; more, the
#: data streams split between them. On the H200's host 0 was fastest or within 2% in 3 of 5 settings, 1 thread
#: 9% faster at 64 learning rates, 4 threads 1.7x at 64 seeds; threads contend with the loop for the GIL
#: (benchmarks/README.md#cuda-graphs)
PREFETCH_THREADS = 0
#: eager steps (on a side stream) before the capture: cuBLAS handles, autograd's accumulators and the
#: optimizer's cached device tensors exist before a graph records them (torch.cuda.graphs' rule)
WARMUP = 3


class _Replay:
    """A stand-in for a CUDA graph off a GPU (tests): the capture records the function and runs nothing (as a
    capture); each replay runs it and copies its outputs into the first replay's tensors, which stay ``out``
    (as a graph's static outputs)."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn, self.out = fn, None

    def replay(self) -> None:
        now = self.fn()
        if self.out is None:
            self.out = now
        else:
            for dst, src in zip(leaves(self.out), leaves(now)):
                dst.copy_(src)


class _CudaGraph:
    """``fn`` captured as one CUDA graph on a side stream; ``out`` its outputs (static tensors)."""

    def __init__(self, fn: Callable[[], Any], pool=None):
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = fn()

    def replay(self) -> None:
        self.graph.replay()


def _signature(batch: Any) -> tuple:
    return tuple((tuple(t.shape), t.dtype) for t in leaves(batch))


class GraphedStep:
    """A job's step as graphs: :meth:`forward_backward` (losses [S] after loss, backward, clipping, as the
    eager step leaves them) and :meth:`update` (the optimizer's). ``job`` is a :class:`tdyn.train.trainer.Job`;
    ``capture`` builds a graph from a function (default: a CUDA graph; tests pass :class:`_Replay`)."""

    def __init__(self, job, capture: Callable[[Callable[[], Any]], Any] | None = None):
        drawn = job.task.member_generators()
        if drawn:
            raise ConfigError(f"cuda_graph: task {job.cfg.task!r} draws random numbers on the host during its loss "
                              f"({', '.join(drawn)}): a graph would replay one draw; set cuda_graph=false")
        self.job = job
        self.capture = capture or _CudaGraph
        self.cuda = job.device.type == "cuda"
        self.warm = 0                     # eager steps taken so far (WARMUP before the capture)
        self.fwd = None                   # the loss/backward/clip graph
        self.static: Any = None           # its input batch
        self.sig: tuple | None = None
        self.grads: dict[str, torch.Tensor] = {}
        self.updates: dict[frozenset, Any] = {}   # frozen set -> the update graph (None: eager)
        self.off: str | None = None       # why graphs stopped (a failed capture): the eager step from then on
        self.said: set[str] = set()
        self.stream = torch.cuda.Stream() if self.cuda else None

    # ---- what the trainer calls

    def applies(self, batch: Any) -> bool:
        """Whether this step trains through the graphs (else the trainer's eager step)."""
        if self.off is not None:
            return False
        if self.sig is not None and _signature(batch) != self.sig:
            self._say("shapes", "cuda_graph: a batch's shapes differ from the captured one's; such steps train eagerly")
            return False
        return True

    def forward_backward(self, batch: Any) -> torch.Tensor:
        """Losses [S] (detached), the gradients in ``p.grad`` and clipped: the eager step's result."""
        job = self.job
        if self.fwd is None and self.warm < WARMUP:
            self.warm += 1
            with self._side():
                return self._loss_backward(batch)[0]
        if self.fwd is None:
            self.static, self.sig = tree_map(torch.clone, batch), _signature(batch)
            try:
                with self._side():
                    self.fwd = self.capture(lambda: self._loss_backward(self.static))
            except Exception as e:    # the eager step from now on: this step's gradients computed eagerly
                first = str(e).splitlines()[0] if str(e) else ""
                self._stop(f"the loss could not be captured ({type(e).__name__}: {first})")
                return self._loss_backward(batch)[0]
        else:
            for dst, src in zip(leaves(self.static), leaves(batch)):
                dst.copy_(src, non_blocking=True)
        with self._side():
            self.fwd.replay()
        losses, grads = self.fwd.out
        for n, p in job.params.items():    # the graph's gradient tensors, whatever set p.grad since
            p.grad = grads[n]
        return losses

    def update(self, frozen: set[str], active: torch.Tensor) -> None:
        """The optimizer's step, as :meth:`EnsembleOptimizer.step`; a graph where every member is active and
        every updated group is SGD, after the warm-up."""
        opt = self.job.opt
        key = frozenset(frozen)
        if self.fwd is None or not bool(active.all()) or not self._sgd(frozen):
            opt.step(frozen, active)
            return
        g = self.updates.get(key)
        if g is None and key not in self.updates:
            try:
                with self._side():
                    g = self.updates[key] = self.capture(lambda: opt.step(frozen, active))
            except Exception as e:
                self.updates[key] = None
                self._say(f"update{sorted(key)}", f"cuda_graph: the optimizer step could not be captured "
                                                  f"({type(e).__name__}); it runs eagerly")
                opt.step(frozen, active)
                return
        if g is None:
            opt.step(frozen, active)
        else:
            with self._side():
                g.replay()

    # ---- internals

    def _sgd(self, frozen: set[str]) -> bool:
        opt = self.job.opt
        return all(opt.groups[g].optimizer == "sgd" for n, g in opt.group_of.items() if n not in frozen)

    @contextlib.contextmanager
    def _side(self):
        """On a GPU, work on the side stream (captures need a non-default stream), ordered after and before
        the current stream's; elsewhere nothing."""
        if self.stream is None:
            yield
            return
        cur = torch.cuda.current_stream()
        self.stream.wait_stream(cur)
        try:
            with torch.cuda.stream(self.stream):
                yield
        finally:
            cur.wait_stream(self.stream)

    def _loss_backward(self, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The eager step's loss, backward and clipping (trainer.Job.run): the losses [S] and the gradients by
        parameter. Under the run's autocast without its weight cache (a graph must not keep a cast made in an
        earlier step); the cache never changes a value, so the eager step's bits."""
        job = self.job
        for p in job.params.values():
            p.grad = None
        with torch.enable_grad(), torch.autocast(job.device.type, dtype=getattr(torch, job.cfg.autocast or "bfloat16"),
                                                 enabled=job.cfg.autocast is not None, cache_enabled=False):
            losses = job.task.loss(batch)
        job.check_losses(losses)
        if losses.requires_grad:
            torch.where(torch.isfinite(losses.detach()), losses, torch.zeros_like(losses)).sum().backward()
            job._clip()
        return losses.detach(), {n: p.grad for n, p in job.params.items()}

    def _stop(self, why: str) -> None:
        self.off = why
        self.fwd = None
        log.warning("cuda_graph: %s; training eagerly from here", why)

    def _say(self, key: str, line: str) -> None:
        if key not in self.said:
            self.said.add(key)
            log.warning(line)


class Prefetch:
    """The next step's batch drawn while the device runs this step (with ``cuda_graph``).

    ``graph`` (generators on the GPU): the draw replayed as a CUDA graph after WARMUP eager ones (:meth:`_capture`).
    ``start()`` records every data stream's generator state, then draws the next batch (``threads`` = 0: at once,
    in this thread): the streams split into consecutive chunks, one ``task.sample_streams(chunk)`` per thread (a stream's draws depend on its generator
    alone, so the joined batch equals the one-pass draw). ``take()`` returns it. While a draw is
    pending, ``states`` are the generators' states before it: what a checkpoint of this step records, so
    resume is exact."""

    def __init__(self, task, gens: list[torch.Generator], threads: int | None = None, graph: bool = False):
        self.task, self.gens = task, gens
        # graph (generators on the GPU, config draw_on_device): after WARMUP eager draws the draw is captured as a
        # CUDA graph owning the generators' states and replayed: each replay draws what the eager draw would (the
        # same Philox offsets), into the same output tensors, ordered on the stream before the next step's use
        self.to_capture = graph
        self.graph: tuple[torch.cuda.CUDAGraph, Any] | None = None     # (the draw's graph, its output batch)
        self.drawn = 0
        n = min(len(gens), PREFETCH_THREADS if threads is None else threads)
        q, r = divmod(len(gens), max(n, 1))
        self.chunks, i = [], 0
        for j in range(max(n, 1)):
            self.chunks.append(gens[i:i + q + (j < r)])
            i += q + (j < r)
        self.pool = ThreadPoolExecutor(n, thread_name_prefix="tdyn-prefetch") if n > 0 else None
        self.pending: list | None = None
        self.futures = False           # pending holds the threads' futures
        self.states: list[torch.Tensor] | None = None

    def start(self) -> None:
        self.states = [g.get_state() for g in self.gens]
        if self.to_capture and self.drawn >= WARMUP:
            self.to_capture = False
            self._capture()
        self.drawn += 1
        self.futures = False
        if self.graph is not None:
            self.graph[0].replay()
            self.pending = [self.graph[1]]
        elif self.pool is None:
            self.pending = [self.task.sample_streams(self.gens)]
        else:
            self.pending = [self.pool.submit(self.task.sample_streams, c) for c in self.chunks]
            self.futures = True

    def _capture(self) -> None:
        """The draw as a CUDA graph (``self.graph``); where it cannot be captured, one warning and eager draws
        from then on."""
        try:
            graph = torch.cuda.CUDAGraph()
            for g in self.gens:
                graph.register_generator_state(g)
            with torch.cuda.graph(graph):
                out = self.task.sample_streams(self.gens)
            self.graph = (graph, out)
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            log.warning("cuda_graph: the batch's draw could not be captured (%s: %s); drawn eagerly",
                        type(e).__name__, first)

    def take(self) -> Any:
        parts, self.pending, self.states = self.pending, None, None
        parts = [f.result() for f in parts] if self.futures else parts
        return parts[0] if len(parts) == 1 else stack_batches(parts, torch.cat)

    def close(self) -> None:
        """Wait for a pending draw (its threads hold the generators) and stop the threads."""
        if self.pending is not None and self.futures:
            for f in self.pending:
                f.exception()
        if self.pool is not None:
            self.pool.shutdown(wait=True)
