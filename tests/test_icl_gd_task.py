"""The ``icl_gd`` task through the trainer, and the construction reproduction end to end at small settings
(docs/reproductions/icl-gd.md#tests)."""

import json

import pytest
import torch

from tdyn import runs
from tdyn.config import load_config
from tdyn.papers.icl_gd import theory as th
from tdyn.papers.icl_gd.task import icl_gd_config
from tdyn.tasks import build_task
from tdyn.train.trainer import expand_members, train


def _cfg(seeds, steps=30, layers=1, lr=3e-3, batch_size=64, init_scale=0.002):
    cfg = icl_gd_config(layers=layers, seeds=seeds, steps=steps, batch_size=batch_size, probe_size=256, probe_every=10)
    cfg["optim"]["groups"]["all"]["lr"] = lr
    cfg["model"]["init_scale"] = init_scale
    return cfg


def _curve(d):
    return [(r["step"], r["loss"]) for r in runs.Run(d).metrics]


def test_an_ensemble_member_equals_its_run_alone(tmp_path):
    both = train(_cfg([0, 1], layers=2), tmp_path / "both", progress=False)
    alone = train(_cfg([1], layers=2), tmp_path / "alone", progress=False)
    # the same trajectory to float32 rounding (batched products of S members round differently from one), as
    # tests/test_trainer.py asks of every task
    for ra, rb in zip(runs.Run(both[1]).metrics, runs.Run(alone[0]).metrics):
        for k in ("loss", "icl_gd.loss/loss", "icl_gd.align/sens_cos", "icl_gd.weights/eta_eff"):
            assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-5), (ra["step"], k)
    for name, p in runs.Run(alone[0]).params().items():
        torch.testing.assert_close(p, runs.Run(both[1]).params()[name], rtol=1e-4, atol=1e-5)
    assert _curve(both[0]) != _curve(both[1])


def test_training_moves_towards_gd_and_the_probes_are_logged(tmp_path):
    # a larger init and rate than the authors' (their 5000 steps leave the small init's plateau slowly)
    (d,) = train(_cfg([0], steps=200, lr=1e-2, batch_size=128, init_scale=0.5), tmp_path / "r", progress=False)
    m = runs.Run(d).metrics
    first, last = m[0], m[-1]
    assert last["icl_gd.loss/loss"] < 0.8 * first["icl_gd.loss/loss"]
    assert last["icl_gd.align/sens_cos"] > first["icl_gd.align/sens_cos"] + 0.3
    os_ = th.one_step(10, 10)
    assert abs(first["icl_gd.loss/loss_gd"] / os_.loss_star - 1) < 0.15      # 256 probe sequences
    assert first["icl_gd.loss/loss_ratio"] == pytest.approx(first["icl_gd.loss/loss"] / first["icl_gd.loss/loss_gd"])
    assert {"icl_gd.weights/cos", "icl_gd.weights/eta_eff", "icl_gd.weights/eta_ratio"} <= set(last)


def test_construction_reproduction_quick(tmp_path, cli):
    r = cli("reproduce", "icl-gd/construction", "--quick", "--out", str(tmp_path / "c"), "--quiet", "--mc", "4096",
            "--gd-steps", "1,2")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "c" / "results.json").read_text())
    verdicts = {c["id"]: c["verdict"] for c in res["claims"]}
    assert verdicts["construction_is_one_gd_step"] == "holds" and verdicts["k_layers_are_k_gd_steps"] == "holds"
    assert (tmp_path / "c" / "construction.png").exists()
    assert {c["source"] for c in res["claims"]} == {"paper", "derived"}


def test_sample_streams_is_the_stacked_samples_batch_last():
    """The task's per-step draw: each stream's :meth:`sample`, the same values as stacking them (the base Task's
    ``sample_streams``), held batch-last (what lsa.c reads without a copy)."""
    rc = load_config(icl_gd_config(layers=2, seeds=[0, 1, 2], steps=1, batch_size=40, probe_size=8))
    task = build_task(rc, expand_members(rc))
    E, y = task.sample_streams([torch.Generator().manual_seed(s) for s in (3, 4, 5)])
    stacked = [task.sample(torch.Generator().manual_seed(s)) for s in (3, 4, 5)]
    assert E.shape == (3, 40, 11, 11) and y.shape == (3, 40)
    assert torch.equal(E, torch.stack([e for e, _ in stacked])) and torch.equal(y, torch.stack([t for _, t in stacked]))
    assert E.permute(0, 2, 3, 1).is_contiguous()


@pytest.mark.parametrize("K", [1, 2])
def test_torch_path_reads_the_batch_last_batch_as_stacked(K):
    """Without lsa.c the task's loss and gradient on ``sample_streams``' batch-last view are those of the stacked,
    contiguous batches bit for bit (the torch path's bits do not depend on the layout)."""
    from tdyn import native

    rc = load_config(icl_gd_config(layers=K, seeds=[0, 1], steps=1, batch_size=40, probe_size=8))
    task = build_task(rc, expand_members(rc))
    E, y = task.sample_streams([torch.Generator().manual_seed(s) for s in (3, 4)])
    params = list(task.model.parameters())
    with native.disabled():
        a, b = task.loss((E, y)), task.loss((E.contiguous(), y))
    assert torch.equal(a, b)
    for u, v in zip(torch.autograd.grad(a.sum(), params), torch.autograd.grad(b.sum(), params)):
        assert torch.equal(u, v)
