"""Shared test fixtures: a toy quadratic task with an exact population loss (no batches)."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import Field

from tdyn.schema import Strict
from tdyn.tasks import Task, register_task
from tdyn.seeding import generator

ROOT = Path(__file__).resolve().parents[1]


class QuadData(Strict):
    dim: int = Field(3, ge=1)
    curvature: float = Field(1.0, gt=0)


class QuadModel(Strict):
    pass


class QuadTask(Task):
    """L(w, u) = c/2 ‖w‖² + 1/2 ‖u − 1‖² per member: an exact population loss (sample → None)."""

    def __init__(self, cfg, members):
        d = QuadData.model_validate(cfg.data)
        S = len(members)
        self.c = d.curvature
        self.model = torch.nn.Module()
        w = torch.stack([torch.randn(d.dim, generator=generator(m.seed, "init")) * m.init_scale for m in members])
        self.model.w = torch.nn.Parameter(w)
        self.model.u = torch.nn.Parameter(torch.zeros(S, d.dim))

    def sample(self, gen):
        return None

    def loss(self, batch):
        w, u = self.model.w, self.model.u
        return 0.5 * self.c * (w ** 2).sum(1) + 0.5 * ((u - 1) ** 2).sum(1)


@register_task("test_quadratic", QuadData, QuadModel, "toy quadratic (tests only)")
def _build(cfg, members):
    return QuadTask(cfg, members)


def quad_config(**kw):
    cfg = {"task": "test_quadratic", "data": {"dim": 3}, "seeds": [0],
           "optim": {"steps": 20, "groups": {"w": {"params": ["w"], "lr": 0.1}, "u": {"params": ["u"], "lr": 0.1}}},
           "checkpoint": {"schedule": "none"}}
    cfg.update(kw)
    return cfg


def tdyn_cli(*args, timeout=300, **kw):
    """Run the CLI in a subprocess (as a user would)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "tdyn", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=kw.get("cwd", ROOT))


@pytest.fixture
def cli():
    return tdyn_cli


@pytest.fixture(scope="module")
def preloaded_cli():
    """Like ``cli`` (the command in a process of its own), forked from a server that imported torch and
    tdyn once (``hostile.PreloadedCli``): for the tables of hostile inputs, a hundred commands a module."""
    from hostile import PreloadedCli

    server = PreloadedCli()
    yield server
    server.close()


from tdyn.probes import probe  # noqa: E402


@probe("test.quad")
def _quad_probe(ctx):
    """A scalar (‖w‖² per member) and an array (w itself) for the probe-interface test."""
    w = ctx.model.w.detach()
    return {"sq": (w ** 2).sum(1), "w": w.clone()}


# ---------------------------------------------------------------- fake reproductions (report tests)

def _fake_reproduce(ctx):
    """A reproduction writing what real ones write: a PNG, a long CSV, claims of every verdict."""
    import matplotlib.pyplot as plt

    from tdyn.reproduce.common import claim
    from tdyn.report import style
    from tdyn.runs import write_csv

    style.apply()
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1, 2], [2.0, 1.0, 0.5])
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    style.save(fig, ctx.out / "curve.png")
    write_csv(ctx.out / "table.csv", [{"step": i, "loss": 1 / (i + 1)} for i in range(40)], ["step", "loss"])
    return {"experiment": "test/fake", "seed": ctx.seed, "config": {"optim": {"steps": 3}},
            "files": ["curve.png", "table.csv"], "extra_number": 1.5,
            "claims": [claim("a", "Loss falls <b>below</b> 1 (Fig 1)", True, source="paper", quote="the loss falls", paper="Fig 1", definition="final loss",
                             final=0.5),
                       claim("b", "Loss reaches 0", False, source="paper", quote="the loss falls", paper="Fig 1", definition="final loss", measured="final training loss", expected="0",
                             final=0.5),
                       claim("c", "Loss is small", None, source="derived", derived="a check tdyn adds", paper="Fig 1", definition="final loss", final=0.5)]}


def _failing_reproduce(ctx):
    raise RuntimeError("boom")


@pytest.fixture
def fake_experiments(monkeypatch):
    """Register ``test/fake`` and ``test/fails`` for the duration of a test; returns their names."""
    from tdyn.reproduce import registry

    registry.all_experiments()
    for name, fn in (("test/fake", _fake_reproduce), ("test/fails", _failing_reproduce)):
        monkeypatch.setitem(registry._REGISTRY, name, registry.Experiment(name, f"{name} (tests only)", fn))
    return ["test/fake", "test/fails"]


@pytest.fixture
def one_thread():
    """One torch intra-op thread for the test, as the CLI sets it: process pools then fork (their workers see
    the test's registrations), and small matrices do not spin several threads against each other."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def benchmarks_script(name: str):
    """A script of benchmarks/ (e.g. an authors'-code patch) loaded as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_text_patch(mod, root: Path, path: Path, before: str, after: str, commit: str):
    """An authors'-checkout patch (``mod.patch``, ``mod.is_patched``) turns ``path``'s text ``before`` into exactly
    ``after``, once (a second patch writes nothing), and refuses a file it does not know, naming the ``commit``."""
    path.write_text(before)
    assert not mod.is_patched(root)
    mod.patch(root)
    once = path.read_text()
    assert once == after
    assert mod.is_patched(root)
    mod.patch(root)
    assert path.read_text() == once                                     # idempotent
    path.write_text("print('another file')\n")
    with pytest.raises(SystemExit, match=commit):
        mod.patch(root)


def per_layer_central_differences(model, names, layers: int, loss, seed: int, h: float = 1e-6):
    """For each weight ``names`` of each of ``layers`` untied layers (parameters shaped [S, K, ...]): a random
    direction v in that layer alone and the central difference (loss(p + h v) − loss(p − h v)) / 2h of
    ``loss()`` (a float, computed by the dense reference), the parameter restored after. Yields (name, layer,
    v, difference): the checks of a hand-written gradient against a reference without autograd."""
    g = torch.Generator().manual_seed(seed)
    for name in names:
        p = getattr(model, name)
        for layer in range(layers):
            v = torch.zeros_like(p)
            v[:, layer] = torch.randn(p.shape[2:], generator=g, dtype=p.dtype)
            with torch.no_grad():
                p += h * v
                up = loss()
                p -= 2 * h * v
                down = loss()
                p += h * v
            yield name, layer, v, (up - down) / (2 * h)


def random_lsa(K: int, tied: bool, S: int, d: int, seed: int = 0, std: float = 0.2, dtype=torch.float64):
    """An icl-gd LSA of K layers (tied or not), S members, tokens of width d + 1, every weight std·N(0, 1) drawn in
    float64 from a generator seeded ``seed`` in parameter order: the random models the icl-gd kernel tests share."""
    from tdyn.papers.icl_gd.model import LSA, LSAConfig

    m = LSA(LSAConfig(d + 1, layers=K, tied=tied, dtype=dtype), S=S)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(std * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return m


def json_differences(a, b, rel_tol: float, path: str = "") -> list[str]:
    """Where two JSON values differ, path by path, floats compared to ``rel_tol`` relative: for results recomputed
    on another CPU, whose last bits may differ (eigen-solves, BLAS reductions); everything else must be equal."""
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=rel_tol) else [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a.keys() ^ b.keys())} in one only"]
        return [d for k in a for d in json_differences(a[k], b[k], rel_tol, f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_differences(x, y, rel_tol, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.fixture
def torch_paths():
    """The test runs with tdyn.native off (``native.disabled()``): the tasks take their torch paths."""
    from tdyn import native

    with native.disabled():
        yield
