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

ARGS = ["configs/syn_small.yaml", "--set", "optim.steps=1500", "--set", "checkpoint.every=100",
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
    """Kill at many moments of a run that checkpoints every step; every visible file stays readable."""
    out = tmp_path / "r"
    args = ["configs/syn_small.yaml", "--set", "optim.steps=400", "--set", "checkpoint.every=1", "--quiet"]
    for i, delay in enumerate([0.9, 1.1, 1.3, 1.6]):
        cmd = [sys.executable, "-m", "tdyn", "run", *(["--resume", str(out), "--quiet"] if i else [*args, "--out", str(out)])]
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if out.exists():
            _all_files_complete(out)


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
