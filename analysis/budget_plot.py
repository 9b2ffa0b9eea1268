"""The tuning-budget figure of ``edps-analyze budget``: the expected (and median) steps-to-result of a study of n
trials against n, a line per curve and batch size, and B_crit against n per curve, with its tolerance band."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from analysis.plots import FIGURE_FORMATS, LEGEND_BESIDE, literal, plt, save_figure, style_axes


def _label(key: tuple, columns: list[str], varying: list[str]) -> str:
    return " ".join(f"{c} {literal(v)}" for c, v in zip(columns, key) if c in varying)


def budget_figure(points: pd.DataFrame, fits: pd.DataFrame, within: float, directory: Path,
                  formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """budget.png (and .svg): left, the expected steps (solid; dashed: the median) against n with the superseded
    trials counted early, and shaded up to never where that differs; right, B_crit against n (solid: early,
    dashed: never) with a band of +-``within`` around its value at the largest n."""
    columns = list(fits.columns[:fits.columns.get_loc("n")])  # the curve's
    varying = [c for c in columns if fits[c].nunique(dropna=False) > 1]
    figure, (left, right) = plt.subplots(1, 2, figsize=(13.0, 4.5), layout="tight")
    lines = list(points.groupby(columns + ["batch_size"], sort=True, dropna=False))
    colours = plt.cm.viridis(np.linspace(0.0, 0.9, max(1, len(lines))))
    for colour, (key, line) in zip(colours, lines):
        n = line["n"].to_numpy(dtype=float)
        left.plot(n, line["expected_steps_early"], "o-", color=colour, markersize=3,
                  label=f"{_label(key[:-1], columns, varying)} B={key[-1]}".strip())
        left.plot(n, line["median_steps_early"], "--", color=colour, linewidth=0.9)
        never = line["median_steps_never"].to_numpy(dtype=float)
        left.fill_between(n, line["median_steps_early"], np.where(np.isfinite(never), never, np.nan),
                          color=colour, alpha=0.15, linewidth=0)
    style_axes(left, "steps to result", "a study of n trials: expected (solid), median (dashed)", x_base=None,
          xlabel="trials per study n")
    for colour, (key, curve) in zip(plt.cm.tab10(np.arange(10) % 10), fits.groupby(columns, sort=True, dropna=False)):
        n = curve["n"].to_numpy(dtype=float)
        right.plot(n, curve["b_crit_early"], "o-", color=colour, markersize=3, label=_label(key, columns, varying) or "B_crit")
        right.plot(n, curve["b_crit_never"], "--", color=colour, linewidth=0.9)
        final = curve["b_crit_early"].iloc[-1]
        if np.isfinite(final):
            right.axhspan(final * (1 - within), final * (1 + within), color=colour, alpha=0.1, linewidth=0)
    style_axes(right, "B_crit (examples per step)", f"B_crit of the median steps; band: +-{within:g} at the largest n",
          x_base=None, y_base=None, xlabel="trials per study n")
    for axis in (left, right):
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # n counts trials
    left.legend(fontsize=7, **LEGEND_BESIDE)
    right.legend(fontsize=7)
    return save_figure(figure, directory, "budget", formats)
