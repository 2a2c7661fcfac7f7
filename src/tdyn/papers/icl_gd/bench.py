"""von Oswald et al. 2023: the benchmark entries (``tdyn bench``): the training step of the LSA ensemble at the
authors' sizes (speed path against the attention as ``model.py`` writes it), the whole trainer loop, and the data
sampler (docs/reproductions/icl-gd.md#speed); and the authors' JAX code against tdyn's step when a checkout of it is
named (docs/reproductions/icl-gd.md#authors-code-side-by-side)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from tdyn import native
from tdyn.bench import (one_thread_step, per_step_by_difference, reference_matmul, register_bench, seconds, step_rate,
                        timed_run, timed_train)
from tdyn.config import load_config
from tdyn.errors import UserError
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


@register_bench("icl_gd_k_layer_steps")
def _k_layer_steps(quick: bool) -> dict:
    """One training step (forward, backward, Adam; sampling not timed) of the K-layer reproductions' ensembles,
    S = 5 members × batch 2048 at d = N = 10: untied K = 2 and 3 (icl-gd/k-layers-untied), recurrent K = 3
    (icl-gd/k-layers), and K = 1. Milliseconds a step by the task's loss as it trains (lsa.c where a C compiler is at
    hand, ``tdyn.native``) and by the torch path (``kernels.predict_deep``, or ``predict`` for K = 1) beside it; the
    step's matmul FLOPs as the torch path computes them (``torch.utils.flop_counter``, forward and backward; lsa.c
    runs the same products densely, ≈ 1.2× as many) and each step's time over what those FLOPs take at this
    machine's reference matmul rate (at the current torch threads): how far a step is above its arithmetic
    (docs/reproductions/icl-gd.md#speed)."""
    from torch.utils.flop_counter import FlopCounterMode

    n = 5 if quick else 30
    threads = torch.get_num_threads()
    ref = reference_matmul(1024, 0.5)
    rate = ref[f"gflops_{threads}_thread{'s' if threads > 1 else ''}"]
    out = {"reference_gflops": rate, "native": native.status()}
    for K, tied in ((2, False), (3, False), (3, True), (1, True)):
        rc = load_config(icl_gd_config(layers=K, tied=tied, seeds=[0, 1, 2, 3, 4], steps=n))
        task = build_task(rc, expand_members(rc))
        batch = task.sample_streams([torch.Generator().manual_seed(i) for i in range(5)])
        with native.disabled():
            with FlopCounterMode(display=False) as fc:
                task.loss(batch).sum().backward()
            torch_ms = 1e3 / step_rate(task, rc, n)
        flops = fc.get_total_flops()
        floor_ms = 1e3 * flops / 1e9 / rate
        row = {"gflop_per_step": flops / 1e9, "torch_ms_per_step": torch_ms,
               "torch_over_matmul_floor": torch_ms / floor_ms}
        if native.compiler()[0] is not None:
            ms = 1e3 / step_rate(task, rc, n)
            row |= {"c_ms_per_step": ms, "c_over_matmul_floor": ms / floor_ms, "c_speedup": torch_ms / ms}
        out[f"K{K}_{'tied' if tied else 'untied'}"] = row
    return out


@register_bench("icl_gd_data")
def _data(quick: bool) -> dict:
    """Sampling batches of 2048 sequences (d = N = 10, float32): batches/s and sequences/s."""
    g = torch.Generator().manual_seed(0)
    n = 20 if quick else 200
    icl.sample(2048, 10, 10, g)
    s = seconds(lambda: icl.sample(2048, 10, 10, g), n)
    return {"batches_per_s": n / s, "sequences_per_s": 2048 * n / s}


#: the environment variables naming a checkout of the authors' ``transformers_learn_icl_by_gd`` folder (patched by
#: benchmarks/icl_gd_authors.py) and an interpreter with JAX, dm-haiku, optax, ml_collections and pytz for it
ANCHOR_ENV = "TDYN_ANCHOR_ICL_GD"
ANCHOR_PYTHON_ENV = "TDYN_ANCHOR_ICL_GD_PYTHON"
#: the driver (tdyn's file, run in the anchor's interpreter); found beside the source tree
DRIVER = Path(__file__).resolve().parents[4] / "benchmarks" / "icl_gd_authors.py"
#: the side-by-side setting of docs/reproductions/icl-gd.md#authors-code-side-by-side: one recurrent LSA layer,
#: d = N = 10, x ~ U(−½, ½), Adam at 1e-3 (clip 1e-3), batch 2048, one member, one thread
SIDE = {"layers": 1, "d": 10, "N": 10, "x_max": 0.5, "batch": 2048}
#: one thread for XLA (and OpenMP) in their subprocess
ONE_THREAD = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
              "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _authors_run(checkout: str, python: str, steps: int) -> tuple[float, dict]:
    """Wall seconds of the driver for ``steps`` training steps (start-up and compilation included) and its JSON."""
    wall, r = timed_run([python, str(DRIVER), "run", str(Path(checkout).resolve()), str(steps)],
                        f"{ANCHOR_ENV}: their training", env=ONE_THREAD, timeout=600 + steps)
    lines = r.stdout.strip().splitlines()
    if not lines:
        raise UserError(f"{ANCHOR_ENV}: their training printed no result")
    return wall, json.loads(lines[-1])


def _authors(checkout: str, python: str, steps: int, base: int) -> dict:
    """Their training in a subprocess, one thread, run twice: ``base`` and ``base + steps`` steps; seconds per step
    = the difference of the two walls / ``steps`` (start-up, compilation and the first ``base`` steps cancel)."""
    if not DRIVER.is_file():
        raise UserError(f"{ANCHOR_ENV}: the driver {DRIVER} is missing (run tdyn from its source checkout)")
    if not (Path(checkout) / "src" / "train.py").is_file() or not (Path(checkout) / "src" / "data.py").is_file():
        raise UserError(f"{ANCHOR_ENV}={checkout}: no src/train.py and src/data.py there (the folder "
                        "transformers_learn_icl_by_gd of google-research/self-organising-systems)")
    if "jnp.DeviceArray" in (Path(checkout) / "src" / "train.py").read_text(encoding="utf-8"):
        raise UserError(f"{ANCHOR_ENV}={checkout}: src/train.py is not patched (run benchmarks/icl_gd_authors.py "
                        "patch on it)")
    out = {}                                                      # steps → the driver's JSON

    def wall_of(n: int) -> float:
        wall, out[n] = _authors_run(checkout, python, n)
        return wall

    timed = per_step_by_difference(wall_of, steps, base)
    js, jl = out[base], out[base + steps]
    return {**timed, "steps_short": base, "steps_long": base + steps,
            "in_loop_s_per_step": (jl["loop_s"] - js["loop_s"]) / steps, "jax": jl.get("jax"), "python": python}


@register_bench("icl_gd_authors")
def _authors_vs_tdyn(quick: bool) -> dict:
    """The authors' JAX training against tdyn at the docs page's side-by-side setting (one recurrent LSA layer,
    d = N = 10, x ~ U(−½, ½), batch 2048, Adam, one member, one thread): seconds per training step (sampling
    included) of each and their ratio. Theirs in a subprocess by benchmarks/icl_gd_authors.py from the checkout
    ``$TDYN_ANCHOR_ICL_GD`` names, in the interpreter ``$TDYN_ANCHOR_ICL_GD_PYTHON``; tdyn's the trainer's step by
    the speed path plus its sampler's batch, in this process on one torch thread. Also tdyn's two-member ensemble
    per member-step (as the docs page's table ran it). Without the variables: skipped, with the reason."""
    checkout, python = os.environ.get(ANCHOR_ENV), os.environ.get(ANCHOR_PYTHON_ENV)
    if not checkout or not python:
        return {"skipped": f"{ANCHOR_ENV} and {ANCHOR_PYTHON_ENV} are not both set: point them at the authors' "
                           "transformers_learn_icl_by_gd folder patched by benchmarks/icl_gd_authors.py and at a "
                           "Python with jax 0.10.2, dm-haiku, optax, ml_collections and pytz to time the authors' code"}
    steps = 60 if quick else 400
    theirs = _authors(checkout, python, steps, base=10)
    ours = {}
    n = max(10, steps // 4)
    for S in (1, 2):
        t = one_thread_step(icl_gd_config(layers=SIDE["layers"], seeds=list(range(S)), steps=2, x_max=SIDE["x_max"],
                                          batch_size=SIDE["batch"]), n, n)
        ours[S] = {"s_per_member_step": (t["train_step_s"] + S * t["sample_s"]) / S, **t}
    return {"setting": dict(SIDE, members=1, threads=1), "authors": theirs,
            "tdyn": {"steps": n, "s_per_step": ours[1]["s_per_member_step"], **ours[1]},
            "tdyn_2_members": ours[2],
            "authors_over_tdyn": theirs["s_per_step"] / ours[1]["s_per_member_step"]}
