"""The decision_list trainer task: population-loss GD through `train` equals a hand-written GD loop."""

import torch

from tdyn import runs
from tdyn.data import decision_list as dl
from tdyn.models.decision_list import DecisionListModel, DecisionListModelConfig
from tdyn.theory import decision_list as th
from tdyn.train.seeding import generator
from tdyn.train.trainer import train


def test_trainer_runs_exact_population_gd(tmp_path):
    L, M, n, lr, steps = 6, 2, 3, 0.5, 10
    cfg = {"task": "decision_list", "data": {"L": L, "M": M, "n": n, "sampler": "B"},
           "model": {"init_std": 0.1, "c": 2.0}, "seeds": [0],
           "optim": {"steps": steps, "groups": {"all": {"params": ["W", "V"], "optimizer": "sgd", "lr": lr,
                                                        "momentum": 0.0}}},
           "checkpoint": {"schedule": "none", "steps": []}, "dtype": "float64"}
    d = train(cfg, tmp_path / "r", progress=False)[0]
    final = runs.params_of(runs.load_checkpoint(d, "final"))

    task = dl.make_task(L, M, 0)
    types = th.enumerate_types(task, n, "B")
    model = DecisionListModel(DecisionListModelConfig(L))
    g = generator(0, "init")
    with torch.no_grad():
        model.W[0] = 0.1 * torch.randn(L, L, generator=g, dtype=torch.float64)
        model.V[0] = 0.1 * torch.randn(L, L, generator=g, dtype=torch.float64) + 2.0 * task.P
    for _ in range(steps):
        model.W.grad = model.V.grad = None
        th.population_loss(model, task, types, backward=True)
        with torch.no_grad():
            model.W -= lr * model.W.grad
            model.V -= lr * model.V.grad
    assert torch.allclose(final["W"].double(), model.W[0].detach(), atol=1e-10)
    assert torch.allclose(final["V"].double(), model.V[0].detach(), atol=1e-10)
    losses = [r["loss"] for r in runs.read_metrics(d) if r.get("loss") is not None]
    assert losses[-1] < losses[0]


def test_result2_admissibility_threshold():
    from tdyn.experiments.decision_lists import admissibility

    rng = __import__("numpy").random.default_rng(0)
    checked = 0
    for _ in range(300):
        n, m, L0 = int(rng.integers(2, 80)), int(rng.integers(1, 7)), float(rng.uniform(0.2, 5))
        if abs(n * L0 ** 2 / (162 * m) - 1) < 1e-6:
            continue
        eps_star = admissibility(L0, n, m, 1.0)["eps_star"]
        a = admissibility(L0, n, m, eps_star)
        assert a["admissible"] == a["threshold_holds"] == (n * L0 ** 2 > 162 * m)
        checked += a["admissible"]
    assert 0 < checked < 300
