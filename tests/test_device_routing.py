"""``--device`` reaches every run config a reproduction trains, and analysis rebuilds a GPU-trained run
on the CPU. (The CUDA kernels themselves run only on a lent GPU machine: benchmarks/gpu_check.sh.)"""

import json

import pytest
import torch

from tdyn import runs
from tdyn.reproduce.common import configure
from tdyn.reproduce.registry import ReproduceContext, all_experiments
from tdyn.train.trainer import train

#: reproductions whose configs are cheap to build (the decision-list ones compute their grids first)
NAMES = ["scan-snap/fig4", "scan-snap/fig6", "topic/stage1", "topic/two-stage", "real/entropy-vs-lr",
         "real/attention-maps", "scan-snap/thm3"]


@pytest.mark.parametrize("name", NAMES)
def test_reproduce_device_reaches_every_run_config(name, tmp_path):
    exp = all_experiments()[name]
    on_gpu = ReproduceContext(out=tmp_path, quick=True, device="cuda")
    on_cpu = ReproduceContext(out=tmp_path, quick=True)
    raws = exp.configs(on_cpu)
    assert raws
    for key, raw in raws.items():
        assert configure(raw, on_gpu.overrides).device == "cuda", key
        assert configure(raw, on_cpu.overrides).device == "cpu", key
        # a --set device= still wins over --device
        assert configure(raw, ReproduceContext(out=tmp_path, device="cuda", overrides=["device=cpu"]).overrides).device == "cpu"


def test_cpu_configs_are_unchanged_by_the_device_routing(tmp_path):
    """On the CPU the raw config is passed through as it is: the Fig 6 sweep's digest, which names its
    directory, does not change for runs made before ``--device`` reached it."""
    from tdyn.reproduce.common import on_reproduction_device

    raw = {"task": "x"}
    assert on_reproduction_device(raw, ReproduceContext(out=tmp_path).overrides) is raw
    assert on_reproduction_device(raw, ReproduceContext(out=tmp_path, device="cuda").overrides) == {"task": "x", "device": "cuda"}


def test_a_gpu_trained_run_is_rebuilt_on_the_cpu(tmp_path):
    """``Run.task()``/``Run.model()`` build on the CPU whatever device the run trained on (its checkpoints
    hold CPU tensors): here a corpus-LM run whose config says cuda, on a machine that may have no GPU.
    Built with the run's device, its dropout streams were CUDA generators and a training-mode forward
    on the CPU weights failed."""
    from tdyn.papers.real_text.analysis import lm_groups

    cfg = {"task": "corpus_lm", "data": {"corpus": "fixture", "bptt": 8, "batch_size": 2},
           "model": {"d": 8, "d_hid": 8, "n_layers": 1, "dropout": 0.2}, "seeds": [0],
           "optim": {"steps": 2, "groups": lm_groups(1, "one", 0.1)},
           "checkpoint": {"schedule": "none"}}
    (d,) = train(cfg, tmp_path / "r", progress=False)
    saved = json.loads((d / runs.CONFIG).read_text())
    (d / runs.CONFIG).write_text(json.dumps(saved | {"device": "cuda"}))
    run = runs.Run(d)
    assert run.config["device"] == "cuda"
    model = run.model()
    assert all(p.device.type == "cpu" for p in model.parameters()) and model.training
    x = torch.zeros(1, 2, 8, dtype=torch.long)
    assert torch.isfinite(model.loss(x, x)).all()
    torch.testing.assert_close(model.emb.detach()[0], run.param("emb"))


class _Stop(Exception):
    pass


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_paths_that_build_their_own_configs_get_the_device(device, tmp_path, monkeypatch):
    """The Fig 6 sweep's spec and topic/stage1's two jobs (the second built from the first's raw config) are
    made outside ``configure``'s return value: what reaches ``run_sweep`` / ``train_into`` is checked. On
    the CPU the sweep's spec has no device key, so its digest, which names its directory, is as before."""
    import tdyn.reproduce.phases as phases       # topic/stage1 is phases: the runner trains e2 and e2-l2;
                                                 # scan-snap/fig6 plans its sweep, which the runner runs

    seen = []

    def sweep(spec, root, **kw):
        seen.append(spec["config"].get("device"))
        raise _Stop

    def train(ctx, name, cfg):
        seen.append(cfg.device)
        if len(seen) == 2:
            raise _Stop
        return []

    monkeypatch.setattr(phases, "run_sweep", sweep)
    monkeypatch.setattr(phases, "train_into", train)
    monkeypatch.setattr(phases, "default_workers", lambda: 1)   # the plan's jobs in this process, through train_into
    with pytest.raises(_Stop):
        all_experiments()["scan-snap/fig6"].reproduce(ReproduceContext(out=tmp_path, quick=True, device=device))
    assert seen == [None if device == "cpu" else "cuda"]
    seen.clear()
    with pytest.raises(_Stop):
        all_experiments()["topic/stage1"].reproduce(ReproduceContext(out=tmp_path / "s", quick=True, device=device))
    assert seen == [device, device]
