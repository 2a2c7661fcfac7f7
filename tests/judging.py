"""The one check of ``--judge-only`` the per-paper tests share: a reproduction's output, its run directories
and figures removed, is judged again from its tables alone and gives the same results.json."""

import json
import shutil

VOLATILE = ("made", "wall_seconds", "judged")   # what a judgement made later may change


def judged_again(cli, name, out):
    """Judge ``out`` (a run of ``name`` already there) again with ``--judge-only``, its ``runs/`` and figures
    deleted first; assert the same claims and numbers, the tables' provenance kept, the figures drawn again.
    Returns both results.json."""
    first = json.loads((out / "results.json").read_text())
    shutil.rmtree(out / "runs", ignore_errors=True)        # the judge reads the tables, never a run directory
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
    assert not (out / "runs").exists()
    return first, again
