"""The library a researcher keeps open in a notebook (issue 37): re-running a registering cell replaces the
entry, the Python API speaks Python (force=/resume=, keyword arguments in its errors), tables are
DataFrames, `tdyn list` shows what exists, `tdyn config` round-trips into `tdyn run`, and the public
functions show their real signatures."""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import json_differences

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

    monkeypatch.setattr(trainer, "_STOP", False)    # stop_all() sets it for the process: put back after the test
    try:
        cfg = dict(SS, probes={"names": ["door.stopper"], "every": 1})
        with pytest.raises(KeyboardInterrupt):
            tdyn.train(cfg, tmp_path / "r", progress=False)
        trainer._STOP = False
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


def test_sweep_errors_name_keyword_arguments(tmp_path):
    spec = {"base": "syn_small", "seeds": [0], "set": ["optim.steps=2"]}
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("a file of mine")
    for kw, words in [({}, "choose another out"), ({"workers": 0}, "workers=0"), ({"executor": "bogus"}, "executor='bogus'")]:
        with pytest.raises(UserError) as e:
            tdyn.sweep(spec, tmp_path / ("full" if not kw else "new"), progress=False, **kw)
        assert words in str(e.value) and "--" not in str(e.value), str(e.value)


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
    assert isinstance(table, pd.DataFrame) and sorted(table["run"].unique()) == ["seed=0", "seed=1"]
    assert table["loss"].notna().all() and set(table["lr.Y"]) == {1.0}
    df = tdyn.load_run(dirs[0]).df
    assert isinstance(df, pd.DataFrame) and df["step"].iloc[-1] == SS["optim"]["steps"]


# ---------------------------------------------------------------- 3. tdyn list, tdyn config round trips

def test_list_groups_what_exists(cli):
    r = cli("list")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    heads = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert [h.split(":")[0] for h in heads] == ["Reproductions", "Packaged run configs", "Packaged sweep specs",
                                                 "Tasks", "Probes"], heads
    for name, words in [("scan-snap/fig4", "Syn-Small c_n maps"), ("syn_small", "Scan and Snap Syn-Small"),
                        ("syn_small_lr", "final loss and norms"), ("scan_snap", "Y/Z model"),
                        ("scan_snap.attention", "distinct entropy"), ("topic.dev_loss", "probe batch")]:
        assert any(line.split()[:1] == [name] and words in line for line in out.splitlines()), (name, out)


def test_list_shows_a_plugins_task_and_probe(cli, tmp_path):
    (tmp_path / "door_plugin.py").write_text(
        "import tdyn\nfrom tdyn.schema import Strict\nclass D(Strict):\n    pass\n"
        "@tdyn.register_task('door_plugin_task', D, D, 'a task of the plugin')\ndef build(cfg, members):\n    return None\n"
        "@tdyn.probe('door.plugin_probe')\ndef p(ctx):\n    '''A probe of the plugin.'''\n    return {}\n")
    r = cli("--import", tmp_path / "door_plugin.py", "list")
    assert r.returncode == 0, r.stderr
    assert "door_plugin_task  a task of the plugin" in r.stdout and "A probe of the plugin." in r.stdout


def test_the_names_catalog_matches_the_registrations():
    """What `tdyn list` shows of the built-in tasks and probes is generated from their registrations."""
    import json

    from tdyn.registry import described
    from tdyn.reproduce import runner

    assert described() == json.loads(runner.names_text()), "regenerate it: make catalog"


@pytest.fixture(scope="module")
def resolving():
    """``tdyn run NAME``'s name resolution (the CLI's) in this process."""
    from tdyn import cli, config

    before = config._name_resolver
    config.set_name_resolver(cli._experiment_config)
    yield
    config.set_name_resolver(before)


def _documents(text: str) -> list[tuple[str | None, dict]]:
    """``tdyn config``'s output: (the NAME:CONFIG heading each document, or None for one bare config, the config)."""
    import yaml

    docs = list(yaml.safe_load_all(text))
    heads = re.findall(r"^# (\S+:\S+)$", text, re.M)
    return list(zip(heads, docs)) if heads else [(None, d) for d in docs]


def _run_takes_back(text: str, path: Path):
    """The config `tdyn run FILE` trains from ``text`` saved as FILE: validated as `tdyn run` validates it."""
    path.write_text(text, encoding="utf-8")
    return tdyn.load_config(path).model_dump(mode="json")


def test_config_round_trips_every_packaged_config_and_sweep(preloaded_cli, tmp_path, resolving):
    from tdyn.config import packaged
    from tdyn.sweep.spec import load_spec, plan

    for name in packaged("run"):
        r = preloaded_cli("config", name)
        assert r.returncode == 0, r.stderr
        assert _run_takes_back(r.stdout, tmp_path / f"{name}.yaml") == tdyn.load_config(name).model_dump(mode="json")
        r = preloaded_cli("config", name, "--set", "optim.steps=3", "--seed", "4")
        assert _run_takes_back(r.stdout, tmp_path / "s.yaml") == \
            tdyn.load_config(name, ["optim.steps=3", "seeds=4"]).model_dump(mode="json")
    r = preloaded_cli("run", tmp_path / "s.yaml", "--out", tmp_path / "r", "--quiet")   # `tdyn run` takes it, really
    assert r.returncode == 0 and "finished" in r.stdout, r.stderr

    def jobs(spec):
        return [(j.id, j.config, [r.name for r in j.runs]) for j in plan(spec)]

    for name in packaged("sweep"):
        r = preloaded_cli("config", name)
        assert r.returncode == 0, r.stderr
        (tmp_path / f"{name}.yaml").write_text(r.stdout)
        assert jobs(load_spec(tmp_path / f"{name}.yaml")) == jobs(load_spec(name))


def test_config_round_trips_every_reproductions_configs(preloaded_cli, tmp_path, resolving):
    """`tdyn config NAME [--quick]`: each document, saved and given to `tdyn run`, is the config the
    reproduction trains (the generated catalog's, which tests/test_imports.py checks against the
    registrations); `tdyn config NAME:CONFIG` prints that one document alone, and `tdyn run NAME:CONFIG`
    trains it."""
    from tdyn.reproduce.registry import catalog

    checked = 0
    for name, entry in catalog().items():
        for mode in ("full", "quick"):
            want = entry["configs"].get(mode, {}) if entry["configs"] else {}
            r = preloaded_cli("config", name, *(["--quick"] if mode == "quick" else []))
            if not want:
                assert r.returncode == 2 and "trains no run config" in r.stderr
                continue
            assert r.returncode == 0, r.stderr
            docs = _documents(r.stdout)
            assert [h for h, _ in docs] == ([None] if len(want) == 1 else [f"{name}:{n}" for n in want])
            texts = re.split(r"^---\n", r.stdout, flags=re.M)      # each document as printed, its heading included
            assert len(texts) == len(want)
            for text, (n, cfg) in zip(texts, want.items()):
                assert _run_takes_back(text, tmp_path / "c.yaml") == tdyn.load_config(cfg).model_dump(mode="json"), \
                    f"{name}:{n} ({mode})"
                checked += 1
        if entry["configs"] and entry["configs"]["full"]:
            first = next(iter(entry["configs"]["full"]))
            r = preloaded_cli("config", f"{name}:{first}")
            assert r.returncode == 0 and _documents(r.stdout) == [(None, entry["configs"]["full"][first])], r.stderr
            # to 1e-8 relative: claim2's learning rates (1/λ_max) differ in their last bits between CPUs
            assert not json_differences(tdyn.load_config(f"{name}:{first}").model_dump(mode="json"),
                                        tdyn.load_config(entry["configs"]["full"][first]).model_dump(mode="json"), 1e-8)
    assert checked > 100


def test_config_names_what_it_accepts(cli):
    r = cli("config", "nosuch")
    assert r.returncode == 2 and "syn_small" in r.stderr and "syn_small_lr" in r.stderr
    r = cli("config", "scan-snap/thm3:nosuch")
    assert r.returncode == 2 and "long_L_sgd" in r.stderr
    r = cli("config", "syn_small", "--quick")
    assert r.returncode == 2 and "--quick" in r.stderr


# ---------------------------------------------------------------- 5. real signatures and docstrings

def _params(obj) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(obj).parameters)


def test_the_entry_points_show_their_real_signatures():
    p = _params(tdyn.train)
    assert list(p) == ["config", "out", "dirs", "force", "resume", "progress"]
    assert all(p[k].kind is inspect.Parameter.KEYWORD_ONLY for k in ("dirs", "force", "resume", "progress"))
    assert p["force"].default is False and p["resume"].default is False and p["progress"].default is True
    p = _params(tdyn.sweep)
    assert list(p)[:2] == ["spec_source", "out"] and {"executor", "workers", "address", "progress", "slurm"} <= set(p)
    assert p["executor"].default == "local" and p["workers"].default is None
    assert list(_params(tdyn.probe)) == ["name", "description"]
    assert list(_params(tdyn.load_run)) == ["path"] and list(_params(tdyn.load_sweep)) == ["path"]
    assert "DataFrame" in str(inspect.signature(tdyn.load_sweep).return_annotation)
    assert list(_params(tdyn.ProbeContext)) == ["model", "task", "batch", "step", "options", "shared", "history"]
    assert list(_params(tdyn.load_config)) == ["source", "overrides"]


def test_the_entry_points_have_docstrings_that_answer_the_questions():
    def doc(obj):
        return " ".join(inspect.getdoc(obj).replace("**", "").split())

    assert all(w in doc(tdyn.train) for w in ("force=True", "resume=True", "dirs", "progress"))
    assert all(w in doc(tdyn.sweep) for w in ("axes", "grid", "seeds", "executor", "workers", "optim.groups.<group>.lr"))
    ctx = doc(tdyn.ProbeContext)
    assert all(w in ctx for w in ("[S, B, L]", "Stacked", "ctx.model.map", "probe_batch", "sample(gen)",
                                  "every checkpoint step", "probes.every"))
    assert all(w in doc(tdyn.probe) for w in ("ProbeContext", "[S]", "notebook"))
    assert "DataFrame" in doc(tdyn.load_sweep) and "DataFrame" in doc(tdyn.load_run)


def test_help_shows_them_and_help_tdyn_is_a_screen():
    import pydoc

    page = pydoc.render_doc(tdyn, renderer=pydoc.plaintext)
    assert len(page.splitlines()) <= 70 and "docs/library.md" in page and "tdyn.train(config, out)" in page
    page = pydoc.render_doc(tdyn.train, renderer=pydoc.plaintext)
    assert "tdyn.train(config:" in page and "resume: 'bool' = False" in page and "resume=True" in page
    page = pydoc.render_doc(tdyn.sweep, renderer=pydoc.plaintext)
    assert "tdyn.sweep(spec_source:" in page and "axes" in page


def test_signatures_cost_import_tdyn_nothing():
    """The signatures are read when asked for: `import tdyn` and touching tdyn.train import no torch."""
    code = ("import sys, tdyn; tdyn.train; print('torch' in sys.modules); import inspect; inspect.signature(tdyn.train); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]
