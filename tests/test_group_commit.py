"""The trainer's write-behind (``runs.GroupCommit``): a file appears under its name only after every file
of its group is durable, renamed in first-write order; a crash between the writes and the renames
leaves the previous checkpoint trusted, and the run resumes from it exactly."""

import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tdyn import runs
from tdyn.papers.scan_snap.data import SYN_SMALL
from tdyn.papers.scan_snap.task import yz_config
from tdyn.train import trainer


def _temps(d: Path) -> list[Path]:
    return list(Path(d).rglob("*.tmp"))


def test_files_appear_only_at_the_commit_in_first_write_order(tmp_path, monkeypatch):
    """Writes land in temp files; the commit renames them in the order each path was first written
    (a path written again keeps its place, with its newest contents), then deletes what remove() named."""
    m, c1, c2, gone = (tmp_path / "metrics.jsonl", tmp_path / "c" / "1", tmp_path / "c" / "2", tmp_path / "old")
    m.write_bytes(b"v0")
    gone.write_bytes(b"x")
    g = runs.GroupCommit(window=3600)
    assert not g.due()                         # nothing pending
    g.write(m, b"v1")
    assert g.due()                             # never committed: due at once
    g.write(c1, b"one")
    g.write(m, lambda: b"v2")                  # contents given by the commit, in m's place
    g.write(c2, b"two")
    g.remove(gone)
    assert m.read_bytes() == b"v0" and not c1.exists() and not c2.exists() and gone.exists()
    assert len(_temps(tmp_path)) == 2 and len(g) == 3
    order, real = [], os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (order.append(Path(dst)), real(src, dst)))
    g.commit()
    assert order == [m, c1, c2]
    assert (m.read_bytes(), c1.read_bytes(), c2.read_bytes()) == (b"v2", b"one", b"two")
    assert not gone.exists() and not _temps(tmp_path)
    g.write(c1, b"again")
    assert not g.due()                         # committed less than an hour ago
    g.discard()
    assert c1.read_bytes() == b"one" and not _temps(tmp_path) and len(g) == 0


@pytest.mark.parametrize("fail", ["fsync", "replace"])
def test_a_failed_commit_keeps_the_older_files(tmp_path, monkeypatch, fail):
    """A sync that fails renames nothing; a rename that fails leaves the files before it new, the rest as
    they were; either way no temp file stays and nothing is removed."""
    old = [tmp_path / f"f{i}" for i in range(3)]
    for p in old:
        p.write_bytes(b"old")
    keep = tmp_path / "keep"
    keep.write_bytes(b"k")
    monkeypatch.setattr(runs, "_syncfs_covers", lambda dev: True)   # fewer than _BATCH_SYNC: one fsync each
    g = runs.GroupCommit()
    for p in old:
        g.write(p, b"new")
    g.remove(keep)
    if fail == "fsync":
        def broken(fd):
            raise OSError(5, "injected write-back error")
        monkeypatch.setattr(os, "fsync", broken)
        with pytest.raises(OSError, match="injected"):
            g.commit()
        assert [p.read_bytes() for p in old] == [b"old"] * 3
    else:
        real = os.replace

        def broken(src, dst):
            if Path(dst) == old[1]:
                raise OSError(28, "injected")
            real(src, dst)
        monkeypatch.setattr(os, "replace", broken)
        with pytest.raises(OSError, match="injected"):
            g.commit()
        assert [p.read_bytes() for p in old] == [b"new", b"old", b"old"]
    assert keep.exists() and not _temps(tmp_path) and len(g) == 0


def test_metrics_lines_are_metrics_file(tmp_path):
    """MetricsLines gives metrics_file's bytes as records are appended, and starts again for another or
    a shorter list."""
    lines = runs.MetricsLines()
    recs = []
    for s in range(5):
        recs.append({"step": s, "loss": 1 / (s + 1), "x": None})
        assert lines.file(tmp_path, recs) == runs.metrics_file(tmp_path, recs)
    other = [{"step": 0, "loss": 9.0}]
    assert lines.file(tmp_path, other) == runs.metrics_file(tmp_path, other)
    del recs[2:]
    assert lines.file(tmp_path, recs) == runs.metrics_file(tmp_path, recs)


def _config(steps: int = 60) -> dict:
    cfg = yz_config(SYN_SMALL, steps=steps, init="torch_default", seeds=[0, 1])
    cfg["checkpoint"] = {"schedule": "none", "every": 1}
    return cfg


class Killed(BaseException):
    """A kill: not an Exception, so no handler of the trainer runs (meta.json stays "running")."""


TARGET = "step-0000040.safetensors"


@pytest.mark.parametrize("window", [0.0, 3600.0])
@pytest.mark.parametrize("at", ["before the sync", "between the renames"])
def test_a_crash_before_the_renames_leaves_the_previous_checkpoint_trusted(tmp_path, monkeypatch, window, at):
    """A kill injected after step 40's checkpoints are written but before they are in place (before
    their group's sync, or while its files are renamed) leaves every visible file whole, the newest
    visible checkpoint older than 40, and --resume from it ends bit for bit as an uninterrupted run.
    ``window``: every checkpoint committed at once (0), or all of them written behind (an hour)."""
    ref = trainer.train(_config(), tmp_path / "ref", progress=False)
    monkeypatch.setattr(trainer, "_COMMIT_SECONDS", window)
    if at == "before the sync":
        real_commit = runs.GroupCommit.commit

        def commit(self):
            if any(p.name == TARGET for p in self._pending):
                raise Killed
            real_commit(self)
        monkeypatch.setattr(runs.GroupCommit, "commit", commit)
    else:
        real_replace = os.replace

        def replace(src, dst):
            if Path(dst).name == TARGET:
                raise Killed
            real_replace(src, dst)
        monkeypatch.setattr(os, "replace", replace)
    out = tmp_path / "killed"
    with pytest.raises(Killed):
        trainer.train(_config(), out, progress=False)
    monkeypatch.undo()
    dirs = runs.ensemble_dirs(out)
    trusted = min(max(runs.checkpoint_steps(d)) for d in dirs)
    assert trusted < 40
    for d in dirs:
        assert runs.read_meta(d)["status"] == "running"
        for s in runs.checkpoint_steps(d):
            runs.load_checkpoint(d, s)          # whole and checksummed
        assert len(runs.read_metrics(d)) >= max(runs.checkpoint_steps(d))
    trainer.resume(out, progress=False)
    for a, b in zip(ref, dirs):
        assert runs.read_meta(b)["status"] == "finished"
        assert runs.read_meta(b)["resumed"][0]["from_step"] == trusted
        assert (a / runs.METRICS).read_bytes() == (b / runs.METRICS).read_bytes()
        fa, fb = (load_file(runs.checkpoint_path(d)) for d in (a, b))
        assert fa.keys() == fb.keys() and all((fa[k] == fb[k]).all() for k in fa)
        assert runs.checkpoint_steps(a) == runs.checkpoint_steps(b)
    assert not _temps(out)


def test_dense_checkpoints_share_their_syncs(tmp_path, monkeypatch):
    """Checkpointing every step within one commit window costs a few syncs for the whole run, not two
    per checkpoint: the syncs are counted, never timed."""
    if runs._SYNCFS is None:
        pytest.skip("no syncfs on this platform: one fsync per file")
    syncs = []
    real_fsync, real_syncfs = os.fsync, runs._SYNCFS
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(runs, "_SYNCFS", lambda fd: (syncs.append("syncfs"), real_syncfs(fd))[1])
    monkeypatch.setattr(runs, "_syncfs_covers", lambda dev: True)   # whatever filesystem tmp_path is on
    monkeypatch.setattr(trainer, "_COMMIT_SECONDS", 3600.0)
    dirs = trainer.train(_config(60), tmp_path / "r", progress=False)
    assert all(runs.checkpoint_steps(d) == list(range(60)) for d in dirs)
    assert len(syncs) <= 12, syncs      # were ~ 2 per checkpoint step: 120
