"""One figure style for every paper: readable fonts, labelled axes, a colour-blind-safe palette
(Okabe–Ito)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
SEQUENTIAL = "viridis"


_MARKERS = "osD^v<>pXh"


def series(i: int, marker: str | None = None) -> dict:
    """Plot keywords that tell curve ``i`` apart from every other: the palette's colour, and past its
    8 colours a marker as well (``marker``, if the caller draws one, is used for the first 8), so a
    figure with more than eight curves still has a legend that identifies each."""
    kw: dict = {"color": PALETTE[i % len(PALETTE)]}
    if i >= len(PALETTE):
        options = [m for m in _MARKERS if m != marker]
        kw |= {"marker": options[(i // len(PALETTE) - 1) % len(options)], "markevery": 0.1 if marker is None else None}
    elif marker is not None:
        kw["marker"] = marker
    return kw


def apply() -> None:
    plt.rcParams.update({
        "figure.dpi": 110, "savefig.dpi": 130, "font.size": 10, "axes.titlesize": 11,
        "axes.labelsize": 10, "legend.fontsize": 9, "axes.grid": False,
        "axes.prop_cycle": matplotlib.cycler(color=PALETTE), "image.cmap": SEQUENTIAL,
        "savefig.bbox": "tight",
    })


def save(fig, path) -> None:
    fig.savefig(path)
    plt.close(fig)
