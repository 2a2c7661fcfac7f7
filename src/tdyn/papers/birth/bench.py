"""Bietti et al. 2023: the benchmark entries (``tdyn bench``): the training step of the simplified transformer at the
paper's size and at tdyn's full setting (speed path against ``model.py``'s attention), and the data sampler
(docs/reproductions/birth.md#speed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from tdyn.bench import one_thread_step, per_step_by_difference, register_bench, seconds, step_rate, timed_run
from tdyn.config import load_config
from tdyn.errors import UserError
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


#: the environment variable naming a patched checkout of the authors' code (benchmarks/birth_authors_patch.py)
ANCHOR_ENV = "TDYN_ANCHOR_BIRTH"
#: an interpreter with torch, numpy and omegaconf for their script (default: this one)
ANCHOR_PYTHON_ENV = "TDYN_ANCHOR_BIRTH_PYTHON"
#: the side-by-side setting of docs/reproductions/birth.md#authors-code-side-by-side: d = T = 64, K = 5 fixed
#: triggers, loss at occ ≥ 2, SGD (lr 0.2, momentum 0.9, weight decay 1e-4), batch 64, one member
SIDE = {"d": 64, "T": 64, "batch": 64, "lr": 0.2}


def authors_command(steps: int, seed: int = 0) -> list[str]:
    """Their ``ihead_basic_main.py`` arguments at :data:`SIDE` for ``steps`` training steps (steps 0 … steps; only
    step 0 evaluates), one sampling worker."""
    s = SIDE
    return ["ihead_basic_main.py", f"max_iters={steps + 1}", "eval_delta=100000", "log_probes=False",
            "loss_head_only=True", "data_args.k=5", "data_args.fixed_special_toks=True",
            f"data_args.seq_length={s['T']}", f"model_args.max_length={s['T']}", "optim_args.use_sgd=True",
            f"optim_args.learning_rate={s['lr']}", "optim_args.weight_decay=1e-4",
            f"optim_args.batch_size={s['batch']}", "model_args.final_ffn=False", "model_args.freeze_embeddings=True",
            "model_args.freeze_output=True", f"model_args.dim={s['d']}", "num_data_workers=1", f"seed={seed}"]


def _authors_wall(checkout: str, python: str, steps: int) -> float:
    """Wall seconds of their script for ``steps`` + 1 training steps (start-up and step 0's evaluation included)."""
    wall, r = timed_run([python, *authors_command(steps)], f"{ANCHOR_ENV}: their script", cwd=checkout,
                        env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, timeout=600 + 5 * steps)
    if "INFO:root:0 " not in r.stderr:
        raise UserError(f"{ANCHOR_ENV}: their script logged no step 0 (not albietz/transformer-birth's "
                        "ihead_basic_main.py?)")
    return wall


def _authors(checkout: str, steps: int, base: int) -> dict:
    """Their script in a subprocess, one torch thread, run twice: ``base`` and ``base + steps`` steps after step 0;
    seconds per step = the difference of the two walls / ``steps`` (start-up, step 0's evaluation and the first
    ``base`` steps cancel; their script logs no time for a step it does not evaluate)."""
    main = Path(checkout) / "ihead_basic_main.py"
    if not main.is_file() or not (Path(checkout) / "data" / "meta.pkl").is_file():
        raise UserError(f"{ANCHOR_ENV}={checkout}: no ihead_basic_main.py and data/meta.pkl there (a checkout of "
                        "albietz/transformer-birth, patched by benchmarks/birth_authors_patch.py)")
    src = main.read_text(encoding="utf-8")
    if ".cuda()" in src or "torch.manual_seed(cfg.seed)" not in src:
        raise UserError(f"{ANCHOR_ENV}={checkout}: ihead_basic_main.py is not patched (run "
                        "benchmarks/birth_authors_patch.py on it)")
    python = os.environ.get(ANCHOR_PYTHON_ENV) or sys.executable
    return {**per_step_by_difference(lambda n: _authors_wall(checkout, python, n), steps, base),
            "steps_short": base + 1, "steps_long": base + steps + 1, "python": python}


@register_bench("birth_authors")
def _authors_vs_tdyn(quick: bool) -> dict:
    """The authors' ``ihead_basic_main.py`` against tdyn at the docs page's side-by-side setting (d = T = 64, K = 5
    fixed triggers, loss at occ ≥ 2, SGD, batch 64, one member, one thread): seconds per training step of each and
    their ratio. Theirs in a subprocess from the checkout ``$TDYN_ANCHOR_BIRTH`` names (patched by
    benchmarks/birth_authors_patch.py; their sampling runs in one worker process beside the step); tdyn's the
    trainer's step by the speed path plus its sampler's batch (drawn in the same thread). Without the variable:
    skipped, with the reason."""
    checkout = os.environ.get(ANCHOR_ENV)
    if not checkout:
        return {"skipped": f"{ANCHOR_ENV} is not set: point it at a checkout of albietz/transformer-birth (commit "
                           "165e11a) patched by benchmarks/birth_authors_patch.py to time the authors' code"}
    steps = 30 if quick else 200
    theirs = _authors(checkout, steps, base=5)
    s = SIDE
    t = one_thread_step(birth_config(seeds=[0], d=s["d"], T=s["T"], batch_size=s["batch"], lr=s["lr"], steps=2),
                        steps, max(10, steps // 4))
    step, draw = t["train_step_s"], t["sample_s"]
    ours = step + draw
    return {"setting": dict(SIDE, k=5, members=1, threads=1), "authors": theirs,
            "tdyn": {"steps": steps, "s_per_step": ours, "train_step_s": step, "sample_s": draw},
            "authors_over_tdyn": theirs["s_per_step"] / ours}
