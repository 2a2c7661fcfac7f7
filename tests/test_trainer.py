"""Trainer: optimizers match torch.optim, ensembles equal their members trained alone, freeze
schedules, exact population losses, divergence handling."""

import itertools
import json
import math

import pytest
import torch

from conftest import QuadData, QuadModel, quad_config
from tdyn import runs
from tdyn.config import GroupConfig, load_config
from tdyn.tasks import Task, register_task
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


def test_a_divergence_is_on_disk_before_meta_json_says_so(tmp_path, monkeypatch):
    """When meta.json is written "diverged", metrics.jsonl already ends with the divergence record: a kill
    between the two writes leaves a job that resumes (meta.json's status without its record is refused)."""
    from tdyn.train import trainer

    seen = []
    real = runs.atomic_write_many

    def checked(files):   # meta.json's writes: what metrics.jsonl holds on disk as one says "diverged"
        files = list(files)
        for path, data in files:
            if path.name == runs.META and json.loads(data)["status"] == "diverged":
                seen.append(_metrics(path.parent)[-1])
        return real(files)

    monkeypatch.setattr(trainer.runs, "atomic_write_many", checked)
    cfg = quad_config(seeds=[0], ensemble={"lrs": [{"w": 0.1}, {"w": 25.0}]}, data={"dim": 3, "curvature": 2.0},
                      checkpoint={"schedule": "none"})
    cfg["optim"]["steps"] = 60
    train(cfg, tmp_path / "d", progress=False)
    assert len(seen) == 1 and seen[0]["diverged"] is True


class RunawayTask(Task):
    """Loss 0 whatever w is (``nan_to_num`` of w − w.detach()), gradient 1: SGD walks w down by lr a step
    until it overflows to −inf, the loss staying finite throughout."""

    def __init__(self, cfg, members):
        self.model = torch.nn.Module()
        self.model.w = torch.nn.Parameter(torch.zeros(len(members), 2))

    def sample(self, gen):
        return None

    def loss(self, batch):
        w = self.model.w
        return torch.nan_to_num((w - w.detach()).sum(1))


register_task("test_runaway", QuadData, QuadModel, "parameters overflow at a finite loss (tests only)")(RunawayTask)


def test_overflowing_norms_are_a_divergence_at_finite_loss(tmp_path):
    """w (two entries) falls by 1e18 a step; in float32 (largest 3.4e38) its norm √2·t·1e18 overflows once
    2t²·1e36 does, at step 14, its loss still 0. The member is diverged there (not finished), its message
    naming the norm and the last good checkpoint (step 12: the one at 16 is never written); the slow member
    finishes."""
    cfg = {"task": "test_runaway", "seeds": [0], "ensemble": {"lrs": [{"w": 0.1}, {"w": 1e18}]},
           "optim": {"steps": 20, "groups": {"w": {"params": ["w"], "lr": 0.1}}},
           "checkpoint": {"schedule": "none", "every": 4}}
    slow, fast = train(cfg, tmp_path / "r", progress=False)
    assert runs.read_meta(slow)["status"] == "finished"
    meta = runs.read_meta(fast)
    assert meta["status"] == "diverged", meta
    assert meta["message"].startswith("diverged at step 14: norm/w = inf")
    assert "last good checkpoint: step 12" in meta["message"]
    m = _metrics(fast)
    assert m[-1] == {"step": 14, "loss": None, "diverged": True}
    assert all(r["loss"] == 0.0 for r in m[:-1]) and len(m) == 15
    assert runs.checkpoint_steps(fast) == [0, 4, 8, 12]


def test_divergence_at_step_0_says_no_good_checkpoint(tmp_path):
    """An init scale of 1e30 overflows c/2‖w‖² in float32 at once: the member diverges at step 0, and its
    message says that no good checkpoint exists (the step-0 checkpoint holds the diverging state)."""
    cfg = quad_config(ensemble={"init_scales": [1.0, 1e30]})
    good, bad = train(cfg, tmp_path / "r", progress=False)
    assert runs.read_meta(good)["status"] == "finished"
    meta = runs.read_meta(bad)
    assert meta["status"] == "diverged"
    assert meta["message"].startswith("diverged at step 0: ") and "no good checkpoint exists" in meta["message"]
    assert _metrics(bad) == [{"step": 0, "loss": None, "diverged": True}]


def test_schedules_are_not_materialised():
    """10¹² steps with a checkpoint and an evaluation every step: the schedules answer ``in`` and
    iterate in order without building a set of 10¹² steps; such a checkpoint count is refused."""
    from tdyn.errors import ConfigError
    from tdyn.train.trainer import check_resources, checkpoint_schedule, eval_steps, expand_members

    T = 10 ** 12
    cfg = load_config(quad_config(optim={"steps": T, "groups": {"w": {"params": ["w", "u"], "lr": 0.1}}},
                                  checkpoint={"schedule": "log", "num": 5, "every": 10 ** 9, "steps": [7]}))
    ck = checkpoint_schedule(cfg)
    assert 7 in ck and 3 * 10 ** 9 in ck and 3 * 10 ** 9 + 1 not in ck and T not in ck
    assert list(itertools.islice(ck, 4)) == [0, 1, 7, 1000]
    ev = eval_steps(cfg)
    assert T in ev and T - 1 in ev and list(itertools.islice(ev, 3)) == [0, 1, 2]
    check_resources(cfg, expand_members(cfg))      # 1000 + 6 checkpoints: allowed
    dense = load_config(cfg.model_dump() | {"checkpoint": {"schedule": "none", "every": 1}})
    with pytest.raises(ConfigError, match="checkpoint"):
        check_resources(dense, expand_members(dense))


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


def test_meta_splits_the_job_seconds_into_probes_checkpoints_and_training(tmp_path, monkeypatch):
    """meta.json's ``seconds``: the job's wall time in the loop, split into probe evaluations, checkpoint writes
    and training; a probe made slow (a sleep per evaluation, 5 evaluations) shows up as probe seconds."""
    import time

    from tdyn.train import trainer

    cfg = quad_config(probes={"names": ["test.quad"], "every": 5}, checkpoint={"schedule": "none", "steps": [10]})
    measure = trainer.Job._measure
    monkeypatch.setattr(trainer.Job, "_measure", lambda self, *a: (time.sleep(0.05), measure(self, *a))[1])
    (d,) = train(cfg, tmp_path / "p", progress=False)
    sec = json.loads((d / "meta.json").read_text())["seconds"]
    assert set(sec) == {"wall", "probes", "checkpoints", "training"}
    assert sec["probes"] >= 5 * 0.05 and sec["checkpoints"] > 0 and sec["training"] > 0
    assert sec["wall"] == pytest.approx(sec["probes"] + sec["checkpoints"] + sec["training"], abs=2e-3)


def test_the_final_checkpoint_and_the_closing_commit_count_as_checkpoint_seconds(tmp_path, monkeypatch):
    """A run whose only checkpoint is the final one: its write (made slow: 0.3 s) and the commit that makes it
    durable are checkpoint seconds, not training (the Fig 6 jobs' 80-160 final checkpoints were training)."""
    import time

    from tdyn.train import trainer

    cfg = quad_config(probes={"names": [], "every": 100}, checkpoint={"schedule": "none", "initial": False})
    save = trainer.Job._save
    monkeypatch.setattr(trainer.Job, "_save",
                        lambda self, step, *a, **k: (time.sleep(0.3 if step == "final" else 0), save(self, step, *a, **k))[1])
    (d,) = train(cfg, tmp_path / "p", progress=False)
    sec = json.loads((d / "meta.json").read_text())["seconds"]
    assert sec["checkpoints"] >= 0.3 and sec["training"] < sec["wall"] - 0.3
    assert sec["wall"] == pytest.approx(sec["probes"] + sec["checkpoints"] + sec["training"], abs=2e-3)


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


_SMALL_LDA = {"num_topics": 3, "words_per_topic": 4, "min_len": 10, "max_len": 12, "num_train": 5, "num_dev": 5,
              "num_test": 2, "probe_docs": 2}


@pytest.mark.parametrize("cfg", [
    {"task": "scan_snap", "data": {"num_last": 3, "num_next_per_last": 2, "num_common_per_last": 2, "seq_len": 8, "batch_size": 2}},
    {"task": "scan_snap", "data": {"num_last": 2, "seq_len": 8, "batch_size": 2}, "model": {"parameterization": "embedding", "d": 16}},
    {"task": "lda_mlm", "data": _SMALL_LDA},
    {"task": "lda_mlm", "data": _SMALL_LDA, "model": {"embedding": "trained", "d": 8, "decoder": "trained", "n_layers": 2}},
    {"task": "lda_mlm", "data": _SMALL_LDA, "model": {"embedding": "trained", "d": 8, "decoder": "trained", "block": "bert"}},
    {"task": "decision_list", "data": {"L": 5, "M": 2, "n": 2}},
    {"task": "corpus_lm", "data": {"corpus": "fixture", "vocab_size": 50, "bptt": 8, "batch_size": 2, "probe_windows": 2},
     "model": {"d": 8, "d_hid": 12, "n_layers": 2}},
], ids=["yz", "embedding", "topic one-hot", "topic trained", "topic bert", "decision list", "corpus lm"])
def test_size_estimates_match_the_built_models(cfg):
    """Each built-in task's ``size(cfg)`` (what the memory check multiplies) is, from the config alone, the
    values of one member's parameters and per-member buffers of the model it builds: exactly, or for the
    topic model (an estimate within a few vectors) within 10 %, never far below."""
    from tdyn.tasks import build_task, get_task
    from tdyn.train.trainer import expand_members

    cfg = load_config(cfg | {"seeds": [0, 1], "optim": {"steps": 1, "groups": {"g": {"params": ["x"], "lr": 0.1}}}})
    model = build_task(cfg, expand_members(cfg)).model
    built = sum(t.numel() for t in [*model.parameters(), *model.buffers()] if t.shape[:1] == (2,)) / 2
    estimate = get_task(cfg.task).size(cfg)
    if cfg.task == "lda_mlm":
        assert built <= estimate <= 1.1 * built
    else:
        assert estimate == built


def test_a_model_too_large_for_memory_is_refused_before_it_is_built(monkeypatch, tmp_path):
    """With 1 MiB available, Syn-Small's Y and Z (2 × 34² values, × 5 state copies × 4 bytes ≈ 46 KB) fit,
    and 8 members with 100 distinct tokens per class (M = 214: 2 × 214² = 91,592 values, 14 MiB) do not:
    the refusal names the estimate and writes nothing."""
    from tdyn.errors import ConfigError
    from tdyn.train import trainer

    monkeypatch.setattr(trainer, "available_memory", lambda device: 2 ** 20)
    base = {"task": "scan_snap", "data": {"num_last": 2, "seq_len": 8, "batch_size": 2},
            "optim": {"steps": 1, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}},
            "checkpoint": {"schedule": "none"}}
    train(base, tmp_path / "fits", progress=False)
    big = base | {"data": base["data"] | {"num_unique_per_next": 100}, "seeds": list(range(8))}
    with pytest.raises(ConfigError, match=r"about 9\.16e\+04 parameters per member × 8 member\(s\) need an estimated "
                                          r"14 MiB .* 1 MiB of cpu memory is available"):
        train(big, tmp_path / "big", progress=False)
    assert not (tmp_path / "big").exists()


@pytest.mark.parametrize("rows", [[1, 4, 6], [3, 4, 5, 6, 7]], ids=["gathered", "range"])
@pytest.mark.parametrize("kind, kw", [("sgd", dict(momentum=0.9)), ("sgd", dict(momentum=0.0)), ("adam", {}),
                                      ("sgd", dict(momentum=0.9, weight_decay=0.01)), ("adamw", dict(weight_decay=0.1))])
def test_grad_rows_update_equals_every_row_bit_for_bit(kind, kw, rows):
    """``Task.grad_rows``: updating only the rows that can have a gradient gives the same floats as the
    update of every row (rows without gradient stay put), with a diverged (inactive) member too, for
    rows gathered and written back and for one range updated through a view; with weight decay the
    hint is ignored (every row moves)."""
    g = torch.Generator().manual_seed(2)
    lrs = torch.tensor([0.05, 0.3, 0.1])
    rows = torch.tensor(rows)
    x0, target = torch.randn(3, 9, 5, generator=g), torch.randn(3, 9, 5, generator=g)
    mask = torch.zeros(1, 9, 1)
    mask[:, rows] = 1
    ps, opts = [], []
    for hint in (None, {"p": rows}):
        p = torch.nn.Parameter(x0.clone())
        ps.append(p)
        opts.append(EnsembleOptimizer({"p": p}, {"g": GroupConfig(params=["p"], optimizer=kind, lr=1.0, **kw)},
                                      {"g": lrs}, hint))
    assert ("p" in opts[1].rows) == (not kw.get("weight_decay"))
    assert not opts[1].rows or isinstance(opts[1].rows["p"], slice) == (len(rows) == 5)
    if not kw.get("weight_decay"):
        for bad in ([-1, 0], [8, 9]):
            with pytest.raises(ValueError, match=r"grad_rows\['p'\]: rows must lie in \[0, 9\)"):
                EnsembleOptimizer({"p": ps[0]}, {"g": GroupConfig(params=["p"], optimizer=kind, lr=1.0, **kw)},
                                  {"g": lrs}, {"p": torch.tensor(bad)})
    for t in range(8):
        active = torch.tensor([True, t < 4, True])
        for p, opt in zip(ps, opts):
            p.grad = None
            (_toy_loss(p * mask + p.detach() * (1 - mask), target)).backward()   # gradient on `rows` only
            opt.step(set(), active)
        assert torch.equal(ps[0].detach(), ps[1].detach()), (kind, t)
        for k in opts[0].state:
            assert torch.equal(opts[0].state[k], opts[1].state[k]), (kind, t, k)


def test_without_the_initial_checkpoint(tmp_path):
    """checkpoint.initial = false: no step-0 checkpoint (nor the empty metrics file written before it),
    the same training; a run killed before any checkpoint reads as running with no records, and
    train_or_resume trains it again from the start to the same bits."""
    from tdyn.train.trainer import train_or_resume

    base = quad_config(seeds=[0, 1])
    with_0 = train(base, tmp_path / "a", progress=False)
    cfg = quad_config(seeds=[0, 1], checkpoint={"schedule": "none", "initial": False})
    without = train(cfg, tmp_path / "b", progress=False)
    for d0, d in zip(with_0, without):
        assert runs.checkpoint_steps(d0) == [0] and runs.checkpoint_steps(d) == []
        assert runs.read_metrics(d0) == runs.read_metrics(d)
        assert all(torch.equal(v, runs.load_checkpoint(d0)[k]) for k, v in runs.load_checkpoint(d).items()
                   if k.startswith("param/"))
    final = runs.load_checkpoint(without[1])
    for d in without:            # as a kill mid-training leaves them: config and meta (running) only
        (d / runs.METRICS).unlink()
        runs.checkpoint_path(d).unlink()
        runs.write_json(d / runs.META, runs.read_meta(d) | {"status": "running", "ended": None})
    assert runs.Run(without[1]).metrics == []
    train_or_resume(cfg, tmp_path / "b", progress=False)
    assert runs.Run(without[1]).status == "finished"
    again = runs.load_checkpoint(without[1])
    assert all(torch.equal(v, again[k]) for k, v in final.items() if k.startswith("param/"))


class FailingTask(Task):
    """The quadratic loss of w, raising at its 6th evaluation (step 5)."""

    def __init__(self, cfg, members):
        self.model = torch.nn.Module()
        self.model.w = torch.nn.Parameter(torch.ones(len(members), 2))
        self.calls = 0

    def sample(self, gen):
        return None

    def loss(self, batch):
        self.calls += 1
        if self.calls == 6:
            raise RuntimeError("the task broke")
        return (self.model.w ** 2).sum(1)


register_task("test_failing", QuadData, QuadModel, "raises at step 5 (tests only)")(FailingTask)


@pytest.mark.parametrize("initial", [True, False])
def test_a_failed_run_keeps_its_records(tmp_path, initial):
    """A job whose task raises marks its runs failed and keeps the records before the failure, also
    without a step-0 checkpoint (no metrics file had been written yet); the run reads like any other."""
    cfg = {"task": "test_failing", "seeds": [0, 1], "probes": {"every": 1},
           "optim": {"steps": 20, "groups": {"w": {"params": ["w"], "lr": 0.1}}},
           "checkpoint": {"schedule": "none", "initial": initial}}
    with pytest.raises(RuntimeError, match="the task broke"):
        train(cfg, tmp_path / "r", progress=False)
    for d in sorted(p for p in (tmp_path / "r").iterdir() if p.is_dir()):
        r = runs.Run(d)
        assert r.status == "failed" and "the task broke" in r.meta["message"]
        assert [m["step"] for m in r.metrics] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("flag", ["0", "1"])
def test_tuned_allocator_serves_large_blocks_from_the_heap(flag):
    """``tune_allocator`` (what training sets): blocks of any size, 64 MB and 1.25 GB (above the 1 GB mmap
    threshold of the setting before, where Fig 10's float32 S = 25 logits were mapped and unmapped every
    step), come from the heap, so a freed block is reused by the next step; under glibc's default
    (``TDYN_MALLOPT=0``) each is a fresh mapping. ``torch.empty`` touches no page: nothing is faulted in.
    Run in a child: the setting is per process."""
    import os
    import subprocess
    import sys

    code = ("import torch; from tdyn.threads import tune_allocator; t = tune_allocator(); "
            "blocks = [torch.empty(n, dtype=torch.uint8) for n in (64 << 20, 5 << 28)]; "
            "heap = [l.split()[0] for l in open('/proc/self/maps') if l.rstrip().endswith('[heap]')]; "
            "lo, hi = (int(x, 16) for x in heap[0].split('-')); "
            "print(t, *[lo <= b.data_ptr() < hi for b in blocks])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, TDYN_MALLOPT=flag))
    assert r.stdout.split() == (["True", "True", "True"] if flag == "1" else ["False", "False", "False"])


def test_a_training_run_hands_its_freed_memory_back(tmp_path, monkeypatch):
    """The tuned allocator keeps freed blocks while training (no page faults per step) and hands them back
    when the run ends: ``release_memory`` returns a freed 256 MB block's pages (child process: RSS from
    /proc/self/statm), and training calls it once per run, also when the run fails."""
    import os
    import subprocess
    import sys

    from tdyn.train import trainer

    code = ("import torch; from tdyn.threads import tune_allocator, release_memory; tune_allocator(); "
            "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096 >> 20; r0 = rss(); "
            "a = torch.ones(64 << 20); del a; r1 = rss(); release_memory(); print(r1 - r0, rss() - r0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, TDYN_MALLOPT="1"))
    kept, left = (int(v) for v in r.stdout.split())
    assert kept > 200 and left < 50, (kept, left)
    calls = []
    monkeypatch.setattr(trainer, "release_memory", lambda: calls.append(1))
    train(quad_config(seeds=[0, 1]), tmp_path / "a", progress=False)
    assert calls == [1]


def test_optimizer_lrs_follow_a_changed_or_replaced_tensor():
    """The optimizer converts each group's lrs once (``_lr``), but a step always uses the lrs it holds now:
    changed in place, or replaced by another tensor."""
    p = torch.nn.Parameter(torch.zeros(2, 3))
    lrs = {"g": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    opt = EnsembleOptimizer({"p": p}, {"g": GroupConfig(params=["p"], optimizer="sgd", lr=1.0)}, lrs)
    active = torch.ones(2, dtype=torch.bool)

    def step():
        before = p.detach().clone()
        p.grad = torch.ones_like(p)
        opt.step(set(), active)
        return (before - p.detach())[:, 0].tolist()

    assert step() == [1.0, 2.0]
    lrs["g"].mul_(3)                                           # in place
    assert step() == [3.0, 6.0]
    opt.lrs["g"] = torch.tensor([0.5, 0.25], dtype=torch.float64)   # replaced
    assert step() == [0.5, 0.25]
