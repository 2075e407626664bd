"""matplotlib PNGs for the validate report (Agg backend: no display needed)."""

from __future__ import annotations

import math
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def line_plot(
    path: Path,
    series: dict[str, list[float]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    log_y: bool = False,
    x: list[float] | None = None,
    hline: tuple[float, str] | None = None,
    log_x: bool = False,
) -> None:
    """One line per series; zeros drawn at a log axis's floor."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, ys in series.items():
        xs = x if x is not None else list(range(len(ys)))
        ys = [max(y, 1e-12) if log_y else y for y in ys]
        ax.plot(xs, ys, marker=".", label=name)
    if hline is not None and not math.isnan(hline[0]):
        ax.axhline(hline[0], color="red", linestyle="--", label=hline[1])
    if log_y:
        ax.set_yscale("log")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def heatmap(
    path: Path,
    values: list[list[float]],
    rows: list[str],
    cols: list[str],
    *,
    title: str,
    label: str,
) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.2 * len(cols) + 2, 0.6 * len(rows) + 1.5))
    im = ax.imshow(values, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", color="white", fontsize=8)
    fig.colorbar(im, ax=ax, label=label)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
