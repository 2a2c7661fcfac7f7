"""One figure style for every paper: readable fonts, labelled axes, a colour-blind-safe palette
(Okabe–Ito). Importing it imports no matplotlib (a module that draws imports this at module level, and
matplotlib only inside the functions that draw): :func:`pyplot` loads it, on the Agg backend."""

from __future__ import annotations

import functools


@functools.cache
def pyplot():
    """matplotlib.pyplot on the Agg backend (no display), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
SEQUENTIAL = "viridis"


_MARKERS = "osD^v<>pXh"


def colors(n: int) -> list:
    """``n`` colours, none repeated: the palette for up to 8, matplotlib's tab20 for up to 20, beyond
    that ``n`` evenly spaced hues of a perceptually ordered map (turbo)."""
    if n <= len(PALETTE):
        return PALETTE[:n]
    import matplotlib.colors

    cmap = pyplot().colormaps["tab20" if n <= 20 else "turbo"]
    if n <= 20:   # tab20's pairs (dark, light) taken darks first, so that neighbours differ most
        order = [*range(0, 20, 2), *range(1, 20, 2)]
        return [matplotlib.colors.to_hex(cmap(k)) for k in order[:n]]
    return [matplotlib.colors.to_hex(cmap(0.04 + 0.92 * k / (n - 1))) for k in range(n)]


def series(i: int, marker: str | None = None, n: int | None = None) -> dict:
    """Plot keywords that tell curve ``i`` apart from every other: the palette's colour, and past its
    8 colours a marker as well (``marker``, if the caller draws one, is used for the first 8), so a
    figure with more than eight curves still has a legend that identifies each. ``n`` (the number of
    curves in the plot): past 8, colours from :func:`colors`, so that no colour repeats in the plot."""
    kw: dict = {"color": colors(n)[i] if n is not None and n > len(PALETTE) and i < n else PALETTE[i % len(PALETTE)]}
    if i >= len(PALETTE):
        options = [m for m in _MARKERS if m != marker]
        kw |= {"marker": options[(i // len(PALETTE) - 1) % len(options)], "markevery": 0.1 if marker is None else None}
    elif marker is not None:
        kw["marker"] = marker
    return kw


def apply() -> None:
    """tdyn's style on matplotlib's defaults: a figure must not depend on what an earlier figure of the same
    process set (under ``reproduce --all --jobs N`` a worker draws several reproductions; some set larger text for
    their page), so every call starts from ``rcdefaults``."""
    import matplotlib

    plt = pyplot()
    matplotlib.rcdefaults()
    plt.rcParams.update({
        "figure.dpi": 110, "savefig.dpi": 130, "font.size": 10, "axes.titlesize": 11,
        "axes.labelsize": 10, "legend.fontsize": 9, "axes.grid": False,
        "axes.prop_cycle": matplotlib.cycler(color=PALETTE), "image.cmap": SEQUENTIAL,
        "savefig.bbox": "tight",
    })


def save(fig, path) -> None:
    plt = pyplot()
    fig.savefig(path)
    plt.close(fig)
