"""Decision lists: the benchmark entries (``tdyn bench``; results and history in benchmarks/README.md): the
exact population gradient, the per-query Hessian blocks of the λ_max probe, one step of claim2's largest job in
token space against the model's path, the reduced W-only flow, claim1's data at its largest L, and
``decision-list/claim1`` end to end."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import torch

from tdyn.bench import register_bench
from tdyn.bench import seconds
from tdyn.papers.decision_list import data as dl
from tdyn.papers.decision_list import kernels
from tdyn.papers.decision_list import theory as th
from tdyn.papers.decision_list.model import DecisionListModel, DecisionListModelConfig
from tdyn.reproduce.registry import ReproduceContext, get
from tdyn.sweep.executors import default_workers, start_method


def _pop_grad_bench(L: int, n: int, sampler: str) -> dict:
    task = dl.make_task(L, 3, seed=0)
    types = th.enumerate_types(task, n, sampler)
    model = DecisionListModel(DecisionListModelConfig(L))
    with torch.no_grad():
        model.W.normal_(generator=torch.Generator().manual_seed(0))
        model.V.copy_(10 * task.P)
    th.population_loss(model, task, types, backward=True)  # warm-up
    t0 = time.perf_counter()
    th.population_loss(model, task, types, backward=True)
    return {"types": len(types), "seconds": time.perf_counter() - t0}


@register_bench("decision_list_popgrad_L32_n4")
def _b1(quick: bool) -> dict:
    """One exact population loss + gradient, sampler B, (L, n) = (32, 4): 35,960 sets."""
    return _pop_grad_bench(32, 4, "B")


@register_bench("decision_list_popgrad_L16_n5")
def _b2(quick: bool) -> dict:
    """One exact population loss + gradient, sampler A, (L, n) = (16, 5): 15,504 multisets."""
    return _pop_grad_bench(16, 5, "A")


@register_bench("decision_list_hessian_blocks_L40")
def _b_blocks(quick: bool) -> dict:
    """The λ_max probe's per-query Hessian blocks at decision-list/claim2's largest case (L = 40, n = 38, M = 3,
    sampler B: 780 sets, 29,640 positions), at V = cP + E with its c and a drawn W: ``kernels.hessian_blocks``
    (token space) against ``theory.hessian_blocks`` (per-position Gram sums), and one classification beside."""
    L, n, M = 40, 38, 3
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, "B")
    model = DecisionListModel(DecisionListModelConfig(L))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.V[0] = 3.97e7 * task.P + 7.6 * (torch.rand(L, L, generator=g, dtype=torch.float64) - 0.5)
        model.W[0] = 0.3 * torch.randn(L, L, generator=g, dtype=torch.float64)
    kernels.hessian_blocks(model, task, types)   # warm-up (and the kernel's cached rows)
    reps = 1 if quick else 3
    new = seconds(lambda: kernels.hessian_blocks(model, task, types), reps) / reps
    ref = seconds(lambda: th.hessian_blocks(model, task, types), reps) / reps
    return {"kernel_seconds": new, "reference_seconds": ref, "speedup": ref / new,
            "classify_seconds": seconds(lambda: th.classify(model, task, types), reps) / reps}


@register_bench("decision_list_claim2_step_L40")
def _b_step(quick: bool) -> dict:
    """One step of decision-list/claim2's largest inside job (L = 40, n = 38, M = 3, sampler B: 29,640 (set, query)
    rows; 3 members at V = cP + E with its c and a small drawn W): the probes' evaluation and the training step, each
    part in token space (``kernels``: one forward shared by the classification, the λ_max probe and the loss) against
    the model's path (``theory.population_loss`` with autograd, ``theory.classify``, the blocks at the model's
    logits), seconds per step of the 3 members."""
    L, n, M, S = 40, 38, 3, 3
    task = dl.make_task(L, M, seed=0)
    types = th.enumerate_types(task, n, "B")
    model = DecisionListModel(DecisionListModelConfig(L), S=S)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for i in range(S):
            model.V[i] = 3.97e7 * task.P + 7.6 * (torch.rand(L, L, generator=g, dtype=torch.float64) - 0.5)
            model.W[i] = 1e-6 * torch.randn(L, L, generator=g, dtype=torch.float64)
    members = [_member(model, i) for i in range(S)]

    def token_step():
        kernels._LAST[0] = None                                  # a new iterate: the forward is computed once
        kernels.classify(model, task, types)
        fw = kernels.token_forward(model, task, types)
        for i in range(S):
            kernels.hessian_blocks(members[i], task, types, fw=fw.member(i))
        model.W.grad = model.V.grad = None
        kernels.population_loss(model, task, types).sum().backward()

    def model_step():
        th.classify(model, task, types)
        for i in range(S):
            kernels.hessian_blocks(members[i], task, types)      # at the model's logits
        model.W.grad = model.V.grad = None
        th.population_loss(model, task, types).sum().backward()

    token_step(), model_step()                                   # warm-up (and the cached rows)
    reps = 1 if quick else 3
    new = seconds(token_step, reps) / reps
    ref = seconds(model_step, reps) / reps
    parts = {}
    fw = kernels.token_forward(model, task, types)
    for name, fn in (("forward", lambda: kernels._compute_forward(model.W.detach(), model.V.detach(), fw.rows)),
                     ("classify", lambda: kernels.classify(model, task, types)),
                     ("lambda_per_member", lambda: kernels.hessian_blocks(members[0], task, types, fw=fw.member(0))),
                     ("gradient", lambda: kernels._population_grad(fw, torch.ones(S, dtype=torch.float64)))):
        parts[f"{name}_seconds"] = seconds(fn, reps) / reps
    return {"token_seconds": new, "model_seconds": ref, "speedup": ref / new, **parts}


def _member(model: DecisionListModel, i: int) -> DecisionListModel:
    one = DecisionListModel(model.cfg, S=1)
    with torch.no_grad():
        one.W[0], one.V[0] = model.W[i], model.V[i]
    return one


@register_bench("decision_list_reduced_ode_L10000")
def _b3(quick: bool) -> dict:
    """Reduced W-only flow to perfect classification, sampler B, L = 10⁴, n = 8, M = 4, c = 4n log L/δ."""
    L, n, M = 10000, 8, 4
    dg = dl.delta_gamma(L, n, M, "B")
    t0 = time.perf_counter()
    res = th.solve_reduced_flow(L, n, M, "B", 4 * n * math.log(L) / dg["delta"], t_max=1e9)
    return {"seconds": time.perf_counter() - t0, "T_sup": res.T_sup}


@register_bench("decision_list_task_and_samples_L10000")
def _b4(quick: bool) -> dict:
    """claim1's data at its largest L: make_task(L = 10⁴, M = 4), then N = 10⁴ sequences of n = 8 tokens
    by sampler B (Gumbel top-k over 10⁸ uniforms)."""
    t0 = time.perf_counter()
    task = dl.make_task(10000, 4, seed=0)
    t1 = time.perf_counter()
    dl.sample(task, 10000, 8, "B", torch.Generator().manual_seed(0))
    return {"make_task_seconds": t1 - t0, "sample_seconds": time.perf_counter() - t1}


@register_bench("decision_list_claim1")
def _bench_claim1(quick: bool) -> dict:
    """``tdyn reproduce decision-list/claim1`` at full settings (with ``quick`` too: it runs once), wall
    seconds, its flows on the local pool (one worker per core)."""
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        get("decision-list/claim1").reproduce(ReproduceContext(out=Path(d), progress=False))
        wall = time.perf_counter() - t0
    return {"seconds": wall, "workers": default_workers(), "start_method": start_method(), "under_2_min": wall <= 120}
