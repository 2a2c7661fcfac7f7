"""Example (c): reading results back, notebook style (each ``# %%`` is a cell in VS Code / Jupytext).

``tdyn.load_sweep`` gives every run of a sweep in one long pandas DataFrame; ``tdyn.load_run`` one run,
with ``.df`` for its metrics (a DataFrame too) and ``.model(step)`` for the module rebuilt from a checkpoint.

    python examples/read_results.py --sweep runs/plain --png runs/plain/distinct_attention.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import tdyn

# %% arguments (in a notebook: set SWEEP and PNG by hand)
ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--sweep", required=True, help="a sweep directory, e.g. from examples/plain_attention_block.py")
ap.add_argument("--png", help="where to save the figure (default: SWEEP/distinct_attention.png)")
args = ap.parse_args()
SWEEP, PNG = args.sweep, args.png or f"{args.sweep}/distinct_attention.png"
tdyn.plugins.add([str(Path(__file__).with_name("plain_attention_block.py"))])   # the task and probe the runs used (for .model())

# %% every run, every evaluated step, in one table
table = tdyn.load_sweep(SWEEP)
cols = {k: np.asarray(table[k]) for k in ("run", "optim.groups.all.lr", "seed", "step", "loss",
                                          "block.distinct_attention/mass")}
lrs = sorted(set(cols["optim.groups.all.lr"].tolist()))
print(f"{len(set(cols['run'].tolist()))} runs, learning rates {lrs}")

# %% one probe against the step, mean ± spread over seeds, one curve per learning rate
import matplotlib                                      # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt                        # noqa: E402

fig, ax = plt.subplots(figsize=(5, 3.5))
for lr in lrs:
    sel = cols["optim.groups.all.lr"] == lr
    steps = np.unique(cols["step"][sel])
    per_seed = np.array([[cols["block.distinct_attention/mass"][sel & (cols["seed"] == s) & (cols["step"] == t)][0]
                          for t in steps] for s in np.unique(cols["seed"][sel])])
    m, lo, hi = per_seed.mean(0), per_seed.min(0), per_seed.max(0)
    ax.plot(steps, m, label=f"lr = {lr:g}")
    ax.fill_between(steps, lo, hi, alpha=0.2)
ax.set(xlabel="step", ylabel="attention on distinct tokens", title="plain attention block, Syn-Small")
ax.legend()
fig.tight_layout()
fig.savefig(PNG, dpi=120)
print(f"wrote {PNG}")

# %% one run: its metrics and its model at the last checkpoint
run = tdyn.load_run(f"{SWEEP}/{cols['run'][0]}")
model = run.model()                                    # a Stacked of one member
block = model.member(0)                                # the plain AttentionBlock with the trained weights
print(type(block).__name__, {k: tuple(v.shape) for k, v in block.state_dict().items()})
final = {k: float(np.asarray(v)[-1]) for k, v in dict(run.df).items() if k in ("step", "loss")}
print(f"{run.path.name}: final {final}")
