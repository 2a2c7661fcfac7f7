"""Figures tell every curve apart: past the palette's 8 colours, curves differ by marker too."""

import csv

from tdyn.report import style


def test_series_are_distinct_beyond_the_palette():
    keys = [(s["color"], s.get("marker")) for s in (style.series(i) for i in range(40))]
    assert len(set(keys)) == 40
    assert style.series(3) == {"color": style.PALETTE[3]}                      # ≤ 8 curves: colour only
    assert style.series(9, marker="o")["marker"] != "o"                         # the caller's marker is taken


def test_sweep_plot_with_twelve_curves_identifies_each(tmp_path):
    from tdyn.report.plots import plot_metric

    rows = [{"lr": lr, "x": x, "loss_mean": lr * x, "loss_std": 0.1} for lr in range(12) for x in (1, 2, 3)]
    path = tmp_path / "s.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, ["lr", "x", "loss_mean", "loss_std"])
        w.writeheader()
        w.writerows(rows)
    import matplotlib.pyplot as plt

    seen = []
    orig = style.save
    style.save = lambda fig, p: (seen.append(fig), orig(fig, p))
    try:
        plot_metric(path, "loss", "x", "lr", tmp_path / "s.png")
    finally:
        style.save = orig
    ax = seen[0].axes[0]
    lines = [c.lines[0] for c in ax.containers]                      # each curve's data line
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(legend) == 12 and len(set(legend)) == 12
    assert len({(ln.get_color(), ln.get_marker()) for ln in lines}) == 12
    plt.close("all")
