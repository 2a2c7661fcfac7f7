"""runs.Run: one reader of the run-directory format (config, meta, metrics, checkpoints, model)."""

import pytest
import torch

from tdyn import runs
from tdyn.errors import UserError
from tdyn.train.trainer import train

from conftest import quad_config


def test_run_reader(tmp_path):
    cfg = quad_config(seeds=[0, 1], checkpoint={"schedule": "linear", "num": 2})
    dirs = train(cfg, tmp_path / "job", progress=False)
    assert (tmp_path / "job" / runs.ENSEMBLE).exists()
    assert runs.job_dirs(tmp_path / "job") == dirs
    r = runs.Run(dirs[1])
    assert r.status == "finished" and r.seed == 1 and r.lrs == {"w": 0.1, "u": 0.1}
    a = r.arrays("step", "loss")
    assert a["step"][0] == 0 and len(a["loss"]) == len(r.metrics)
    assert r.steps()[0] == 0
    w = r.param("w")
    assert w.shape == (3,)
    model = r.model()
    assert torch.equal(model.w[0], w)
    assert torch.equal(r.params(0)["w"], r.checkpoint(0)["param/w"])
    with pytest.raises(UserError, match="not a run directory"):
        runs.Run(tmp_path)


def test_prepare_dir(tmp_path):
    d = tmp_path / "x"
    runs.prepare_dir(d, False)
    (d / "f").write_text("1")
    with pytest.raises(UserError, match="already exists"):
        runs.prepare_dir(d, False)
    with pytest.raises(UserError, match="not a tdyn output directory"):   # force touches only tdyn's own
        runs.prepare_dir(d, True)
    (d / runs.RESULTS).write_text('{"experiment": "x/y", "claims": []}')   # now a reproduction directory
    runs.prepare_dir(d, True)
    assert (d / "f").exists()
    with pytest.raises(UserError, match="holds 'f', which tdyn did not write"):   # clearing deletes: only tdyn's
        runs.prepare_dir(d, True, clear=True)
    (d / "f").rename(d / "f.csv")                                        # a reproduction's table
    runs.prepare_dir(d, True, clear=True)
    assert not any(d.iterdir())


def test_written_files_are_readable_as_the_umask_allows(tmp_path):
    """Atomic writes keep open()'s permissions (0644 under umask 022), not mkstemp's 0600."""
    import os
    import stat

    from tdyn import runs

    mask = os.umask(0o022)
    os.umask(mask)
    runs.write_json(tmp_path / "a.json", {"x": 1})
    runs.write_csv(tmp_path / "b.csv", [{"x": 1}], ["x"])
    plain = tmp_path / "c.txt"
    plain.write_text("x")
    for f in ("a.json", "b.csv"):
        assert stat.S_IMODE((tmp_path / f).stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)


@pytest.mark.parametrize("cmd", ["run", "reproduce"])
def test_force_deletes_only_tdyn_outputs(cli, tmp_path, cmd):
    """--force on a directory tdyn did not write (a user's project) refuses with exit 2 and touches nothing."""
    proj = tmp_path / "myproject"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "thesis.tex").write_text("\\\\documentclass{article}")
    args = (["run", "scan-snap/fig4", "--set", "optim.steps=2"] if cmd == "run"
            else ["reproduce", "scan-snap/fig3", "--quick"])
    r = cli(*args, "--out", proj, "--force")
    assert r.returncode == 2 and "not a tdyn output directory" in r.stderr and "Traceback" not in r.stderr
    assert (proj / "src" / "thesis.tex").read_text() == "\\\\documentclass{article}"
    assert sorted(p.name for p in proj.iterdir()) == ["src"]
    r = cli(*args, "--out", ".", "--force", cwd=proj)
    assert r.returncode == 2 and (proj / "src" / "thesis.tex").exists()


def test_force_replaces_a_tdyn_run(cli, tmp_path):
    r = cli("run", "scan-snap/fig4", "--set", "optim.steps=2", "--out", tmp_path / "r", "--quiet")
    assert r.returncode == 0, r.stderr
    r = cli("run", "scan-snap/fig4", "--set", "optim.steps=3", "--out", tmp_path / "r", "--force", "--quiet")
    assert r.returncode == 0, r.stderr


def test_dumps_json_is_json_dumps_with_indent_2():
    """runs.dumps_json (the nesting in Python, every value through json's C encoder) writes the same
    text as json.dumps(indent=2, allow_nan=False), and refuses what it refuses."""
    import json
    import math

    from tdyn.config import load_config
    from tdyn.train.trainer import expand_members, member_config

    rc = load_config(quad_config(seeds=[0, 1], checkpoint={"schedule": "linear", "num": 2}))
    objs = [member_config(rc, expand_members(rc)[1]), rc.model_dump(mode="json"), {}, [], {"a": []}, {"a": {}},
            [1, [2, [3, {}]], ()], {"é": "ü\n\"\\", "x": 1e-8, "y": -0.0, "z": True, "f": False, "n": None,
                                    "big": 10 ** 30, "t": (1, 2.5), "s": "tab\there"},
            1.5, "s", None, 7, {1: 2, "b": {None: 1}}, {"a": {2.5: [True]}}]
    for o in objs:
        assert runs.dumps_json(o) == json.dumps(o, indent=2, allow_nan=False), o
    loop = []
    loop.append(loop)
    for bad in (math.nan, {"a": [math.inf]}, [{"x": -math.inf}], loop):   # json.dumps's own error, word for word
        with pytest.raises(ValueError) as ours:
            runs.dumps_json(bad)
        with pytest.raises(ValueError) as theirs:
            json.dumps(bad, indent=2, allow_nan=False)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(TypeError, match="not JSON serializable"):
        runs.dumps_json({"a": object()})


@pytest.mark.parametrize("n", [1, 3, runs._BATCH_SYNC, 12])
@pytest.mark.parametrize("syncfs", [True, False])
def test_atomic_write_many(tmp_path, monkeypatch, n, syncfs):
    """Every file lands whole with the umask's mode; durability: below runs._BATCH_SYNC files (or
    without syncfs) one fsync per file, from it on one syncfs per filesystem and no fsync."""
    import os

    if syncfs and runs._SYNCFS is None:
        pytest.skip("no syncfs on this platform")   # (the else-branch of the parametrisation still runs)
    calls = {"fsync": 0, "syncfs": 0}
    real_fsync, real_syncfs = os.fsync, runs._SYNCFS

    def fsync(fd):
        calls["fsync"] += 1
        real_fsync(fd)

    def fake_syncfs(fd):
        calls["syncfs"] += 1
        return real_syncfs(fd)

    monkeypatch.setattr(runs.os, "fsync", fsync)
    monkeypatch.setattr(runs, "_SYNCFS", fake_syncfs if syncfs else None)
    monkeypatch.setattr(runs, "_syncfs_covers", lambda dev: syncfs)   # whatever filesystem tmp_path is on
    files = [(tmp_path / f"r{i}" / "sub" / "f.json", f"data {i}\n".encode() * (i + 1)) for i in range(n)]
    runs.atomic_write_many(iter(files))   # a generator is fine
    for p, data in files:
        assert p.read_bytes() == data
        assert p.stat().st_mode & 0o777 == runs._MODE
    assert not [p for p in tmp_path.rglob("*.tmp")]
    batched = syncfs and n >= runs._BATCH_SYNC
    assert calls == ({"fsync": 0, "syncfs": 1} if batched else {"fsync": n, "syncfs": 0})


@pytest.mark.parametrize("n", [2, 9])
def test_atomic_write_many_failing_midway_changes_nothing(tmp_path, n):
    """A batch that fails while its files are written leaves every file as it was and no temp file:
    nothing is renamed into place before all are written and made durable."""
    old = tmp_path / "a.json"
    old.write_text("old\n")

    def files():
        yield old, b"new\n"
        for i in range(1, n):
            yield tmp_path / f"f{i}.json", b"x"
        raise RuntimeError("the producer failed")

    with pytest.raises(RuntimeError, match="producer failed"):
        runs.atomic_write_many(files())
    assert old.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_a_failing_syncfs_renames_nothing(tmp_path, monkeypatch):
    """A batch whose syncfs reports an error (a write-back failed) raises it and leaves no file in place
    and no temp file behind."""
    monkeypatch.setattr(runs, "_SYNCFS", lambda fd: -1)
    monkeypatch.setattr(runs, "_syncfs_covers", lambda dev: True)
    with pytest.raises(OSError, match="syncfs"):
        runs.atomic_write_many((tmp_path / f"f{i}", b"x") for i in range(6))
    assert list(tmp_path.iterdir()) == []


def test_mount_types():
    """Device numbers and filesystem types read from /proc/self/mountinfo lines (its documented format:
    field 3 is major:minor, the type follows the ' - ' separator; optional fields may precede it)."""
    import os

    text = ("22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard\n"
            "40 22 0:36 / /work rw master:5 shared:9 - fuse.sshfs host:/x rw\n"
            "41 22 0:37 / /run rw - tmpfs tmpfs rw\n"
            "garbage line\n")
    assert runs.mount_types(text) == {os.makedev(254, 0): "ext4", os.makedev(0, 36): "fuse.sshfs",
                                      os.makedev(0, 37): "tmpfs"}
    assert "fuse.sshfs" not in runs.SYNCFS_FILESYSTEMS and "ext4" in runs.SYNCFS_FILESYSTEMS


def test_a_checkpoint_has_the_same_bytes_in_every_process(tmp_path):
    """safetensors writes its header's metadata from a hash map whose order differs between processes;
    tdyn sorts it, so the same tensors and metadata give the same file in any process (and it reads back)."""
    import subprocess
    import sys

    code = ("import sys, torch; from tdyn import runs; "
            "p, b = runs.checkpoint_file(sys.argv[1], 'final', {'b': torch.arange(3.0), 'a': torch.ones(2, 2)}, "
            "{'step': '7', 'kind': 'x', 'zeta': 'y'}); sys.stdout.buffer.write(b)")
    outs = {subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, check=True).stdout
            for _ in range(6)}
    assert len(outs) == 1
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / runs.FINAL).write_bytes(outs.pop())
    ck = runs.load_checkpoint(tmp_path)
    assert torch.equal(ck["b"], torch.arange(3.0)) and torch.equal(ck["a"], torch.ones(2, 2))


def test_foreign_entry_knows_every_directory_tdyn_writes(tmp_path):
    """What --force may clear: a sweep (its .jobs/, summary, runs), with a report of it, and a `reproduce
    --all` directory stopped as its first reproduction began (an empty subdirectory) are all tdyn's; a file
    of the user's anywhere in them is named."""
    from tdyn.report.html import build_run_report
    from tdyn.sweep import run_sweep

    sw = tmp_path / "sw"
    run_sweep({"base": "syn_small", "set": ["optim.steps=2"], "axes": {"grid": {"optim.groups.Y.lr": [1.0, 2.0]}},
               "seeds": [0]}, sw, workers=1, progress=False)
    build_run_report(sw)
    assert (sw / ".jobs").is_dir() and (sw / "index.html").exists() and runs.foreign_entry(sw) is None
    run = next(p for p in sw.iterdir() if runs.is_run_dir(p))
    (run / "mine.txt").write_text("x")
    assert runs.foreign_entry(sw) == run / "mine.txt"
    al = tmp_path / "all"
    (al / "a__b").mkdir(parents=True)
    runs.write_json(al / runs.REPRODUCE, {"reproductions": [{"name": "a/b", "dir": "a__b", "status": "interrupted"}]})
    assert runs.is_tdyn_dir(al) and runs.foreign_entry(al) is None
    (al / "a__b" / "partial.csv").write_text("x")          # its analysis had begun: a reproduction's table
    assert runs.foreign_entry(al) is None
    (al / "a__b" / "notes.md").write_text("x")
    assert runs.foreign_entry(al) == al / "a__b" / "notes.md"
    (run / "mine.txt").unlink()
    (run / "results.json").write_text('{"accuracy": 0.9}')   # a file of the user's, named like tdyn's marker
    assert runs.foreign_entry(sw) == run / "results.json"
    (run / "results.json").unlink()
    (sw / ".DS_Store").write_bytes(b"\0")                        # a file browser's litter: deletable
    assert runs.foreign_entry(sw) is None


def test_a_reproduction_under_way_is_tdyns_whatever_it_wrote_so_far(tmp_path):
    """.reproducing.json (written as a reproduction begins, removed with its results.json) makes its
    directory tdyn's for --resume and --force, with a table written before training or no runs/ at all;
    a report of its runs/ is tdyn's too."""
    from tdyn.sweep import run_sweep

    out = tmp_path / "r"
    out.mkdir()
    (out / "first_gradient.csv").write_text("a\n1\n")
    assert not runs.is_tdyn_dir(out)
    runs.write_json(out / runs.REPRODUCING, {"experiment": "x/y", "started": runs.now()})
    assert runs.is_tdyn_dir(out) and runs.foreign_entry(out) is None
    run_sweep({"base": "syn_small", "set": ["optim.steps=2"], "axes": {"grid": {"optim.groups.Y.lr": [1.0]}},
               "seeds": [0]}, out / "runs" / "sw", workers=1, progress=False)
    runs.record(out / "runs", "index.html", "report_files")   # what the report does where it writes its page
    (out / "runs" / "index.html").write_text("<p>")
    (out / "runs" / "report_files").mkdir()
    assert runs.foreign_entry(out) is None
    (out / runs.REPRODUCING).unlink()
    (out / "first_gradient.csv").unlink()
    assert runs.is_tdyn_dir(out)          # an older tdyn's stopped reproduction: runs/ (and its report) only
