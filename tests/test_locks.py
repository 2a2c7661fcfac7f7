"""One writer per directory (issue 17, item 3): a run, job, sweep or reproduction directory being
written holds an ``fcntl`` lock on ``.tdyn.lock`` naming its writer (``pid@host``); a second
``run``, ``run --force``, ``run --resume`` or ``sweep`` on it exits 2 naming that writer; a lock left by
a killed process is taken over; resume's clean-up deletes only the temp files of writers that are gone."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, tdyn_cli
from hostile import assert_rejected, tree_state
from tdyn import runs
from tdyn.train.trainer import train

CFG = {"task": "scan_snap", "data": {"num_last": 2, "num_next_per_last": 1, "seq_len": 16, "batch_size": 8},
       "seeds": [0], "optim": {"steps": 12, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}},
       "checkpoint": {"schedule": "none", "every": 4}}
ME = f"{os.getpid()}@{runs.host()}"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("built")
    (root / "cfg.json").write_text(json.dumps(CFG))
    train(CFG, root / "run", progress=False)
    train(dict(CFG, seeds=[0, 1]), root / "ensemble", progress=False)
    (root / "spec.json").write_text(json.dumps({"base": str(root / "cfg.json"), "seeds": [0],
                                                "axes": {"grid": {"optim.groups.Y.lr": [1.0]}}}))
    return {"root": root, "cfg": root / "cfg.json", "spec": root / "spec.json", "run": root / "run",
            "ensemble": root / "ensemble"}


def test_a_finished_run_leaves_no_lock(built):
    assert not (built["run"] / runs.LOCK).exists()
    assert not any(p.name == runs.LOCK for p in built["ensemble"].rglob("*"))


@pytest.mark.parametrize("command", ["resume", "run", "run --force", "sweep"])
def test_second_writer_is_refused_naming_the_holder(built, tmp_path, command):
    """This test process holds the directory's lock; a CLI process that would write it exits 2 naming
    ``pid@host`` of this process, and changes nothing."""
    d = tmp_path / "d"
    if command == "sweep":
        d.mkdir()
    else:
        shutil.copytree(built["run"], d)
    args = {"resume": ["run", "--resume", d], "run": ["run", built["cfg"], "--out", d],
            "run --force": ["run", built["cfg"], "--out", d, "--force"],
            "sweep": ["sweep", built["spec"], "--out", d, "--workers", "1"]}[command]
    with runs.Locks() as locks:
        locks.acquire(d)
        assert runs.lock_holder(d) == ME
        before, inside = tree_state(tmp_path), tree_state(d)
        r = tdyn_cli(*args, "--quiet")
        assert_rejected(r, ME, before, tree_state(tmp_path), case=command)
        assert "in use by pid" in r.stderr
        assert tree_state(d) == inside
    assert not (d / runs.LOCK).exists()          # released: the file goes with the lock


def test_force_stops_at_a_member_another_process_writes(built, tmp_path):
    """`run --force` on an ensemble would clear it: while another process writes one member (holds its
    lock) nothing is deleted and the writer is named."""
    e = tmp_path / "e"
    shutil.copytree(built["ensemble"], e)
    (tmp_path / "c.json").write_text(json.dumps(dict(CFG, seeds=[0, 1])))
    with runs.Locks() as locks:
        locks.acquire(e / "seed=1")
        before = tree_state(tmp_path)
        r = tdyn_cli("run", tmp_path / "c.json", "--out", e, "--force", "--quiet")
        assert_rejected(r, ME, before, tree_state(tmp_path))
        assert "seed=1" in r.stderr


def test_stale_lock_of_a_dead_process_is_taken_over(built, tmp_path):
    d = tmp_path / "d"
    shutil.copytree(built["run"], d)
    dead = f"{_dead_pid()}@{runs.host()}"
    (d / runs.LOCK).write_text(dead + "\n")
    r = tdyn_cli("run", "--resume", d, "--quiet")
    assert r.returncode == 0, r.stderr
    assert f"took over the stale lock of pid {dead}" in r.stderr
    assert not (d / runs.LOCK).exists()


def test_lock_is_reentrant_within_a_process_and_exclusive_across(tmp_path):
    d = tmp_path / "d"
    with runs.Locks() as outer:
        outer.acquire(d)
        with runs.Locks() as inner:
            inner.acquire(d)                      # nested writer in the same process (a reproduction's run)
        fd = os.open(d / runs.LOCK, os.O_RDWR)   # another open file: another writer
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        assert runs.lock_holder(d) == ME
    assert not (d / runs.LOCK).exists()
    assert list(d.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_holds_none_of_its_parents_locks(tmp_path):
    """A forked pool worker is another writer: it holds nothing (so it is refused the parent's directory)
    and keeps no copy of the parent's lock descriptors; the parent's lock stays held."""
    d = tmp_path / "d"
    with runs.Locks() as locks:
        locks.acquire(d)
        (fd,) = [e[0] for e in runs._held.values()]
        pid = os.fork()
        if pid == 0:   # the child: exit 0 only if all holds
            code = 1
            try:
                closed = False
                try:
                    os.fstat(fd)
                except OSError:
                    closed = True
                if closed and not runs.held_lock_files():
                    try:
                        with runs.Locks() as mine:
                            mine.acquire(d)
                    except runs.LockError:
                        code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert runs.held_lock_files() == {os.path.join(os.path.realpath(d), runs.LOCK)}
        probe = os.open(d / runs.LOCK, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(probe)


def test_a_running_process_holds_its_lock_until_killed(tmp_path, caplog):
    """A real `tdyn run`: while it trains its directory names it and a second writer is refused; killed
    (SIGKILL), its lock file stays behind naming it, and the next writer takes it over."""
    out = tmp_path / "r"
    p = subprocess.Popen([sys.executable, "-m", "tdyn", "run", "syn_small", "--set", "optim.steps=100000",
                          "--set", "checkpoint.every=50", "--set", "checkpoint.schedule=none", "--quiet", "--out",
                          str(out)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while not runs.checkpoint_steps(out):
            assert p.poll() is None, p.communicate()
            assert time.time() - t0 < 120, "no checkpoint appeared"
            time.sleep(0.02)
        holder = f"{p.pid}@{runs.host()}"
        assert runs.lock_holder(out) == holder
        for args in (["run", "--resume", out], ["run", "syn_small", "--out", out, "--force"]):
            r = tdyn_cli(*args, "--quiet", timeout=120)   # refused at once (a second writer would train on)
            assert_rejected(r, holder)
        assert p.poll() is None, "the run ended before the checks"
    finally:
        p.kill()
        p.wait()
    assert runs.lock_holder(out) == holder        # left behind by the kill
    with caplog.at_level(logging.WARNING, logger="tdyn.runs"), runs.Locks() as locks:
        locks.acquire(out)
        assert runs.lock_holder(out) == ME
    assert f"took over the stale lock of pid {holder}" in caplog.text


def test_resume_deletes_only_the_temp_files_of_writers_that_are_gone(built, tmp_path):
    d = tmp_path / "u"
    shutil.copytree(built["run"], d)
    (d / runs.CKPT_DIR / runs.FINAL).unlink()      # unfinished, as if killed before the last write
    runs.write_json(d / runs.META, runs.read_meta(d) | {"status": "running"})
    here = runs.host()
    temps = {"dead": d / f".metrics.jsonl.tdyn-{_dead_pid()}@{here}.ab12cd.tmp",
             "live": d / f".meta.json.tdyn-{os.getpid()}@{here}.ef34gh.tmp",          # this test: alive
             "other host": d / runs.CKPT_DIR / f".final.safetensors.tdyn-1@elsewhere.example.org.ij56kl.tmp",
             "unnamed": d / ".config.json.mn78op.tmp"}
    for t in temps.values():
        t.write_text("partial")
    r = tdyn_cli("run", "--resume", d, "--quiet")
    assert r.returncode == 0, r.stderr
    assert runs.read_meta(d)["status"] == "finished"
    assert {k: t.exists() for k, t in temps.items()} == {"dead": False, "live": True, "other host": True,
                                                         "unnamed": True}


def test_temp_files_name_their_writer(tmp_path, monkeypatch):
    """An atomic write's temp file carries pid@host (what resume's clean-up reads)."""
    seen = []
    real = os.replace

    def spy(src, dst):
        seen.append(Path(src).name)
        return real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    runs.write_json(tmp_path / "x.json", {"a": 1})
    assert seen and seen[0].startswith(f".x.json.tdyn-{ME}.") and seen[0].endswith(".tmp")
    assert runs._TMP_RE.search(seen[0]).groups() == (str(os.getpid()), runs.host())


@pytest.mark.parametrize("kind", ["symlink to a user's file", "dangling symlink", "fifo", "directory"])
def test_a_lock_path_that_is_not_a_regular_file_is_refused_and_never_written(built, tmp_path, kind):
    """``.tdyn.lock`` replaced by a link to the user's notes (or a FIFO, a directory): `run --resume` exits 2
    naming it, and the notes are as they were (the lock is opened with O_NOFOLLOW, never written through)."""
    d = tmp_path / "d"
    shutil.copytree(built["run"], d)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    lock = d / runs.LOCK
    if kind == "symlink to a user's file":
        lock.symlink_to("../notes.txt")
    elif kind == "dangling symlink":
        lock.symlink_to("../gone.txt")
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    before = tree_state(tmp_path)
    r = tdyn_cli("run", "--resume", d, "--quiet", timeout=120)
    assert_rejected(r, runs.LOCK, before, tree_state(tmp_path), case=kind)
    assert notes.read_text() == "my notes\n"
    assert not (tmp_path / "gone.txt").exists()
    with pytest.raises(runs.UserError, match=runs.LOCK):
        runs.Locks().acquire(d)       # the API refuses it too, naming it
    assert notes.read_text() == "my notes\n"
