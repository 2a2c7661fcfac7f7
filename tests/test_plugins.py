"""A user's task from outside tdyn: registered in a module named by `tdyn --import`, it trains with
`run`, in a `sweep` (local pool workers and Ray import it too) and renders in `report`."""

import json
import os
import textwrap

import pytest

from tdyn import runs

USER_MODULE = textwrap.dedent('''
    """A user's task: noisy linear regression y = <w*, x> + noise, a linear model with an ensemble axis."""
    import torch
    from pydantic import Field

    from tdyn import Task, probe, register_task
    from tdyn.schema import Strict
    from tdyn.seeding import generator


    class LinRegData(Strict):
        dim: int = Field(5, ge=1)
        batch_size: int = 16
        noise: float = 0.1


    class LinRegModel(Strict):
        init_std: float = 0.01


    class LinReg(Task):
        def __init__(self, cfg, members):
            self.d = LinRegData.model_validate(cfg.data)
            m = LinRegModel.model_validate(cfg.model)
            self.w_star = torch.randn(self.d.dim, generator=torch.Generator().manual_seed(123))
            self.model = torch.nn.Module()
            self.model.w = torch.nn.Parameter(torch.stack([
                m.init_std * mem.init_scale * torch.randn(self.d.dim, generator=generator(mem.seed, "init"))
                for mem in members]))

        def sample(self, gen):
            x = torch.randn(self.d.batch_size, self.d.dim, generator=gen)
            return x, x @ self.w_star + self.d.noise * torch.randn(self.d.batch_size, generator=gen)

        def loss(self, batch):
            x, y = batch                                   # [S, B, dim], [S, B]
            pred = torch.einsum("sbd,sd->sb", x, self.model.w)
            return ((pred - y) ** 2).mean(1)


    @register_task("my_linreg", LinRegData, LinRegModel, "noisy linear regression (a user's task)")
    def build(cfg, members):
        return LinReg(cfg, members)


    @probe("my_linreg.distance")
    def distance(ctx):
        return {"to_w_star": (ctx.model.w - ctx.task.w_star).norm(dim=1)}
''')

CONFIG = {"task": "my_linreg", "data": {"dim": 5}, "seeds": [0, 1],
          "optim": {"steps": 30, "groups": {"all": {"params": ["w"], "lr": 0.05}}},
          "probes": {"names": ["my_linreg.distance"], "every": 10}}


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    monkeypatch.delenv("TDYN_IMPORT", raising=False)
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "mytasks.py").write_text(USER_MODULE)
    (pkg / "cfg.json").write_text(json.dumps(CONFIG))
    return pkg


def test_user_task_unknown_without_import(cli, user_module):
    r = cli("run", user_module / "cfg.json", "--out", user_module / "r", cwd=user_module)
    assert r.returncode == 2 and "unknown task 'my_linreg'" in r.stderr and "--import" in r.stderr
    r = cli("--import", "no_such_mod", "list", cwd=user_module)
    assert r.returncode == 2 and "no module named 'no_such_mod'" in r.stderr


@pytest.mark.parametrize("how", ["module", "file"])
def test_user_task_runs_sweeps_and_reports(cli, user_module, how):
    imp = "mytasks" if how == "module" else str(user_module / "mytasks.py")
    r = cli("--import", imp, "run", "cfg.json", "--out", "r", "--quiet", cwd=user_module)
    assert r.returncode == 0, r.stderr
    for d in runs.job_dirs(user_module / "r"):
        dist = [m["my_linreg.distance/to_w_star"] for m in runs.Run(d).metrics]
        assert runs.Run(d).status == "finished" and dist[-1] < dist[0]
    spec = {"base": "cfg.json", "axes": {"grid": {"optim.groups.all.lr": [0.01, 0.05]}}, "seeds": [0]}
    (user_module / "spec.json").write_text(json.dumps(spec))
    r = cli("--import", imp, "sweep", "spec.json", "--out", "s", "--workers", "2", "--quiet", cwd=user_module)
    assert r.returncode == 0, r.stderr
    sw = runs.read_json(user_module / "s" / runs.SWEEP)
    assert [x["status"] for x in sw["runs"]] == ["finished"] * 2
    r = cli("--import", imp, "report", "s", cwd=user_module)
    assert r.returncode == 0 and (user_module / "s" / "index.html").exists(), r.stderr


def test_user_task_under_ray(cli, user_module):
    pytest.importorskip("ray")
    spec = {"base": "cfg.json", "axes": {"grid": {"optim.groups.all.lr": [0.01, 0.05]}}, "seeds": [0]}
    (user_module / "spec.json").write_text(json.dumps(spec))
    r = cli("--import", "mytasks", "sweep", "spec.json", "--out", "s", "--executor", "ray", "--workers", "1",
            "--quiet", cwd=user_module)
    assert r.returncode == 0, r.stderr
    assert [x["status"] for x in runs.read_json(user_module / "s" / runs.SWEEP)["runs"]] == ["finished"] * 2
