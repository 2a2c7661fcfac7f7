"""Trainer: optimizers match torch.optim, ensembles equal their members trained alone, freeze
schedules, exact population losses, divergence handling."""

import json
import math

import pytest
import torch

from conftest import quad_config
from tdyn import runs
from tdyn.config import GroupConfig, load_config
from tdyn.train.optim import EnsembleOptimizer
from tdyn.train.trainer import train


def _toy_loss(p, target):
    d = p - target
    return torch.log(torch.cosh(d)).sum() + 0.1 * (d ** 2).sum()


@pytest.mark.parametrize("kind, kw, ref", [
    ("sgd", dict(momentum=0.9, weight_decay=0.01), lambda p, lr: torch.optim.SGD([p], lr=lr, momentum=0.9, weight_decay=0.01)),
    ("adam", dict(weight_decay=0.01), lambda p, lr: torch.optim.Adam([p], lr=lr, weight_decay=0.01)),
    ("adamw", dict(weight_decay=0.1), lambda p, lr: torch.optim.AdamW([p], lr=lr, weight_decay=0.1)),
])
def test_optimizers_match_torch(kind, kw, ref):
    g = torch.Generator().manual_seed(0)
    lrs = [0.05, 0.3]
    x0 = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
    target = torch.randn(4, 3, generator=g, dtype=torch.float64)
    p = torch.nn.Parameter(x0.clone())
    opt = EnsembleOptimizer({"p": p}, {"g": GroupConfig(params=["p"], optimizer=kind, lr=1.0, **kw)},
                            {"g": torch.tensor(lrs, dtype=torch.float64)})
    refs = [torch.nn.Parameter(x0[i].clone()) for i in range(2)]
    ropts = [ref(r, lr) for r, lr in zip(refs, lrs)]
    for _ in range(25):
        p.grad = None
        _toy_loss(p, target).backward()
        opt.step(set(), torch.ones(2, dtype=torch.bool))
        for r, o in zip(refs, ropts):
            o.zero_grad()
            _toy_loss(r, target).backward()
            o.step()
    for i in range(2):
        torch.testing.assert_close(p.detach()[i], refs[i].detach(), rtol=1e-12, atol=1e-12)


def _reference_step(kind, kw, p, grad, state, lr):
    """The update as written before the in-place optimizer (out of place, fresh temporaries): the
    floats the in-place form must reproduce bit for bit."""
    g, lr = grad, lr.view(-1, 1, 1)
    if kind == "sgd":
        if kw.get("weight_decay"):
            g = g.add(p, alpha=kw["weight_decay"])
        if kw["momentum"] > 0:
            state.setdefault("m", torch.zeros_like(p)).mul_(kw["momentum"]).add_(g)
            g = state["m"]
        return p.sub_(lr * g)
    b1, b2, eps = 0.9, 0.999, 1e-8
    if kind == "adamw":
        p.mul_(1 - lr * kw["weight_decay"])
    else:
        g = g.add(p, alpha=kw["weight_decay"])
    step = state.setdefault("t", torch.zeros(2, dtype=torch.float64)).add_(1)
    m, v = state.setdefault("m", torch.zeros_like(p)), state.setdefault("v", torch.zeros_like(p))
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    t = step.view(-1, 1, 1)
    bc1, bc2_sqrt = (1 - b1 ** t).to(p), (1 - b2 ** t).sqrt().to(p)
    return p.sub_((lr / bc1) * (m / (v.sqrt() / bc2_sqrt).add_(eps)))


@pytest.mark.parametrize("kind, kw", [("sgd", dict(momentum=0.9, weight_decay=0.01)), ("sgd", dict(momentum=0.0)),
                                      ("adam", dict(weight_decay=0.01)), ("adamw", dict(weight_decay=0.1))])
def test_in_place_update_equals_the_formula_bit_for_bit_and_allocates_once(kind, kw):
    """The update's temporaries live in one preallocated buffer per parameter (``out=``/in-place ops,
    no allocation of a parameter's size per step) and give exactly the out-of-place formula's floats."""
    g = torch.Generator().manual_seed(1)
    lrs = torch.tensor([0.05, 0.3])
    x0, target = torch.randn(2, 64, 33, generator=g), torch.randn(64, 33, generator=g)
    p = torch.nn.Parameter(x0.clone())
    opt = EnsembleOptimizer({"p": p}, {"g": GroupConfig(params=["p"], optimizer=kind, lr=1.0, **kw)}, {"g": lrs})
    ref, state, ptrs = x0.clone(), {}, set()
    for t in range(1, 11):
        p.grad = None
        _toy_loss(p, target).backward()
        r = ref.clone().requires_grad_(True)
        _toy_loss(r, target).backward()
        ref = _reference_step(kind, kw, ref, r.grad, state, lrs)
        opt.step(set(), torch.ones(2, dtype=torch.bool))
        ptrs.add(opt.scratch["p"].data_ptr())
        assert torch.equal(p.detach(), ref), (kind, t, (p.detach() - ref).abs().max().item())
    assert len(ptrs) == 1 and set(opt.scratch) == {"p"} and not any("scratch" in k for k in opt.state)


def _metrics(d):
    return runs.read_metrics(d)


def test_ensemble_equals_members_alone(tmp_path):
    """Each member of a seeds × lr-sets ensemble follows the trajectory it has when trained alone."""
    cfg = load_config("syn_small", [
        "optim.steps=30", "seeds=0,1", "ensemble.lrs=[{Y: 1, Z: 1}, {Y: 10, Z: 2}]", "model.init=torch_default",
        "checkpoint.schedule=none"])
    dirs = train(cfg, tmp_path / "ens", progress=False)
    assert len(dirs) == 4 and (tmp_path / "ens" / "ensemble.json").exists()
    for d in dirs:
        alone = train(runs.read_config(d), tmp_path / ("alone-" + d.name), progress=False)[0]
        a, b = _metrics(d), _metrics(alone)
        assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(31))
        for ra, rb in zip(a, b):
            assert ra.keys() == rb.keys()
            for k in ra:
                assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-5), (d.name, ra["step"], k)
        pa = runs.params_of(runs.load_checkpoint(d))
        pb = runs.params_of(runs.load_checkpoint(alone))
        for k in pa:
            torch.testing.assert_close(pa[k], pb[k], rtol=1e-4, atol=1e-5)


def test_step0_loss_is_ln_M_exactly(tmp_path):
    cfg = load_config("syn_small", ["optim.steps=1", "dtype=float64"])
    (d,) = train(cfg, tmp_path / "r", progress=False)
    # zero logits: CE = logsumexp(0) = ln M; the batch mean may round in the last ulp
    assert _metrics(d)[0]["loss"] == pytest.approx(math.log(34), rel=1e-15, abs=0)


def test_population_loss_and_per_group_lrs(tmp_path):
    """Exact population loss (no batches): plain GD on c/2‖w‖² contracts by (1 − η c) per step."""
    cfg = quad_config(seeds=[3], data={"dim": 3, "curvature": 2.0})
    cfg["optim"]["groups"]["w"]["lr"] = 0.1
    (d,) = train(cfg, tmp_path / "q", progress=False)
    m = _metrics(d)
    assert len(m) == 21
    w0, w20 = m[0]["norm/w"], m[20]["norm/w"]
    assert w20 == pytest.approx(w0 * 0.8 ** 20, rel=1e-5)
    assert m[20]["norm/u"] == pytest.approx(math.sqrt(3) * (1 - 0.9 ** 20), rel=1e-5)


def test_freeze_schedules(tmp_path):
    cfg = quad_config(optim={"steps": 10, "groups": {"w": {"params": ["w"], "lr": 0.1}, "u": {"params": ["u"], "lr": 0.1}},
                             "freeze": {"w": {"until": 4}, "u": {"after": 6}}})
    (d,) = train(cfg, tmp_path / "f", progress=False)
    m = _metrics(d)
    upd_w = [r["update_norm/w"] for r in m[:-1]]
    upd_u = [r["update_norm/u"] for r in m[:-1]]
    assert all(u == 0 for u in upd_w[:4]) and all(u > 0 for u in upd_w[4:])
    assert all(u > 0 for u in upd_u[:6]) and all(u == 0 for u in upd_u[6:])
    cfg["optim"]["freeze"] = {"w": {"always": True}}
    (d2,) = train(cfg, tmp_path / "f2", progress=False)
    w_init = runs.params_of(runs.load_checkpoint(d2, 0))["w"]
    assert torch.equal(runs.params_of(runs.load_checkpoint(d2))["w"], w_init)


def test_divergence_stops_member_keeps_checkpoint(tmp_path):
    """GD on c/2‖w‖² with η c = 50 overflows; the member is marked diverged, the others finish."""
    cfg = quad_config(seeds=[0], ensemble={"lrs": [{"w": 0.1}, {"w": 25.0}]}, data={"dim": 3, "curvature": 2.0},
                      checkpoint={"schedule": "none", "every": 5})
    cfg["optim"]["steps"] = 60
    good, bad = train(cfg, tmp_path / "d", progress=False)
    assert runs.read_meta(good)["status"] == "finished"
    meta = runs.read_meta(bad)
    assert meta["status"] == "diverged"
    step = int(meta["message"].split("step ")[1].split(":")[0])
    assert 0 < step < 60 and "\n" not in meta["message"]
    m = _metrics(bad)
    assert m[-1] == {"step": step, "loss": None, "diverged": True}
    assert all(math.isfinite(r["loss"]) for r in m[:-1])
    ckpts = runs.checkpoint_steps(bad)
    assert ckpts and max(ckpts) <= step and not (bad / "checkpoints" / "final.safetensors").exists()
    assert all(torch.isfinite(v).all() for v in runs.params_of(runs.load_checkpoint(bad, max(ckpts))).values())


def test_existing_dir_not_overwritten(tmp_path):
    from tdyn.errors import UserError

    cfg = quad_config()
    train(cfg, tmp_path / "r", progress=False)
    before = (tmp_path / "r" / "metrics.jsonl").read_text()
    with pytest.raises(UserError, match="already exists"):
        train(cfg, tmp_path / "r", progress=False)
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == before
    train(cfg, tmp_path / "r", progress=False, force=True)


def test_meta_and_checkpoints_load_without_pickle(tmp_path):
    (d,) = train(quad_config(checkpoint={"schedule": "log", "num": 4}), tmp_path / "r", progress=False)
    meta = json.loads((d / "meta.json").read_text())
    assert {"tdyn_version", "torch_version", "git_commit", "seed", "started", "ended", "status"} <= meta.keys()
    from safetensors.torch import load_file

    for f in (d / "checkpoints").iterdir():
        t = load_file(f)
        assert {"param/w", "param/u", "rng/data"} <= t.keys()


def test_probes_scalars_to_metrics_arrays_to_checkpoints(tmp_path):
    cfg = quad_config(probes={"names": ["test.quad"], "every": 5}, checkpoint={"schedule": "none", "steps": [10]})
    (d,) = train(cfg, tmp_path / "p", progress=False)
    m = _metrics(d)
    assert [r["step"] for r in m] == [0, 5, 10, 15, 20]
    for r in m:
        assert r["test.quad/sq"] == pytest.approx(r["norm/w"] ** 2, rel=1e-5)
    for s in (0, 10, "final"):
        ck = runs.load_checkpoint(d, s)
        torch.testing.assert_close(ck["probe/test.quad/w"], ck["param/w"])


def test_unknown_probe_is_a_config_error(tmp_path):
    from tdyn.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown probe 'nope'"):
        train(quad_config(probes={"names": ["nope"]}), tmp_path / "never", progress=False)
    assert not (tmp_path / "never").exists()


def test_tensorboard_sink_gets_the_metric_stream(tmp_path):
    """log.tensorboard: true writes every scalar of metrics.jsonl to <run>/tensorboard (same steps and values)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tdyn import runs
    from tdyn.train.trainer import train

    cfg = {"task": "decision_list", "data": {"L": 5, "M": 2, "n": 3}, "seeds": [0], "dtype": "float64",
           "optim": {"steps": 6, "groups": {"all": {"params": ["W", "V"], "lr": 1.0}}},
           "probes": {"names": ["decision_list.V"], "every": 2}, "log": {"tensorboard": True}}
    (d,) = train(cfg, tmp_path / "r", progress=False)
    ev = EventAccumulator(str(d / "tensorboard"))
    ev.Reload()
    recs = runs.Run(d).metrics
    assert recs[0]["decision_list.V/cos_c"] is None          # cos with V₀ = 0 is undefined: left out
    for key in ("loss", "decision_list.V/cos_c"):
        got = [(e.step, e.value) for e in ev.Scalars(key)]
        want = [(r["step"], r[key]) for r in recs if r.get(key) is not None]   # null (NaN) is not logged
        assert [s for s, _ in got] == [s for s, _ in want]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)


def test_missing_log_extra_is_one_line(cli, tmp_path):
    import json

    cfg = {"task": "decision_list", "data": {"L": 5, "M": 2, "n": 3},
           "optim": {"steps": 2, "groups": {"all": {"params": ["W", "V"], "lr": 1.0}}}, "log": {"wandb": True}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    r = cli("run", tmp_path / "c.json", "--out", tmp_path / "r")
    try:
        import wandb  # noqa: F401
    except ImportError:
        assert r.returncode == 2 and "pip install 'tdyn[wandb]'" in r.stderr and "Traceback" not in r.stderr
    else:
        assert r.returncode == 0, r.stderr


def test_wandb_sink_logs_offline(tmp_path, monkeypatch):
    """log.wandb: true writes an offline W&B run per member (no network, no login) with the metric stream."""
    pytest.importorskip("wandb")
    from tdyn.train.trainer import train

    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = {"task": "decision_list", "data": {"L": 5, "M": 2, "n": 3}, "seeds": [0, 1], "dtype": "float64",
           "optim": {"steps": 4, "groups": {"all": {"params": ["W", "V"], "lr": 1.0}}}, "log": {"wandb": True}}
    dirs = train(cfg, tmp_path / "e", progress=False)
    for d in dirs:
        offline = list((d / "wandb").glob("offline-run-*"))
        (log,) = offline[0].glob("*.wandb")
        assert len(offline) == 1 and b"update_norm/W" in log.read_bytes(), d   # the metric stream's keys
