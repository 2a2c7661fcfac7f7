"""The Scan and Snap reproductions, written as phases, are judged again from their tables alone: ``tdyn reproduce
NAME --judge-only`` on a quick run's output, its run directories removed, gives the same results.json (claims and
numbers) and draws the figures again. One reproduction per family (theory figures, Syn-Small maps, thm3,
snap-time), and the Fig 6 sweep with Figs 11-12 reading the same runs."""

import shutil

import pytest
from judging import judged_again


@pytest.mark.parametrize("name", ["scan-snap/fig3", "scan-snap/fig4", "scan-snap/thm3", "scan-snap/snap-time"])
def test_judge_only_gives_the_same_results(cli, tmp_path, name):
    out = tmp_path / name.replace("/", "__")
    r = cli("reproduce", name, "--quick", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    judged_again(cli, name, out)


def test_fig6_and_fig11_12_are_judged_again_without_their_sweep(cli, tmp_path):
    f6, f11 = tmp_path / "fig6", tmp_path / "fig11-12"
    assert cli("reproduce", "scan-snap/fig6", "--quick", "--out", f6, "--quiet").returncode == 0
    r = cli("reproduce", "scan-snap/fig11-12", "--quick", "--out", f11, "--sweep-dir", f6, "--quiet")
    assert r.returncode == 0, r.stderr
    assert not (f11 / "runs").exists()                     # fig11-12 read fig6's sweep
    shutil.rmtree(f6 / "runs")
    judged_again(cli, "scan-snap/fig6", f6)
    judged_again(cli, "scan-snap/fig11-12", f11)
