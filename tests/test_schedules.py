"""Learning-rate schedules (``optim.groups.<g>.schedule``, tdyn.train.schedules): the factors are transformers'
and torch's; the trainer updates at lr · f(t) per member (hand-computed on an exact quadratic), logs the rates,
and resumes exactly mid-schedule; a config with no schedule is written (and identified) as before."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import quad_config
from tdyn import runs
from tdyn.config import ScheduleConfig, load_config
from tdyn.errors import ConfigError
from tdyn.probes import probe
from tdyn.train import trainer
from tdyn.train.schedules import factor

T = 40


@pytest.mark.parametrize("kind,warmup,min_factor", [("constant", 7, 0.0), ("linear", 0, 0.0), ("linear", 7, 0.0),
                                                     ("cosine", 0, 0.0), ("cosine", 7, 0.0), ("cosine", 7, 0.1)])
def test_factors_are_transformers_schedules(kind, warmup, min_factor):
    """Against transformers' schedulers driving a torch optimizer at lr 1 (its get_last_lr at each step)."""
    from transformers import optimization as hf
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    if kind == "constant":
        sched = hf.get_constant_schedule_with_warmup(opt, num_warmup_steps=warmup)
    elif kind == "linear":
        sched = hf.get_linear_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=T)
    elif min_factor:
        sched = hf.get_cosine_with_min_lr_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=T,
                                                               min_lr_rate=min_factor)
    else:
        sched = hf.get_cosine_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=T)
    s = ScheduleConfig(kind=kind, warmup=warmup, min_factor=min_factor)
    for t in range(T + 1):
        assert factor(s, t, T) == pytest.approx(sched.get_last_lr()[0], rel=1e-12, abs=1e-15), t
        opt.step()
        sched.step()
    if kind != "constant":   # after the horizon the floor (transformers' cosine would rise again)
        assert factor(s, T + 5, T) == min_factor


def test_step_factors_are_torchs_step_lr():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=6, gamma=0.5)
    s = ScheduleConfig(kind="step", step_size=6, gamma=0.5)
    for t in range(T):
        assert factor(s, t, T) == pytest.approx(sched.get_last_lr()[0], rel=1e-15), t
        opt.step()
        sched.step()


def test_bad_schedules_are_one_line():
    with pytest.raises(ConfigError, match="kind 'step' needs step_size"):
        load_config("syn_small", ["optim.groups.Y.schedule={kind: step}"])
    with pytest.raises(ConfigError, match="warmup = 9 is past horizon = 5"):
        load_config("syn_small", ["optim.groups.Y.schedule={kind: cosine, warmup: 9, horizon: 5}"])
    with pytest.raises(ConfigError, match="step_size is for kind 'step'"):
        load_config("syn_small", ["optim.groups.Y.schedule={kind: linear, step_size: 3}"])


def test_no_schedule_leaves_config_json_and_identity_as_before():
    cfg = load_config("syn_small", [])
    dumped = cfg.model_dump(mode="json")
    assert all("schedule" not in g for g in dumped["optim"]["groups"].values())
    assert runs.config_digest(dumped) == "d261fc55a1684a97"   # the digest of syn_small before schedules
    with_s = load_config("syn_small", ["optim.groups.Y.schedule={kind: cosine}"]).model_dump(mode="json")
    assert with_s["optim"]["groups"]["Y"]["schedule"]["kind"] == "cosine"
    assert runs.config_digest(with_s) != runs.config_digest(dumped)


def _sched_cfg(**kw):
    """Plain GD on c/2‖w‖² (an exact population gradient c·w), two members at lr 0.1 and 0.05, a cosine
    schedule with warm-up on w, none on u."""
    cfg = quad_config(seeds=[0], ensemble={"lrs": [{"w": 0.1, "u": 0.1}, {"w": 0.05, "u": 0.1}]},
                      data={"dim": 3, "curvature": 2.0}, **kw)
    cfg["optim"] = {"steps": T, "groups": {
        "w": {"params": ["w"], "lr": 0.1, "schedule": {"kind": "cosine", "warmup": 5, "min_factor": 0.1}},
        "u": {"params": ["u"], "lr": 0.1}}}
    cfg["probes"] = {"names": [], "every": 1}
    return cfg


def test_the_trainer_updates_at_lr_times_the_factor(tmp_path):
    """‖w_T‖ = ‖w_0‖ ∏_t |1 − η_m f(t) c| for member m, and lr/w logged at every step is η_m f(t)."""
    s = ScheduleConfig(kind="cosine", warmup=5, min_factor=0.1)
    dirs = trainer.train(_sched_cfg(), tmp_path / "r", progress=False)
    for d, eta in zip(dirs, (0.1, 0.05)):
        m = runs.read_metrics(d)
        expect = m[0]["norm/w"] * math.prod(abs(1 - eta * factor(s, t, T) * 2.0) for t in range(T))
        assert m[-1]["norm/w"] == pytest.approx(expect, rel=2e-5)
        assert [r["lr/w"] for r in m] == [eta * factor(s, t, T) for t in range(T + 1)]
        assert "lr/u" not in m[0]
        assert m[T]["norm/u"] == pytest.approx(math.sqrt(3) * (1 - 0.9 ** T), rel=1e-5)   # unscheduled: as before


_STOP_AT = {"step": -1}


@probe("test.schedule_stopper")
def _stopper(ctx):
    if ctx.step == _STOP_AT["step"]:
        trainer.stop_all()
    return {}


def test_resume_mid_schedule_is_exact(tmp_path, monkeypatch):
    """Interrupted during the warm-up's last step and resumed: the same metrics and final state as the run
    that was not interrupted (a factor is a function of the step: nothing to save)."""
    monkeypatch.setattr(trainer, "_STOP", False)
    cfg = _sched_cfg()
    cfg["probes"] = {"names": ["test.schedule_stopper"], "every": 1}
    cfg["checkpoint"] = {"schedule": "none", "every": 2}
    ref = trainer.train(cfg, tmp_path / "ref", progress=False)
    _STOP_AT["step"] = 4
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train(cfg, tmp_path / "r", progress=False)
    finally:
        _STOP_AT["step"] = -1
        trainer._STOP = False
    got = trainer.resume(tmp_path / "r", progress=False)
    for a, b in zip(ref, got):
        assert runs.read_metrics(a) == runs.read_metrics(b)
        pa, pb = runs.params_of(runs.load_checkpoint(a)), runs.params_of(runs.load_checkpoint(b))
        assert all(torch.equal(pa[k], pb[k]) for k in pa)
