"""A reproduction written as phases (plan → measure → judge → draw) is judged again from its tables,
training nothing: ``tdyn reproduce NAME --judge-only --out DIR`` (docs/architecture.md#a-reproduction)."""

import json

from tdyn.reproduce.phases import _cell, read_table, write_table


def test_tables_read_back_the_values_written(tmp_path):
    rows = [{"a": 1, "b": 0.1, "c": 1e-300, "d": float("nan"), "e": None, "f": True, "g": "x y", "h": -2.5e17}]
    back = read_table(write_table(tmp_path / "t.csv", rows))
    assert back[0]["a"] == 1 and isinstance(back[0]["a"], int)
    assert back[0]["b"] == 0.1 and back[0]["c"] == 1e-300 and back[0]["h"] == -2.5e17
    assert back[0]["d"] != back[0]["d"] and back[0]["e"] is None and back[0]["f"] is True and back[0]["g"] == "x y"
    assert _cell("007") == 7 and _cell("1e3") == 1000.0 and _cell("inf") == float("inf")


def test_judge_only_judges_the_tables_again(cli, tmp_path):
    out = tmp_path / "fig8"
    assert cli("reproduce", "scan-snap/fig8", "--out", out).returncode == 0
    first = json.loads((out / "results.json").read_text())
    r = cli("reproduce", "scan-snap/fig8", "--judge-only", "--out", out)
    assert r.returncode == 0, r.stderr
    again = json.loads((out / "results.json").read_text())
    assert again["claims"] == first["claims"] and again["made"] == first["made"]     # same tables, same verdicts
    assert "--judge-only" in again["judged"]["command"] and "runs" not in {p.name for p in out.iterdir()}
    # a table changed by hand is judged as it now is: the gap above its bound makes Lemma 7's claim fail
    table = (out / "fig8.csv").read_text().splitlines()
    cells = table[5].split(",")
    cells[-1] = "1.0"
    table[5] = ",".join(cells)
    (out / "fig8.csv").write_text("\n".join(table) + "\n")
    assert cli("reproduce", "scan-snap/fig8", "--judge-only", "--out", out).returncode == 0
    claims = {c["id"]: c["verdict"] for c in json.loads((out / "results.json").read_text())["claims"]}
    assert claims["lemma7-bound"] == "fails"


def test_judge_only_refuses_what_it_cannot_judge(cli, tmp_path):
    out = tmp_path / "fig8"
    assert cli("reproduce", "scan-snap/fig8", "--out", out).returncode == 0
    r = cli("reproduce", "scan-snap/fig8", "--judge-only", "--quick", "--out", out)
    assert r.returncode == 2 and "takes no --quick" in r.stderr
    r = cli("reproduce", "scan-snap/fig8", "--judge-only", "--out", tmp_path / "empty")
    assert r.returncode == 2 and "holds no results" in r.stderr
    (out / "fig8.csv").unlink()
    r = cli("reproduce", "scan-snap/fig8", "--judge-only", "--out", out)
    assert r.returncode == 2 and "fig8.csv" in r.stderr and "missing" in r.stderr


def test_planned_sweeps_are_run_by_the_runner(tmp_path):
    """Phases.sweeps: the runner runs each planned sweep, with --set, into DIR/<name>-<digest> (DIR: the option
    sweep_dir, an earlier --out meaning its runs/, else OUT/runs) and hands measure that directory; a reproduction
    planning the same sweep into the same DIR trains nothing, another --set is another sweep beside it."""
    from types import SimpleNamespace

    from tdyn import runs
    from tdyn.papers.scan_snap.data import SYN_SMALL
    from tdyn.papers.scan_snap.task import yz_config
    from tdyn.reproduce.phases import Phases, run
    from tdyn.reproduce.registry import ReproduceContext

    spec = {"config": yz_config(SYN_SMALL | {"batch_size": 8, "seq_len": 16}, steps=3),
            "axes": {"grid": {"optim.groups.Y.lr": [1.0, 2.0]}}, "seeds": [0, 1]}
    seen = []

    def measure(ctx, trained):
        (root,) = trained.values()
        seen.append(root)
        return {"t": [{"run": r["name"], "steps": runs.Run(root / r["name"]).config["optim"]["steps"]}
                      for r in runs.read_sweep(root)["runs"]]}

    phases = Phases(sweeps=lambda ctx: {"s": spec}, measure=measure, tables=("t",),
                    judge=lambda ctx, t: {"claims": [], "steps": sorted({r["steps"] for r in t["t"]})})
    a = ReproduceContext(out=tmp_path / "a", progress=False, overrides=["optim.steps=2"])
    a.out.mkdir()
    res = run(phases, a)
    root = seen[-1]
    assert root.parent == a.out / "runs" and root.name.startswith("s-") and a.overrides.consumed
    assert res["steps"] == [2] and len(runs.read_sweep(root)["runs"]) == 4 and res["files"] == ["t.csv"]
    metrics = root / runs.read_sweep(root)["runs"][0]["name"] / "metrics.jsonl"
    stamp = metrics.stat().st_mtime_ns
    (a.out / runs.RESULTS).write_text("{}")              # a finished reproduction's --out
    b = ReproduceContext(out=tmp_path / "b", progress=False, overrides=["optim.steps=2"],
                         options=SimpleNamespace(sweep_dir=a.out))
    b.out.mkdir()
    run(phases, b)
    assert seen[-1] == root and metrics.stat().st_mtime_ns == stamp and not (b.out / "runs").exists()
    run(phases, ReproduceContext(out=b.out, progress=False, options=SimpleNamespace(sweep_dir=a.out / "runs")))
    assert seen[-1] != root and seen[-1].parent == root.parent and (b.out / "t.csv").is_file()


def test_optional_tables_may_be_missing_only_when_judging_again(tmp_path):
    """Phases.optional: --judge-only on a directory made before a table was kept judges without it (judge sees
    it absent, results.json lists only the tables there); a missing required table is the one-line error."""
    import pytest

    from tdyn.errors import UserError
    from tdyn.reproduce.phases import Phases, run
    from tdyn.reproduce.registry import ReproduceContext

    phases = Phases(measure=lambda ctx, trained: {"a": [{"x": 1}], "b": [{"y": 2}]}, tables=("a", "b"),
                    optional=("b",), judge=lambda ctx, t: {"claims": [], "seen": sorted(t)})
    ctx = ReproduceContext(out=tmp_path, progress=False)
    assert run(phases, ctx)["seen"] == ["a", "b"]
    (tmp_path / "b.csv").unlink()
    ctx.judge_only = True
    res = run(phases, ctx)
    assert res["seen"] == ["a"] and res["files"] == ["a.csv"]
    (tmp_path / "a.csv").unlink()
    with pytest.raises(UserError, match="a.csv' is missing"):
        run(phases, ctx)


def test_judge_only_keeps_the_overrides_an_older_directory_recorded(tmp_path):
    """A directory judged by the former --from-tables recorded its tables' --set as
    ``tables_trained_with_overrides`` (docs/results/real__entropy-vs-lr); judging it again restores them, so the
    claims stay labelled "under --set" and the judge rebuilds the configs they were trained with."""
    from tdyn import runs
    from tdyn.reproduce import registry, runner
    from tdyn.reproduce.registry import ReproduceContext

    runs.write_json(tmp_path / runs.RESULTS, {"experiment": "real/entropy-vs-lr", "quick": True,
                                              "tables_trained_with_overrides": ["seeds=[1,2,3,4,5]"]})
    exp = registry.get("real/entropy-vs-lr")
    ctx = ReproduceContext(out=tmp_path, judge_only=True, options=exp.make_options())
    runner._tables_made(exp, ctx)
    assert list(ctx.overrides) == ["seeds=[1,2,3,4,5]"] and ctx.quick
