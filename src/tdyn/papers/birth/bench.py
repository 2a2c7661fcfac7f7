"""Bietti et al. 2023: the benchmark entries (``tdyn bench``): the training step of the simplified transformer at the
paper's size and at tdyn's full setting (speed path against ``model.py``'s attention), and the data sampler
(docs/reproductions/birth.md#speed)."""

from __future__ import annotations

import torch

from tdyn.bench import register_bench, seconds, step_rate
from tdyn.config import load_config
from tdyn.papers.birth import data as bd
from tdyn.papers.birth.task import birth_config, loss_mask
from tdyn.papers.birth import kernels
from tdyn.tasks import build_task
from tdyn.train.trainer import expand_members


def _model_path_rate(task, steps: int) -> float:
    """Steps/s of forward + backward through ``model.py``'s attention (no optimizer step)."""
    g = [torch.Generator().manual_seed(i) for i in range(task.model.S)]
    b = task.sample_streams(g)

    def step():
        for p in task.model.parameters():
            p.grad = None
        kernels.masked_ce(task.model(b["x"]), b["y"], loss_mask(b["occ"], "outputs")).sum().backward()

    step()
    return steps / seconds(step, steps)


@register_bench("birth_steps")
def _steps(quick: bool) -> dict:
    """One training step (forward, backward, SGD) of one member, sampling not timed: at tdyn's full setting
    (d = T = 128, batch 64) and at the paper's (d = T = 256, batch 512; skipped with --quick), by the speed path,
    with ``model.py``'s attention beside it at the full setting."""
    out = {}
    sizes = {"full": (128, 128, 64)} | ({} if quick else {"paper": (256, 256, 512)})
    for name, (d, T, B) in sizes.items():
        rc = load_config(birth_config(seeds=[0], d=d, T=T, batch_size=B, steps=2))
        task = build_task(rc, expand_members(rc))
        n = 2 if name == "paper" else (5 if quick else 20)
        fast = step_rate(task, rc, n)
        out[name] = {"d": d, "T": T, "batch": B, "steps_per_s": fast}
        if name == "full":
            slow = _model_path_rate(task, max(2, n // 4))
            out[name] |= {"model_py_steps_per_s": slow, "speedup": fast / slow}
    return out


@register_bench("birth_data")
def _data(quick: bool) -> dict:
    """Sampling batches of the bigram language with triggers (tiny Shakespeare, K = 5): batches/s and sequences/s
    at batch 64, T = 128 and at the paper's batch 512, T = 256."""
    tb = bd.tables(bd.BirthData())
    g = torch.Generator().manual_seed(0)
    out = {}
    for B, T in ((64, 128), (512, 256)):
        n = 3 if quick else 20
        bd.sample(B, T, tb, 5, g)
        s = seconds(lambda: bd.sample(B, T, tb, 5, g), n)
        out[f"B{B}_T{T}"] = {"batches_per_s": n / s, "sequences_per_s": B * n / s}
    return out
