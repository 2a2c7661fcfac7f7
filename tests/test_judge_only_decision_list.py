"""The decision-list reproductions are phases: ``--judge-only`` judges a quick run's tables again, training and
solving nothing, and gives the same claims (docs/reproductions/decision-lists.md)."""

import json

from judging import judged_again


def _judged_again(cli, name, out):
    """Run ``name`` quick into ``out``, then judge its tables again; both results.json."""
    r = cli("reproduce", name, "--quick", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    return judged_again(cli, name, out)


def test_claim1_judged_again_from_its_tables(cli, tmp_path):
    first, again = _judged_again(cli, "decision-list/claim1", tmp_path / "c1")
    assert again["fixed_c"] == first["fixed_c"] and again["rows"] == first["rows"]


def test_claim2_judged_again_from_its_tables(cli, tmp_path):
    """What ``--rejudge DIR`` did: the claims of an earlier run's tables, nothing trained; a table changed by
    hand is judged as it now is."""
    out = tmp_path / "c2"
    first, again = _judged_again(cli, "decision-list/claim2", out)
    assert again["free_c"] == first["free_c"] and again["settings"] == first["settings"]
    rows = (out / "claim2.csv").read_text().splitlines()
    cols = rows[0].split(",")
    for i, line in enumerate(rows[1:], 1):     # no perfect iterate in any exploratory run
        cells = line.split(",")
        if cells[cols.index("regime")] == "exploratory":
            cells[cols.index("k_star")] = ""
            rows[i] = ",".join(cells)
    (out / "claim2.csv").write_text("\n".join(rows) + "\n")
    assert cli("reproduce", "decision-list/claim2", "--judge-only", "--out", out, "--quiet").returncode == 0
    claims = {c["id"]: c for c in json.loads((out / "results.json").read_text())["claims"]}
    assert claims["result2_perfect_iterate_exploratory"]["verdict"] == "inconclusive"
    assert claims["result2_perfect_iterate_exploratory"]["numbers"]["found"] == 0
    r = cli("reproduce", "decision-list/claim2", "--help")
    assert r.returncode == 0 and "--rejudge" not in r.stdout    # the one way to judge again is --judge-only


def test_uniform_attention_judged_again_from_its_tables(cli, tmp_path):
    first, again = _judged_again(cli, "decision-list/uniform-attention", tmp_path / "ua")
    assert again["eta_1_over_lambda"] == first["eta_1_over_lambda"]
