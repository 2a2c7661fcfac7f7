"""scan-snap/snap-time's figure is drawn from its tables alone (draw_snap_time): a true measured = predicted
identity with the claims' window, no clipped step-1 zeros on the log axes, readable text, QUICK when quick."""

import matplotlib
import matplotlib.collections
import matplotlib.legend
import matplotlib.text
import numpy as np
import pytest

from tdyn.papers.scan_snap import snap_time as st
from tdyn.runs import write_csv
from tdyn.papers.scan_snap import theory as th


def _tables(out, etas=(0.1, 0.2, 0.4)):
    rows, curves = [], []
    for setting, Ks in (("theorem", (2, 4)), ("paper", (2, 6))):
        for K in Ks:
            M = 10 * K + 4
            for e in etas:
                for seed in (0, 1):
                    t0p, t0 = th.t0_prime(K, M, e), th.t0(K, M, e)
                    f = 1.0 if setting == "theorem" else 1.5
                    rows.append({"setting": setting, "K": K, "M": M, "eta_y": e, "eta_z": 0.02, "seed": seed,
                                 "rho": 0.01, "t0prime": t0p, "t0": t0, "switch_pred": th.switch_time(K, M, e),
                                 "switch_batch": f * 1.01 * th.switch_time(K, M, e), "switch_limit": 1.0,
                                 "remark1_lo": t0p, "remark1_hi": 3 * t0p, "peak_growth": 1.0, "peak_growth_pred": 1.0,
                                 "snap_slope<1.5": 0.5 * t0, "snap_slope<1.5_pred": 0.5 * t0,
                                 "snap_slope<1": f * 0.86 * t0 if e != 0.1 else float("nan"),
                                 "snap_slope<1_pred": 0.86 * t0})
                    if setting == "theorem" and seed == 0:
                        B = st.theory_B(int(3 * t0), K, M, e, 0.02)
                        curves += [{"setting": setting, "K": K, "M": M, "eta_y": e, "eta_z": 0.02, "seed": 0,
                                    "step": t, "B": b, "B_theory": b} for t, b in enumerate(B)]
    write_csv(out / "snap_time.csv", rows, list(rows[0]))
    write_csv(out / "snap_curves.csv", curves, st.CURVE_COLS)


@pytest.fixture
def drawn(monkeypatch):
    from tdyn.report import style

    figs = []

    def save(fig, path):
        figs.append(fig)
        fig.savefig(path)

    monkeypatch.setattr(style, "save", save)
    return figs


@pytest.mark.parametrize("quick", [False, True])
def test_snap_time_figure_from_tables(tmp_path, drawn, quick):
    _tables(tmp_path)
    path = st.draw_snap_time(tmp_path, quick=quick)
    assert path == tmp_path / "snap_time.png" and path.stat().st_size > 0
    (fig,) = drawn
    assert ("QUICK" in fig._suptitle.get_text()) == quick
    ax_sw, ax_sn, ax_g = fig.axes
    for ax in (ax_sw, ax_sn):      # the identity is y = x, with the ±25% window around it
        ident = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 2]
        assert ident and all(np.allclose(ln.get_xdata(), ln.get_ydata()) for ln in ident)
        (band,) = [c for c in ax.collections if isinstance(c, matplotlib.collections.PolyCollection)]
        xy = band.get_paths()[0].vertices
        assert xy[:, 1].max() / xy[:, 0].max() == pytest.approx(1 + st.SNAP_TOL)
        assert xy[:, 1].min() / xy[:, 0].min() == pytest.approx(1 - st.SNAP_TOL)
    labels = [t.get_text() for leg in fig.findobj(matplotlib.legend.Legend) for t in leg.get_texts()]
    assert "measured = predicted" in labels and any("±25%" in x for x in labels)
    for ln in ax_g.get_lines():     # G(t) from step 2: no step-0/1 zeros clipped on the log axis
        x = np.asarray(ln.get_xdata(), dtype=float)
        if len(x) > 2:
            assert x.min() >= 2
    for t in fig.findobj(matplotlib.text.Text):
        if t.get_text().strip() and t.get_visible():
            assert t.get_fontsize() >= 12, t.get_text()
    matplotlib.pyplot.close(fig)
