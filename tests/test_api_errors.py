"""Wrong Python types through the public API are one-line UserErrors naming the argument (issue 36, item 4),
and a PlainTask that breaks its contract or a plugin registering a taken name is refused, naming whose it is.

``CASES``: one row per call — what is called, and what the error must name. Every row must raise a
``tdyn.errors.UserError`` (never a raw ``TypeError`` / ``AttributeError``) whose message is one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tdyn
from tdyn.errors import RegisteredTwice, UserCodeError, UserError
from tdyn.schema import Strict

SS = {"task": "scan_snap", "data": {"num_last": 2, "num_next_per_last": 1, "seq_len": 16, "batch_size": 8},
      "seeds": [0], "optim": {"steps": 2, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}},
      "checkpoint": {"schedule": "none"}}


class Cfg(Strict):
    pass


# (case, call(tmp_path), what the one-line message names)
CASES = [
    ("train config an int", lambda t: tdyn.train(5, t / "o"), "'config'"),
    ("train config a list", lambda t: tdyn.train([SS], t / "o"), "'config'"),
    ("train out an int", lambda t: tdyn.train(SS, 5), "'out'"),
    ("train out None", lambda t: tdyn.train(SS, None), "'out'"),
    ("train out empty", lambda t: tdyn.train(SS, ""), "'out'"),
    ("train force a string", lambda t: tdyn.train(SS, t / "o", force="yes"), "'force'"),
    ("train progress an int", lambda t: tdyn.train(SS, t / "o", progress=2), "'progress'"),
    ("train dirs a string", lambda t: tdyn.train(SS, t / "o", dirs="abc"), "'dirs'"),
    ("train dirs holding an int", lambda t: tdyn.train(SS, t / "o", dirs=[3]), "'dirs[0]'"),
    ("train dirs one inside another", lambda t: tdyn.train(dict(SS, seeds=[0, 1]), t / "o", dirs=[t / "o/a", t / "o/a/sub"]),
     "a/sub' is inside"),
    ("train dirs one inside another, outer second", lambda t: tdyn.train(dict(SS, seeds=[0, 1]), t / "o",
                                                                         dirs=[t / "o/a/b/c", t / "o/a"]), "a/b/c' is inside"),
    ("sweep spec an int", lambda t: tdyn.sweep(5, t / "s"), "'spec'"),
    ("sweep spec a list", lambda t: tdyn.sweep([1], t / "s"), "'spec'"),
    ("sweep out an int", lambda t: tdyn.sweep({"base": SS, "seeds": [0]}, 5), "'out'"),
    ("sweep out empty", lambda t: tdyn.sweep({"base": SS, "seeds": [0]}, ""), "'out'"),
    ("sweep workers a string", lambda t: tdyn.sweep({"base": SS, "seeds": [0]}, t / "s", workers="2"), "'workers'"),
    ("sweep workers a float", lambda t: tdyn.sweep({"base": SS, "seeds": [0]}, t / "s", workers=2.0), "'workers'"),
    ("sweep progress an int", lambda t: tdyn.sweep({"base": SS, "seeds": [0]}, t / "s", progress=1), "'progress'"),
    ("sweep executor a list", lambda t: tdyn.sweep({"base": SS, "seeds": [0]}, t / "s", executor=["local"]), "'executor'"),
    ("load_run an int", lambda t: tdyn.load_run(5), "'path'"),
    ("load_run None", lambda t: tdyn.load_run(None), "'path'"),
    ("load_run empty", lambda t: tdyn.load_run(""), "'path'"),
    ("load_sweep a list", lambda t: tdyn.load_sweep([str(t)]), "'path'"),
    ("load_config an int", lambda t: tdyn.load_config(5), "'source'"),
    ("load_config overrides a string", lambda t: tdyn.load_config(SS, "optim.steps=3"), "'overrides'"),
    ("load_config override an int", lambda t: tdyn.load_config(SS, [3]), "'overrides[0]'"),
    ("register_task name an int", lambda t: tdyn.register_task(5, Cfg, Cfg)(lambda c, m: None), "'name'"),
    ("register_task name empty", lambda t: tdyn.register_task(" ", Cfg, Cfg)(lambda c, m: None), "empty name"),
    ("register_task config a dict class", lambda t: tdyn.register_task("api_x", dict, Cfg), "'data_config'"),
    ("register_task model config an instance", lambda t: tdyn.register_task("api_x", Cfg, Cfg()), "'model_config'"),
    ("register_task decorates a number", lambda t: tdyn.register_task("api_x", Cfg, Cfg)(3), "not a function"),
    ("register_task size not callable", lambda t: tdyn.register_task("api_x", Cfg, Cfg, size=4), "'size'"),
    ("probe name an int", lambda t: tdyn.probe(5), "'name'"),
    # a built-in name is never replaced, loaded or not
    ("plugin re-registers scan_snap", lambda t: tdyn.register_task("scan_snap", Cfg, Cfg)(lambda c, m: None), "scan_snap"),
    ("plugin re-registers a built-in probe", lambda t: tdyn.probe("scan_snap.attention")(lambda ctx: {}), "scan_snap.attention"),
    ("plugin re-registers a built-in reproduction",
     lambda t: __import__("tdyn.reproduce.registry", fromlist=["register"]).register("scan-snap/fig4", "mine")(lambda ctx: {}),
     "scan-snap/fig4"),
]


@pytest.mark.parametrize("case,call,names", CASES, ids=[c[0] for c in CASES])
def test_wrong_argument_is_a_user_error(tmp_path, case, call, names):
    with pytest.raises(UserError) as e:
        call(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and names in msg, f"[{case}] {msg!r}"
    assert not (tmp_path / "o").exists() and not (tmp_path / "s").exists()


@pytest.mark.parametrize("step", ["../x", "final/../../x", -3, 5.5, True, None, [1]])
def test_a_bad_checkpoint_step_is_a_user_error_naming_it(tmp_path, step):
    """``Run.model`` / ``checkpoint`` / ``params`` take 'final' or a step number ≥ 0: anything else (a path
    fragment, a negative or fractional number, a bool) is one line naming it, never a file name built from it."""
    (d,) = tdyn.train(SS, tmp_path / "r", progress=False)
    run = tdyn.load_run(d)
    for call in (run.model, run.checkpoint, run.params):
        with pytest.raises(UserError) as e:
            call(step)
        assert "\n" not in str(e.value) and repr(step) in str(e.value)


def test_re_registration_keeps_the_built_in():
    from tdyn.tasks import TASKS

    with pytest.raises(RegisteredTwice):
        tdyn.register_task("scan_snap", Cfg, Cfg)(lambda c, m: None)
    assert TASKS.get("scan_snap").build.__module__ == "tdyn.papers.scan_snap.task"


# ---------------------------------------------------------------- a PlainTask breaking its contract

class _Plain(tdyn.PlainTask):
    mode = "ok"

    def __init__(self, cfg, members):
        self.facts = {}
        super().__init__(cfg, members)

    def make_model(self):
        if self.mode == "none":
            return None
        if self.mode == "raises":
            raise ValueError("the user's model is broken")
        return nn.Linear(3, 1)

    def sample(self, gen):
        return torch.randn(4, 3, generator=gen)

    def probe_batch(self, gen):
        return self.sample(gen)

    def member_loss(self, model, x):
        out = model(x)
        return out.squeeze(-1) if self.mode == "vector" else (out ** 2).mean()


def _plain_cfg(name):
    return {"task": name, "seeds": [0, 1], "optim": {"steps": 2, "groups": {"all": {"params": ["weight", "bias"], "lr": 0.1}}},
            "checkpoint": {"schedule": "none"}}


@pytest.mark.parametrize("mode,names", [("none", "make_model"), ("vector", "member_loss")])
def test_plain_task_contract(tmp_path, mode, names):
    from tdyn.tasks import TASKS

    name = f"api_plain_{mode}"
    cls = type(f"Plain_{mode}", (_Plain,), {"mode": mode})
    tdyn.register_task(name, Cfg, Cfg)(cls)
    try:
        with pytest.raises(UserCodeError) as e:
            tdyn.train(_plain_cfg(name), tmp_path / "o", progress=False)
    finally:
        TASKS.unregister(name)
    msg = str(e.value)
    assert "\n" not in msg and names in msg and "your task's code" in msg and __file__ in msg, msg


def test_user_code_error_names_the_users_frame():
    from tdyn.errors import user_code_error

    try:
        _Plain.make_model(type("X", (), {"mode": "raises"})())
    except ValueError as exc:
        err = user_code_error(exc)
    assert err is not None and "ValueError: the user's model is broken" in str(err) and __file__ in str(err)
    try:
        torch.zeros(2) @ torch.zeros(3)     # raised inside torch, called from here: still this file's line
    except RuntimeError as exc:
        assert __file__ in str(user_code_error(exc))
