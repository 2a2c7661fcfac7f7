"""One figure style for every paper: readable fonts, labelled axes, a colour-blind-safe palette
(Okabe–Ito)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]
SEQUENTIAL = "viridis"


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
