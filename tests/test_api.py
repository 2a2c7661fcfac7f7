"""The public Python API: every exported name resolves, `import tdyn` stays light, and
train → load_run / load_sweep round-trips."""

import subprocess
import sys

import pytest

import tdyn


def test_import_tdyn_is_light():
    code = "import sys, tdyn, tdyn.models, tdyn.data; print('torch' in sys.modules, 'tdyn.train.trainer' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_every_exported_name_resolves():
    for pkg in (tdyn, tdyn.models, tdyn.data):
        for name in getattr(pkg, "__all__", None) or dir(pkg):   # tdyn has no __all__ (a short help(tdyn))
            assert getattr(pkg, name) is not None, f"{pkg.__name__}.{name}"
    with pytest.raises(AttributeError):
        tdyn.no_such_thing
    assert issubclass(tdyn.PlainTask, tdyn.Task) and callable(tdyn.train) and callable(tdyn.sweep)


def test_train_load_run_and_load_sweep(tmp_path):
    cfg = {"task": "decision_list", "data": {"L": 5, "M": 2, "n": 3}, "seeds": [0, 1], "dtype": "float64",
           "optim": {"steps": 4, "groups": {"all": {"params": ["W", "V"], "lr": 1.0}}},
           "probes": {"names": ["decision_list.classify"], "every": 2}}
    dirs = tdyn.train(cfg, tmp_path / "e", progress=False)
    run = tdyn.load_run(dirs[1])
    df = run.df
    assert list(df["step"]) == [0, 1, 2, 3, 4] and "decision_list.classify/err_sup" in df  # checkpoints add steps
    table = tdyn.load_sweep(tmp_path / "e")
    assert sorted(set(table["run"])) == ["seed=0", "seed=1"] and len(table["step"]) == 10
    assert set(table["lr.all"]) == {1.0}
    with pytest.raises(tdyn.runs.UserError if hasattr(tdyn.runs, "UserError") else Exception, match="holds 2 runs"):
        tdyn.load_run(tmp_path / "e")
    model = run.model(2)
    assert model.W.shape == (1, 5, 5) and model.W.dtype.is_floating_point


def test_one_member_per_run_directory(tmp_path):
    """dirs= naming one directory twice (or through a symlink) is refused before anything is written."""
    from tdyn.errors import UserError

    cfg = {"task": "decision_list", "data": {"L": 5, "M": 2, "n": 3}, "seeds": [0, 1], "dtype": "float64",
           "optim": {"steps": 2, "groups": {"all": {"params": ["W", "V"], "lr": 1.0}}}}
    a = tmp_path / "a"
    with pytest.raises(UserError, match="given to two members"):
        tdyn.train(cfg, tmp_path / "e", dirs=[a, a], progress=False)
    (tmp_path / "b").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "b")
    with pytest.raises(UserError, match="given to two members"):
        tdyn.train(cfg, tmp_path / "e", dirs=[tmp_path / "b", tmp_path / "link"], progress=False)
    assert not a.exists() and not (tmp_path / "e").exists() and not any((tmp_path / "b").iterdir())
