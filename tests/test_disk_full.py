"""A disk that fills up mid-run (issue 36, item 4): one stderr line naming the file that could not be
written and saying nothing was left half-written, exit 1 (the machine failed, not the input), every file
tdyn trusts whole (no temp file left), and the run resumable once there is space again.

Two ways: a real small tmpfs (``mount -t tmpfs``: needs root or a user namespace; skipped with the reason
where the machine refuses), and everywhere a deterministic one: ``os.write`` of the atomic writer fails
with ENOSPC after a byte budget, through the CLI's ``main`` in this process."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tdyn import cli, runs
from tdyn.runs import atomic

CFG = {"task": "scan_snap", "data": {"num_last": 2, "num_next_per_last": 1, "seq_len": 16, "batch_size": 8},
       "seeds": [0], "optim": {"steps": 400, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}},
       "checkpoint": {"schedule": "none", "every": 1}}


def _check_left_whole(out: Path) -> None:
    """Every JSON file parses, every checkpoint verifies, no temp file is left."""
    assert not list(out.rglob("*.tmp")), list(out.rglob("*.tmp"))
    for p in out.rglob("*.json"):
        runs.read_json(p)
    for p in sorted(out.rglob("*.safetensors")):
        runs.read_checkpoint(p)       # its checksum verified


def _assert_disk_full(rc: int, err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 1, (rc, err[-2000:])
    assert "Traceback" not in err and len(lines) == 1, err[-2000:]
    assert "No space left on device" in lines[0] and "nothing was left half-written" in lines[0], lines[0]
    assert "could not be written" in lines[0] and "--resume" in lines[0], lines[0]


class _FullDisk:
    """``os`` for the atomic writer, whose ``write`` fails with ENOSPC once ``budget`` bytes are written."""

    def __init__(self, budget: int):
        self.budget = budget

    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        n = len(data)
        if n > self.budget:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.budget -= n
        return os.write(fd, data)


def test_simulated_disk_full_run_and_resume(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(CFG))
    out = tmp_path / "r"
    disk = _FullDisk(200_000)
    monkeypatch.setattr(atomic, "os", disk)
    rc = cli.main(["run", str(cfg), "--out", str(out), "--quiet"])
    _assert_disk_full(rc, capsys.readouterr().err)
    _check_left_whole(out)
    disk.budget = 60_000                        # a little space freed: --resume fills it again
    rc = cli.main(["run", "--resume", str(out), "--quiet"])
    _assert_disk_full(rc, capsys.readouterr().err)
    _check_left_whole(out)
    monkeypatch.setattr(atomic, "os", os)      # space again: the run finishes
    assert cli.main(["run", "--resume", str(out), "--quiet"]) == 0
    assert runs.Run(out).status == "finished"


class _Inline:
    """A sweep executor running each job in this process (where the full disk is simulated)."""

    name = "inline"

    def submit(self, fn, *args):
        import concurrent.futures as cf

        f = cf.Future()
        f.set_result(fn(*args))
        return f

    def shutdown(self):
        pass


def test_simulated_disk_full_sweep_is_one_line(tmp_path, monkeypatch, capsys):
    """A sweep whose job fails on a full disk: one stderr line (how many runs are not finished, the job's
    error naming the file and that nothing was left half-written, where the errors are, how to go on), exit
    1, every file whole; the same command finishes it once there is space, to the same result as a sweep
    that never ran out of space."""
    from tdyn import sweep

    base = tmp_path / "c.json"
    base.write_text(json.dumps(CFG | {"optim": CFG["optim"] | {"steps": 30}}))
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"base": str(base), "seeds": [0], "axes": {"grid": {"optim.groups.Y.lr": [1.0, 2.0]}}}))
    monkeypatch.setattr(sweep, "make_executor", lambda *a, **k: _Inline())
    argv = ["sweep", str(spec), "--out", str(tmp_path / "sw"), "--workers", "1", "--quiet"]
    disk = _FullDisk(60_000)
    monkeypatch.setattr(atomic, "os", disk)
    rc = cli.main(argv)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 1 and len(err) == 1 and "Traceback" not in err[0], err
    for words in ("run(s) not finished", "No space left on device", "nothing was left half-written",
                  "could not be written", "sweep.json", "re-run the same command"):
        assert words in err[0], (words, err[0])
    _check_left_whole(tmp_path / "sw")
    monkeypatch.setattr(atomic, "os", os)
    assert cli.main(argv) == 0
    assert cli.main(argv[:2] + ["--out", str(tmp_path / "ref"), "--workers", "1", "--quiet"]) == 0
    for r in runs.read_sweep(tmp_path / "ref")["runs"]:
        assert runs.read_metrics(tmp_path / "sw" / r["name"]) == runs.read_metrics(tmp_path / "ref" / r["name"])


def test_write_error_names_the_target_not_its_temp(tmp_path, monkeypatch):
    from tdyn.errors import WriteError

    monkeypatch.setattr(atomic, "os", _FullDisk(0))
    (tmp_path / "a.json").write_text("old")
    with pytest.raises(WriteError) as e:
        runs.write_json(tmp_path / "a.json", {"x": 1})
    assert e.value.filename == str(tmp_path / "a.json") and e.value.errno == errno.ENOSPC and e.value.environment
    assert (tmp_path / "a.json").read_text() == "old" and os.listdir(tmp_path) == ["a.json"]


def _mount_tmpfs(d: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` on ``d``; None, or why it cannot be done here."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (this test is skipped elsewhere; the simulated disk-full test runs)"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True, text=True)
    return None if r.returncode == 0 else f"mount -t tmpfs refused: {r.stderr.strip() or r.returncode}"


def test_real_disk_full_on_a_small_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    why = _mount_tmpfs(mnt, "256k")
    if why:
        pytest.skip(why)
    try:
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps(CFG))
        out = mnt / "r"
        tdyn = [sys.executable, "-m", "tdyn"]
        r = subprocess.run([*tdyn, "run", str(cfg), "--out", str(out), "--quiet"], capture_output=True, text=True)
        _assert_disk_full(r.returncode, r.stderr)
        assert str(out) in r.stderr
        _check_left_whole(out)
        r = subprocess.run([*tdyn, "run", "--resume", str(out), "--quiet"], capture_output=True, text=True)
        _assert_disk_full(r.returncode, r.stderr)
        subprocess.run(["mount", "-o", "remount,size=16m", str(mnt)], check=True)
        r = subprocess.run([*tdyn, "run", "--resume", str(out), "--quiet"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        assert runs.Run(out).status == "finished"
        _check_left_whole(out)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_fork_the_machine_refuses_is_one_line_exit_1(tmp_path, monkeypatch, capsys):
    """A sweep whose worker cannot be started (fork: EAGAIN at the process limit) is one line naming the
    resource, exit 1, no traceback; the sweep continues once processes are free."""
    base = tmp_path / "c.json"
    base.write_text(json.dumps(CFG | {"optim": CFG["optim"] | {"steps": 3}}))
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"base": str(base), "seeds": [0, 1]}))

    ns: dict = {}   # os.fork refusing, as the real one raises it: from the standard library's code, not the user's
    exec(compile("import errno, os\ndef refuse():\n    raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))\n",
                 os.__file__, "exec"), ns)
    refuse = ns["refuse"]

    with monkeypatch.context() as m:
        m.setattr(os, "fork", refuse)
        m.setenv("TDYN_START_METHOD", "auto")
        rc = cli.main(["sweep", str(spec), "--out", str(tmp_path / "sw"), "--workers", "2", "--quiet"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 1 and len(err) == 1 and "Traceback" not in err[0], err
    assert "refused a resource" in err[0] and "Resource temporarily unavailable" in err[0]
    assert cli.main(["sweep", str(spec), "--out", str(tmp_path / "sw"), "--workers", "2", "--quiet"]) == 0
