"""Plots of a sweep's ``summary.csv`` (the sweep layer writes the table; drawing it belongs here, so that
sweep workers never import matplotlib)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tdyn.report import style
from tdyn.runs.io import read_csv_dicts


def plot_metric(summary_csv: str | Path, metric: str, x: str, curve: str, path: str | Path, panel: str | None = None):
    """Plot ``metric`` (mean ± std) against axis ``x``, one curve per value of ``curve`` (and one
    panel per value of ``panel``), from a ``summary.csv``. Each value of ``curve`` has one colour of
    its own, the same in every panel and never repeated (:func:`tdyn.report.style.series` with ``n``);
    one legend, beside the panels, so that it hides no curve."""
    import matplotlib.pyplot as plt

    style.apply()
    rows = read_csv_dicts(Path(summary_csv))
    panels = sorted({r[panel] for r in rows}, key=_num) if panel else [None]
    values = sorted({r[curve] for r in rows}, key=_num)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2), squeeze=False)
    handles: dict[str, Any] = {}
    for ax, pv in zip(axes[0], panels):
        sub = [r for r in rows if panel is None or r[panel] == pv]
        for k, cv in enumerate(values):
            pts = sorted(((_num(r[x]), float(r[f"{metric}_mean"]), float(r[f"{metric}_std"] or "nan"))
                          for r in sub if r[curve] == cv))
            if not pts:
                continue
            xs, ys, es = zip(*pts)
            handles[f"{curve}={cv}"] = ax.errorbar(xs, ys, yerr=[0 if math.isnan(e) else e for e in es], capsize=2,
                                                   **style.series(k, marker="o", n=len(values)))
        ax.set_xlabel(x)
        ax.set_ylabel(metric)
        if pv is not None:
            ax.set_title(f"{panel}={pv}")
    fig.tight_layout()   # the panels laid out first; the saved figure grows to take the legend
    axes[0][-1].legend(list(handles.values()), list(handles), loc="upper left", bbox_to_anchor=(1.02, 1.0),
                       frameon=False, ncol=2 if len(handles) > 10 else 1)
    style.save(fig, path)
    return Path(path)


def _num(s: str):
    try:
        return float(s)
    except (TypeError, ValueError):
        return s
