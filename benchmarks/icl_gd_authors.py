"""The authors' code of von Oswald et al. 2023 (github.com/google-research/self-organising-systems, folder
``transformers_learn_icl_by_gd/``, commit 3d5547c) for ``tdyn bench --only icl_gd_authors``, as
docs/reproductions/icl-gd.md#authors-code-side-by-side describes: the one patch, and a driver that trains their
one-layer model at the notebook's setting for a given number of steps. Nothing of their code is committed to tdyn.

    cp -r <self-organising-systems>/transformers_learn_icl_by_gd /tmp/icl && python benchmarks/icl_gd_authors.py patch /tmp/icl
    python3 -m venv /tmp/icl-venv && /tmp/icl-venv/bin/pip install jax==0.10.2 jaxlib==0.10.2 dm-haiku==0.0.17 \\
        optax==0.2.8 ml_collections==1.1.0 numpy pytz                      # outside tdyn's venv
    TDYN_ANCHOR_ICL_GD=/tmp/icl TDYN_ANCHOR_ICL_GD_PYTHON=/tmp/icl-venv/bin/python tdyn bench --only icl_gd_authors

The patch (``src/train.py`` only, idempotent): ``jnp.DeviceArray`` → ``jax.Array`` in its state tuples' type
annotations (JAX removed ``DeviceArray`` in 0.4.x; no computation changes).

The driver (``python icl_gd_authors.py run CHECKOUT STEPS``, in the anchor's interpreter; stdlib only at module
level so it runs without tdyn) sets the configuration cell of ``constructed_token_setup.ipynb`` (one recurrent
layer, softmax off, Adam at 1e-3, clip 1e-3, batch 2048, d = N = 10, ``input_range = 1``: x ~ U(−½, ½)), calls
their ``init()`` for seed 0, then runs their training cell's step — ``data_creator`` (their jitted
``create_reg_data`` under vmap) and ``update`` — ``STEPS`` times, without the step-size scan and the ``analyse``
calls; it prints one JSON line with the in-loop seconds. ``tdyn bench`` times two such runs and divides the wall
difference by the step difference, so start-up and compilation cancel.
"""

from __future__ import annotations

import sys
from pathlib import Path

TRAIN = Path("src") / "train.py"
OLD, NEW = "jnp.DeviceArray", "jax.Array"
#: the notebook's configuration cell for num_layers = 1 (constructed_token_setup.ipynb, cell 4)
CONFIG = dict(seed=0, local_usage=True, deq=True, gd_deq=True, att_only_trans=True, pre_train_gd=True,
              train_gd_whitening=True, train_gd_lr=True, use_bias=False, include_query=False, distract_size=0,
              training_steps_gd=1000, use_softmax=False, first_layer_sm=False, use_non_lin_mix=False,
              widening_factor=4, layer_norm=False, out_proj=False, in_proj=False, adam=True, dataset_size=10,
              input_size=10, key_size=11, num_layers=1, num_heads=1, grad_clip_value=0.001,
              grad_clip_value_gd=0.001, lr=0.001, gd_lr=0.001, wd=0.0, init_scale=0.002, bs=2048, bs_gd_train=512,
              dampening=1.0, clip=0, dropout_rate=0.0, y_update=False, input_range=1, pos_enc=False,
              pos_enc_size=20, concat_pos_enc=False, analyse=True, cycle_data=0, num_seeds=1, emb_size=11)


def is_checkout(checkout: str | Path) -> bool:
    """Whether ``checkout`` looks like their ``transformers_learn_icl_by_gd`` folder."""
    return all((Path(checkout) / "src" / f).is_file() for f in ("train.py", "data.py", "config.py", "transformer.py"))


def patch(checkout: str | Path) -> Path:
    """Apply the patch to ``checkout``'s ``src/train.py`` in place; returns its path. Raises ``SystemExit`` with
    one line when the checkout is not their code."""
    if not is_checkout(checkout):
        raise SystemExit(f"icl_gd_authors: {checkout} is no transformers_learn_icl_by_gd folder (no src/train.py, "
                         "data.py, config.py, transformer.py)")
    path = Path(checkout) / TRAIN
    src = path.read_text(encoding="utf-8")
    if OLD not in src and f": {NEW}" not in src:
        raise SystemExit(f"icl_gd_authors: {path} is not the code of commit 3d5547c (no {OLD} annotation)")
    path.write_text(src.replace(OLD, NEW), encoding="utf-8")
    return path


def is_patched(checkout: str | Path) -> bool:
    """Whether ``checkout``'s ``src/train.py`` carries the patch."""
    path = Path(checkout) / TRAIN
    return path.is_file() and OLD not in path.read_text(encoding="utf-8")


def run(checkout: str, steps: int) -> dict:
    """Their training step ``steps`` times at :data:`CONFIG` (see the module's docstring); in-loop seconds."""
    import json
    import os
    import time

    os.chdir(checkout)
    sys.path.insert(0, checkout)
    import jax
    from jax import vmap
    from src.config import config
    from src.data import create_reg_data
    from src.train import init, update

    for k, v in CONFIG.items():
        setattr(config, k, v)
    config.training_steps = steps
    data_creator = vmap(create_reg_data, in_axes=(0, None, None, None, None, None), out_axes=0)
    optimiser, train_state, _, rng = init()
    rng, data_rng = jax.random.split(rng, 2)
    t0 = time.perf_counter()
    for _ in range(steps):
        rng, data_rng = jax.random.split(data_rng, 2)
        train_data = data_creator(jax.random.split(rng, num=config.bs), config.input_size, config.dataset_size,
                                  config.size_distract, config.input_range, config.weight_scale)
        train_state, metrics = update(train_state, train_data, optimiser)
    jax.block_until_ready(train_state.params)
    out = {"steps": steps, "loop_s": time.perf_counter() - t0, "loss": float(metrics["train_loss"])
           if isinstance(metrics, dict) and "train_loss" in metrics else None, "jax": jax.__version__}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "patch":
        print("patched", patch(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit("usage: python benchmarks/icl_gd_authors.py patch CHECKOUT | run CHECKOUT STEPS")
