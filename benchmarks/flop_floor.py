"""Each full-setting reproduction's arithmetic, counted: its training and probe FLOPs and the seconds they take at
the reference matmul rate (issue 35: a reproduction whose training FLOPs at that rate exceed its share of the
30-minute target may join the GPU-scale list). Counted with ``torch.utils.flop_counter.FlopCounterMode`` on one
training step (loss and backward) and one probe evaluation of every config a reproduction trains, times its
steps and evaluations. The counter counts matrix products (mm, bmm, addmm, einsum's, attention), not element-wise
work, gathers or scatters: the floor is the matmul part of the paper's arithmetic, a lower bound.

    .venv/bin/python benchmarks/flop_floor.py [NAME ...]   # prints one JSON line per config and a table
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from tdyn.bench import reference_matmul
from tdyn.probes import ProbeContext, get_probes
from tdyn.reproduce import runner
from tdyn.reproduce.registry import EXPERIMENTS, ReproduceContext, get
from tdyn.seeding import generator
from tdyn.tasks import build_task
from tdyn.tasks.base import stack_batches
from tdyn.train.trainer import _select, eval_steps, expand_members


def count(fn) -> int:
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


def config_flops(cfg) -> dict:
    members = expand_members(cfg)
    task = build_task(cfg, members)
    params = list(task.model.parameters())
    seeds = sorted({m.seed for m in members})
    stream_of = torch.tensor([seeds.index(m.seed) for m in members])
    batch = _select(task.sample_streams([generator(s, "data") for s in seeds]), stream_of)

    def step():
        loss = task.loss(batch)
        if loss.requires_grad:
            loss.sum().backward()

    train = count(step)
    for p in params:
        p.grad = None
    probe_batch = _select(stack_batches([task.probe_batch(generator(s, "probe")) for s in seeds]), stream_of)
    probes = get_probes(cfg.probes.names)

    def evaluate():
        shared: dict = {}
        with torch.no_grad():
            for name, fn in probes.items():
                fn(ProbeContext(task.model, task, probe_batch, 0, cfg.probes.options.get(name, {}), shared))

    probe = count(evaluate) if probes else 0
    evals = sum(1 for _ in eval_steps(cfg))
    return {"members": len(members), "steps": cfg.optim.steps, "train_step_flops": train, "evals": evals,
            "probe_flops": probe, "train_flops": train * cfg.optim.steps, "probes_flops": probe * evals}


def main(names: list[str]) -> None:
    torch.set_num_threads(1)
    rate = reference_matmul()["gflops_1_thread"] * 1e9
    print(json.dumps({"reference_gflops_1_thread": rate / 1e9}), flush=True)
    rows = []
    for name in names or sorted(EXPERIMENTS.table):
        exp = get(name)
        if exp.configs is None and exp.default_config is None:
            continue
        t0 = time.perf_counter()
        try:
            cfgs = runner.resolved_configs(exp, ReproduceContext(out=Path("."), options=exp.make_options({})))
        except Exception as e:   # a reproduction that trains through a sweep or phases only
            print(json.dumps({"reproduction": name, "error": f"{type(e).__name__}: {e}"}), flush=True)
            continue
        total = {"train_flops": 0, "probes_flops": 0}
        for cname, cfg in cfgs.items():
            f = config_flops(cfg)
            print(json.dumps({"reproduction": name, "config": cname, **f}), flush=True)
            total = {k: total[k] + f[k] for k in total}
        rows.append((name, total["train_flops"] / rate, total["probes_flops"] / rate, time.perf_counter() - t0))
    print("| reproduction | training matmul floor (s) | probes matmul floor (s) |")
    print("|---|---|---|")
    for name, tr, pr, _ in sorted(rows, key=lambda r: -r[1]):
        print(f"| {name} | {tr:.1f} | {pr:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
