"""--force inside tdyn's own trees (issue 36, item 1): checkpoints/, .jobs/, tensorboard/, wandb/,
report_files/ and .submitit/ are checked entry by entry by their rules (``runs.ownership.TREE_RULES``),
never taken whole.

Real outputs are made once (a two-member ``tdyn run`` with checkpoints, TensorBoard and wandb, a report of
it with copies of an evidence directory, a sweep with its .jobs/ and a submitit job's files recorded as its
.submitit/); each case works on a copy. ``FOREIGN`` is the table of a user's entries planted in a tree —
one row per tree and kind (a user's file, a user's subdirectory, a symlink, a file named like tdyn's with
another's content): ``runs.foreign_entry`` names it, and ``tdyn run … --force`` over the directory is
refused as in ``test_bad_inputs.py`` (exit 2, one stderr line naming the entry's relative path, nothing
touched). ``OWN`` is the table of what tdyn (or the library it drives) leaves there: ``--force`` clears it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from hostile import assert_rejected, tree_state
from tdyn import runs
from tdyn.runs import ownership

RUN_ARGS = ["--set", "optim.steps=2", "--quiet"]
SPEC = {"base": "syn_small", "set": ["optim.steps=2"], "axes": {"grid": {"optim.groups.Y.lr": [1.0, 2.0]}}, "seeds": [0]}
UUID = "0123456789abcdef0123456789abcdef"
NOTE = "my notes: keep"


@pytest.fixture(scope="module")
def made(tmp_path_factory, preloaded_cli):
    """``base/run`` (an ensemble: seed0, seed1, each with checkpoints/, tensorboard/, wandb/; its report with
    report_files/ and evidence copies) and ``base/sw`` (a sweep: .jobs/, and a submitit local job's files
    recorded as its .submitit/), all written by tdyn, TensorBoard, wandb and submitit themselves."""
    base = tmp_path_factory.mktemp("made")
    env = {"WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    r = preloaded_cli("run", "syn_small", "--out", base / "run", "--set", "seeds=[0,1]", "--set", "log.tensorboard=true",
                      "--set", "log.wandb=true", *RUN_ARGS, env=env)
    assert r.returncode == 0, r.stderr
    assert preloaded_cli("report", base / "run").returncode == 0
    ev = base / "evidence" / "scan-snap__fig6"
    ev.mkdir(parents=True)
    (ev / "results.json").write_text('{"experiment": "scan-snap/fig6", "claims": []}')
    (ev / "table.csv").write_text("a\n1\n")
    shutil.copy(next((base / "run" / "report_files").glob("*.png")), ev / "fig6.png")
    from tdyn.report.html import _copy_evidence
    _copy_evidence(ev, base / "run")                      # what `reproduce --all --evidence` copies beside its page
    (base / "spec.json").write_text(json.dumps(SPEC))
    r = preloaded_cli("sweep", base / "spec.json", "--out", base / "sw", "--workers", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    submitit = pytest.importorskip("submitit")
    ex = submitit.AutoExecutor(folder=base / "sw" / ".submitit", cluster="local")
    assert ex.submit(abs, -3).result() == 3
    runs.record(base / "sw", ".submitit")                 # as run_sweep does for --executor slurm
    for p in (base / "run").rglob("*"):
        assert not p.name.endswith(".tdyn.lock")
    return base


def _copy(made: Path, dest: Path) -> Path:
    """A copy of the made outputs, with submitit's link from a submission script's temporary name to the
    script (``--executor slurm`` leaves one per job; the local cluster does not), made by submitit itself."""
    shutil.copytree(made, dest, symlinks=True)
    from submitit.core.utils import JobPaths

    sub = dest / "sw" / ".submitit"
    tmp = sub / f".submission_file_{UUID}.sh"
    tmp.write_text("#!/bin/bash\n")
    JobPaths(sub, job_id="4242").move_temporary_file(tmp, "submission_file", keep_as_symlink=True)
    assert tmp.is_symlink() and (sub / "4242_submission.sh").is_file()
    return dest


def _one(pattern: str, root: Path) -> Path:
    """The path ``pattern`` names below ``root``: its wildcards matched against what exists (the first
    match), a last component without one taken as it is (a new entry)."""
    parent, name = os.path.split(pattern)
    if any(c in name for c in "*?"):
        found = sorted(root.glob(pattern))
        assert found, pattern
        return found[0]
    return (_one(parent, root) if parent else root) / name


def _user_safetensors() -> bytes:
    return save({"weight": torch.ones(2, 2)}, metadata={"format": "pt"})   # a model from elsewhere


def _link_out(p: Path, root: Path) -> None:
    (root.parent / "elsewhere").mkdir(exist_ok=True)
    (root.parent / "elsewhere" / "target.txt").write_text(NOTE)
    p.symlink_to(root.parent / "elsewhere" / "target.txt")


# What a case plants (kind): "file" a user's note, "dir" a user's subdirectory with a note in it ("dir" names
# the subdirectory), "link" a symlink to a user's file elsewhere, "bytes:<…>" / "text:<…>" a file of that
# content (replacing tdyn's where it exists), "retarget" an existing symlink re-pointed outside its tree.
# (case, the directory --force is given, the planted path (glob) below it, kind, the path the refusal names)
FOREIGN = [
    # ---- checkpoints/
    ("checkpoints: user file", "run", "seed=0/checkpoints/MY_NOTES.txt", "file", None),
    ("checkpoints: user subdirectory", "run", "seed=0/checkpoints/mine", "dir", None),
    ("checkpoints: symlink", "run", "seed=0/checkpoints/link.safetensors", "link", None),
    ("checkpoints: symlink named like a checkpoint", "run", "seed=1/checkpoints/step-0000009.safetensors", "link", None),
    ("checkpoints: another's model as final.safetensors", "run", "seed=0/checkpoints/final.safetensors", "safetensors", None),
    ("checkpoints: another's model as an extra step", "run", "seed=1/checkpoints/step-0000100.safetensors", "safetensors", None),
    ("checkpoints: text named like a checkpoint", "run", "seed=0/checkpoints/step-0000001.safetensors", "text:" + NOTE, None),
    ("checkpoints: temp-like name of another file", "run", "seed=0/checkpoints/.notes.txt.tdyn-1@h.x.tmp", "file", None),
    # ---- .jobs/
    ("jobs: user file", "sw", ".jobs/MY_NOTES.txt", "file", None),
    ("jobs: user subdirectory", "sw", ".jobs/mine", "dir", None),
    ("jobs: user file in a job", "sw", ".jobs/job0000/notes.txt", "file", None),
    ("jobs: symlink", "sw", ".jobs/job0001", "link", None),
    ("jobs: ensemble.json of the user's", "sw", ".jobs/job0000/ensemble.json", 'text:{"accuracy": 0.9}', None),
    ("jobs: ensemble.json not JSON", "sw", ".jobs/job0000/ensemble.json", "text:" + NOTE, None),
    # ---- tensorboard/
    ("tensorboard: user file", "run", "seed=0/tensorboard/MY_NOTES.txt", "file", None),
    ("tensorboard: user subdirectory", "run", "seed=1/tensorboard/mine", "dir", None),
    ("tensorboard: symlink", "run", "seed=0/tensorboard/events.out.tfevents.1.host.2.3", "link", None),
    ("tensorboard: text named like an event file", "run", "seed=0/tensorboard/events.out.tfevents.*", "text:" + NOTE * 5, None),
    # ---- wandb/
    ("wandb: user file", "run", "seed=0/wandb/MY_NOTES.txt", "file", None),
    ("wandb: user subdirectory", "run", "seed=0/wandb/mine", "dir", None),
    ("wandb: user file in a run folder", "run", "seed=1/wandb/offline-run-*/notes.txt", "file", None),
    ("wandb: user file in a run's logs", "run", "seed=0/wandb/offline-run-*/logs/notes.txt", "file", None),
    ("wandb: symlink", "run", "seed=0/wandb/link", "link", None),
    ("wandb: latest-run pointing elsewhere", "run", "seed=0/wandb/latest-run", "retarget", None),
    ("wandb: transaction log of other content", "run", "seed=0/wandb/offline-run-*/run-*.wandb", "text:" + NOTE, None),
    ("wandb: run-like folder without wandb's log", "run", "seed=0/wandb/offline-run-20240101_000000-abc123/files", "dir",
     "seed=0/wandb/offline-run-20240101_000000-abc123"),
    # ---- report_files/ (recorded by the report)
    ("report_files: user file", "run", "report_files/MY_NOTES.txt", "file", None),
    ("report_files: user subdirectory", "run", "report_files/mine", "dir", None),
    ("report_files: symlink", "run", "report_files/curves_mine.png", "link", None),
    ("report_files: text named like a figure", "run", "report_files/curves_loss.png", "text:" + NOTE, None),
    ("report_files: user file in an evidence copy", "run", "report_files/evidence/*/notes.md", "file", None),
    ("report_files: text as an evidence figure", "run", "report_files/evidence/*/fig6.png", "text:" + NOTE, None),
    # ---- .submitit/ (recorded by a slurm sweep)
    ("submitit: user file", "sw", ".submitit/MY_NOTES.txt", "file", None),
    ("submitit: user subdirectory", "sw", ".submitit/mine", "dir", None),
    ("submitit: symlink", "sw", ".submitit/1_0_log.out", "link", None),
    ("submitit: submission link pointing elsewhere", "sw", f".submitit/.submission_file_{UUID}.sh", "retarget", None),
]


def _plant(root: Path, pattern: str, kind: str) -> Path:
    """Plant ``kind`` at ``pattern`` (a glob where it names existing entries) below ``root``; returns its path."""
    p = _one(pattern, root)
    if kind == "retarget":
        assert p.is_symlink()
        p.unlink()
        _link_out(p, root)
    elif p.is_symlink() or (p.exists() and p.is_file()):
        p.unlink()
    if kind == "file":
        p.write_text(NOTE)
    elif kind == "dir":
        p.mkdir(parents=True)
        (p / "notes.txt").write_text(NOTE)
    elif kind == "link":
        _link_out(p, root)
    elif kind == "safetensors":
        p.write_bytes(_user_safetensors())
    elif kind.startswith("text:"):
        p.write_text(kind[len("text:"):])
    return p


@pytest.mark.parametrize("case,where,pattern,kind,named", FOREIGN, ids=[c[0] for c in FOREIGN])
def test_a_users_entry_in_a_tree_is_refused(made, preloaded_cli, tmp_path, case, where, pattern, kind, named):
    base = _copy(made, tmp_path / "t")
    root = base / where
    assert runs.foreign_entry(root) is None                    # the copy before the case: all tdyn's
    p = _plant(root, pattern, kind)
    want = root / named if named else p
    assert runs.foreign_entry(root) == want, case
    before = tree_state(tmp_path)
    r = preloaded_cli("run", "syn_small", "--out", root, *RUN_ARGS, "--force")
    assert_rejected(r, str(want.relative_to(root)), before, tree_state(tmp_path), case=case)
    assert "--force" in r.stderr and "which tdyn did not write" in r.stderr


# What tdyn (or the library it drives) leaves in its trees besides the made outputs: each still cleared.
# (case, the directory, the planted path below it, kind as in FOREIGN; "" for the made outputs as they are)
OWN = [
    ("as made: run with checkpoints, tensorboard, wandb, report, evidence", "run", "", ""),
    ("as made: sweep with .jobs and .submitit", "sw", "", ""),
    ("checkpoint temp file of a killed write", "run", "seed=0/checkpoints/.final.safetensors.tdyn-99999@host.ab12.tmp", "file"),
    ("checkpoint with a damaged header", "run", "seed=0/checkpoints/final.safetensors", "damaged"),
    ("checkpoint empty", "run", "seed=0/checkpoints/step-0000001.safetensors", "text:"),
    ("checkpoints: empty directory", "run", "seed=0/checkpoints/empty", "emptydir"),
    ("checkpoints: a file browser's litter", "run", "seed=0/checkpoints/.DS_Store", "file"),
    ("jobs: a killed job's lock and temp manifest", "sw", ".jobs/job0000/.ensemble.json.tdyn-99999@host.ab12.tmp", "lock"),
    ("jobs: a job stopped before its manifest", "sw", ".jobs/job0007", "emptydir"),
    ("tensorboard: an event file not yet flushed", "run", "seed=1/tensorboard/events.out.tfevents.1795760025.vm.1.9", "text:"),
    ("wandb: a synced run's marker", "run", "seed=0/wandb/offline-run-*/run-*.wandb", "synced"),
    ("wandb: files wandb keeps for a run", "run", "seed=0/wandb/offline-run-*/files/wandb-summary.json", "file"),
]


@pytest.mark.parametrize("case,where,pattern,kind", OWN, ids=[c[0] for c in OWN])
def test_tdyns_own_trees_are_cleared_by_force(made, preloaded_cli, tmp_path, case, where, pattern, kind):
    base = _copy(made, tmp_path / "t")
    root = base / where
    if pattern:
        p = _one(pattern, root)
        if kind == "damaged":      # safetensors framing kept, its JSON header garbled (a flipped bit)
            data = bytearray(p.read_bytes())
            data[9] ^= 0x01
            p.write_bytes(bytes(data))
        elif kind == "emptydir":
            p.mkdir()
        elif kind == "lock":
            p.write_bytes(b"{")
            (p.parent / runs.LOCK).write_text("99999@host")
        elif kind == "synced":
            Path(str(p) + ".synced").write_text("")
        else:
            _plant(root, pattern, kind)
    assert runs.foreign_entry(root) is None, case
    r = preloaded_cli("run", "syn_small", "--out", root, *RUN_ARGS, "--force")
    assert r.returncode == 0, f"[{case}] {r.stderr}"
    assert runs.is_run_dir(root) and not (root / "seed=0").exists() and not (root / runs.JOBS).exists()
    assert not (root / "report_files").exists() and not (root / ".submitit").exists()


def test_recorded_directory_without_a_rule_is_tdyns_only_while_empty(tmp_path):
    """runs.record of a directory no rule describes: empty, it is tdyn's; holding anything, it is named."""
    d = tmp_path / "r"
    runs.write_json(d / runs.ENSEMBLE, {"config": {}, "members": [], "dirs": []})
    runs.record(d, "extras")
    (d / "extras").mkdir()
    assert runs.foreign_entry(d) is None
    (d / "extras" / "a.txt").write_text(NOTE)
    assert runs.foreign_entry(d) == d / "extras"


def test_own_needs_a_rule_for_a_tree(tmp_path, monkeypatch):
    """runs.own(trees=) takes a name whose rule runs knows, or {name: rule}; a name without one is refused,
    and a given rule is what checks that tree wherever tdyn writes."""
    monkeypatch.setattr(ownership, "OWN_TREES", set(ownership.OWN_TREES))
    monkeypatch.setattr(ownership, "TREE_RULES", dict(ownership.TREE_RULES))
    with pytest.raises(ValueError, match="no rule for what 'notes' holds"):
        runs.own(trees=("notes",))
    runs.own(trees={"plots": lambda t: next((p for p in sorted(t.iterdir()) if p.suffix != ".svg"), None)})
    d = tmp_path / "r"
    runs.write_json(d / runs.ENSEMBLE, {"config": {}, "members": [], "dirs": []})
    (d / "plots").mkdir()
    (d / "plots" / "a.svg").write_text("<svg/>")
    assert runs.foreign_entry(d) is None
    (d / "plots" / "a.txt").write_text(NOTE)
    assert runs.foreign_entry(d) == d / "plots" / "a.txt"


@pytest.mark.parametrize("planted,refused", [
    ({".jobs/job0000/ensemble.json": '{"config": {}, "members": [], "dirs": []}'}, None),   # a sweep stopped early
    ({".submitit/12_submitted.pkl": "x"}, None),
    ({".jobs/MY_NOTES.txt": NOTE}, ".jobs"),
    ({".jobs/job0000/ensemble.json": '{"accuracy": 1}'}, ".jobs"),
    ({".submitit/MY_NOTES.txt": NOTE}, ".submitit"),
    ({"summary.csv": NOTE}, "summary.csv"),
], ids=["jobs", "submitit", "user file in jobs", "user's ensemble.json in jobs", "user file in submitit", "user file"])
def test_sweep_starts_only_where_nothing_but_its_own_trees_is(tmp_path, planted, refused):
    """What a new sweep accepts in its --out (runs.ownership.leftover, sweep's one check): its lock, and its
    .jobs/ and .submitit/ where their rules find only tdyn's (or submitit's) entries."""
    out = tmp_path / "sw"
    for name, text in planted.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    first = ownership.leftover(out, (runs.JOBS, ".submitit"))
    assert (first.name if first else None) == refused


def test_sweep_into_a_directory_holding_a_users_jobs_file_is_refused(preloaded_cli, tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    out = tmp_path / "sw"
    (out / runs.JOBS).mkdir(parents=True)
    (out / runs.JOBS / "MY_NOTES.txt").write_text(NOTE)
    before = tree_state(tmp_path)
    r = preloaded_cli("sweep", tmp_path / "spec.json", "--out", out, "--workers", "1", "--quiet")
    assert_rejected(r, ("holds no sweep",), before, tree_state(tmp_path))
    assert "'.jobs'" in r.stderr and (out / runs.JOBS / "MY_NOTES.txt").read_text() == NOTE


def test_tables_cover_every_tree():
    trees = {c[0].split(":")[0] for c in FOREIGN}
    assert trees == {"checkpoints", "jobs", "tensorboard", "wandb", "report_files", "submitit"}
    assert set(ownership.TREE_RULES) == {runs.CKPT_DIR, runs.JOBS, "tensorboard", "wandb", "report_files", ".submitit"}
    for tree in trees:
        kinds = {c[3] for c in FOREIGN if c[0].startswith(tree + ":")}
        assert {"file", "dir"} <= kinds and ({"link", "retarget"} & kinds), tree


def test_a_directory_that_cannot_be_read_is_never_cleared(tmp_path, monkeypatch):
    """--force on an output holding a directory tdyn cannot list (permissions, I/O; simulated: as root every
    directory is readable) is a one-line UserError naming that directory, and nothing is deleted."""
    import tdyn

    out = tmp_path / "r"
    cfg = {"task": "scan_snap", "data": {"num_last": 2, "num_next_per_last": 1, "seq_len": 16, "batch_size": 8},
           "seeds": [0], "optim": {"steps": 3, "groups": {"Y": {"params": ["Y"], "lr": 1.0}, "Z": {"params": ["Z"], "lr": 1.0}}}}
    (d,) = tdyn.train(cfg, out, progress=False)
    bad = d / runs.CKPT_DIR
    listdir = Path.iterdir

    def iterdir(self):
        if self == bad:
            raise PermissionError(13, "Permission denied")
        return listdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    before = tree_state(tmp_path)
    with pytest.raises(runs.UserError) as e:
        runs.clear_own(out)
    assert "\n" not in str(e.value) and str(bad) in str(e.value) and "Permission denied" in str(e.value)
    assert tree_state(tmp_path) == before
