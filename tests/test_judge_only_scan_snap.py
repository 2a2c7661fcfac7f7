"""The Scan and Snap reproductions, written as phases, are judged again from their tables alone: ``tdyn reproduce
NAME --judge-only`` on a quick run's output, its run directories removed, gives the same results.json (claims and
numbers) and draws the figures again. One reproduction per family (theory figures, Syn-Small maps, thm3,
snap-time), and the Fig 6 sweep with Figs 11-12 reading the same runs."""

import json
import shutil

import pytest

VOLATILE = ("made", "wall_seconds", "judged")


def _judged_again(cli, out, name):
    first = json.loads((out / "results.json").read_text())
    figures = [f for f in first["files"] if f.endswith(".png")]
    for f in figures:
        (out / f).unlink()
    r = cli("reproduce", name, "--judge-only", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    again = json.loads((out / "results.json").read_text())
    assert again["claims"] == first["claims"]
    assert {k: v for k, v in again.items() if k not in VOLATILE} == {k: v for k, v in first.items() if k not in VOLATILE}
    assert again["made"] == first["made"] and "--judge-only" in again["judged"]["command"]
    assert figures and all((out / f).stat().st_size > 0 for f in figures)   # drawn again from the tables


@pytest.mark.parametrize("name", ["scan-snap/fig3", "scan-snap/fig4", "scan-snap/thm3", "scan-snap/snap-time"])
def test_judge_only_gives_the_same_results(cli, tmp_path, name):
    out = tmp_path / name.replace("/", "__")
    r = cli("reproduce", name, "--quick", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    shutil.rmtree(out / "runs", ignore_errors=True)       # the judge reads the tables, never a run directory
    _judged_again(cli, out, name)


def test_fig6_and_fig11_12_are_judged_again_without_their_sweep(cli, tmp_path):
    f6, f11 = tmp_path / "fig6", tmp_path / "fig11-12"
    assert cli("reproduce", "scan-snap/fig6", "--quick", "--out", f6, "--quiet").returncode == 0
    r = cli("reproduce", "scan-snap/fig11-12", "--quick", "--out", f11, "--sweep-dir", f6, "--quiet")
    assert r.returncode == 0, r.stderr
    assert not (f11 / "runs").exists()                     # fig11-12 read fig6's sweep
    shutil.rmtree(f6 / "runs")
    _judged_again(cli, f6, "scan-snap/fig6")
    _judged_again(cli, f11, "scan-snap/fig11-12")
