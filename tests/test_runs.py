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
    (d / runs.RESULTS).write_text("{}")                                  # now a reproduction directory
    runs.prepare_dir(d, True)
    assert (d / "f").exists()
    runs.prepare_dir(d, True, clear=True)
    assert not (d / "f").exists()


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
