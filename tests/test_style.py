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


def test_apply_does_not_inherit_an_earlier_figures_settings(tmp_path):
    """A worker of `reproduce --all --jobs N` draws several reproductions in one process; one that sets larger
    text for its page (real/attention-maps, scan-snap/snap-time) must not change the next one's figure: after
    style.apply() the settings and the saved PNG's bytes are those of a process that drew nothing before."""
    import matplotlib

    plt = style.pyplot()

    def draw(name):
        style.apply()
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot([0, 1], [1, 0], label="a")
        ax.set(xlabel="x", ylabel="y", title="t")
        ax.legend()
        style.save(fig, tmp_path / name)
        return dict(plt.rcParams)

    matplotlib.rcdefaults()
    first = draw("first.png")
    plt.rcParams.update({"xtick.labelsize": 12, "ytick.labelsize": 12, "font.size": 13, "axes.titlesize": 14})
    again = draw("again.png")
    assert again == first
    assert (tmp_path / "again.png").read_bytes() == (tmp_path / "first.png").read_bytes()
