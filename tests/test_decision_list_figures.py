"""The decision-list figures are drawn from their tables alone (draw_claim1, draw_claim2): the committed
evidence's CSVs redraw every figure without solving or training; each draws the bound or window its claim is
judged against; quick runs say QUICK in the title; no two series of a plot share a colour; text readable at
page width; symlog / log tick labels kept apart."""

import shutil
import types
from pathlib import Path

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
import matplotlib.colors  # noqa: E402
import matplotlib.patches  # noqa: E402
import matplotlib.text  # noqa: E402

from tdyn.papers.decision_list import claim1 as c1  # noqa: E402
from tdyn.papers.decision_list import claim2 as c2  # noqa: E402
from tdyn.papers.decision_list import analysis as common  # noqa: E402
from tdyn.reproduce.phases import read_table  # noqa: E402
from tdyn.runs import write_csv  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


@pytest.fixture
def drawn(monkeypatch):
    """The figures the draw functions save, by file name (still open)."""
    from tdyn.report import style

    figs = {}

    def save(fig, path):
        figs[Path(path).name] = fig
        fig.savefig(path)

    monkeypatch.setattr(style, "save", save)
    yield figs
    for f in figs.values():
        matplotlib.pyplot.close(f)


def _readable(fig, size=12):
    for t in fig.findobj(matplotlib.text.Text):
        if t.get_text().strip() and t.get_visible():
            assert t.get_fontsize() >= size, t.get_text()


def _handle_key(h):
    """A legend handle's colour, and its marker where that is what the entry names (grey shape proxies)."""
    if isinstance(h, matplotlib.lines.Line2D):
        c = h.get_color() if h.get_linestyle() not in ("None", "none", "") else h.get_markerfacecolor()
        colour, marker = matplotlib.colors.to_hex(c), h.get_marker()
    elif isinstance(h, matplotlib.patches.Patch):
        colour, marker = matplotlib.colors.to_hex(h.get_facecolor()), None
    else:
        fc = h.get_facecolor()
        colour = matplotlib.colors.to_hex(fc[0] if len(fc) and fc[0][3] > 0 else h.get_edgecolor()[0])
        marker = h.get_paths()[0].vertices.tobytes()
    return colour, marker if colour == "#737373" else None


def _distinct_series(fig):
    """No two entries of a legend share a colour (entries that name a marker shape, drawn grey, differ in
    marker)."""
    for lg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]:
        keys = [_handle_key(h) for h in lg.legend_handles]
        assert len(keys) == len(set(keys)), [t.get_text() for t in lg.get_texts()]


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in list(src.glob("*.csv")) + [src / "results.json"]:
        shutil.copyfile(f, dst / f.name)
    return dst


def _vlines_x(ax):
    return [ln.get_xdata()[0] for ln in ax.lines if len(ln.get_xdata()) == 2 and ln.get_xdata()[0] == ln.get_xdata()[1]
            and list(ln.get_ydata()) == [0, 1]]


def _hlines_y(ax):
    return [ln.get_ydata()[0] for ln in ax.lines if list(ln.get_xdata()) == [0, 1] and len(set(ln.get_ydata())) == 1]


@pytest.mark.skipif(not (RESULTS / "decision-list__claim1" / c1.TRAJ_CSV).exists(), reason="no committed evidence")
def test_claim1_figures_from_the_committed_tables(tmp_path, drawn):
    src = RESULTS / "decision-list__claim1"
    out = _copy(src, tmp_path / "c1")
    paths = c1.draw_claim1(out)
    assert sorted(p.name for p in paths) == sorted(c1.CLAIM1_FIGURES) and all(p.stat().st_size > 0 for p in paths)
    for f in out.glob("*.csv"):   # the tables are read, never written
        assert f.read_bytes() == (src / f.name).read_bytes()
    rows = {(r["sampler"], r["L"], r["n"], r["M"]): r for r in read_table(src / "claim1.csv")}
    for name, fig in drawn.items():
        _readable(fig)
        _distinct_series(fig)
        assert "QUICK" not in fig._suptitle.get_text(), name
    # the bound-ratio figure: the bound (ratio 1) in every sampler's panel
    assert all(1 in _hlines_y(ax) for ax in drawn["claim1_bound_ratio.png"].axes)
    assert all(3 in _hlines_y(ax) for ax in drawn["claim1_tsup_logL.png"].axes)
    # every reading's bound drawn on the margin figure, inside the time axis
    fig = drawn["claim1_margin_vs_bounds.png"]
    for ax, key in zip(fig.axes, c1._trajectories(read_table(out / c1.TRAJ_CSV))):
        bounds = [rows[key][f"bound_gamma_{g}"] for g in c1.GAMMAS]
        assert sorted(_vlines_x(ax)) == sorted(bounds)
        assert ax.get_xlim()[1] > max(bounds)
    # the ordering figure: one curve per score difference, each visible (distinct dash or width)
    for ax in drawn["claim1_overtaking.png"].axes:
        curves = [ln for ln in ax.lines if len(ln.get_xdata()) > 2]
        assert len({(str(ln.get_linestyle()), ln.get_linewidth()) for ln in curves}) == len(curves) == 4


@pytest.mark.skipif(not (RESULTS / "decision-list__claim2" / c2.FREE_CURVES_CSV).exists(), reason="no committed evidence")
def test_claim2_figures_from_the_committed_tables(tmp_path, drawn):
    src = RESULTS / "decision-list__claim2"
    out = _copy(src, tmp_path / "c2")
    paths = c2.draw_claim2(out)
    assert sorted(p.name for p in paths) == ["claim2.png", "claim2_eta_lambda.png", "claim2_exploratory.png",
                                             "claim2_free_c.png"]
    for f in out.glob("*.csv"):
        assert f.read_bytes() == (src / f.name).read_bytes()
    for name, fig in drawn.items():
        _readable(fig)
        _distinct_series(fig)
        assert "QUICK" not in fig._suptitle.get_text(), name
    # the window of result2_inside_hypotheses: both ends of every inside run drawn, above k*
    inside = [r for r in read_table(src / "claim2.csv") if r["regime"] == "inside" and r["admissible"]]
    (ax,) = drawn["claim2.png"].axes
    ends = {m: sorted(ln.get_ydata()[0] for ln in ax.lines if ln.get_marker() == m) for m in ("v", "^")}
    assert ends["v"] == sorted(r["k_bound"] for r in inside)
    assert ends["^"] == sorted(r["step_range_hi"] for r in inside)
    assert ax.get_ylim()[1] > max(ends["^"]) and "3.46e+06" in ax.get_title()
    (ax,) = drawn["claim2_eta_lambda.png"].axes
    assert 1 in _hlines_y(ax)
    a0, _ = drawn["claim2_free_c.png"].axes
    assert 0.5 in _hlines_y(a0)   # ε/2


def _tiny_claim1(out: Path):
    """claim1's tables for a 2-sampler, 2-L, 1-n, M ∈ {1, 2} grid (made-up numbers) and a two-flow trajectory."""
    rows = []
    for s in ("A", "B"):
        for L in (10, 100):
            for M in (1, 2):
                T = (3.0 if s == "A" else 0.1) * L * M
                rows.append({k: "" for k in c1.CLAIM1_COLUMNS} | {
                    "sampler": s, "L": L, "n": 3, "M": M, "degenerate": M == 1, "c": 10.0, "delta": 0.2,
                    "gamma_joint": 0.02, "gamma_pattern": 1e-3, "T_sup": T, "T_sup_kappa_0.1": 1.1 * T,
                    "T_sup_kappa_1": 2 * T, "t_max": 1e9, "bound_gamma_delta": 40.0 * M, "bound_gamma_joint": 400.0 * M,
                    "bound_gamma_pattern": 8000.0 * M})
    write_csv(out / "claim1.csv", rows, c1.CLAIM1_COLUMNS)
    write_csv(out / "claim1_fixed_c.csv", [{k: r.get(k, "") for k in c1.FIXED_C_COLUMNS} | {"L": 100, "c": 1e3}
                                           for r in rows if r["L"] == 100], c1.FIXED_C_COLUMNS)
    t = np.concatenate([[0.0], np.geomspace(1e-3, 600.0, 50)])
    traj = {}
    for key in (("B", 100, 3, 2), ("A", 100, 3, 2)):
        w = np.stack([np.tanh(t / 10), np.tanh(t / 10) - 1e-3 * np.tanh(t), -1e-2 * np.tanh(t)], 1)
        traj[key] = types.SimpleNamespace(t=t, w=w, margin=np.tanh(t / 50) - 0.5, T_sup=rows[0]["T_sup"])
    trows, cols = c1.trajectory_table(traj, c1.trajectory_keys(traj))
    write_csv(out / c1.TRAJ_CSV, trows, cols)
    return traj


def test_claim1_trajectories_read_back(tmp_path):
    traj = _tiny_claim1(tmp_path)
    back = c1._trajectories(read_table(tmp_path / c1.TRAJ_CSV))
    assert list(back) == [("B", 100, 3, 2), ("A", 100, 3, 2)]
    for key, d in back.items():
        assert np.array_equal(d["t"], traj[key].t) and np.array_equal(d["w"], traj[key].w)
        assert np.array_equal(d["margin"], traj[key].margin)


def test_quick_figures_say_quick(tmp_path, drawn):
    _tiny_claim1(tmp_path)
    (tmp_path / "results.json").write_text('{"quick": true}')
    c1.draw_claim1(tmp_path)
    assert len(drawn) == len(c1.CLAIM1_FIGURES)
    for name, fig in drawn.items():
        assert "QUICK" in fig._suptitle.get_text(), name
        _readable(fig)


def test_free_c_curve_rows_keep_the_early_steps_and_thin_the_rest():
    steps = np.arange(2001.0)
    cv = np.column_stack([steps, np.ones(2001), np.zeros(2001), np.linspace(-1, 5, 2001), np.full(2001, np.nan),
                          np.zeros(2001), np.zeros(2001)])
    rows = c2.free_curve_rows({0.5: (cv, cv)})
    joint = [r["step"] for r in rows if r["mode"] == "joint"]
    assert joint[:101] == list(range(101)) and joint[-1] == 2000 and len(joint) < 200
    assert all(r["v_drift"] == "" for r in rows) and {r["mode"] for r in rows} == {"joint", "W_only"}


def test_symlog_ticks_do_not_collide():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    t = np.geomspace(1e-3, 1e6, 200)
    ax.plot(t, np.where(t < 1e5, -1e5 * np.exp(-t / 1e6), np.linspace(0, 1, 200)))
    ax.set_xscale("log")
    common.symlog_ticks(ax, 1e-3, "y", max_ticks=7)
    fig.canvas.draw()
    ticks = ax.get_yticks()
    assert 0 in ticks and len(ticks) <= 8
    px = np.sort(ax.transData.transform(np.column_stack([np.ones(len(ticks)), ticks]))[:, 1])
    height = 13 * fig.dpi / 72
    assert np.diff(px).min() > 1.2 * height     # labels a line apart at least
    lo, hi = ax.get_ylim()
    assert lo < -1e5 * np.exp(-1e-3 / 1e6) and hi > 1     # the data inside, with room
    plt.close(fig)


def test_log_ticks_thin_wide_axes_and_label_narrow_ones():
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2)
    a.plot([1, 2], [1e-8, 1e22])
    a.set_yscale("log")
    common.log_ticks(a, "y", max_ticks=6)
    assert len([v for v in a.get_yticks() if a.get_ylim()[0] <= v <= a.get_ylim()[1]]) <= 6
    b.plot([1, 2], [0.02, 0.08])
    b.set_yscale("log")
    common.log_ticks(b, "y", max_ticks=6)
    labels = [b.yaxis.get_major_formatter()(v) for v in b.get_yticks()]
    assert labels and all(lab.startswith("0.0") for lab in labels)
    plt.close(fig)
