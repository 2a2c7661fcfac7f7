"""The static report pages: `reproduce --all` index (claims table, sections, failures), run / ensemble /
sweep pages (curves, heat-map strips, summary table), relative links only, and the CLI around them."""

import concurrent.futures as cf
import csv
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tdyn import runs
from tdyn.experiments.runner import reproduce_all
from tdyn.report.html import MANIFEST, slug
from tdyn.report import html


class _Page(HTMLParser):
    """Links, image sources, ids and the claims table's rows of a page."""

    def __init__(self, text):
        super().__init__()
        self.refs, self.ids, self.claim_rows, self._in_claims, self._tbody = [], set(), [], False, False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag in ("a", "img") and (a.get("href") or a.get("src")):
            self.refs.append(a.get("href") or a.get("src"))
        if tag == "table":
            self._in_claims = "claims" in (a.get("class") or "").split()
        if tag == "tbody":
            self._tbody = True
        if tag == "tr" and self._in_claims and self._tbody:
            self.claim_rows.append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_claims = self._tbody = False

    def handle_data(self, data):
        if self._in_claims and self.claim_rows:
            self.claim_rows[-1] += data


def check_links(page: Path) -> _Page:
    """Every link and image of ``page`` is relative and resolves (anchors exist, files exist)."""
    p = _Page(page.read_text())
    assert p.refs
    for ref in p.refs:
        u = urlsplit(ref)
        assert not u.scheme and not u.netloc and not ref.startswith("/"), f"non-relative link {ref!r}"
        if u.path:
            assert (page.parent / unquote(u.path)).exists(), f"broken link {ref!r}"
        if u.fragment and not u.path:
            assert u.fragment in p.ids, f"missing anchor {ref!r}"
    return p


def _write_results(d: Path, results: dict, files: dict[str, str] | None = None) -> None:
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps(results))
    for name, text in (files or {}).items():
        (d / name).write_text(text)


def test_index_from_results_dir(tmp_path):
    claims = [{"id": "x", "claim": "Attention <script>sparsifies</script>", "verdict": "holds", "held": True,
               "numbers": {"entropy": [1.0, 0.5]}},
              {"id": "y", "claim": "Loss hits zero", "verdict": "fails", "held": False, "numbers": {"loss": 0.1},
               "measured": "final training loss", "expected": "0"}]
    long_csv = "a,b\n" + "".join(f"{i},{i * i}\n" for i in range(100))
    _write_results(tmp_path / "scan-snap__fig4", {"experiment": "scan-snap/fig4", "claims": claims, "seed": 3,
                                                 "wall_seconds": 1.25, "config": {"k": 1}, "files": ["t.csv"]},
                   {"t.csv": long_csv})
    _write_results(tmp_path / "topic__stage1", {"experiment": "topic/stage1", "claims": [claims[0]]})
    page = html.build_index(tmp_path)
    p = check_links(page)
    text = page.read_text()
    assert len(p.claim_rows) == 3
    assert "Tian et al. 2023" in p.claim_rows[0] and "Li, Li, Risteski 2023" in p.claim_rows[2]
    assert "final training loss" in p.claim_rows[1] and "fails" in p.claim_rows[1]
    assert "<script>" not in text and "&lt;script&gt;" in text      # claim text is escaped
    assert {html.anchor("scan-snap/fig4"), html.anchor("topic/stage1"), "claims"} <= p.ids
    assert f"showing {html.MAX_TABLE_ROWS} of 100 rows" in text and ">99<" not in text  # long CSV truncated
    assert "1.2 s" in text or "1.3 s" in text                       # run time
    # a copy elsewhere works the same (relative links only)
    copy = tmp_path.parent / "copied"
    shutil.copytree(tmp_path, copy)
    check_links(copy / "index.html")


def test_reproduce_all_goes_on_past_failures(tmp_path, fake_experiments, capsys):
    out = tmp_path / "all"
    page, failed = reproduce_all(out, quick=True, seed=4, names=fake_experiments, progress=False)
    assert page == out / "index.html" and failed == ["test/fails"]
    man = runs.read_json(out / MANIFEST)
    assert [(r["name"], r["status"]) for r in man["reproductions"]] == [("test/fails", "failed"), ("test/fake", "finished")]
    assert man["quick"] is True and man["metadata"]["torch"]
    failed = runs.read_json(out / slug("test/fails") / "results.json")
    assert failed["error"] == "RuntimeError: boom" and "Traceback" in failed["traceback"]
    fake = runs.read_json(out / slug("test/fake") / "results.json")
    assert fake["seed"] == 4 and fake["quick"] is True and "wall_seconds" in fake
    p = check_links(page)
    assert len(p.claim_rows) == 1 + 3                               # the failure, then one row per claim
    assert "reproduction failed" in p.claim_rows[0] and "boom" in p.claim_rows[0]
    assert [v in r for r, v in zip(p.claim_rows[1:], ("holds", "fails", "inconclusive"))] == [True] * 3
    assert "final training loss" in p.claim_rows[2]                 # claim(..., measured=, expected=)
    text = page.read_text()
    assert 'src="test__fake/curve.png"' in text and "RuntimeError: boom" in text
    with pytest.raises(Exception, match="already exists"):
        reproduce_all(out, names=fake_experiments, progress=False)
    (out / slug("test/fake") / "stale.png").write_bytes(b"x")
    reproduce_all(out, names=["test/fake"], force=True, progress=False)
    assert not (out / slug("test/fake") / "stale.png").exists()
    assert len(check_links(out / "index.html").claim_rows) == 3     # only this run's reproductions


def _yz_config(steps=6):
    from tdyn.data.scan_snap import SYN_SMALL
    from tdyn.experiments.scan_snap import yz_config

    cfg = yz_config(SYN_SMALL | {"seq_len": 16, "batch_size": 8}, steps=steps, seeds=(0, 1), init="torch_default")
    cfg["checkpoint"] = {"schedule": "none", "steps": [0, 2, 4]}
    return cfg


def test_run_report_ensemble_curves_and_heatmaps(tmp_path):
    from tdyn.train.trainer import train

    out = tmp_path / "ens"
    train(_yz_config(), out, progress=False)
    page = html.build_run_report(out)
    p = check_links(page)
    imgs = {r for r in p.refs if r.endswith(".png")}
    assert {f"{html.ASSETS}/curves_loss.png", f"{html.ASSETS}/heatmap_param_Z.png", f"{html.ASSETS}/heatmap_param_Y.png"} <= imgs
    text = page.read_text()
    assert "seed0" in text and "seed1" in text and "finished" in text
    assert html._strip_steps(out / "seed0") == [0, 2, 4, "final"]
    # one run directory on its own
    check_links(html.build_run_report(out / "seed1"))


class _InlineExecutor:
    """Runs sweep jobs in this process (the test task is registered only here)."""

    def submit(self, fn, *args):
        f = cf.Future()
        f.set_result(fn(*args))
        return f


def test_cli_report_on_a_folder_of_runs_skips_foreign_meta_json(tmp_path, capsys):
    """`tdyn report` on a folder holding runs (and other tools' meta.json) lists the runs only."""
    from tdyn.cli import main
    from tdyn.train.trainer import train

    (d,) = train(_yz_config() | {"seeds": [0]}, tmp_path / "runs" / "a", progress=False)
    (tmp_path / "runs" / "cache").mkdir()
    (tmp_path / "runs" / "cache" / "meta.json").write_text("{}")
    assert main(["report", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert f"{d}: finished" in out and "cache" not in out.replace(str(tmp_path), "")


def test_sweep_summary_table(tmp_path):
    from tdyn.sweep import run_sweep

    spec = {"config": _yz_config(steps=3) | {"seeds": [0]}, "axes": {"grid": {"optim.groups.Y.lr": [1.0, 10.0]}},
            "seeds": [0, 1]}
    out = tmp_path / "sw"
    run_sweep(spec, out, executor_obj=_InlineExecutor(), progress=False)
    (out / "summary.csv").unlink()                                 # the page (re)writes it
    page = html.build_run_report(out)
    check_links(page)
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [(float(r["optim.groups.Y.lr"]), int(r["count"])) for r in rows] == [(1.0, 2), (10.0, 2)]
    text = page.read_text()
    assert 'id="summary"' in text and "loss_mean" in text and text.count("<td>finished</td>") >= 4


def test_cli_report_and_reproduce_all_args(tmp_path, capsys):
    from tdyn.cli import main

    _write_results(tmp_path / "r", {"experiment": "decision-list/x", "claims": [
        {"id": "a", "claim": "c", "verdict": "holds", "held": True, "numbers": {}}]})
    assert main(["report", str(tmp_path / "r")]) == 0
    stdout = capsys.readouterr().out
    assert "[holds] c" in stdout and stdout.strip().endswith(str(tmp_path / "r" / "index.html"))
    assert (tmp_path / "r" / "index.html").exists()
    assert main(["reproduce", "scan-snap/fig4", "--all", "--out", str(tmp_path / "x")]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["reproduce", "--out", str(tmp_path / "x")]) == 2
    assert "--all" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_interrupted_reproduce_all_still_writes_the_page(tmp_path, fake_experiments, monkeypatch):
    from tdyn.experiments import registry

    def interrupted(ctx):
        raise KeyboardInterrupt

    monkeypatch.setitem(registry._REGISTRY, "test/zz-interrupted", registry.Experiment("test/zz-interrupted", "", interrupted))
    with pytest.raises(KeyboardInterrupt):
        reproduce_all(tmp_path, names=["test/fake", "test/zz-interrupted"], progress=False)
    p = check_links(tmp_path / "index.html")
    assert len(p.claim_rows) == 3 + 1 and "did not finish (status interrupted)" in p.claim_rows[-1]


def test_every_results_string_is_escaped(tmp_path):
    """A hostile results.json (verdict, id, reason, experiment name, numbers, files, error) runs no script."""
    evil = "<script>alert(1)</script>"
    claims = [{"id": evil, "claim": evil, "verdict": evil, "reason": evil, "numbers": {evil: evil},
               "measured": evil, "expected": evil, "paper": evil, "definition": evil},
              {"id": "b", "claim": "c", "verdict": "inconclusive", "reason": evil, "numbers": {}}]
    _write_results(tmp_path / "a", {"experiment": f"scan-snap/{evil}", "claims": claims, "seed": evil,
                                    "files": [evil], "settings_note": evil})
    _write_results(tmp_path / "b", {"experiment": "topic/stage1", "error": evil, "traceback": evil})
    page = html.build_index(tmp_path)
    text = page.read_text()
    assert "<script>" not in text and text.count("&lt;script&gt;") >= 8
