"""The library a researcher keeps open in a notebook (issue 37): re-running a registering cell replaces the
entry, the Python API speaks Python (force=/resume=, keyword arguments in its errors), tables are
DataFrames, `tdyn list` shows what exists, `tdyn config` round-trips into `tdyn run`, and the public
functions show their real signatures."""

from __future__ import annotations

import importlib
import inspect
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import tdyn
from tdyn.errors import RegisteredTwice, UserError
from tdyn.probes import PROBES
from tdyn.schema import Strict
from tdyn.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]

SS = {"task": "scan_snap", "data": {"num_last": 2, "num_next_per_last": 1, "seq_len": 16, "batch_size": 8},
      "seeds": [0], "optim": {"steps": 12, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}},
      "checkpoint": {"schedule": "linear", "num": 3}}


class Cfg(Strict):
    pass


# ---------------------------------------------------------------- 1. notebook-safe registration

CELL = '''
import tdyn
from tdyn.schema import Strict

class D(Strict):
    pass

@tdyn.register_task("door_task", D, D, "version {v}")
def build{v}(cfg, members):
    return None

@tdyn.probe("door.probe")
def door_probe(ctx):
    """Version {v} of the probe."""
    return {{}}

@__import__("tdyn.reproduce.registry", fromlist=["register"]).register("door/repro", "version {v}")
def door_repro(ctx):
    return {{}}
'''


def _run_cell(v: int) -> None:
    """A notebook cell: code run in ``__main__`` (an edited cell renames its function: build1 → build2)."""
    exec(compile(CELL.format(v=v), "<cell>", "exec"), {"__name__": "__main__"})


@pytest.fixture
def clean_names():
    from tdyn.reproduce.registry import EXPERIMENTS

    yield
    TASKS.unregister("door_task")
    PROBES.unregister("door.probe")
    EXPERIMENTS.unregister("door/repro")


def test_a_cell_run_again_replaces_its_entries_with_one_line_each(clean_names, caplog):
    from tdyn.reproduce.registry import EXPERIMENTS

    _run_cell(1)
    with caplog.at_level(logging.WARNING, logger="tdyn.registry"):
        _run_cell(2)
    assert TASKS.get("door_task").description == "version 2" and TASKS.get("door_task").build.__name__ == "build2"
    assert PROBES.description("door.probe") == "Version 2 of the probe."
    assert EXPERIMENTS.get("door/repro").description == "version 2"
    notices = [r.getMessage() for r in caplog.records if r.name == "tdyn.registry"]
    assert len(notices) == 3 and all("\n" not in m and "registered again" in m for m in notices), notices


def test_a_module_reloaded_replaces_and_another_module_is_refused(tmp_path, monkeypatch, clean_names):
    (tmp_path / "door_mod_a.py").write_text(
        "import tdyn\nfrom tdyn.schema import Strict\nclass D(Strict):\n    pass\n"
        "@tdyn.register_task('door_task', D, D)\ndef build(cfg, members):\n    return None\n")
    (tmp_path / "door_mod_b.py").write_text((tmp_path / "door_mod_a.py").read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("door_mod_a")
    first = TASKS.get("door_task").build
    importlib.reload(mod)                              # the same module and function: replaced
    assert TASKS.get("door_task").build is not first and TASKS.get("door_task").build is mod.build
    with pytest.raises(RegisteredTwice) as e:          # another module's function under a taken name: refused
        importlib.import_module("door_mod_b")
    msg = str(e.value)
    assert "\n" not in msg and "door_mod_a.build" in msg and "door_mod_b.build" in msg
    assert TASKS.get("door_task").build is mod.build
    monkeypatch.delitem(sys.modules, "door_mod_a")
    monkeypatch.delitem(sys.modules, "door_mod_b", raising=False)


@pytest.mark.parametrize("kind", ["task", "probe", "reproduction"])
def test_a_built_in_name_is_never_replaced_not_even_from_main(kind):
    """A cell in ``__main__`` naming a built-in entry: refused, the built-in kept."""
    from tdyn.reproduce.registry import EXPERIMENTS

    name, registry, code = {
        "task": ("scan_snap", TASKS, "tdyn.register_task('scan_snap', C, C)(lambda c, m: None)"),
        "probe": ("scan_snap.attention", PROBES, "tdyn.probe('scan_snap.attention')(lambda ctx: {})"),
        "reproduction": ("scan-snap/fig4", EXPERIMENTS,
                         "__import__('tdyn.reproduce.registry', fromlist=['r']).register('scan-snap/fig4', 'x')(lambda c: {})"),
    }[kind]
    before = registry.get(name)
    for _ in range(2):
        with pytest.raises(RegisteredTwice, match="never replaced"):
            exec(code, {"__name__": "__main__", "tdyn": tdyn, "C": Cfg})
    assert registry.get(name) is before


# ---------------------------------------------------------------- 1. the API speaks Python

def test_train_again_names_force_and_resume_not_flags(tmp_path):
    tdyn.train(SS, tmp_path / "o", progress=False)
    with pytest.raises(UserError) as e:
        tdyn.train(SS, tmp_path / "o", progress=False)
    msg = str(e.value)
    assert "force=True" in msg and "resume=True" in msg and "--" not in msg, msg


def test_resume_true_continues_the_same_run_by_the_cli_path(tmp_path, monkeypatch):
    """An interrupted run continues with ``resume=True`` (the resume of ``tdyn run --resume``: its meta
    records the resume) and ends as the uninterrupted run does; a finished one is returned as it is; an
    empty ``out`` is trained; a run of another config is refused naming force=True."""
    from tdyn.train import trainer

    stop_at = {"step": 5}

    @tdyn.probe("door.stopper")
    def stopper(ctx):
        if ctx.step == stop_at["step"]:
            trainer.stop_all()
        return {}

    try:
        cfg = dict(SS, probes={"names": ["door.stopper"], "every": 1})
        with pytest.raises(KeyboardInterrupt):
            tdyn.train(cfg, tmp_path / "r", progress=False)
        monkeypatch.setattr(trainer, "_STOP", False)
        assert tdyn.load_run(tmp_path / "r").status == "interrupted"
        stop_at["step"] = -1
        (d,) = tdyn.train(cfg, tmp_path / "r", resume=True, progress=False)
        run = tdyn.load_run(d)
        assert run.status == "finished" and run.meta["resumed"][0]["from_step"] == 6
        (ref,) = tdyn.train(cfg, tmp_path / "ref", resume=True, progress=False)   # empty out: trained
        assert run.df["loss"].tolist() == tdyn.load_run(ref).df["loss"].tolist()
        mtime = (d / "meta.json").stat().st_mtime_ns
        assert tdyn.train(cfg, tmp_path / "r", resume=True, progress=False) == [d]
        assert (d / "meta.json").stat().st_mtime_ns == mtime                          # finished: left as it is
        with pytest.raises(UserError, match=r"another run.*force=True") as e:
            tdyn.train(dict(cfg, seeds=[1]), tmp_path / "r", resume=True, progress=False)
        assert "--" not in str(e.value)
        (d2,) = tdyn.train(dict(cfg, seeds=[1]), tmp_path / "r", resume=True, force=True, progress=False)
        assert tdyn.load_run(d2).meta["seed"] == 1 and "resumed" not in tdyn.load_run(d2).meta
    finally:
        PROBES.unregister("door.stopper")


def test_resume_keyword_is_checked():
    with pytest.raises(UserError, match="'resume'"):
        tdyn.train(SS, "x", resume="yes")


def test_python_words():
    from tdyn.api import python_words

    assert python_words("start it again with --force") == "start it again with force=True"
    assert python_words("tdyn deletes only its own outputs — move it, or choose another --out") == \
        "tdyn deletes only its own outputs — move it, or choose another out"
    assert python_words("set the members' rates instead: --set 'ensemble.lrs=[1]'") == \
        "set the members' rates instead: the override 'ensemble.lrs=[1]'"


# ---------------------------------------------------------------- 2. pandas in the default install

def test_pandas_is_a_dependency_and_tables_are_dataframes(tmp_path):
    import tomllib

    import pandas as pd
    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "pandas" in {Requirement(d).name for d in deps}
    dirs = tdyn.train(dict(SS, seeds=[0, 1]), tmp_path / "e", progress=False)
    table = tdyn.load_sweep(tmp_path / "e")
    assert isinstance(table, pd.DataFrame) and sorted(table["run"].unique()) == ["seed0", "seed1"]
    assert table["loss"].notna().all() and set(table["lr.Y"]) == {1.0}
    df = tdyn.load_run(dirs[0]).df
    assert isinstance(df, pd.DataFrame) and df["step"].iloc[-1] == SS["optim"]["steps"]
