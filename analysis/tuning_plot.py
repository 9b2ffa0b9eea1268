"""The figure of ``edps-analyze tuning``: the best learning rate against batch size, log-log, a line per curve
(bars: the replicates' min..max) with its perfect-scaling slope drawn over the points it was fitted to; a panel per
optimizer and parameterization."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.plots import FIGURE_FORMATS, literal, plt, save_figure, style_axes
from analysis.regimes import curve_columns, matching
from analysis.report import several_methods, with_interval
from analysis.tuning import LEARNING_RATE, PARAMETERIZATION, curve_label, varying_columns


def _draw_slope(axis: plt.Axes, curve: pd.DataFrame, slope: pd.Series, colour: object) -> None:
    """The fitted power law over the regime's points (dashed), where the curve has a slope."""
    if pd.isna(slope["slope"]):
        return
    end = slope["perfect_scaling_end"]
    regime = curve[np.isfinite(curve[LEARNING_RATE]) & (curve["batch_size"] < end if pd.notna(end) else True)]
    b, lr = regime["batch_size"].to_numpy(float), regime[LEARNING_RATE].to_numpy(float)
    centre = np.exp(np.log(lr).mean() - slope["slope"] * np.log(b).mean())
    axis.plot(b, centre * b ** slope["slope"], "--", color=colour, linewidth=1.2)


def _slope_words(slope: pd.Series) -> str:
    """``slope 0.98 [0.9, 1.1]``, or why none with the slope over every batch size."""
    if pd.notna(slope["slope"]):
        return f"slope {with_interval(slope, 'slope')}"
    every = f"; every B: {with_interval(slope, 'slope_all')}" if pd.notna(slope.get("slope_all")) else ""
    count = int(slope['regime_points'])
    return f"no slope ({count} point{'' if count == 1 else 's'} in perfect scaling){every}"


def tuning_figure(points: pd.DataFrame, slopes: pd.DataFrame, directory: Path,
                  formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """best_learning_rate.png (and .svg): a panel per (optimizer, parameterization)."""
    keys, varying, several = curve_columns(points), varying_columns(points), several_methods(points)
    varying = [c for c in varying if c != PARAMETERIZATION]
    workloads = points["workload"].nunique() > 1
    panels = list(points.groupby(["optimizer", PARAMETERIZATION], sort=True))
    figure, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 5.6), layout="tight", squeeze=False)
    for axis, ((optimizer, parameterization), panel) in zip(axes[0], panels):
        lines = list(panel.groupby(keys, sort=True, dropna=False))
        for colour, (key, curve) in zip(plt.cm.viridis(np.linspace(0.0, 0.85, max(1, len(lines)))), lines):
            curve = curve.sort_values("batch_size")
            slope = slopes[matching(slopes, dict(zip(keys, key)))].iloc[0]
            lr = curve[LEARNING_RATE].to_numpy(float)
            spread = np.vstack([lr - curve[f"{LEARNING_RATE}_min"].to_numpy(float),
                                curve[f"{LEARNING_RATE}_max"].to_numpy(float) - lr])
            name = (f"{literal(curve['workload'].iloc[0])} " if workloads else "") + literal(
                curve_label(curve.iloc[0], varying, several))
            axis.errorbar(curve["batch_size"], lr, yerr=np.nan_to_num(np.clip(spread, 0, None)), fmt="o-",
                          color=colour, capsize=3, markersize=4,
                          label=f"{name}: {_slope_words(slope)}")
            _draw_slope(axis, curve, slope, colour)
            if pd.notna(slope["perfect_scaling_end"]):
                axis.axvline(slope["perfect_scaling_end"], color=colour, linestyle=":", linewidth=1.0)
        style_axes(axis, "best learning rate", f"{literal(optimizer)}, {literal(parameterization)}\ndashed: the "
                   f"slope in perfect scaling (ends at the dotted line)\nbars: min..max over replicates", y_base=10)
        axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below: the panel keeps its width
    return save_figure(figure, directory, "best_learning_rate", formats)
