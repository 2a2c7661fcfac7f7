"""A fourth paper is one package: a toy paper built in a temporary directory (data, model, task, one
probe, one reproduction with one claim), declared by its manifest and registered through the
``tdyn.papers`` entry-point group, runs through ``tdyn list``, ``tdyn reproduce`` and ``tdyn report``
exactly as a built-in paper does (docs/architecture.md#adding-a-paper)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

FILES = {
    "toypaper/__init__.py": '''
        """A toy paper: the mean of a Gaussian learned by a linear map (the manifest only: no torch)."""
        from tdyn.manifest import Paper, Reproduction

        MANIFEST = Paper(
            name="toypaper", prefix="toy", label="Toy et al.", title="Toy et al. — a toy paper",
            docs="toy.md",
            tasks={"toy_mean": "toypaper.task"},
            probes={"toy.weight_norm": "toypaper.probes"},
            reproductions={"toy/mean": Reproduction("toypaper.mean", "the learned bias approaches the data mean",
                                                    "reproduces Fig 1 of Toy et al.")},
        )
    ''',
    "toypaper/data.py": '''
        """The distribution: x ~ N(mu, 1) in dimension d."""
        import torch
        from tdyn.schema import Strict

        class ToyData(Strict):
            d: int = 3
            mu: float = 2.0
            batch_size: int = 16

        def sample(cfg: ToyData, gen: torch.Generator) -> torch.Tensor:
            return cfg.mu + torch.randn(cfg.batch_size, cfg.d, generator=gen)
    ''',
    "toypaper/model.py": '''
        """The model: a bias b, fitted to x by the squared loss ||x - b||^2 / 2 (Eqn 1)."""
        import torch
        from torch import nn
        from tdyn.schema import Strict

        class ToyModelConfig(Strict):
            d: int = 3

        class ToyModel(nn.Module):
            def __init__(self, d: int):
                super().__init__()
                self.b = nn.Parameter(torch.zeros(d))

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return 0.5 * ((x - self.b) ** 2).sum(-1).mean()      # Eqn 1
    ''',
    "toypaper/task.py": '''
        """The task: the data wired to the model."""
        import tdyn
        from toypaper.data import ToyData, sample
        from toypaper.model import ToyModel, ToyModelConfig

        class ToyTask(tdyn.PlainTask):
            def __init__(self, cfg, members):
                self.data_cfg = ToyData.model_validate(cfg.data)
                self.d = ToyModelConfig.model_validate(cfg.model).d
                super().__init__(cfg, members)

            def make_model(self):
                return ToyModel(self.d)

            def sample(self, gen):
                return sample(self.data_cfg, gen)

            def member_loss(self, model, batch):
                return model(batch)

        @tdyn.register_task("toy_mean", ToyData, ToyModelConfig, "the toy paper's Gaussian mean")
        def build(cfg, members):
            return ToyTask(cfg, members)
    ''',
    "toypaper/probes.py": '''
        """One probe: the norm of the learned bias."""
        import tdyn

        @tdyn.probe("toy.weight_norm")
        def weight_norm(ctx):
            return {"norm": dict(ctx.model.named_parameters())["b"].norm(dim=-1)}
    ''',
    "toypaper/mean.py": '''
        """The reproduction: two seeds learn b ≈ mu."""
        from tdyn import runs, stats
        from tdyn.reproduce.common import claim, configure, train_into
        from tdyn.reproduce.registry import register

        def config(seed=0, steps=200):
            return {"task": "toy_mean", "data": {"d": 3, "mu": 2.0}, "model": {"d": 3}, "seeds": [seed, seed + 1],
                    "optim": {"steps": steps, "groups": {"all": {"params": ["b"], "optimizer": "sgd", "lr": 0.1}}},
                    "probes": {"names": ["toy.weight_norm"], "every": 50}, "checkpoint": {"schedule": "none"}}

        @register("toy/mean", configs=lambda ctx: {"toy": config(ctx.seed, 40 if ctx.quick else 200)})
        def mean(ctx):
            dirs = train_into(ctx, "toy", configure(config(ctx.seed, 40 if ctx.quick else 200), ctx.overrides))
            finals = [runs.Run(d).metrics[-1]["toy.weight_norm/norm"] for d in dirs]
            ratio = stats.median(finals) / (2.0 * 3 ** 0.5)
            c = claim("C1", "the learned bias approaches the data mean", stats.within(ratio, stats.se(finals), 0.2),
                      source="paper", quote="the bias converges to the mean", paper="Toy et al., Fig 1",
                      definition="‖b‖ / ‖mu‖ at the last step (median of the seeds), within 20%", ratio=ratio)
            return {"experiment": "toy/mean", "claims": [c], "files": []}
    ''',
    "toypaper-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: toypaper\nVersion: 0.1\n",
    "toypaper-0.1.dist-info/entry_points.txt": "[tdyn.papers]\ntoypaper = toypaper\n",
}


def _tdyn(root: Path, *args, check=True):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(SRC)]))
    env.pop("TDYN_IMPORT", None)
    r = subprocess.run([sys.executable, "-m", "tdyn", *map(str, args)], capture_output=True, text=True,
                       env=env, cwd=root)
    assert not check or r.returncode == 0, r.stderr
    return r


def test_a_toy_paper_package_runs_like_a_built_in_one(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip())
    listed = _tdyn(tmp_path, "list").stdout
    assert "toy/mean" in listed and "the learned bias approaches the data mean" in listed
    out = tmp_path / "out"
    r = _tdyn(tmp_path, "reproduce", "toy/mean", "--quick", "--out", out)
    res = json.loads((out / "results.json").read_text())
    assert res["claims"][0]["source"] == "paper" and res["claims"][0]["verdict"] in ("holds", "fails", "inconclusive")
    assert "1 paper claims: 1 holds" in r.stdout
    _tdyn(tmp_path, "report", out)
    page = (out / "index.html").read_text()
    assert "Toy et al. — a toy paper" in page and "reproduces Fig 1 of Toy et al." in page   # the manifest's words
    assert "the learned bias approaches the data mean" in page
    # the built-in papers are still there, beside it
    assert "scan-snap/fig4" in listed
