"""The topic reproductions, written as phases, are judged again from their tables alone: ``tdyn reproduce NAME
--judge-only`` on a quick run's output, its run directories removed, gives the same claims and numbers and draws
the figures again (one reproduction per family whose quick run is short: E1, E3, E6)."""

import json
import shutil

import pytest

VOLATILE = ("made", "wall_seconds", "judged")


@pytest.mark.parametrize("name", ["topic/embeddings", "topic/stage2", "topic/squared-loss"])
def test_judge_only_gives_the_same_results(cli, tmp_path, name):
    out = tmp_path / name.replace("/", "__")
    r = cli("reproduce", name, "--quick", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    first = json.loads((out / "results.json").read_text())
    shutil.rmtree(out / "runs")                           # the judge reads the tables, never a run directory
    figures = [f for f in first["files"] if f.endswith(".png")]
    for f in figures:
        (out / f).unlink()
    r = cli("reproduce", name, "--judge-only", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    again = json.loads((out / "results.json").read_text())
    assert again["claims"] == first["claims"]
    assert {k: v for k, v in again.items() if k not in VOLATILE} == {k: v for k, v in first.items() if k not in VOLATILE}
    assert again["made"] == first["made"] and "--judge-only" in again["judged"]["command"]
    assert all((out / f).stat().st_size > 0 for f in figures)   # drawn again from the tables
