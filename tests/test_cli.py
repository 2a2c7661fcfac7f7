"""The CLI as a user runs it: list, reproduce scan-snap/fig4, report, help."""

import csv
import json
import math


def test_list_and_help(cli):
    r = cli("list")
    assert r.returncode == 0 and "scan-snap/fig4" in r.stdout
    for args in (["--help"], ["run", "--help"], ["reproduce", "--help"], ["report", "--help"], ["list", "--help"]):
        assert cli(*args).returncode == 0


def test_reproduce_fig4(cli, tmp_path):
    out = tmp_path / "fig4"
    r = cli("reproduce", "scan-snap/fig4", "--out", out, "--seed", "2")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader((out / "loss.csv").open()))
    assert list(rows[0]) == ["eta_y", "eta_z", "step", "loss"]
    assert len(rows) == 200
    assert sorted({float(r["eta_y"]) for r in rows}) == [1.0, 10.0]
    assert [int(r["step"]) for r in rows if float(r["eta_y"]) == 1.0] == list(range(100))
    assert all(abs(float(r["loss"]) - math.log(34)) < 1e-5 for r in rows if r["step"] == "0")
    res = json.loads((out / "results.json").read_text())
    assert res["experiment"] == "scan-snap/fig4" and res["claims"]
    assert all(c["verdict"] in ("holds", "fails", "depends on definition", "inconclusive") for c in res["claims"])
    assert (out / "fig4.png").stat().st_size > 10_000
    r = cli("reproduce", "scan-snap/fig4", "--out", out)
    assert r.returncode == 2 and "already exists" in r.stderr
    r = cli("report", out)
    assert r.returncode == 0 and "holds" in r.stdout


def test_reproduction_stopped_before_its_results_resumes(cli, tmp_path):
    """A reproduction stopped before its results.json leaves only OUT/runs, and tdyn says "re-run it with
    --resume": --resume accepts that directory, keeps its finished runs and writes the results. A file of
    the user's beside runs/ makes the directory not tdyn's: --force refuses it (one line, exit 2) and
    leaves the file."""
    out = tmp_path / "fig4"
    assert cli("reproduce", "scan-snap/fig4", "--quick", "--out", out, "--quiet").returncode == 0

    def stop_before_results():
        for p in out.iterdir():
            if p.name != "runs":
                p.unlink() if p.is_file() else __import__("shutil").rmtree(p)

    stop_before_results()
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("metrics.jsonl")}
    assert stamps
    assert cli("report", out).returncode == 0            # a look at it meanwhile (index.html, report_files/)
    r = cli("reproduce", "scan-snap/fig4", "--quick", "--out", out, "--quiet", "--resume")
    assert r.returncode == 0, r.stderr
    assert (out / "results.json").exists() and (out / "loss.csv").exists()
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())          # kept, not retrained
    stop_before_results()
    (out / "notes.txt").write_text("mine")
    r = cli("reproduce", "scan-snap/fig4", "--quick", "--out", out, "--quiet", "--force")
    assert r.returncode == 2 and "not a tdyn output directory" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert (out / "notes.txt").read_text() == "mine"


def test_force_deletes_only_what_tdyn_wrote(cli, tmp_path):
    """--force clears a run directory only when everything in it is tdyn's (its runs, checkpoints, a report
    of them): a file named like tdyn's marker but not tdyn's, a user's file or folder anywhere inside, is
    refused in one line (exit 2) naming it, and nothing is deleted."""
    user = tmp_path / "user"
    (user / "data").mkdir(parents=True)
    (user / "results.json").write_text('{"accuracy": 0.93}')
    (user / "data" / "thesis.tex").write_text("precious")
    r = cli("run", "syn_small", "--out", user, "--set", "optim.steps=3", "--quiet", "--force")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert (user / "data" / "thesis.tex").read_text() == "precious" and (user / "results.json").exists()
    run = tmp_path / "run"
    assert cli("run", "syn_small", "--out", run, "--set", "optim.steps=3", "--set", "seeds=[0,1]", "--quiet").returncode == 0
    assert cli("report", run).returncode == 0
    assert cli("run", "syn_small", "--out", run, "--set", "optim.steps=3", "--set", "seeds=[0,1]", "--quiet",
               "--force").returncode == 0                               # its own runs and report: cleared
    (run / "seed=1" / "notes.txt").write_text("mine")
    r = cli("run", "syn_small", "--out", run, "--set", "optim.steps=3", "--quiet", "--force")
    assert r.returncode == 2 and "seed=1/notes.txt" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert (run / "seed=1" / "notes.txt").read_text() == "mine" and (run / "seed=0" / "metrics.jsonl").exists()
    # the report's page counts as tdyn's where tdyn recorded writing it (runs.record), not by its name
    other = tmp_path / "other"
    assert cli("run", "syn_small", "--out", other, "--set", "optim.steps=3", "--quiet").returncode == 0
    (other / "index.html").write_text("<p>my own page</p>")
    r = cli("run", "syn_small", "--out", other, "--set", "optim.steps=3", "--quiet", "--force")
    assert r.returncode == 2 and "index.html" in r.stderr and (other / "index.html").read_text() == "<p>my own page</p>"


def test_run_experiment_by_name(cli, tmp_path):
    r = cli("run", "scan-snap/fig4", "--out", tmp_path / "r", "--set", "optim.steps=5", "--quiet")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r" / "ensemble.json").exists()
    assert len(list((tmp_path / "r").glob("*__seed=0/metrics.jsonl"))) == 2


def test_packaged_configs_by_name_outside_a_clone(cli, tmp_path):
    """`tdyn run syn_small` and `tdyn sweep syn_small_lr` take the configs shipped in the package, from
    any directory; an unknown name exits 2 listing the packaged names."""
    r = cli("run", "syn_small", "--out", "r", "--set", "optim.steps=3", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "r" / "config.json").read_text())["task"] == "scan_snap"
    r = cli("sweep", "syn_small_lr", "--out", "sw", "--quiet", "--workers", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cells = list(csv.DictReader((tmp_path / "sw" / "summary.csv").open()))   # seq_len × η_Y, 3 seeds each
    assert len(cells) == 6 and {c["count"] for c in cells} == {"3"}
    for cmd, listed in (("run", "packaged config (syn_small)"), ("sweep", "packaged sweep spec (syn_small_lr)")):
        r = cli(cmd, "syn_smal", "--out", "x", cwd=tmp_path)
        assert r.returncode == 2 and listed in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / "x").exists()


def test_reproduce_all_resumes_what_an_interrupt_left(tmp_path):
    """`reproduce --all --resume` (what tdyn advises after Ctrl-C): a reproduction finished before is kept
    as it is, an interrupted one continues (its trained runs kept) and gets its results; other options than
    the directory's are refused in one line. `--all --force` clears a reproduction's partial outputs."""
    import pytest

    from tdyn import runs
    from tdyn.errors import UserError
    from tdyn.reproduce.runner import reproduce_all

    out = tmp_path / "all"
    names = ["scan-snap/fig4", "scan-snap/fig5"]
    reproduce_all(out, quick=True, progress=False, names=names)
    man = runs.read_json(out / "reproduce.json")
    man["reproductions"][1]["status"] = "interrupted"        # as Ctrl-C during fig5's analysis leaves it
    runs.write_json(out / "reproduce.json", man)
    sub = out / man["reproductions"][1]["dir"]
    (sub / "results.json").unlink()
    kept = (out / man["reproductions"][0]["dir"] / "results.json").stat().st_mtime_ns
    trained = {p: p.stat().st_mtime_ns for p in (sub / "runs").rglob("metrics.jsonl")}
    assert trained
    with pytest.raises(UserError, match="other options"):
        reproduce_all(out, quick=False, progress=False, names=names, resume=True)
    reproduce_all(out, quick=True, progress=False, names=names, resume=True)
    assert (out / man["reproductions"][0]["dir"] / "results.json").stat().st_mtime_ns == kept
    assert (sub / "results.json").exists() and all(p.stat().st_mtime_ns == t for p, t in trained.items())
    assert [e["status"] for e in runs.read_json(out / "reproduce.json")["reproductions"]] == ["finished", "finished"]
    (sub / "results.json").unlink()                 # stopped mid-way by an older tdyn: a table, no results
    (sub / "partial.csv").write_text("x\n")
    reproduce_all(out, quick=True, progress=False, names=names, force=True)   # --force starts it again
    assert (sub / "results.json").exists() and not (sub / "partial.csv").exists()


def test_report_names_a_results_or_manifest_file_of_the_wrong_shape(cli, tmp_path):
    """A results.json or reproduce.json that parses but is not tdyn's shape is one line naming the file
    (exit 2), as a truncated one is; never a traceback."""
    cases = [("results.json", "[]", "holds a JSON list"), ("results.json", '{"claims": 5}', "not a list of claims"),
             ("reproduce.json", "[]", "holds a JSON list"), ("reproduce.json", '{"reproductions": 3}', "not a list"),
             ("reproduce.json", '{"reproductions": [{"name": "x"}]}', "without a subdirectory name"),
             ("reproduce.json", '{"reproductions": [{"dir": "../x"}]}', "without a subdirectory name")]
    for i, (name, text, says) in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        (d / name).write_text(text)
        r = cli("report", d)
        assert r.returncode == 2 and says in r.stderr and name in r.stderr, (name, text, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1


def test_reproduce_force_over_another_reproduction_leaves_none_of_its_files(cli, tmp_path):
    """`reproduce B --force --out DIR` where DIR holds reproduction A: A's tables, figures and runs go (the
    page would show them as B's); B's own re-run keeps overwriting in place (--at-step relies on it)."""
    out = tmp_path / "d"
    assert cli("reproduce", "scan-snap/fig4", "--quick", "--out", out, "--quiet").returncode == 0
    assert cli("reproduce", "scan-snap/fig5", "--quick", "--out", out, "--quiet", "--force").returncode == 0
    assert not (out / "fig4.png").exists() and not (out / "runs" / "fig4").exists() and (out / "fig5.png").exists()
    # A stopped before its results.json (only .reproducing.json names it): cleared the same way
    (out / "results.json").unlink()
    (out / ".reproducing.json").write_text('{"experiment": "scan-snap/fig5"}')
    assert cli("reproduce", "scan-snap/fig4", "--quick", "--out", out, "--quiet", "--force").returncode == 0
    assert not (out / "fig5.png").exists() and not (out / "runs" / "fig5").exists() and (out / "fig4.png").exists()
