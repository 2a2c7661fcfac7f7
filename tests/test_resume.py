"""Interruption: SIGKILL mid-run then --resume equals an uninterrupted run line for line; files are
never half-written; Ctrl-C leaves a resumable run."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import ROOT
from tdyn import runs

ARGS = ["syn_small", "--set", "optim.steps=1500", "--set", "checkpoint.every=100",
        "--set", "checkpoint.schedule=none", "--set", "model.init=torch_default", "--quiet"]


def _start(out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tdyn", "run", *ARGS, "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(proc, out: Path, step: int, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if any(s >= step for s in runs.checkpoint_steps(out)):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    raise AssertionError("no checkpoint appeared")


def _all_files_complete(out: Path):
    for f in out.rglob("*"):
        if f.is_file() and not f.name.startswith("."):
            if f.suffix == ".json":
                runs.read_json(f)
            elif f.suffix == ".jsonl":
                runs.read_metrics(f.parent)
            elif f.suffix == ".safetensors":
                load_file(f)


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted(cli, tmp_path):
    ref = cli("run", *ARGS, "--out", tmp_path / "ref")
    assert ref.returncode == 0, ref.stderr
    killed = tmp_path / "killed"
    proc = _start(killed)
    _wait_for_checkpoint(proc, killed, 500)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert runs.read_meta(killed)["status"] == "running"
    _all_files_complete(killed)
    last = max(runs.checkpoint_steps(killed))
    assert 500 <= last < 1500
    r = cli("run", "--resume", killed, "--quiet")
    assert r.returncode == 0, r.stderr
    assert runs.read_meta(killed)["status"] == "finished"
    assert runs.read_meta(killed)["resumed"][0]["from_step"] == last
    a = (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()
    b = (killed / "metrics.jsonl").read_text().splitlines()
    assert len(a) == len(b) == 1501
    assert a == b
    fa, fb = (load_file(d / "checkpoints" / "final.safetensors") for d in (tmp_path / "ref", killed))
    assert all((fa[k] == fb[k]).all() for k in fa)


@pytest.mark.slow
def test_repeated_kills_leave_no_half_written_file(tmp_path):
    """Kill at many moments of a run that checkpoints every step; every visible file stays readable.

    Each start (the first run, then each --resume) is killed only after it has written a checkpoint
    beyond the previous one, plus a varying delay, so every kill lands mid-training with files on disk:
    the checks below always run (a kill before the directory exists would check nothing)."""
    out = tmp_path / "r"
    args = ["syn_small", "--set", "optim.steps=5000", "--set", "checkpoint.every=1", "--quiet"]
    last = -1
    for i, delay in enumerate([0.0, 0.03, 0.11, 0.27, 0.5]):
        cmd = [sys.executable, "-m", "tdyn", "run", *(["--resume", str(out), "--quiet"] if i else [*args, "--out", str(out)])]
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _wait_for_checkpoint(p, out, last + 1)
        time.sleep(delay)
        assert p.poll() is None, "the run ended before it was killed"
        p.send_signal(signal.SIGKILL)
        p.wait()
        _all_files_complete(out)
        assert runs.read_meta(out)["status"] == "running"
        steps = runs.checkpoint_steps(out)
        assert steps and max(steps) > last
        assert len(runs.read_metrics(out)) >= max(steps) - 1   # metrics kept up with the checkpoints
        last = max(steps)


def test_ctrl_c_leaves_resumable_run(cli, tmp_path):
    out = tmp_path / "r"
    proc = _start(out)
    _wait_for_checkpoint(proc, out, 100)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "--resume" in err
    meta = runs.read_meta(out)
    assert meta["status"] == "interrupted" and "--resume" in meta["message"]
    stop = max(runs.checkpoint_steps(out))
    assert len(runs.read_metrics(out)) == stop       # metrics up to (not including) the stop step
    r = cli("run", "--resume", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert [m["step"] for m in runs.read_metrics(out)] == list(range(1501))


def test_ensemble_manifest_cannot_point_outside(tmp_path, cli):
    """An ensemble.json whose member directory is ../victim is refused (exit 2), and nothing is written there."""
    import json

    cfg = {"task": "decision_list", "data": {"L": 5, "M": 2, "n": 3}, "seeds": [0, 1],
           "optim": {"steps": 3, "groups": {"all": {"params": ["W", "V"], "lr": 1.0}}}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert cli("run", tmp_path / "c.json", "--out", tmp_path / "e", "--quiet").returncode == 0
    man = json.loads((tmp_path / "e" / "ensemble.json").read_text())
    victim = tmp_path / "victim"
    victim.mkdir()
    man["dirs"][1] = "../victim"
    (tmp_path / "e" / "ensemble.json").write_text(json.dumps(man))
    r = cli("run", "--resume", tmp_path / "e")
    assert r.returncode == 2 and "lies outside" in r.stderr and "Traceback" not in r.stderr
    assert list(victim.iterdir()) == []
