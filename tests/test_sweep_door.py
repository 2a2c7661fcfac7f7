"""Issue 37, items 4 (rest), 6 and 8: ``tdyn sweep --set``, the short form of ensemble rates, hydra's
multirun (``-m``), the sweep's progress over members' steps, optional packages checked before any job,
``tdyn.sweep`` raising on runs without a result, losses printed with significant digits, Slurm job arrays
with requeue on preemption (submitit's local executor) and Ray's ``num_gpus`` per job."""

import json
import os
import re
import signal
import threading
import time
import tomllib
from pathlib import Path

import pytest
import torch

import tdyn
from tdyn import runs
from tdyn.errors import ConfigError, SweepFailed, UserError
from tdyn.sweep import Progress, run_sweep
from tdyn.sweep.spec import load_spec, multirun_spec, plan, with_overrides

ROOT = Path(__file__).resolve().parents[1]
TINY = {"task": "scan_snap", "data": {"num_last": 2, "num_next_per_last": 1, "seq_len": 16, "batch_size": 8},
        "seeds": [0], "optim": {"steps": 3, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}},
        "checkpoint": {"schedule": "none"}}


# ---------------------------------------------------------------- item 4: ensemble.lrs short form, sweep --set

def test_ensemble_lrs_short_form_is_one_rate_for_every_group():
    short = tdyn.load_config("syn_small", ["ensemble.lrs=0.001,0.01"])
    long = tdyn.load_config("syn_small", ["ensemble.lrs=[{Y: 0.001, Z: 0.001}, {Y: 0.01, Z: 0.01}]"])
    assert short.ensemble.lrs == [{"Y": 0.001, "Z": 0.001}, {"Y": 0.01, "Z": 0.01}]
    assert short.model_dump() == long.model_dump()          # the same config, so the same runs and identities
    mixed = tdyn.load_config("syn_small", ["ensemble.lrs=[0.5, {Y: 1, Z: 2}]"])
    assert mixed.ensemble.lrs == [{"Y": 0.5, "Z": 0.5}, {"Y": 1.0, "Z": 2.0}]
    yaml_form = tdyn.load_config(dict(TINY, ensemble={"lrs": [0.1, 0.2]}))   # a config file may use it too
    assert yaml_form.ensemble.lrs == [{"Y": 0.1, "Z": 0.1}, {"Y": 0.2, "Z": 0.2}]
    with pytest.raises(ConfigError, match="shadowed by ensemble.lrs"):     # a group's lr it would make unused
        tdyn.load_config("syn_small", ["ensemble.lrs=0.001,0.01", "optim.groups.Y.lr=3"])
    with pytest.raises(ConfigError, match="ensemble.lrs"):
        tdyn.load_config("syn_small", ["ensemble.lrs=0.001,-1"])


def test_ensemble_lrs_short_form_from_the_command_line(cli, tmp_path):
    r = cli("run", "syn_small", "--set", "optim.steps=3", "--set", "ensemble.lrs=0.001,0.01", "--out", tmp_path / "r")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "r").iterdir() if p.is_dir()) == [
        "optim.groups.Y.lr=0.001__optim.groups.Z.lr=0.001__seed=0", "optim.groups.Y.lr=0.01__optim.groups.Z.lr=0.01__seed=0"]
    assert re.search(r"final loss \d\.\d{3}\)", r.stdout)      # four significant digits


def test_sweep_set_applies_to_the_base_and_refuses_an_axis_key(cli, tmp_path):
    r = cli("sweep", "syn_small_lr", "--out", tmp_path / "a", "--set", "optim.steps=2", "--set", "data.batch_size=4",
            "--quiet")
    assert r.returncode == 0, r.stderr
    spec = runs.read_sweep(tmp_path / "a")["spec"]
    assert spec["set"] == ["model.init=torch_default", "optim.steps=2", "data.batch_size=4"]   # replaces the spec's 50
    cfg = runs.read_json(next((tmp_path / "a").glob("data.seq_len=*")) / "config.json")
    assert cfg["optim"]["steps"] == 2 and cfg["data"]["batch_size"] == 4
    for bad, words in ((["optim.groups.Y.lr=2"], "'optim.groups.Y.lr' is an axis of the sweep (axes.grid)"),
                       (["data=[]"], "'data.seq_len' is an axis of the sweep"),
                       (["seeds=3"], "the sweep sets 'seeds' of every job itself"),
                       (["ensemble.lrs=0.1,0.2"], "the sweep sets 'ensemble' of every job itself"),
                       (["optim.steps=2", "optim.steps=3"], "given twice")):
        r = cli("sweep", "syn_small_lr", "--out", tmp_path / "b", *[x for o in bad for x in ("--set", o)])
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "b").exists()
    # the API speaks the same, its message in Python's words
    with pytest.raises(ConfigError, match="override optim.groups.Y.lr=2: 'optim.groups.Y.lr' is an axis"):
        tdyn.sweep("syn_small_lr", tmp_path / "c", overrides=["optim.groups.Y.lr=2"])
    # a spec's own set: of an axis key is refused too
    with pytest.raises(ConfigError, match="which axes.grid varies"):
        load_spec({"base": "syn_small", "set": ["data.seq_len=8"], "axes": {"grid": {"data.seq_len": [16]}}})


def test_config_prints_a_sweep_with_set_as_sweep_takes_it(cli, tmp_path):
    r = cli("config", "syn_small_lr", "--set", "optim.steps=7")
    assert r.returncode == 0, r.stderr
    assert "- optim.steps=7" in r.stdout and "optim.steps=50" not in r.stdout


# ---------------------------------------------------------------- item 8: hydra's multirun

YAML_GRID = """\
base: syn_small
set: [optim.steps=3, model.init=torch_default]
axes:
  grid:
    data.seq_len: [16, 32]
    optim.groups.Y.lr: [1.0, 10.0]
seeds: [0, 1]
"""
MULTIRUN = ["optim.steps=3", "model.init=torch_default", "data.seq_len=16,32", "optim.groups.Y.lr=1.0,10.0",
            "seeds=0,1"]


def test_multirun_expands_to_the_yaml_grid(tmp_path, cli):
    (tmp_path / "grid.yaml").write_text(YAML_GRID)
    assert multirun_spec("syn_small", MULTIRUN) == load_spec(tmp_path / "grid.yaml")
    assert [r.name for j in plan(multirun_spec("syn_small", MULTIRUN)) for r in j.runs] == \
        [r.name for j in plan(load_spec(tmp_path / "grid.yaml")) for r in j.runs]
    # values in brackets stay whole; one value is an override; a config file base is stored absolute
    (tmp_path / "base.json").write_text(json.dumps(TINY))
    s = multirun_spec(str(tmp_path / "base.json"), ["data.seq_len=[16],[32]", "optim.steps=2"])
    assert s.axes.grid == {"data.seq_len": [[16], [32]]} and s.set == ["optim.steps=2"]
    assert s.base == str((tmp_path / "base.json").resolve())
    # the command line: the same sweep, so the YAML spec continues it (nothing trained again)
    r = cli("sweep", "syn_small", "-m", *MULTIRUN, "--out", tmp_path / "o", "--quiet")
    assert r.returncode == 0 and "8 finished" in r.stdout, r.stderr
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "o").glob("*/metrics.jsonl")}
    r = cli("sweep", tmp_path / "grid.yaml", "--out", tmp_path / "o", "--quiet")
    assert r.returncode == 0 and "8 finished" in r.stdout, r.stderr
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "o").glob("*/metrics.jsonl")} == before
    for args, words in ((["syn_small_lr", "-m", "data.seq_len=8,16"], "is a sweep spec"),
                        (["syn_small", "-m", "noequals"], "must look like key.path=a,b"),
                        (["syn_small", "-m", "x.y=1,2", "x.y=3"], "given twice"),
                        (["syn_small", "-m", "data.seq_len=8,16", "--set", "data.seq_len=4"], "is an axis")):
        r = cli("sweep", *args, "--out", tmp_path / "bad")
        assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---------------------------------------------------------------- item 6: progress, extras, failures

def test_progress_counts_every_members_steps_and_shows_the_loss(tmp_path, monkeypatch, capsys, one_thread):
    from tdyn.train import trainer

    spec = multirun_spec("syn_small", ["optim.steps=12", "data.seq_len=16,32", "seeds=0,1"])
    monkeypatch.setattr(trainer, "interactive", lambda: True)
    run_sweep(spec, tmp_path / "s", workers=1)
    bar = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "48/48" in bar and "jobs=2/2" in bar, bar           # 4 runs × 12 steps, not "2/2" jobs

    class Bar:
        n = 0

        def set_postfix(self, post, refresh=True):
            self.post = post

        def refresh(self):
            pass

    jobs = plan(spec)
    p = Progress(tmp_path / "s", jobs, Bar())             # a continued sweep starts where its runs are
    assert p.bar.n == 48 and re.fullmatch(r"[\d.e+-]+(\.\.[\d.e+-]+)?", p.bar.post["loss"])
    last = runs.read_metrics(tmp_path / "s" / jobs[0].runs[0].name)[-1]["loss"]
    assert f"{last:.4g}" in p.bar.post["loss"]
    m = tmp_path / "s" / jobs[0].runs[0].name / "metrics.jsonl"    # a run half-way: its last recorded step
    m.write_text("".join(m.read_text().splitlines(keepends=True)[:6]))
    p.poll([jobs[0].id])
    assert p.bar.n == 48 - 12 + 5


def test_a_missing_optional_package_is_refused_before_any_job(tmp_path, monkeypatch):
    from tdyn import config

    real = config.installed
    monkeypatch.setattr(config, "installed", lambda extra: extra not in ("tensorboard", "wandb") and real(extra))
    spec = {"config": TINY, "set": ["log.tensorboard=true"], "axes": {"grid": {"data.seq_len": [16, 32]}}}
    with pytest.raises(ConfigError) as e:
        tdyn.sweep(spec, tmp_path / "s")
    assert "log.tensorboard: true needs the tensorboard package" in str(e.value)
    assert not (tmp_path / "s").exists()                  # before anything was written
    with pytest.raises(ConfigError, match="log.wandb: true needs the wandb package"):
        tdyn.train(dict(TINY, log={"wandb": True}), tmp_path / "t")
    assert not (tmp_path / "t").exists()
    # every hint names a package that tdyn's own extras pin (so one that pip finds on PyPI)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in config.EXTRAS:
        package = re.match(r"pip install (\S+) ", config.install_hint(extra)).group(1)
        assert any(r.split("==")[0] == package for r in extras[extra]), (extra, package)


def test_tdyn_sweep_raises_naming_the_runs_without_a_result(tmp_path, cli):
    spec = {"config": TINY, "axes": {"grid": {"model.parameterization": ["yz", "embedding"]}}}
    with pytest.raises(SweepFailed) as e:
        tdyn.sweep(spec, tmp_path / "s", workers=1, progress=False)
    err = e.value
    assert err.failed == ["model.parameterization=embedding__seed=0"]
    assert err.status["model.parameterization=yz__seed=0"] == "finished"
    msg = str(err)
    assert "1 of 2 run(s) not finished (model.parameterization=embedding__seed=0)" in msg
    assert "unknown parameter 'Y'" in msg and "call tdyn.sweep again with the same spec and out" in msg
    # the command line says it on one line and exits 1
    (tmp_path / "s.json").write_text(json.dumps(spec))
    r = cli("sweep", tmp_path / "s.json", "--out", tmp_path / "s", "--quiet")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "(model.parameterization=embedding__seed=0)" in r.stderr and "re-run the same command" in r.stderr


def test_run_summary_prints_small_losses_with_significant_digits(cli, tmp_path):
    cfg = dict(TINY, optim={"steps": 3, "groups": {"Y": {"params": ["Y"], "lr": 1e-9}, "Z": {"params": ["Z"], "lr": 1e-9}}})
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    r = cli("run", tmp_path / "c.json", "--out", tmp_path / "r", "--quiet")
    assert r.returncode == 0, r.stderr
    loss = runs.read_metrics(tmp_path / "r")[-1]["loss"]
    assert f"(final loss {loss:.4g})" in r.stdout and "0.0000" not in r.stdout


# ---------------------------------------------------------------- item 8: Ray's num_gpus per job

def test_gpus_per_job_reaches_rays_remote_options(tmp_path, monkeypatch):
    """``--gpus-per-job 0.25`` becomes ``ray.remote(num_gpus=0.25)`` of every job (no GPU or Ray cluster
    needed: ray's init is replaced, its remote decorator recorded and the job run here)."""
    ray = pytest.importorskip("ray")
    import concurrent.futures as cf

    from tdyn import cli as tcli

    seen = []

    def remote(**opts):
        seen.append(opts)

        def wrap(fn):
            class Remote:
                def remote(self, *args):
                    class Ref:
                        def future(self):
                            f = cf.Future()
                            f.set_result(fn(*args))
                            return f
                    return Ref()
            return Remote()
        return wrap

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: None)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(ray, "remote", remote)
    (tmp_path / "base.json").write_text(json.dumps(TINY))
    threads = torch.get_num_threads()
    try:
        rc = tcli.main(["--threads", "1", "sweep", str(tmp_path / "base.json"), "-m", "data.seq_len=16,32",
                        "--out", str(tmp_path / "o"), "--executor", "ray", "--gpus-per-job", "0.25", "--quiet"])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    assert seen and all(o["num_gpus"] == 0.25 and o["num_cpus"] == 1 for o in seen)
    # the real decorator keeps the option
    from tdyn.sweep.executors import RayExecutor

    monkeypatch.undo()
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    def job():
        pass

    ex = RayExecutor(num_gpus=0.5)
    assert ex.remote(job)._default_options["num_gpus"] == 0.5
    for bad in (0, -1, 1.5, True):
        with pytest.raises(UserError, match="--gpus-per-job"):
            RayExecutor(num_gpus=bad)


def test_gpus_per_job_goes_with_ray(cli, tmp_path):
    r = cli("sweep", "syn_small_lr", "--out", tmp_path / "o", "--gpus-per-job", "0.5")
    assert r.returncode == 2 and "--gpus-per-job goes with --executor ray" in r.stderr


# ---------------------------------------------------------------- item 8: Slurm job arrays, requeue

PREEMPT = {"config": dict(TINY, optim={"steps": 3000, "groups": TINY["optim"]["groups"]},
                          checkpoint={"schedule": "none", "every": 100}, data=dict(TINY["data"], seq_len=64)),
           "axes": {"grid": {"data.seq_len": [48, 64]}}, "seeds": [0, 1], "slurm": {"time_min": 60}}


@pytest.mark.slow
def test_slurm_array_requeues_a_preempted_job_which_resumes_to_the_same_result(tmp_path):
    """The sweep's jobs go out through ``map_array`` as Checkpointable jobs (submitit's local executor stands
    in for Slurm); SIGUSR2, Slurm's preemption signal, sent to a job's process mid-training makes submitit call
    its checkpoint() and requeue it: the job starts again, resumes its runs from their last checkpoints, and
    every run ends with the metrics and final weights of an uninterrupted sweep."""
    pytest.importorskip("submitit")
    from tdyn.sweep.executors import SlurmExecutor

    def executor(name):
        return SlurmExecutor(str(tmp_path / name), cluster="local",
                             **load_spec(PREEMPT).slurm.submitit_parameters())

    calls = []
    ex = executor("ref-submitit")
    real = ex.ex.map_array
    ex.ex.map_array = lambda fn, *its: calls.append(len(its[0])) or real(fn, *its)
    assert set(run_sweep(PREEMPT, tmp_path / "ref", executor_obj=ex, progress=False).values()) == {"finished"}
    assert calls == [2]                                   # both jobs in one array submission
    ex.shutdown()

    ex = executor("pre-submitit")
    out = tmp_path / "pre"
    th = threading.Thread(target=run_sweep, args=(PREEMPT, out), kwargs=dict(executor_obj=ex, progress=False))
    th.start()
    victim = None
    t0 = time.time()
    jobs = {j.id: [out / r.name for r in j.runs] for j in plan(load_spec(PREEMPT))}
    while victim is None and time.time() - t0 < 240:
        for jid, dirs in jobs.items():
            steps = [max(runs.checkpoint_steps(d), default=-1) for d in dirs if (d / "checkpoints").is_dir()]
            holder = runs.lock_holder(out / ".jobs" / jid)
            # mid-run: every run of the job has a checkpoint past step 0, none is near its end (checkpoints appear
            # in the trainer's group commits, at most one a second: a window wide enough for a loaded machine)
            if holder and steps and 100 <= min(steps) and max(steps) < 2700:
                victim, preempted = int(holder.split("@")[0]), (jid, time.time())
                os.kill(victim, signal.SIGUSR2)     # Slurm's preemption signal, as submitit asks Slurm to send it
                break
        time.sleep(0.02)
    assert victim is not None, "no job to preempt"
    th.join(300)
    ex.shutdown()
    logs = "".join(j.stderr() or "" for j in ex.jobs)
    assert "Caught signal SIGUSR2" in logs and "this job is preempted" in logs, logs[-2000:]
    sw = runs.read_sweep(out)
    busy = runs.read_json(out / "sweep.json")["worker_busy_seconds"]
    assert len(busy) == 2 and str(victim) not in busy     # the preempted job's result came from its requeued process
    from datetime import datetime

    for d in jobs[preempted[0]]:    # resumed, not trained again: each run is the one started before the signal
        assert datetime.fromisoformat(runs.read_meta(d)["started"]).timestamp() <= preempted[1]
    assert {r["status"] for r in sw["runs"]} == {"finished"}
    for r in sw["runs"]:
        assert (out / r["name"] / "metrics.jsonl").read_text() == (tmp_path / "ref" / r["name"] / "metrics.jsonl").read_text()
        a, b = runs.Run(out / r["name"]).params(), runs.Run(tmp_path / "ref" / r["name"]).params()
        assert all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- a notebook's own task: executor="inline"

def test_a_notebooks_task_sweeps_inline_and_a_spawning_pool_says_so(tmp_path, monkeypatch, one_thread):
    """A task registered by a notebook's cells (``__main__`` without a file) cannot reach a spawned pool worker:
    the local pool refuses it on one line naming executor='inline', which trains the jobs here, to the bits
    of tdyn.train."""
    import sys
    import types

    import tdyn.sweep as sweep_mod
    from conftest import QuadData, QuadModel, QuadTask, quad_config

    def build(cfg, members):
        return QuadTask(cfg, members)

    build.__module__ = "__main__"
    tdyn.register_task("test_notebook_quadratic", QuadData, QuadModel, "tests only")(build)
    spec = {"config": quad_config(task="test_notebook_quadratic"), "axes": {"grid": {"data.dim": [2, 3]}},
            "seeds": [0, 1]}
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))   # a kernel's: no __file__
    monkeypatch.setattr(sweep_mod, "start_method", lambda: "spawn")
    with pytest.raises(UserError, match=r"task 'test_notebook_quadratic' is defined in this notebook.*"
                                        r"executor='inline'"):
        tdyn.sweep(spec, tmp_path / "nb", progress=False)
    assert not (tmp_path / "nb").exists()
    status = tdyn.sweep(spec, tmp_path / "nb", executor="inline", progress=False)
    assert len(status) == 4 and set(status.values()) == {"finished"}
    job = plan(load_spec(spec))[0]                          # trained here as tdyn.train trains the job's config
    alone = tdyn.train(job.config, tmp_path / "alone")
    for run, d in zip(job.runs, alone):
        assert (tmp_path / "nb" / run.name / "metrics.jsonl").read_text() == (d / "metrics.jsonl").read_text()
