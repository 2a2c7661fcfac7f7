"""Issue 37's last item: one scheme names every member's run directory (an ensemble's members and a sweep's runs,
by :func:`tdyn.runs.run_name`), and directories an older tdyn wrote, under its names (``seed0_lrY0.001_lrZ0.001``
for an ensemble's members, ``:g``-rounded values and ``-`` for odd characters in a sweep's), keep loading and
resume bit for bit under those names, never renamed or trained twice.

The older tdyn is this one with its naming code of before put back (copied below verbatim from the commit before
the change): everything else it wrote (configs, identities ``member@digest``, checkpoints, metrics) it wrote the
same way, so a directory it writes here is what it wrote then."""

import json
import math
import re
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import tdyn
from tdyn import runs
from tdyn.config import RunConfig
from tdyn.errors import ConfigError
from tdyn.probes import probe
from tdyn.sweep import run_sweep
from tdyn.sweep import spec as sweep_spec
from tdyn.sweep.spec import load_spec, plan
from tdyn.tasks import Member
from tdyn.train import trainer

TINY = {"task": "scan_snap", "data": {"num_last": 2, "num_next_per_last": 1, "seq_len": 16, "batch_size": 8},
        "seeds": [0, 1], "optim": {"steps": 8, "groups": {"Y": {"params": ["Y"], "lr": 1.0},
                                                           "Z": {"params": ["Z"], "lr": 1.0}}},
        "checkpoint": {"schedule": "none", "every": 2}, "probes": {"names": ["test.names_stop"], "every": 1}}
ENSEMBLE = TINY | {"ensemble": {"lrs": [0.5, {"Y": 2.0, "Z": 1.0}], "init_scales": [1.0, 0.5]}}
SAFE = re.compile(r"^[A-Za-z0-9_.,=+%-]+$")


# ---------------------------------------------------------------- the older tdyn's naming, verbatim


def _old_fmt_member(v: float) -> str:
    return f"{v:g}"


def old_expand_members(cfg: RunConfig) -> list[Member]:
    """Members = seeds × lr sets × init scales, in that order."""
    base = {g: gc.lr for g, gc in cfg.optim.groups.items()}
    lr_sets = cfg.ensemble.lrs or [{}]
    scales = cfg.ensemble.init_scales or [1.0]
    members = []
    for seed in cfg.seeds:
        for lrs in lr_sets:
            for scale in scales:
                parts = [f"seed{seed}"]
                if cfg.ensemble.lrs:
                    parts += [f"lr{g}{_old_fmt_member(v)}" for g, v in sorted(lrs.items())]
                if cfg.ensemble.init_scales:
                    parts.append(f"init{_old_fmt_member(scale)}")
                members.append(Member(seed, base | lrs, scale, "_".join(parts)))
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ConfigError("seeds / ensemble.lrs / ensemble.init_scales: members repeat; each must be distinct")
    return members


def _old_fmt_sweep(v):
    return f"{v:g}" if isinstance(v, float) else json.dumps(v, separators=(",", ":")) if isinstance(v, (list, dict)) else str(v)


def old_run_name(axes, seed: int) -> str:
    """A stable, filesystem-safe directory name from a run's overrides."""
    parts = [f"{k}={_old_fmt_sweep(v)}" for k, v in axes.items()] + [f"seed={seed}"]
    return re.sub(r"[^A-Za-z0-9_.,=+-]", "-", "__".join(parts))


@contextmanager
def older_tdyn(monkeypatch):
    """This tdyn naming as the older one did, while inside."""
    with monkeypatch.context() as m:
        m.setattr(trainer, "expand_members", old_expand_members)
        m.setattr(sweep_spec, "expand_members", old_expand_members)
        m.setattr(sweep_spec, "run_name", old_run_name)
        yield


_STOP = {"at": None}


@probe("test.names_stop")
def _stop(ctx):
    """Interrupts training once at step ``_STOP['at']`` (as a kill between two checkpoints would); set outside the
    config, so that the interrupted run and the reference are the same run (the same identity)."""
    if ctx.step == _STOP["at"]:
        _STOP["at"] = None
        raise KeyboardInterrupt
    return {}


def _tree(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` (but locks) → its bytes, except meta.json (times) → its status and identity."""
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file() and p.name != runs.LOCK:
            rel = str(p.relative_to(d))
            out[rel] = (json.dumps({k: runs.read_json(p).get(k) for k in ("status", "identity", "member")})
                        .encode() if p.name == runs.META else p.read_bytes())
    return out


def _same_run(a: Path, b: Path) -> None:
    """Run ``b`` is run ``a`` bit for bit: its checkpoints (every tensor), its metrics lines, its identity."""
    assert runs.checkpoint_steps(a) == runs.checkpoint_steps(b)
    for s in [*runs.checkpoint_steps(a), "final"]:
        fa, fb = runs.load_checkpoint(a, s), runs.load_checkpoint(b, s)
        assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa), (b, s)
    assert (a / runs.METRICS).read_bytes() == (b / runs.METRICS).read_bytes()
    assert runs.read_meta(a)["identity"] == runs.read_meta(b)["identity"]


# ---------------------------------------------------------------- one scheme


def test_members_are_named_by_their_overrides():
    members = trainer.expand_members(tdyn.load_config(ENSEMBLE))
    assert [m.name for m in members][:4] == [
        "optim.groups.Y.lr=0.5__optim.groups.Z.lr=0.5__init_scale=1__seed=0",
        "optim.groups.Y.lr=0.5__optim.groups.Z.lr=0.5__init_scale=0.5__seed=0",
        "optim.groups.Y.lr=2__optim.groups.Z.lr=1__init_scale=1__seed=0",
        "optim.groups.Y.lr=2__optim.groups.Z.lr=1__init_scale=0.5__seed=0"]
    assert [m.name for m in trainer.expand_members(tdyn.load_config(TINY))] == ["seed=0", "seed=1"]
    # each key=value is the override that makes the member alone (init_scale and seed: the sweep's axes)
    cfg = tdyn.load_config(ENSEMBLE)
    for m, c in zip(members, trainer.member_configs(cfg, members)):
        parts = dict(p.split("=") for p in m.name.split("__"))
        assert int(parts.pop("seed")) == m.seed == c["seeds"][0]
        assert float(parts.pop("init_scale")) == m.init_scale == c["ensemble"]["init_scales"][0]
        for k, v in parts.items():
            g = re.fullmatch(r"optim\.groups\.(\w+)\.lr", k).group(1)
            assert float(v) == m.lrs[g] == c["optim"]["groups"][g]["lr"]


def test_a_sweep_names_its_runs_as_the_ensemble_names_its_members():
    """A sweep over learning rates and init scales is planned as ensemble jobs: each run's name is the name
    the job's trainer gives the member that trains it (one function names both), and a further axis is one
    more key=value in the same scheme."""
    spec = load_spec({"config": TINY, "seeds": [0, 1, 2],
                      "axes": {"grid": {"data.seq_len": [16, 12], "optim.groups.Y.lr": [0.5, 2.0],
                                        "optim.groups.Z.lr": [1e-3, 0.001, 3e-4][1:], "init_scale": [1.0, 0.5]}}})
    jobs = plan(spec)
    assert sum(len(j.runs) for j in jobs) == 2 * 2 * 2 * 2 * 3
    for j in jobs:
        members = trainer.expand_members(tdyn.load_config(j.config))
        assert len(members) == len(j.runs)
        for r, m in zip(j.runs, members):
            seq = r.axes["data.seq_len"]
            assert r.name == f"data.seq_len={seq}__{m.name}" == runs.run_name(r.axes, r.seed)
    assert "data.seq_len=12__optim.groups.Y.lr=2__optim.groups.Z.lr=0.0003__init_scale=0.5__seed=2" in [
        r.name for j in jobs for r in j.runs]


def test_both_doors_call_the_one_function(monkeypatch):
    """The trainer and the sweep planner name through ``tdyn.runs.run_name`` and nothing else."""
    calls = []

    def spy(axes, seed):
        calls.append((dict(axes), seed))
        return f"n{len(calls)}"

    monkeypatch.setattr(trainer.runs, "run_name", spy)
    monkeypatch.setattr(sweep_spec, "run_name", spy)
    assert [m.name for m in trainer.expand_members(tdyn.load_config(TINY))] == ["n1", "n2"]
    assert calls == [({}, 0), ({}, 1)]
    calls.clear()
    jobs = plan(load_spec({"config": TINY, "seeds": [3], "axes": {"grid": {"optim.groups.Y.lr": [0.5]}}}))
    # the planner's check and its run, and the job's trainer naming its member: the same axes, the same function
    assert len(calls) == 3 and all(c == ({"optim.groups.Y.lr": 0.5}, 3) for c in calls)
    assert jobs[0].runs[0].name in {f"n{i}" for i in (1, 2, 3)}


def test_names_are_filesystem_safe_and_distinct_exactly_when_the_values_are(tmp_path):
    """Brute force over learning rates, init scales and group names: names equal exactly when the values are
    equal (1e-3 and 0.001 are one float, so one name; 0.001 and the next float up are two), every name is one
    directory name on any filesystem and gives its value back."""
    rates = [1e-3, 0.001, math.nextafter(0.001, 1), math.nextafter(0.001, 0), 0.1 + 0.2, 0.3, 1e-5, 1e-05, 3e-4,
             1.0, 10.0, 1e6, 1e-300, 5e-324, 1.5e300, 123456789.0, 0.123456789, 0.1234567]
    scales = [1.0, 0.5, 1 + 2 ** -52, 10.0, 1e-3]
    names = {}
    for lr in rates:
        for sc in scales:
            name = runs.run_name(runs.member_axes({"Y": lr}, sc), 0)
            assert SAFE.match(name) and len(name.encode()) <= 255, name
            parts = dict(p.split("=") for p in name.split("__"))
            assert float(parts["optim.groups.Y.lr"]) == lr and float(parts["init_scale"]) == sc
            names.setdefault(name, set()).add((lr, sc))
    assert all(len(v) == 1 for v in names.values())                               # one name, one value pair
    assert len(names) == len({(lr, sc) for lr in rates for sc in scales})        # distinct pairs, distinct names
    for name in names:                                                            # each a directory of its own
        (tmp_path / name).mkdir()
    assert len(list(tmp_path.iterdir())) == len(names)
    groups = ["*", "a/b", "a b", "a%2Fb", "é", "x=y", "..", "a-b"]
    gnames = [runs.run_name(runs.member_axes({g: 0.5}, None), 1) for g in groups]
    assert len(set(gnames)) == len(groups) and all(SAFE.match(n) for n in gnames), gnames
    assert gnames[0] == "optim.groups.%2A.lr=0.5__seed=1" and gnames[3] == "optim.groups.a%252Fb.lr=0.5__seed=1"
    for n in gnames:
        (tmp_path / n).mkdir()


def test_repeated_and_too_long_names_are_refused():
    with pytest.raises(ConfigError, match="members repeat"):      # 1e-3 and 0.001: the same member twice
        trainer.expand_members(tdyn.load_config(TINY | {"ensemble": {"lrs": [1e-3, 0.001]}}))
    for axis, values, name in (("data.seq_len", [16, 16.0], "data.seq_len=16__seed=0"),
                               ("optim.groups.Y.lr", [1e-3, 0.001], "optim.groups.Y.lr=0.001__seed=0"),
                               ("init_scale", [1, 1.0], "init_scale=1__seed=0")):
        with pytest.raises(ConfigError, match=f"two runs are named {name!r}"):   # one run, never trained as two
            plan(load_spec({"config": TINY, "seeds": [0], "axes": {"grid": {axis: values}}}))
    with pytest.raises(ConfigError, match="bytes, more than a directory name may have"):
        runs.run_name({"model.note": "x" * 300}, 0)


def test_a_new_ensemble_is_written_and_read_under_the_new_names(tmp_path):
    dirs = tdyn.train(ENSEMBLE, tmp_path / "e", progress=False)
    cfg = tdyn.load_config(ENSEMBLE)
    want = [m.name for m in trainer.expand_members(cfg)]
    assert [d.name for d in dirs] == want and sorted(p.name for p in (tmp_path / "e").iterdir() if p.is_dir()) == sorted(want)
    ens = runs.read_ensemble(tmp_path / "e")
    assert ens["members"] == ens["dirs"] == want
    for d, name in zip(dirs, want):
        meta = runs.read_meta(d)
        assert meta["member"] == name and meta["identity"] == f"{name}@{runs.config_digest(runs.read_config(d))}"
    table = tdyn.load_sweep(tmp_path / "e")
    assert sorted(table["run"].unique()) == sorted(want)


# ---------------------------------------------------------------- directories an older tdyn wrote


def _interrupted_and_reference(tmp_path, monkeypatch, config):
    """An older tdyn's job interrupted at step 5 (``cut``: checkpoints 0, 2, 4) and the same job uninterrupted (``ref``)."""
    with older_tdyn(monkeypatch):
        tdyn.train(config, tmp_path / "ref", progress=False)
        _STOP["at"] = 5
        with pytest.raises(KeyboardInterrupt):
            tdyn.train(config, tmp_path / "cut", progress=False)
    _STOP["at"] = None


def test_an_older_ensemble_loads_and_resumes_bit_for_bit_under_its_names(tmp_path, monkeypatch, caplog):
    _interrupted_and_reference(tmp_path, monkeypatch, ENSEMBLE)
    cfg = tdyn.load_config(ENSEMBLE)
    old = [m.name for m in old_expand_members(cfg)]
    assert old[:2] == ["seed0_lrY0.5_lrZ0.5_init1", "seed0_lrY0.5_lrZ0.5_init0.5"]
    cut, ref = tmp_path / "cut", tmp_path / "ref"
    assert sorted(p.name for p in cut.iterdir() if p.is_dir()) == sorted(old)
    assert runs.read_meta(cut / old[0])["status"] == "running"
    # it loads as it is: every member, its identity checked
    table = tdyn.load_sweep(ref)
    assert sorted(table["run"].unique()) == sorted(old)
    assert trainer.legacy_member_names(cfg) == old
    # resumed (the API's door and the CLI's are the same resume): under the old names, bit for bit
    with caplog.at_level("WARNING"):
        tdyn.train(ENSEMBLE, cut, resume=True, progress=False)
    notices = [r.getMessage() for r in caplog.records if "older tdyn" in r.getMessage()]
    assert len(notices) <= 1 and all("\n" not in n for n in notices)
    assert sorted(p.name for p in cut.iterdir() if p.is_dir()) == sorted(old)      # nothing renamed, nothing added
    assert runs.read_ensemble(cut)["members"] == old
    for name in old:
        assert runs.read_meta(cut / name)["status"] == "finished" and runs.read_meta(cut / name)["member"] == name
        _same_run(ref / name, cut / name)
    # a finished older job resumed again is left as it is: not one byte written
    before = _tree(ref)
    tdyn.train(ENSEMBLE, ref, resume=True, progress=False)
    assert _tree(ref) == before


def test_an_older_ensemble_continues_where_a_reproduction_resumes_it(tmp_path, monkeypatch):
    """``train_or_resume`` (``reproduce --resume`` and every sweep job) continues an older job, never trains it
    again under new names beside the old ones."""
    _interrupted_and_reference(tmp_path, monkeypatch, ENSEMBLE)
    trainer.train_or_resume(ENSEMBLE, tmp_path / "cut", progress=False)
    old = [m.name for m in old_expand_members(tdyn.load_config(ENSEMBLE))]
    assert sorted(p.name for p in (tmp_path / "cut").iterdir() if p.is_dir()) == sorted(old)
    for name in old:
        _same_run(tmp_path / "ref" / name, tmp_path / "cut" / name)


def test_force_over_an_older_ensemble_replaces_it_under_the_new_names(tmp_path, monkeypatch):
    """``--force`` trains the job again from step 0: the older members go (they are tdyn's), nothing of them
    is left beside the new ones."""
    cfg = ENSEMBLE | {"optim": TINY["optim"] | {"steps": 2}}
    with older_tdyn(monkeypatch):
        tdyn.train(cfg, tmp_path / "e", progress=False)
    tdyn.train(cfg, tmp_path / "e", force=True, progress=False)
    want = [m.name for m in trainer.expand_members(tdyn.load_config(cfg))]
    assert sorted(p.name for p in (tmp_path / "e").iterdir() if p.is_dir()) == sorted(want)
    assert runs.read_ensemble(tmp_path / "e")["members"] == want


def test_an_older_single_run_resumes_under_its_identity(tmp_path, monkeypatch):
    one = TINY | {"seeds": [3]}
    _interrupted_and_reference(tmp_path, monkeypatch, one)
    assert runs.read_meta(tmp_path / "cut")["identity"].startswith("seed3@")
    tdyn.train(one, tmp_path / "cut", resume=True, progress=False)
    _same_run(tmp_path / "ref", tmp_path / "cut")
    assert runs.read_meta(tmp_path / "cut")["identity"].startswith("seed3@")


def test_an_ensemble_listing_other_names_is_still_refused(tmp_path):
    """Only this tdyn's names or the older tdyn's names of the very members its config makes are accepted."""
    tdyn.train(ENSEMBLE | {"optim": TINY["optim"] | {"steps": 2}}, tmp_path / "e", progress=False)
    path = tmp_path / "e" / runs.ENSEMBLE
    ens = runs.read_json(path)
    ens["members"] = ens["members"][1:] + ens["members"][:1]
    runs.write_json(path, ens)
    with pytest.raises(runs.CorruptFile, match="lists members"):
        trainer.resume(tmp_path / "e", progress=False)


SPEC = {"config": TINY, "axes": {"grid": {"optim.groups.Y.lr": [0.5, 0.1 + 0.2], "data.seq_len": [16, 12]}},
        "seeds": [0, 1]}


def _lines(d: Path) -> list[dict]:
    """metrics.jsonl's lines as written, but line 1's run identity and the chained checksums."""
    return [{k: v for k, v in json.loads(x).items() if k not in (runs.METRICS_KEY, runs.LINE_CRC)}
            for x in (d / runs.METRICS).read_text().splitlines()]


def test_an_older_sweep_continues_under_its_names(tmp_path, monkeypatch):
    """A sweep an older tdyn wrote (its names: ``:g``-rounded rates; its runs' identities: its member names),
    interrupted in its first job, continues under the names its sweep.json records: the interrupted job resumes
    bit for bit (identities too), the job never started trains in its recorded place, none under a new name beside
    them; a run later repaired (trained again) is recorded with the identity it now carries; load_sweep reads all."""
    with older_tdyn(monkeypatch):
        jobs = plan(load_spec(SPEC))
        run_sweep(SPEC, tmp_path / "ref", executor="inline", progress=False)
        _STOP["at"] = 5
        with pytest.raises(KeyboardInterrupt):
            run_sweep(SPEC, tmp_path / "cut", executor="inline", progress=False)
    _STOP["at"] = None
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    old = [r.name for j in jobs for r in j.runs]
    assert "optim.groups.Y.lr=0.3__data.seq_len=16__seed=0" in old          # 0.30000000000000004, rounded
    new = [r.name for j in plan(load_spec(SPEC)) for r in j.runs]
    assert "optim.groups.Y.lr=0.30000000000000004__data.seq_len=16__seed=0" in new and set(new) != set(old)
    st = {r["name"]: r["status"] for r in runs.read_sweep(cut)["runs"]}
    started = [n for n in old if (cut / n).exists()]
    assert 0 < len(started) < len(old) and all(runs.read_meta(cut / n)["status"] == "running" for n in started)

    status = run_sweep(SPEC, cut, executor="inline", progress=False)
    assert list(status) == old and set(status.values()) == {"finished"}, (st, status)
    assert sorted(p.name for p in cut.iterdir() if p.is_dir() and not p.name.startswith(".")) == sorted(old)
    for n in old:
        if n in started:                      # resumed: bit for bit the older tdyn's uninterrupted run
            _same_run(ref / n, cut / n)
        else:                                 # trained now, in its recorded place: the same numbers, this tdyn's identity
            assert _lines(ref / n) == _lines(cut / n)
            fa, fb = runs.load_checkpoint(ref / n), runs.load_checkpoint(cut / n)
            assert all(torch.equal(fa[k], fb[k]) for k in fa)
            assert runs.read_meta(cut / n)["identity"].startswith("optim.groups.Y.lr=")
    sw = runs.read_sweep(cut)
    assert [r["name"] for r in sw["runs"]] == old
    assert all(runs.read_meta(cut / r["name"])["identity"] == r["identity"] for r in sw["runs"])

    # repaired: a run of the resumed job loses its final checkpoint; its job trains again (this tdyn's identities)
    before = {n: _tree(cut / n) for n in old if n not in started}
    runs.checkpoint_path(cut / started[0], "final").unlink()
    status = run_sweep(SPEC, cut, executor="inline", progress=False)
    assert list(status) == old and set(status.values()) == {"finished"}
    assert all(_tree(cut / n) == before[n] for n in before)                 # the other job: not one byte written
    sw = runs.read_sweep(cut)
    assert all(runs.read_meta(cut / r["name"])["identity"] == r["identity"] for r in sw["runs"])
    assert runs.read_meta(cut / started[0])["identity"].startswith("optim.groups.Y.lr=")
    assert sorted(tdyn.load_sweep(cut)["run"].unique()) == sorted(old)
    assert sorted(tdyn.load_sweep(ref)["run"].unique()) == sorted(old)       # the older sweep loads as it is


def test_a_new_sweep_uses_the_new_names(tmp_path):
    status = run_sweep(SPEC, tmp_path / "sw", executor="inline", progress=False)
    want = sorted(r.name for j in plan(load_spec(SPEC)) for r in j.runs)
    assert sorted(status) == want and "optim.groups.Y.lr=0.30000000000000004__data.seq_len=16__seed=0" in want
    for r in runs.read_sweep(tmp_path / "sw")["runs"]:
        assert runs.read_meta(tmp_path / "sw" / r["name"])["identity"].startswith("optim.groups.Y.lr=")
