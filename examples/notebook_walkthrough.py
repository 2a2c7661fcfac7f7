"""A notebook walkthrough (docs/library.md#a-notebook-walkthrough): a new task, a sweep with a probe, the task
edited and its cell run again, a plot. Each ``# %%`` is a cell (Jupyter through Jupytext, VS Code); run as a
script it is what CI executes (tests/test_examples.py), and docs/library.md shows these very cells.

    python examples/notebook_walkthrough.py        # writes runs/walkthrough/ (about 15 s on 2 cores)
"""

# %% 1. The task: in-context linear regression, a one-layer linear-attention model
from pathlib import Path

import torch
from pydantic import Field
from torch import nn

import tdyn
from tdyn.schema import Strict

OUT = Path("runs/walkthrough")


class ICLData(Strict):
    dim: int = Field(4, ge=1)            # x in R^dim
    context: int = Field(16, ge=1)       # (x_i, y_i) pairs before the query
    batch_size: int = Field(64, ge=1)
    noise: float = Field(0.0, ge=0)      # y = w·x + noise·ε


class ICLModel(Strict):
    pass


class LinearAttention(nn.Module):
    """Tokens z = [x, y] (the query's y = 0); one linear-attention head read at the query: no softmax."""

    def __init__(self, dim: int):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(dim + 1, dim + 1, bias=False) for _ in range(3))

    def forward(self, z: torch.Tensor) -> torch.Tensor:       # z [B, n+1, dim+1] -> prediction [B]
        ctx = z[:, :-1]
        scores = self.q(z[:, -1:]) @ self.k(ctx).transpose(1, 2) / ctx.shape[1]   # [B, 1, n]
        return (scores @ self.v(ctx))[:, 0, -1]                                    # the label coordinate


class ICLRegression(tdyn.PlainTask):
    def __init__(self, cfg, members):
        self.d = ICLData.model_validate(cfg.data)
        n, dim = self.d.context, self.d.dim
        self.facts = {"eta_gd": n / (n + dim + 1)}    # the best step size of one GD step from w = 0
        super().__init__(cfg, members)

    def make_model(self):
        return LinearAttention(self.d.dim)

    def sample(self, gen):
        B, n, dim = self.d.batch_size, self.d.context, self.d.dim
        x = torch.randn(B, n + 1, dim, generator=gen)
        w = torch.randn(B, dim, 1, generator=gen)
        y = (x @ w)[..., 0] + self.d.noise * torch.randn(B, n + 1, generator=gen)
        z = torch.cat([x, y[..., None]], -1)
        z[:, -1, -1] = 0.0                               # the query's label is what the model predicts
        return {"z": z, "y": y[:, -1]}

    def member_loss(self, model, batch):
        return ((model(batch["z"]) - batch["y"]) ** 2).mean()


@tdyn.register_task("icl_linreg", ICLData, ICLModel, "in-context linear regression, linear attention")
def build(cfg, members):
    return ICLRegression(cfg, members)


# %% 2. A probe: the in-context loss, and its gap to one step of gradient descent on the context
@tdyn.probe("icl.loss")
def icl_loss(ctx):
    """The probe batch's in-context loss and its excess over one GD step (best step size) on the context."""
    z, y = ctx.batch["z"], ctx.batch["y"]                 # [S, B, n+1, dim+1], [S, B]
    x, ys, xq = z[..., :-1, :-1], z[..., :-1, -1], z[..., -1, :-1]
    w_gd = ctx.task.facts["eta_gd"] * (x * ys[..., None]).mean(-2)        # [S, B, dim]
    gd = (((xq * w_gd).sum(-1) - y) ** 2).mean(-1)                        # [S]
    loss = ctx.model.map(lambda m, zb, yb: ((m(zb) - yb) ** 2).mean(), z, y)
    return {"icl": loss, "gap_to_gd": loss - gd}


# %% 3. A sweep: 4 seeds × 3 learning rates, trained as one ensemble job
config = {"task": "icl_linreg", "data": {"dim": 4, "context": 16},
          "optim": {"steps": 150, "groups": {"all": {"params": ["*"], "optimizer": "adam", "lr": 1e-2}}},
          "probes": {"names": ["icl.loss"], "every": 10}, "checkpoint": {"schedule": "log", "num": 3}}
spec = {"config": config, "axes": {"grid": {"optim.groups.all.lr": [3e-3, 1e-2, 3e-2]}}, "seeds": [0, 1, 2, 3]}
status = tdyn.sweep(spec, OUT / "sweep", executor="inline")   # raises tdyn.errors.SweepFailed if a run fails
df = tdyn.load_sweep(OUT / "sweep")
last = df[df.step == df.step.max()]
print(last.groupby("optim.groups.all.lr")[["icl.loss/icl", "icl.loss/gap_to_gd"]].mean())

# %% 4. Edit the task and run its cell again (here: noisy labels by default): the same code registering the
#       same name replaces the old entry, with one line on the log (no kernel restart)
class ICLData(ICLData):
    noise: float = Field(0.5, ge=0)


@tdyn.register_task("icl_linreg", ICLData, ICLModel, "in-context linear regression, noisy labels")
def build(cfg, members):
    return ICLRegression(cfg, members)


noisy = tdyn.train(dict(config, ensemble={"lrs": [1e-2, 3e-2]}), OUT / "noisy", force=True, resume=True)
print([(d.name, f"{tdyn.load_run(d).df['icl.loss/icl'].iloc[-1]:.4g}") for d in noisy])

# %% 5. Plot: the in-context loss against the step, mean over seeds, one curve per learning rate
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(5, 3.2))
for lr, runs in df.groupby("optim.groups.all.lr"):
    curve = runs.groupby("step")["icl.loss/icl"].mean()
    ax.plot(curve.index, curve.values, label=f"lr {lr:g}")
gd = (last["icl.loss/icl"] - last["icl.loss/gap_to_gd"]).mean()
ax.axhline(gd, color="k", ls="--", label="one GD step")
ax.set(xlabel="step", ylabel="in-context loss", yscale="log")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "icl_loss.png", dpi=100)
