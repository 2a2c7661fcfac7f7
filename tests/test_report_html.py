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
from tdyn.reproduce.runner import reproduce_all
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
    from tdyn.papers.scan_snap.data import SYN_SMALL
    from tdyn.papers.scan_snap.fig4_fig5 import yz_config

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
    assert "seed=0" in text and "seed=1" in text and "finished" in text
    assert html._strip_steps(out / "seed=0") == [0, 2, 4, "final"]
    # one run directory on its own
    check_links(html.build_run_report(out / "seed=1"))


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
    from tdyn.reproduce import registry

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


def test_tables_edited_by_hand_are_shown_beside_the_verdicts(tmp_path):
    """A reproduction judged by --judge-only on tables edited since its run wrote them (results.json's
    tables_edited) is flagged beside its verdicts — on its card, in its section above the claims, and in the
    row of a quick run made here — every name escaped; an unedited one is not flagged; a malformed entry
    (hand-edited results.json) is shown as text, never a traceback."""
    from tdyn.reproduce.phases import EDITED

    assert html.EDITED == EDITED
    evil = "<script>alert(1)</script>"
    claims = [{"id": "x", "claim": "c", "verdict": "holds", "source": "paper", "numbers": {}}]
    _write_results(tmp_path / "full", {"experiment": "scan-snap/fig4", "claims": claims,
                                       EDITED: [{"table": f"loss{evil}.csv", "rows_written": 200, "rows_now": 10}]})
    _write_results(tmp_path / "quick", {"experiment": "scan-snap/fig3", "claims": claims, "quick": True,
                                        EDITED: [f"odd {evil}", 5]})
    _write_results(tmp_path / "plain", {"experiment": "scan-snap/fig5", "claims": claims})
    text = html.build_index(tmp_path).read_text()
    assert "<script>" not in text
    assert text.count("judged on tables edited by hand") >= 4      # fig4: card + section; fig3: here-row + section
    assert f"loss{html._e(evil)}.csv (200 rows written, 10 now)" in text and f"odd {html._e(evil)}; 5" in text
    card = text[text.index(f'id="{html.anchor("scan-snap/fig5")}"'):]
    card = card[:card.index("</section>")]
    assert "edited by hand" not in card


# ---------------------------------------------------------------- the answer first: full-setting evidence

def _evidence(root: Path) -> Path:
    """A docs/results-like folder: test/fake at full settings (claim b holds there, fails in a quick run),
    the same at quick settings (not evidence), and an older result without sources or provenance."""
    ev = root / "ev"
    claims = [{"id": "a", "claim": "Loss falls", "verdict": "holds", "source": "paper", "quote": "falls", "paper": "Fig 1"},
              {"id": "b", "claim": "Loss reaches 0", "verdict": "holds", "source": "paper", "quote": "zero", "paper": "Fig 1"},
              {"id": "c", "claim": "Loss is small", "verdict": "inconclusive", "reason": "inside its noise band",
               "source": "derived", "derived": "tdyn's", "paper": "Fig 1"}]
    _write_results(ev / "test__fake", {"experiment": "test/fake", "quick": False, "wall_seconds": 0.5, "claims": claims,
                                       "files": ["curve.png"], "made": {"tdyn": "0.1.0", "git_commit": "abcdef1234567",
                                       "date": "2026-11-26T10:00:00+00:00", "machine": "box: 2 CPU cores",
                                       "command": "tdyn reproduce test/fake --out docs/results/test__fake --force"}},
                   {"curve.png": ""})
    _png(ev / "test__fake" / "curve.png")
    _write_results(ev / "test__fake-quick", {"experiment": "test/fake", "quick": True, "claims": [
        {"id": "a", "claim": "Loss falls", "verdict": "fails", "source": "paper"}]})
    _write_results(ev / "test__old", {"experiment": "test/old", "quick": False, "wall_seconds": 500, "claims": [
        {"id": "z", "claim": "An older claim", "verdict": "fails"}]})
    return ev


def _png(path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1], [1, 0])
    fig.savefig(path)
    plt.close(fig)
    return path


def test_full_evidence_picks_the_full_setting_result(tmp_path):
    from tdyn.report.verdicts import full_evidence

    ev = _evidence(tmp_path)
    found = full_evidence(ev)
    assert set(found) == {"test/fake", "test/old"} and found["test/fake"][0].name == "test__fake"
    _write_results(ev / "test__fake-later", {"experiment": "test/fake", "quick": False, "claims": [],
                                             "made": {"date": "2026-11-27T10:00:00+00:00"}})
    assert full_evidence(ev)["test/fake"][0].name == "test__fake-later"      # the one made last
    _write_results(ev / "test__fake-set", {"experiment": "test/fake", "quick": False, "claims": [],
                                           "overrides": ["data.x_max=0.5"], "made": {"date": "2026-11-28T10:00:00+00:00"}})
    assert full_evidence(ev)["test/fake"][0].name == "test__fake-later"      # made under --set: not the setting's


def test_the_page_leads_with_the_full_setting_answer(tmp_path, fake_experiments, capsys):
    ev = _evidence(tmp_path)
    out = tmp_path / "demo"
    page, _ = reproduce_all(out, quick=True, names=["test/fake"], evidence=ev, progress=False)
    from tdyn.cli import _print_answer

    _print_answer(out, ev)
    printed = capsys.readouterr().out
    assert "test/fake: quick, made here: 1 / 1 / 0; full, shipped (ev/test__fake): 2 / 0 / 0; 1 of 3 quick verdicts differ" in printed
    text = page.read_text()
    # the answer first: per paper, its claims at full settings from the shipped evidence, then what did not hold
    assert text.index('id="answer"') < text.index('id="not-held"') < text.index('id="here"') < text.index('id="derived"') \
        < text.index('id="reproductions"')
    answer = text[text.index('id="answer"'):text.index('id="not-held"')]
    assert "Which paper claims hold at full settings" in answer and "2 shipped" in answer
    assert "1 made 2026-11-26 at commit abcdef1; 1 not recorded (older results)" in answer
    not_held = text[text.index('id="not-held"'):text.index('id="unlabelled"')]
    assert "An older claim" not in not_held                               # no source: not a paper claim
    assert "An older claim" in text[text.index('id="unlabelled"'):]
    # the quick run is a pipeline check, its disagreement with the full-setting verdict flagged
    here = text[text.index('id="here"'):text.index('id="reproductions"')]
    assert "quick (pipeline check)" in here and "⚑ 1 of 3 differ" in here and "b: fails here, holds at full settings" in here
    assert "inside its noise band" in text[text.index('id="derived"'):text.index('id="reproductions"')]
    # each reproduction: its main (full-setting) figure, what it reproduces, provenance and the command
    assert "report_files/evidence/test__fake/curve.png" in text and "2026-11-26 10:00 UTC" in text
    assert "tdyn reproduce test/fake --out docs/results/test__fake --force" in text
    assert "tdyn reproduce test/old --out" in text and "(reconstructed: not recorded)" in text
    check_links(page)                                                     # the evidence is copied: the page stands alone
    assert runs.read_json(out / MANIFEST)["evidence"] == str(ev.resolve())
    fake = runs.read_json(out / slug("test/fake") / "results.json")
    assert fake["made"]["setting"] == "quick" and fake["made"]["command"].startswith("tdyn reproduce test/fake --out ")
    assert "--quick" in fake["made"]["command"] and fake["made"]["date"]
    # rebuilt later (`tdyn report DIR`): the page remembers its evidence
    (out / "index.html").unlink()
    assert 'id="answer"' in html.build_index(out).read_text() and "2 shipped" in (out / "index.html").read_text()


def test_full_under_runs_the_cheap_ones_at_full_settings(tmp_path, fake_experiments, capsys):
    ev = _evidence(tmp_path)
    out = tmp_path / "demo"
    page, _ = reproduce_all(out, quick=True, names=fake_experiments, evidence=ev, full_under=1, progress=False)
    fake = runs.read_json(out / slug("test/fake") / "results.json")
    assert fake["quick"] is False and fake["made"]["setting"] == "full"  # its full run took 0.5 s <= 1 s
    man = runs.read_json(out / MANIFEST)
    assert {r["name"]: r["quick"] for r in man["reproductions"]} == {"test/fake": False, "test/fails": True}
    assert man["full_under"] == 1
    text = page.read_text()
    answer = text[text.index('id="answer"'):text.index('id="not-held"')]
    assert "1 made here now" in answer and "re-derived on this machine now" in answer
    # re-derived here: compared with the shipped verdicts (b fails here, holds there)
    here = text[text.index('id="here"'):text.index('id="reproductions"')]
    assert "full settings: re-derived here" in here and "differ from the shipped full-setting verdicts" in here
    # the CLI's summary says of each reproduction's verdicts: full or quick, made here or shipped
    from tdyn.cli import _print_answer

    _print_answer(out, None)                                          # the evidence from the manifest
    printed = capsys.readouterr().out
    assert "Paper claims at full settings" in printed and "(1 reproduction(s) made here at full settings, 1 shipped)" in printed
    assert "test/fake: full, made here: 1 / 1 / 0" in printed and "test/fails: quick, made here: FAILED" in printed


@pytest.mark.parametrize("args, why", [
    (["reproduce", "--all", "--quick", "--evidence", "{tmp}/missing"], "no such directory"),
    (["reproduce", "--all", "--quick", "--evidence", "{tmp}/empty"], "holds no results.json"),
    (["reproduce", "--all", "--quick", "--full-under", "60"], "--full-under needs --evidence"),
    (["reproduce", "--all", "--quick", "--full-under", "-1", "--evidence", "{ev}"], "must be a finite number"),
    (["reproduce", "--all", "--quick", "--full-under", "nan", "--evidence", "{ev}"], "must be a finite number"),
    (["reproduce", "--all", "--full-under", "60", "--evidence", "{ev}"], "without --quick"),
    (["reproduce", "scan-snap/fig3", "--evidence", "{ev}"], "goes with --all"),
    (["reproduce", "scan-snap/fig3", "--full-under", "5"], "goes with --all"),
    (["reproduce", "scan-snap/fig3", "--jobs", "2"], "--jobs goes with --all"),
    (["reproduce", "--all", "--quick", "--jobs", "0"], "--jobs 0: must be a whole number >= 1"),
    (["reproduce", "decision-list/claim1", "--jobs", "2"], "--jobs goes with --all"),
    (["report", "{ev}", "--evidence", "{tmp}/missing"], "no such directory"),
    (["report", "{ev}", "--evidence", "{ev}", "--readme", "{tmp}/README.md"], "--readme writes"),
    (["report", "{tmp}/empty", "--evidence", "{ev}"], "holds no results.json"),
])
def test_evidence_options_bad_input_exit_2_with_one_line(tmp_path, capsys, args, why):
    from tdyn.cli import main

    ev = _evidence(tmp_path)
    (tmp_path / "empty").mkdir()
    argv = [a.format(tmp=tmp_path, ev=ev) for a in args]
    if argv[0] == "reproduce":
        argv += ["--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert why in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_full_under_that_is_not_a_number_is_exit_2(tmp_path, capsys):
    from tdyn.cli import main

    with pytest.raises(SystemExit) as e:
        main(["reproduce", "--all", "--quick", "--full-under", "soon", "--evidence", ".", "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1


# ---------------------------------------------------------------- the report's own figures

def test_no_colour_repeats_within_a_plot():
    from tdyn.report import style

    for n in (1, 8, 9, 12, 20, 21, 24, 40):
        cs = [style.series(i, n=n)["color"] for i in range(n)]
        assert len(set(cs)) == n, n
    assert style.series(3, n=5) == {"color": style.PALETTE[3]}


def test_run_report_colours_twelve_runs_apart(tmp_path, monkeypatch):
    """The report's curves of 12 runs: 12 colours, none repeated."""
    import matplotlib.pyplot as plt

    from tdyn.report import style

    dirs = []
    for k in range(12):
        d = tmp_path / f"r{k}"
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1 / (s + k + 1)}) + "\n" for s in range(5)))
        dirs.append(d)
    monkeypatch.setattr(html.runs, "read_metrics",
                        lambda d: [json.loads(x) for x in (Path(d) / "metrics.jsonl").read_text().splitlines()])
    seen = []
    save = style.save
    monkeypatch.setattr(style, "save", lambda fig, p: (seen.append([ln.get_color() for ln in fig.axes[0].lines]), save(fig, p)))
    html._curves(dirs, [d.name for d in dirs], tmp_path)
    assert len(seen[0]) == 12 and len(set(seen[0])) == 12
    plt.close("all")


def test_run_report_legend_names_every_run_in_columns(tmp_path, monkeypatch):
    """20 runs: 20 colours and a legend naming each, in columns that fit the figure's width."""
    import matplotlib.pyplot as plt

    from tdyn.report import style

    dirs = []
    for k in range(20):
        d = tmp_path / f"r{k}"
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1 / (s + k + 1)}) + "\n" for s in range(5)))
        dirs.append(d)
    monkeypatch.setattr(html.runs, "read_metrics",
                        lambda d: [json.loads(x) for x in (Path(d) / "metrics.jsonl").read_text().splitlines()])
    seen = []
    save = style.save
    monkeypatch.setattr(style, "save", lambda fig, p: (seen.append(fig), save(fig, p)))
    html._curves(dirs, [d.name for d in dirs], tmp_path)
    fig = seen[0]
    assert len({ln.get_color() for ln in fig.axes[0].lines}) == 20
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [d.name for d in dirs] and legend._ncols > 1
    assert html._legend_columns(["a" * 60] * 5, 4.2) == 1 and html._legend_columns(["r1"] * 2, 12.6) == 2
    plt.close("all")


def test_full_under_trusts_only_times_of_plain_full_runs():
    from tdyn.reproduce.runner import cost

    assert cost("a/b", {"wall_seconds": 5.0}) == 5.0
    assert cost("a/b", {"wall_seconds": 0.7, "options": {"rejudge": "/tmp/x", "eta": None}}) is None   # re-judged
    assert cost("a/b", {"wall_seconds": 1.1, "at_step": 5000}) is None                # judged on runs made elsewhere
    assert cost("a/b", {"wall_seconds": 3.0, "made": {"resumed": True}}) is None     # part of the run was earlier
    assert cost("a/b", {"quick": False}) is None
    assert cost("scan-snap/fig11-12", {"wall_seconds": 5.3, "options": {"sweep_dir": "x"}}) == 5.3
    assert cost("scan-snap/fig6", {"wall_seconds": 9.0, "options": {"sweep_dir": "x"}}) == 9.0     # only where it lives
    assert cost("a/b", {"wall_seconds": 9.0, "options": {"steps": 10}}) is None      # another setting than the default


def test_a_page_s_copies_of_its_evidence_are_not_results(tmp_path, fake_experiments):
    from tdyn.report.verdicts import collect

    ev = _evidence(tmp_path)
    out = tmp_path / "demo"
    reproduce_all(out, quick=True, names=["test/fake"], evidence=ev, progress=False)
    assert (out / "report_files" / "evidence" / "test__fake" / "results.json").exists()
    assert [d.name for d, _ in collect(out)] == ["test__fake"]
    reproduce_all(out, quick=True, names=["test/fake"], evidence=ev, progress=False, force=True)   # --force clears them


def test_reproduce_all_on_two_workers(tmp_path, fake_experiments, monkeypatch, one_thread):
    """--jobs 2: the same directories, results and page as one after another (the manifest in the
    registry's order, with the whole run's wall time); the longest first by the evidence's run times, and a
    reproduction that reuses another's runs starts only after that one finished."""
    from tdyn.reproduce import registry, runner

    one, two = tmp_path / "one", tmp_path / "two"
    reproduce_all(one, quick=True, seed=4, names=fake_experiments, progress=False)
    page, failed = reproduce_all(two, quick=True, seed=4, names=fake_experiments, progress=False, jobs=2)
    assert failed == ["test/fails"] and page == two / "index.html"
    m1, m2 = runs.read_json(one / MANIFEST), runs.read_json(two / MANIFEST)
    assert [(r["name"], r["status"]) for r in m2["reproductions"]] == [(r["name"], r["status"]) for r in m1["reproductions"]]
    assert m2["jobs"] == 2 and m2["wall_seconds"] > 0 and m1["jobs"] == 1
    for name in fake_experiments:
        a, b = (runs.read_json(d / slug(name) / "results.json") for d in (one, two))
        assert a.get("claims") == b.get("claims") and a.get("error") == b.get("error")
    assert len(check_links(page).claim_rows) == 1 + 3
    # the schedule: c reuses a's runs; costs b > a; d's is unknown (no full run): first
    for n in ("test/a", "test/b", "test/c", "test/d"):
        monkeypatch.setitem(registry._REGISTRY, n, registry.Experiment(n, "", registry.get("test/fake").reproduce))
    monkeypatch.setattr(runner, "shares_runs", lambda: {"test/c": "test/a"})
    exps = [registry.get(n) for n in ("test/c", "test/a", "test/b", "test/d")]
    events = []

    def start(i, exp):
        events.append(("start", exp.name))
        (tmp_path / "s" / slug(exp.name)).mkdir(parents=True)
        return {"name": exp.name}, {"out": tmp_path / "s" / slug(exp.name), "quick": True, "progress": False}

    runner._in_parallel(exps, 2, start, lambda entry, outcome: events.append(("end", entry["name"], outcome["status"])),
                        {"test/c": 100.0, "test/b": 10.0, "test/a": 1.0})
    starts = [e[1] for e in events if e[0] == "start"]
    assert starts[:3] == ["test/d", "test/b", "test/a"] and starts[3] == "test/c"
    assert events.index(("end", "test/a", "finished")) < events.index(("start", "test/c"))


def test_full_evidence_exported_and_gpu_scale_quick_on_a_cpu(tmp_path, fake_experiments, monkeypatch, one_thread):
    """`make evidence`: reproduce --all at full settings, then export_evidence copies each full result (its
    results.json and listed files, dropping files the earlier evidence listed and this one does not) into
    the evidence directory; a GPU-scale reproduction ran quick on the CPU and is not exported."""
    from tdyn.reproduce import runner

    monkeypatch.setattr(runner, "gpu_scale", lambda: {"test/fails": "needs a GPU (tests)"})
    out, dest = tmp_path / "all", tmp_path / "results"
    reproduce_all(out, names=fake_experiments, progress=False, jobs=2)
    man = runs.read_json(out / MANIFEST)
    assert {r["name"]: r["quick"] for r in man["reproductions"]} == {"test/fails": True, "test/fake": False}
    _write_results(dest / slug("test/fake"), {"experiment": "test/fake", "files": ["old.png", "table.csv"]},
                   {"old.png": "x", "table.csv": "y", "notes.txt": "mine"})
    assert runner.export_evidence(out, dest) == ["test/fake"]
    got = sorted(p.name for p in (dest / slug("test/fake")).iterdir())
    assert got == ["curve.png", "notes.txt", "results.json", "table.csv"]      # old.png went; notes.txt is not tdyn's
    assert (dest / slug("test/fake") / "table.csv").read_bytes() == (out / slug("test/fake") / "table.csv").read_bytes()
    assert not (dest / slug("test/fails")).exists()
    # two at once: each exported result says its wall was made beside another reproduction, and the README's table
    made, res = runs.read_json(out / slug("test/fake") / "results.json"), runs.read_json(dest / slug("test/fake") / "results.json")
    assert res["made"] == made["made"] | {"jobs": 2} and res["claims"] == made["claims"]
    from tdyn.report import verdicts
    row = [r for r in verdicts.table(dest).splitlines() if "test/fake" in r][0]
    assert "(2 at once)" in row
    (out / MANIFEST).write_text(json.dumps(runs.read_json(out / MANIFEST) | {"jobs": 1}))
    runner.export_evidence(out, dest)                                  # one at a time: copied byte for byte
    assert (dest / slug("test/fake") / "results.json").read_bytes() == (out / slug("test/fake") / "results.json").read_bytes()


def test_an_unshipped_table_is_left_out_of_the_evidence(tmp_path, fake_experiments, monkeypatch, one_thread):
    """A table the manifest declares ``unshipped`` (scan-snap/fig8's 2.3 MB curves) is not exported, and an earlier
    copy of it in the evidence goes; the other files and results.json are exported as always."""
    from tdyn.reproduce import runner

    assert "fig8.csv" in runner.unshipped()["scan-snap/fig8"]
    monkeypatch.setattr(runner, "unshipped", lambda: {"test/fake": {"table.csv": "too large (tests)"}})
    out, dest = tmp_path / "all", tmp_path / "results"
    reproduce_all(out, names=["test/fake"], progress=False)
    _write_results(dest / slug("test/fake"), {"experiment": "test/fake", "files": ["table.csv"]}, {"table.csv": "y"})
    assert runner.export_evidence(out, dest) == ["test/fake"]
    assert sorted(p.name for p in (dest / slug("test/fake")).iterdir()) == ["curve.png", "results.json"]


@pytest.mark.parametrize("what", ["index.html", "index.html link", "report_files file"])
def test_report_never_replaces_a_users_page(tmp_path, what):
    """`tdyn report DIR` writes DIR/index.html and DIR/report_files/ only where absent or its own: a user's
    page (or a link, or a file of theirs in report_files/) is refused with one line naming it, unchanged."""
    from conftest import tdyn_cli

    d = runs_train(tmp_path / "A")
    first = tdyn_cli("report", d)
    assert first.returncode == 0, first.stderr
    again = tdyn_cli("report", d)                 # its own page: rewritten
    assert again.returncode == 0, again.stderr
    mine = tmp_path / "mine.html"
    mine.write_text("<h1>mine</h1>\n")
    if what == "index.html":
        (d / "index.html").write_text("<h1>mine</h1>\n")
        named = "index.html"
    elif what == "index.html link":
        (d / "index.html").unlink()
        (d / "index.html").symlink_to(mine)
        named = "index.html"
    else:
        (d / "report_files" / "notes.txt").write_text("mine\n")
        named = "notes.txt"
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    r = tdyn_cli("report", d)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and named in err[0] and "Traceback" not in r.stderr, r.stderr
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before
    assert mine.read_text() == "<h1>mine</h1>\n"


def runs_train(out: Path) -> Path:
    from tdyn.train.trainer import train

    train(_yz_config(steps=4), out, progress=False)
    return out
