"""Sweeps: expansion and batching, local / Ray / submitit executors, skipping finished runs,
failures, and killed workers (no lost or altered results)."""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tdyn import runs
from tdyn.report.plots import plot_metric
from tdyn.sweep import run_sweep, summarize
from tdyn.sweep.executors import LocalExecutor, pool_map
from tdyn.sweep.spec import cells, load_spec, plan

SPEC = {"base": "syn_small", "set": ["optim.steps=12", "model.init=torch_default"],
        "axes": {"grid": {"data.seq_len": [16, 32], "optim.groups.Y.lr": [1.0, 10.0]}}, "seeds": [0, 1]}


def _metrics_by_run(out: Path) -> dict[str, str]:
    sw = runs.read_json(out / "sweep.json")
    return {r["name"]: (out / r["name"] / "metrics.jsonl").read_text() for r in sw["runs"]}


def test_plan_batches_seeds_and_lrs():
    jobs = plan(load_spec(SPEC))
    assert len(jobs) == 2                                  # one ensemble job per seq_len
    assert all(len(j.runs) == 4 for j in jobs)             # 2 seeds × 2 learning rates
    names = [r.name for j in jobs for r in j.runs]
    assert "data.seq_len=16__optim.groups.Y.lr=10__seed=1" in names
    assert plan(load_spec(SPEC))[0].runs == jobs[0].runs   # stable


def test_jobs_run_largest_first():
    """Largest-first: members × steps, then the job's numeric axes (here the longer sequences first)."""
    from tdyn.sweep import job_cost

    jobs = plan(load_spec(SPEC))
    order = [j.runs[0].axes["data.seq_len"] for j in sorted(jobs, key=job_cost, reverse=True)]
    assert order == [32, 16]
    spec = dict(SPEC, axes={"grid": {"data.seq_len": [16, 32]}}, seeds=[0, 1, 2])
    assert job_cost(plan(load_spec(spec))[0])[0] == 3 * 12


def test_pool_map_keeps_the_order_of_calls_and_raises_their_errors():
    import math

    calls = [(2, 3), (3, 2), (5, 1)]
    assert pool_map(pow, calls, workers=2, cost=[1, 3, 2]) == pool_map(pow, calls, workers=1) == [8, 9, 5]
    with pytest.raises(ValueError):
        pool_map(math.sqrt, [(4.0,), (-1.0,)], workers=2)
    # costliest first: with 2 workers the cheapest of 3 calls (each 3 s long) starts only after both others
    start = "(__import__('time').time(), __import__('time').sleep(3))[0]"
    t = pool_map(eval, [(start,)] * 3, workers=2, cost=[1, 3, 2])
    assert t[0] > max(t[1], t[2])
    # a failing call stops the pool at once: its error does not wait for a long call before it
    t0 = time.time()
    with pytest.raises(ZeroDivisionError):
        pool_map(eval, [("__import__('time').sleep(120)",), ("1/0",)], workers=2, cost=[2, 1])
    assert time.time() - t0 < 60


def test_pool_start_method_forks_only_where_safe(monkeypatch):
    """Forked workers only in a process with no other thread, one torch thread (here and in the workers),
    no CUDA context, on Linux and Python < 3.12; otherwise (or with TDYN_START_METHOD=spawn) spawned
    ones; another value of TDYN_START_METHOD is a one-line error."""
    from tdyn.errors import UserError
    from tdyn.sweep import executors

    monkeypatch.delenv("TDYN_START_METHOD", raising=False)
    monkeypatch.setenv("TDYN_THREADS", "1")
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    can_fork = sys.platform.startswith("linux") and sys.version_info < (3, 12)
    assert executors.start_method() == ("fork" if can_fork else "spawn")
    monkeypatch.setenv("TDYN_START_METHOD", "spawn")
    assert executors.start_method() == "spawn"
    monkeypatch.setenv("TDYN_START_METHOD", "fork")
    with pytest.raises(UserError, match="TDYN_START_METHOD"):
        executors.start_method()
    monkeypatch.setenv("TDYN_START_METHOD", "auto")
    assert executors.start_method() == ("fork" if can_fork else "spawn")
    for name, value, patch in (("TDYN_THREADS", "2", None), (None, None, (torch, "get_num_threads", lambda: 2)),
                               (None, None, (torch.cuda, "is_initialized", lambda: True)),
                               (None, None, (torch.cuda, "is_available", lambda: True)),   # a device: never fork
                               (None, None, (threading, "active_count", lambda: 2))):   # e.g. a tqdm monitor
        with monkeypatch.context() as m:
            if name:
                m.setenv(name, value)
            else:
                m.setattr(*patch)
            assert executors.start_method() == "spawn"


def test_forked_and_spawned_workers_train_the_same_bits(tmp_path, monkeypatch):
    from tdyn.sweep import executors

    spec = dict(SPEC, seeds=[0])
    out = {}
    for method in ("fork", "spawn"):
        monkeypatch.setattr(executors, "start_method", lambda m=method: m)
        run_sweep(spec, tmp_path / method, workers=2, progress=False)
        out[method] = _metrics_by_run(tmp_path / method)
    assert out["fork"] == out["spawn"] and len(out["fork"]) == 4


def test_large_jobs_are_split_by_seed_bit_for_bit(tmp_path):
    """A job above ``job_members`` is cut into seed chunks (Fig 6: 4 jobs of 160 → 8 of 80 by default);
    the split changes which process trains a run, never its result: final tensors equal bit for bit."""
    from tdyn.papers.scan_snap.analysis import FIG6, fig6_spec

    fig6 = plan(load_spec(fig6_spec(FIG6)))
    assert [len(j.runs) for j in fig6] == [80] * 8 and {tuple(j.config["seeds"]) for j in fig6} == {(1, 2, 3, 4, 5), (6, 7, 8, 9, 10)}
    spec = dict(SPEC, seeds=[0, 1, 2])
    whole, split = plan(load_spec(spec)), plan(load_spec(dict(spec, job_members=4)))
    assert [len(j.runs) for j in whole] == [6, 6] and [len(j.runs) for j in split] == [4, 2, 4, 2]
    assert sorted(r.name for j in whole for r in j.runs) == sorted(r.name for j in split for r in j.runs)
    run_sweep(spec, tmp_path / "a", workers=1, progress=False)
    run_sweep(dict(spec, job_members=4), tmp_path / "b", workers=1, progress=False)
    for r in runs.read_json(tmp_path / "a" / "sweep.json")["runs"]:
        a, b = runs.Run(tmp_path / "a" / r["name"]).params(), runs.Run(tmp_path / "b" / r["name"]).params()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), r["name"]


def test_axes_zip_and_random():
    spec = load_spec({"base": "syn_small", "axes": {
        "zip": {"optim.groups.Y.lr": [1, 2, 3], "optim.groups.Z.lr": [0.1, 0.2, 0.3]},
        "random": {"n": 4, "seed": 7, "params": {"data.seq_len": {"kind": "choice", "values": [16, 32]},
                                                 "init_scale": {"kind": "loguniform", "low": 0.1, "high": 1}}}}})
    cs = cells(spec)
    assert len(cs) == 12 and cs == cells(spec)
    assert {(c["optim.groups.Y.lr"], c["optim.groups.Z.lr"]) for c in cs} == {(1, 0.1), (2, 0.2), (3, 0.3)}
    assert all(0.1 <= c["init_scale"] <= 1 for c in cs)
    jobs = plan(spec)
    assert sum(len(j.runs) for j in jobs) == 12


def test_bad_spec_is_a_config_error(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: syn_small\naxes: {grid: {data.seq_len: [16]}, zipp: {}}\n")
    r = cli("sweep", bad, "--out", tmp_path / "o")
    assert r.returncode == 2 and "axes.zipp" in r.stderr and "Traceback" not in r.stderr


def test_local_sweep_skip_summary_and_failure(tmp_path):
    out = tmp_path / "sw"
    st = run_sweep(SPEC, out, workers=2, progress=False)
    assert len(st) == 8 and set(st.values()) == {"finished"}
    busy = runs.read_json(out / "sweep.json")["worker_busy_seconds"]       # per worker process
    assert 1 <= len(busy) <= 2 and all(v > 0 for v in busy.values())
    rows = (out / "summary.csv").read_text().splitlines()
    assert rows[0].startswith("data.seq_len,optim.groups.Y.lr,count,loss_mean,loss_std")
    assert len(rows) == 5 and all(r.split(",")[2] == "2" for r in rows[1:])
    png = plot_metric(out / "summary.csv", "loss", x="optim.groups.Y.lr", curve="data.seq_len",
                      path=out / "loss.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import tdyn.sweep
    assert tdyn.sweep.plot_metric is plot_metric        # its old home still imports it
    before = {n: (out / n / "metrics.jsonl").stat().st_mtime_ns for n in st}
    run_sweep(SPEC, out, workers=2, progress=False)         # finished runs are skipped
    assert {n: (out / n / "metrics.jsonl").stat().st_mtime_ns for n in st} == before
    # a job that raises is recorded as failed with its error; the other jobs complete
    spec = dict(SPEC, axes={"grid": {"model.parameterization": ["yz", "embedding"]}}, seeds=[0])
    st = run_sweep(spec, tmp_path / "fail", workers=2, progress=False)
    sw = runs.read_json(tmp_path / "fail" / "sweep.json")
    by = {r["axes"]["model.parameterization"]: r for r in sw["runs"]}
    assert by["yz"]["status"] == "finished"
    assert by["embedding"]["status"] == "failed" and "unknown parameter 'Y'" in by["embedding"]["error"]


LONG = {"base": "syn_small",
        "set": ["optim.steps=1200", "checkpoint.every=100", "checkpoint.schedule=none", "model.init=torch_default"],
        "axes": {"grid": {"data.seq_len": [64, 128]}}, "seeds": [0, 1]}


def _kill_when_checkpointed(out: Path, pids, min_step=300, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        steps = [max(runs.checkpoint_steps(d), default=-1) for d in out.glob("data.seq_len=*")]
        if steps and max(steps) >= min_step:
            victims = pids()
            if victims:
                os.kill(victims[0], signal.SIGKILL)
                return victims[0]
        time.sleep(0.01)
    raise AssertionError("no worker to kill")


@pytest.mark.slow
def test_killed_pool_worker_loses_nothing(tmp_path):
    ref = tmp_path / "ref"
    run_sweep(LONG, ref, workers=2, progress=False)
    out = tmp_path / "killed"
    ex = LocalExecutor(2)
    th = threading.Thread(target=run_sweep, args=(LONG, out), kwargs=dict(executor_obj=ex, progress=False))
    th.start()
    _kill_when_checkpointed(out, ex.pids)
    th.join(300)
    ex.shutdown()
    assert _metrics_by_run(out) == _metrics_by_run(ref)
    assert {r["status"] for r in runs.read_json(out / "sweep.json")["runs"]} == {"finished"}


def _ray_worker_pids() -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (p / "cmdline").read_bytes().startswith(b"ray::run_job"):
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


@pytest.mark.slow
def test_ray_single_node_with_killed_worker(tmp_path):
    ray = pytest.importorskip("ray")
    from tdyn.sweep.executors import RayExecutor

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        ex = RayExecutor()
        ref = tmp_path / "ref"
        run_sweep(LONG, ref, executor_obj=ex, progress=False)
        out = tmp_path / "killed"
        th = threading.Thread(target=run_sweep, args=(LONG, out), kwargs=dict(executor_obj=ex, progress=False))
        th.start()
        _kill_when_checkpointed(out, _ray_worker_pids)
        th.join(300)
        assert _metrics_by_run(out) == _metrics_by_run(ref)
        assert {r["status"] for r in runs.read_json(out / "sweep.json")["runs"]} == {"finished"}
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_submitit_local_executor(tmp_path):
    pytest.importorskip("submitit")
    from tdyn.sweep.executors import SlurmExecutor

    from tdyn.sweep.spec import SlurmOptions

    opts = SlurmOptions(partition="gpu", time_min=10, mem_gb=4, account="acct", extra={"qos": "high"})
    ex = SlurmExecutor(str(tmp_path / "submitit"), cluster="local", **opts.submitit_parameters())
    assert ex.ex._executor.parameters["timeout_min"] == 10           # not submitit's 5-minute default
    st = run_sweep(SPEC, tmp_path / "sw", executor_obj=ex, progress=False)
    assert set(st.values()) == {"finished"} and len(st) == 8
    local = tmp_path / "local"
    run_sweep(SPEC, local, workers=2, progress=False)
    # other processes may use other torch thread counts: equal to float tolerance
    a, b = _metrics_by_run(tmp_path / "sw"), _metrics_by_run(local)
    assert a.keys() == b.keys()
    for n in a:
        for ra, rb in zip(runs.read_metrics(tmp_path / "sw" / n), runs.read_metrics(local / n), strict=True):
            assert ra.keys() == rb.keys() and all(ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-6) for k in ra)


def test_summarize_cli(cli, tmp_path):
    out = tmp_path / "sw"
    run_sweep(dict(SPEC, seeds=[0]), out, workers=1, progress=False)
    (out / "summary.csv").unlink()
    r = cli("sweep", "--summarize", out)
    assert r.returncode == 0 and (out / "summary.csv").exists()
    summarize(out)


def test_sweep_worker_equals_tdyn_run_bit_for_bit(cli, tmp_path):
    """--threads reaches the sweep's workers: one run of a sweep (--workers 1) and `tdyn run` of the same
    config write identical metrics and final tensors; --threads 0 / --workers 0 are one-line errors."""
    import json

    cfg = {"task": "scan_snap", "data": {"batch_size": 128, "seq_len": 128}, "seeds": [0],
           "optim": {"steps": 8, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}},
           "probes": {"names": ["scan_snap.attention"], "every": 4}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    (tmp_path / "s.json").write_text(json.dumps({"base": str(tmp_path / "c.json"), "seeds": [0],
                                                 "axes": {"grid": {"optim.groups.Y.lr": [1.0]}}}))
    assert cli("run", tmp_path / "c.json", "--out", tmp_path / "r", "--quiet").returncode == 0   # 1 thread
    r = cli("sweep", tmp_path / "s.json", "--out", tmp_path / "s", "--workers", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    (name,) = [x["name"] for x in runs.read_json(tmp_path / "s" / "sweep.json")["runs"]]
    strip = lambda t: [{k: v for k, v in json.loads(x).items() if k not in (runs.METRICS_KEY, runs.LINE_CRC)} for x in t.splitlines()]  # noqa: E731  (the run identity differs: another member, another config; so do the lines' chained checksums)
    assert strip((tmp_path / "s" / name / "metrics.jsonl").read_text()) == strip((tmp_path / "r" / "metrics.jsonl").read_text())
    a = runs.Run(tmp_path / "s" / name).params()
    b = runs.Run(tmp_path / "r").params()
    assert all(torch.equal(a[k], b[k]) for k in a)
    for bad in (["--threads", "0", "sweep", tmp_path / "s.json", "--out", tmp_path / "t"],
                ["sweep", tmp_path / "s.json", "--out", tmp_path / "t", "--workers", "0"]):
        r = cli(*bad)
        assert r.returncode == 2 and "must be at least 1" in r.stderr and not (tmp_path / "t").exists()


def test_spec_base_resolves_relative_to_the_spec_file(tmp_path, monkeypatch):
    import shutil

    from tdyn.config import packaged
    from tdyn.sweep.spec import base_config

    d = tmp_path / "proj" / "sweeps"
    d.mkdir(parents=True)
    shutil.copy(packaged()["syn_small"], tmp_path / "proj" / "base.yaml")
    (d / "s.yaml").write_text("base: ../base.yaml\naxes:\n  grid:\n    optim.groups.Y.lr: [1.0, 2.0]\n")
    monkeypatch.chdir(tmp_path)                       # not the spec's directory
    spec = load_spec(d / "s.yaml")
    assert Path(spec.base) == (tmp_path / "proj" / "base.yaml").resolve()
    assert base_config(spec)["task"] == "scan_snap" and len(plan(spec)) == 1
    shipped = load_spec("syn_small_lr")                 # a packaged spec by name: its base is packaged too
    assert Path(shipped.base) == packaged()["syn_small"] and len(plan(shipped)) == 2


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(p.name))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_no_worker_survives_a_killed_sweep(tmp_path):
    """SIGKILL of the `tdyn sweep` process takes its pool workers with it (they would otherwise train on)."""
    import json
    import subprocess

    (tmp_path / "s.json").write_text(json.dumps(LONG))
    root = Path(__file__).resolve().parents[1]
    env = os.environ | {"PYTHONPATH": str(root / "src")}
    p = subprocess.Popen([sys.executable, "-m", "tdyn.cli", "sweep", str(tmp_path / "s.json"), "--out",
                          str(tmp_path / "o"), "--workers", "2", "--quiet"], cwd=root, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0, workers = time.time(), []
    def training():   # both jobs (one per worker) past their first checkpoint: both workers initialised
        ds = list((tmp_path / "o").glob("data.seq_len=*"))
        return len(ds) == 4 and all(runs.is_run_dir(d) and runs.checkpoint_steps(d) for d in ds)

    while time.time() - t0 < 180 and not training():
        time.sleep(0.05)
    own = Path(f"/proc/{p.pid}/cmdline").read_bytes()
    workers = [c for c in _children(p.pid)   # pool workers: forked (the sweep's command line) or spawned
               if Path(f"/proc/{c}/cmdline").read_bytes() == own or b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert workers, "no pool worker found"
    p.kill()
    p.wait()
    deadline = time.time() + 10     # a worker left alone trains on for tens of seconds
    while time.time() < deadline and any(Path(f"/proc/{w}").exists() and
                                         "Z" not in Path(f"/proc/{w}/stat").read_text().rsplit(")", 1)[1].split()[0]
                                         for w in workers):
        time.sleep(0.1)
    alive = [w for w in workers if Path(f"/proc/{w}").exists()
             and "Z" not in Path(f"/proc/{w}/stat").read_text().rsplit(")", 1)[1].split()[0]]
    assert not alive, f"workers {alive} outlived the killed sweep"


def test_slurm_resources_reach_the_sbatch_script(tmp_path, cli):
    """The spec's slurm: section, overridden by --slurm-*, becomes submitit parameters whose sbatch script
    asks for them (submitit's own sbatch writer; no cluster needed); a bad value is one line."""
    submitit = pytest.importorskip("submitit")
    from submitit.slurm import slurm as sl

    from tdyn.sweep.spec import SlurmOptions

    spec = load_spec(dict(SPEC, slurm={"partition": "cpu", "time_min": 240, "extra": {"qos": "high"}}))
    merged = SlurmOptions.model_validate(spec.slurm.model_dump() | {"partition": "gpu", "gpus_per_node": 1,
                                                                     "mem_gb": 16, "account": "acct"})
    params = merged.submitit_parameters()
    eq = submitit.SlurmExecutor._equivalence_dict()
    conv = {(k[len("slurm_"):] if k.startswith("slurm_") else eq[k]): v for k, v in params.items()}
    conv["mem"] = f"{int(conv['mem'])}GB"
    text = sl._make_sbatch_string(command="true", folder=str(tmp_path), **conv)
    for line in ("--partition=gpu", "--time=240", "--gpus-per-node=1", "--cpus-per-task=1", "--mem=16GB",
                 "--account=acct", "--qos=high"):
        assert f"#SBATCH {line}" in text, line
    (tmp_path / "s.json").write_text(__import__("json").dumps(SPEC))
    r = cli("sweep", tmp_path / "s.json", "--out", tmp_path / "o", "--executor", "slurm", "--slurm-time", "0")
    assert r.returncode == 2 and "slurm.time_min" in r.stderr and "Traceback" not in r.stderr


def test_ray_joining_a_cluster_passes_no_num_cpus(monkeypatch):
    ray = pytest.importorskip("ray")
    from tdyn.sweep.executors import RayExecutor

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    RayExecutor(address="ray://head:10001", num_cpus=8)
    RayExecutor(address=None, num_cpus=8)
    assert calls[0]["address"] == "ray://head:10001" and calls[0]["num_cpus"] is None
    assert calls[1]["num_cpus"] == 8


# ---------------------------------------------------------------- lost work is never success (issue 17, item 1)

TINY = {"task": "scan_snap", "data": {"num_last": 2, "num_next_per_last": 1, "seq_len": 16, "batch_size": 8},
        "seeds": [0], "optim": {"steps": 3, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}},
        "checkpoint": {"schedule": "none"}}


def test_sweep_exits_nonzero_while_a_job_failed(cli, tmp_path):
    """Three jobs: one trains; one raises inside training (a parameterization without the groups' Y);
    one raises before training starts (an OS error: its job directory's path is taken by a file, planted in
    the sweep's own .jobs/ after a first pass, its run deleted so that the re-run trains it again; a stray
    file in a fresh --out's .jobs/ is refused up front). Both failures are `failed` with their error in
    sweep.json, and `tdyn sweep` exits 1 saying so."""
    import json
    import shutil

    (tmp_path / "base.json").write_text(json.dumps(TINY))
    spec = {"base": str(tmp_path / "base.json"), "seeds": [0],
            "axes": {"zip": {"data.seq_len": [16, 32, 16], "model.parameterization": ["yz", "yz", "embedding"]}}}
    (tmp_path / "s.json").write_text(json.dumps(spec))
    jobs = {(j.runs[0].axes["data.seq_len"], j.runs[0].axes["model.parameterization"]): j for j in plan(load_spec(spec))}
    out = tmp_path / "o"
    r = cli("sweep", tmp_path / "s.json", "--out", out, "--workers", "1", "--quiet")
    assert r.returncode == 1, r.stderr
    job = jobs[32, "yz"]
    for x in runs.read_sweep(out)["runs"]:
        if x["axes"] == {"data.seq_len": 32, "model.parameterization": "yz"}:
            shutil.rmtree(out / x["name"])
    shutil.rmtree(out / ".jobs" / job.id, ignore_errors=True)
    (out / ".jobs").mkdir(exist_ok=True)
    (out / ".jobs" / job.id).write_text("not a directory")
    r = cli("sweep", tmp_path / "s.json", "--out", out, "--workers", "1", "--quiet")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "not finished" in r.stderr
    by = {(x["axes"]["data.seq_len"], x["axes"]["model.parameterization"]): x for x in runs.read_sweep(out)["runs"]}
    assert by[16, "yz"]["status"] == "finished" and "error" not in by[16, "yz"]
    assert by[32, "yz"]["status"] == "failed" and "FileExistsError" in by[32, "yz"]["error"]
    assert by[16, "embedding"]["status"] == "failed" and "unknown parameter 'Y'" in by[16, "embedding"]["error"]
    (out / ".jobs" / jobs[32, "yz"].id).unlink()          # the cause removed, the same command completes
    r = cli("sweep", tmp_path / "s.json", "--out", out, "--workers", "1", "--quiet")
    assert r.returncode == 1 and "unknown parameter 'Y'" in r.stderr
    by = {(x["axes"]["data.seq_len"], x["axes"]["model.parameterization"]): x for x in runs.read_sweep(out)["runs"]}
    assert by[32, "yz"]["status"] == "finished" and by[16, "embedding"]["status"] == "failed"


DYING = '''
import os, signal, torch
from tdyn.schema import Strict
from tdyn.tasks import Task, register_task


class DyingData(Strict):
    die: bool = False


class DyingModel(Strict):
    pass


class Dying(Task):
    """Kills its own process at the first loss (after checkpoint 0): an out-of-memory kill, say."""

    def __init__(self, cfg, members):
        self.die = DyingData.model_validate(cfg.data).die
        self.model = torch.nn.Module()
        self.model.w = torch.nn.Parameter(torch.ones(len(members), 2))

    def sample(self, gen):
        return None

    def loss(self, batch):
        if self.die:
            os.kill(os.getpid(), signal.SIGKILL)
        return (self.model.w ** 2).sum(1)


@register_task("test_dying", DyingData, DyingModel, "kills its process (tests only)")
def _build(cfg, members):
    return Dying(cfg, members)
'''


def test_sweep_fails_a_job_whose_worker_keeps_dying(cli, tmp_path):
    """A job that kills its worker process (SIGKILL at its first step) is retried on a fresh pool, then
    `failed` as lost; the job queued behind it (never started when the pool broke) is not blamed and
    finishes; `tdyn sweep` exits 1."""
    import json

    from tdyn.sweep import MAX_LOST

    (tmp_path / "dying.py").write_text(DYING)
    spec = {"config": {"task": "test_dying", "optim": {"steps": 3, "groups": {"w": {"params": ["w"], "lr": 0.1}}},
                       "checkpoint": {"schedule": "none"}},
            "seeds": [0], "axes": {"grid": {"data.die": [False, True]}}}
    (tmp_path / "s.json").write_text(json.dumps(spec))
    out = tmp_path / "o"
    r = cli("--import", tmp_path / "dying.py", "sweep", tmp_path / "s.json", "--out", out, "--workers", "1", "--quiet")
    assert r.returncode == 1, r.stderr
    by = {x["axes"]["data.die"]: x for x in runs.read_sweep(out)["runs"]}
    assert by[True]["status"] == "failed" and f"lost {MAX_LOST} times" in by[True]["error"]
    assert by[False]["status"] == "finished" and "error" not in by[False]
    assert f"lost {MAX_LOST} times" in r.stderr and "Traceback" not in r.stderr


def test_lost_job_without_a_word_from_its_worker_is_failed(tmp_path):
    """An executor that loses a job (its future raises) fails the job's runs with that error; run_sweep's
    statuses cover every planned run, so nothing lost reads as finished."""
    import concurrent.futures as cf

    class Losing:
        name, retry_broken = "losing", False

        def __init__(self):
            self.pool = cf.ThreadPoolExecutor(1)

        def submit(self, fn, *args):
            if "seq_len=32" in args[2][0]:
                f = cf.Future()
                f.set_exception(ConnectionError("node went away"))
                return f
            return self.pool.submit(fn, *args)

    spec = {"config": TINY, "seeds": [0], "axes": {"grid": {"data.seq_len": [16, 32]}}}
    ex, threads = Losing(), torch.get_num_threads()
    try:
        st = run_sweep(spec, tmp_path / "o", executor_obj=ex, progress=False)
    finally:
        ex.pool.shutdown()
        torch.set_num_threads(threads)   # run_job ran in this process
    assert len(st) == 2 and sorted(st.values()) == ["failed", "finished"]
    (lost,) = [x for x in runs.read_sweep(tmp_path / "o")["runs"] if x["status"] == "failed"]
    assert "seq_len=32" in lost["name"] and "node went away" in lost["error"]


def test_a_sweep_started_while_a_worker_imports_the_script_says_where_to_put_it(tmp_path, monkeypatch):
    """A spawned worker runs the top level of the user's script again (multiprocessing marks the process
    as inheriting meanwhile): tdyn.sweep called there names the fix in one line instead of failing on the
    parent's lock."""
    import multiprocessing

    from tdyn.errors import UserError

    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(UserError, match='if __name__ == "__main__":'):
        run_sweep("syn_small_lr", tmp_path / "sw")
    assert not (tmp_path / "sw").exists()


def test_ctrl_c_stops_a_sweep_at_once_and_a_rerun_finishes_it(tmp_path):
    """SIGINT to `tdyn sweep` alone (as `timeout -s INT` sends it): the running jobs save an interrupt
    checkpoint and end, a job already handed to a worker ends at its first step, the process exits 130 within seconds with sweep.json written;
    the same command again finishes every run, the summary equal to an uninterrupted sweep's."""
    import json
    import shutil
    import signal
    import subprocess

    # A sweep that finishes before the signal reaches it (exit 0: every run done) says nothing about SIGINT, and
    # how soon that happens depends on the machine (seen three times at 4,000 steps on loaded or fast CPUs), so such
    # a try is repeated at 4x the steps, up to 64,000; a sweep that ignored SIGINT still fails at the last try.
    root = Path(__file__).resolve().parents[1]
    env = os.environ | {"PYTHONPATH": str(root / "src")}
    cmd = [sys.executable, "-m", "tdyn.cli", "sweep", str(tmp_path / "s.json"), "--workers", "2", "--quiet"]
    out = tmp_path / "o"
    for steps in (4000, 16000, 64000):
        spec = dict(LONG, axes={"grid": {"data.seq_len": [64, 96, 128]}},
                    set=[s if not s.startswith("optim.steps=") else f"optim.steps={steps}" for s in LONG["set"]])
        (tmp_path / "s.json").write_text(json.dumps(spec))
        shutil.rmtree(out, ignore_errors=True)
        p = subprocess.Popen(cmd + ["--out", str(out)], cwd=root, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0 = time.time()
        while time.time() - t0 < 180 and sum(bool(runs.checkpoint_steps(d)) for d in out.glob("data.seq_len=*")
                                             if runs.is_run_dir(d)) < 4:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        t1 = time.time()
        err = p.communicate(timeout=60)[1]
        if not (p.returncode == 0 and {r["status"] for r in runs.read_sweep(out)["runs"]} == {"finished"}):
            break                                      # the signal found the sweep running
    assert p.returncode == 130 and time.time() - t1 < 20, err
    st = {d.name: runs.read_meta(d)["status"] for d in out.glob("data.seq_len=*") if runs.is_run_dir(d)}
    assert set(st.values()) == {"interrupted"}, st    # the running jobs stopped; one already handed to a worker
    # stopped at its start
    assert {r["status"] for r in runs.read_sweep(out)["runs"]} == {"pending"}
    assert subprocess.run(cmd + ["--out", str(out)], cwd=root, env=env, capture_output=True).returncode == 0
    assert subprocess.run(cmd + ["--out", str(tmp_path / "ref")], cwd=root, env=env, capture_output=True).returncode == 0
    assert (out / "summary.csv").read_text() == (tmp_path / "ref" / "summary.csv").read_text()
