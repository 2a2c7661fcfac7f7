"""von Oswald et al. 2023: the benchmark entries (``tdyn bench``): the training step of the LSA ensemble at the
authors' sizes (speed path against the attention as ``model.py`` writes it), the whole trainer loop, and the data
sampler (docs/reproductions/icl-gd.md#speed)."""

from __future__ import annotations

import torch

from tdyn.bench import register_bench, seconds, step_rate, timed_train
from tdyn.config import load_config
from tdyn.papers.icl_gd import data as icl
from tdyn.papers.icl_gd.task import icl_gd_config
from tdyn.tasks import build_task
from tdyn.train.trainer import expand_members


def _model_path_rate(task, steps: int) -> float:
    """Steps/s of forward + backward through ``model.py``'s attention (no optimizer step: the comparison's upper
    bound for the model path)."""
    g = [torch.Generator().manual_seed(i) for i in range(task.model.W_K.shape[0])]
    E, y = task.sample_streams(g)

    def step():
        for p in task.model.parameters():
            p.grad = None
        task.model.seq_loss(E, y).mean(-1).sum().backward()

    step()
    return steps / seconds(step, steps)


@register_bench("icl_gd_one_layer_steps")
def _steps(quick: bool) -> dict:
    """One training step (forward, backward, Adam) of S = 5 members × batch 2048 at d = N = 10 (sampling not
    timed), K = 1, 2, 3 recurrent layers: member-steps/s by the speed path (the task's loss), and forward +
    backward by ``model.py``'s attention beside it; then 200 steps of the whole trainer (sampling, probes every
    100 steps on 10,000 sequences) for K = 1."""
    out = {}
    n = 5 if quick else 20
    for K in (1, 2, 3):
        rc = load_config(icl_gd_config(layers=K, seeds=[0, 1, 2, 3, 4], steps=n))
        task = build_task(rc, expand_members(rc))
        fast = step_rate(task, rc, n)
        slow = _model_path_rate(task, max(2, n // 4))
        out[f"K{K}"] = {"member_steps_per_s": 5 * fast, "model_py_member_steps_per_s": 5 * slow,
                        "speedup": fast / slow}
    steps = 50 if quick else 200
    s = timed_train(icl_gd_config(layers=1, seeds=[0, 1, 2, 3, 4], steps=steps))
    out["trainer_K1"] = {"steps": steps, "seconds": s, "member_steps_per_s": 5 * steps / s}
    return out


@register_bench("icl_gd_data")
def _data(quick: bool) -> dict:
    """Sampling batches of 2048 sequences (d = N = 10, float32): batches/s and sequences/s."""
    g = torch.Generator().manual_seed(0)
    n = 20 if quick else 200
    icl.sample(2048, 10, 10, g)
    s = seconds(lambda: icl.sample(2048, 10, 10, g), n)
    return {"batches_per_s": n / s, "sequences_per_s": 2048 * n / s}
