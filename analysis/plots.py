"""Figures from tidy tables only (no MLflow, no training): PNG and SVG, readable in print."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402

from analysis.regimes import (CURVE_KEYS, UNBOUNDED_FACTOR, curve_columns, curves, family_columns,  # noqa: E402
                              fit_of, fit_table, fit_value, is_degenerate, point_table, unbounded,
                              with_curve_axes)
from analysis.report import curve_words, several_methods  # noqa: E402
from analysis.timing import TIME_COLUMNS, duration_unit  # noqa: E402
from edps_mlflow.parameterization import Parameterization  # noqa: E402

FIGURE_FORMATS = ("png", "svg")  # the PNG that reports show, the SVG for print
PNG_DPI = 150
REGIME_COLOURS = {"perfect scaling": "#d9ead3", "diminishing returns": "#fff2cc", "maximal data parallelism": "#f4cccc"}
AXIS_MARGIN = 2 ** 0.4  # how far the axes reach beyond the measured batch sizes (a factor on the log2 axis)
BATCH_AXIS = "batch size (examples per step)"
LEGEND_BESIDE = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0, "framealpha": 0.9}
# File names from values read from a store or a CSV (a workload, an optimizer): a plain value as it is; any other
# cleaned, with a hash of every value after them, so that values that clean alike ('a/b', 'a\\b'; 'SGD', 'sgd' on a
# case-insensitive file system) never write one file.
_PLAIN = re.compile(r"[a-z0-9][a-z0-9.-]{0,63}")
_NOT_PLAIN = re.compile(r"[^a-z0-9.-]+")
_CLEANED_LENGTH = 40  # a stem of three values stays far below the 255 bytes of a file name
_HASH_LENGTH = 12


def file_stem(kind: str, *values: object) -> str:
    """``kind_value1_value2...``, each value as it is when plain; else cleaned and a hash appended."""
    texts = [str(value) for value in values]
    if all(_PLAIN.fullmatch(text) for text in texts):
        return "_".join((kind, *texts))
    cleaned = [_NOT_PLAIN.sub("-", text.lower()).strip(".-")[:_CLEANED_LENGTH].strip(".-") or "-" for text in texts]
    # JSON keeps the values apart (no joined text of two values equals another pair's) and is ASCII.
    digest = hashlib.sha256(json.dumps(texts).encode("ascii")).hexdigest()[:_HASH_LENGTH]
    return "_".join((kind, *cleaned, digest))


def literal(value: object) -> str:
    """A value read from a store or a CSV as text for a figure: a '$' is a dollar sign, not mathtext."""
    return str(value).replace("$", r"\$")


def _plain_number(value: float) -> str:
    """A tick value as people write it: ``64``, ``0.5``, ``0.015625``."""
    if float(value).is_integer() and abs(value) < 1e7:
        return str(int(value))
    return f"{value:.4g}" if abs(value) >= 1e7 else f"{value:.10g}"


class PlainLogFormatter(LogFormatter):
    """The ticks that matplotlib's log formatter labels, as plain numbers (``64``, not ``2^6``)."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return _plain_number(x) if super().__call__(x, pos) else ""


def style_axes(axis: plt.Axes, ylabel: str, title: str | None = None, x_base: float | None = 2,
          y_base: float | None = 2, xlabel: str | None = BATCH_AXIS) -> None:
    """Log scales (a base of None: linear), labels, a title and a light grid."""
    for ticks, set_scale, base in ((axis.xaxis, axis.set_xscale, x_base), (axis.yaxis, axis.set_yscale, y_base)):
        if base is not None:
            set_scale("log", base=base)
            ticks.set_major_formatter(PlainLogFormatter(base))
            ticks.set_minor_formatter(PlainLogFormatter(base, labelOnlyBase=False))
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    if title:
        axis.set_title(title, fontsize=9)
    axis.grid(True, alpha=0.3)


def _relative_axes(axis: plt.Axes, title: str) -> None:
    """Steps relative to the dense network against batch size."""
    style_axes(axis, "steps relative to the dense network", title, y_base=None)
    axis.axhline(1.0, color="grey", linewidth=0.8)


def _write(figure: plt.Figure, paths: list[Path]) -> None:
    for path in paths:
        figure.savefig(path, dpi=PNG_DPI, bbox_inches="tight")


def save_figure(figure: plt.Figure, directory: Path, stem: str, formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """``figure`` written to ``directory/stem.<format>`` and closed; the paths."""
    for axis in figure.axes:
        drawn = [y for line in axis.get_lines() for y in np.asarray(line.get_ydata(), dtype=float)]
        if not any(np.isfinite(y) and y > 0 for y in drawn):  # nothing reached the goal: nothing for a log axis
            axis.set_xscale("linear")
            axis.set_yscale("linear")
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{stem}.{suffix}" for suffix in formats]
    try:
        _write(figure, paths)
    finally:
        plt.close(figure)
    return paths


def _edge_arrow(axis: plt.Axes, edge: float, y: float, side: int, text: str, colour: object) -> None:
    """An arrow at the axis edge (``side`` -1: left, +1: right) pointing out, with the value it stands for."""
    axis.annotate(text, xy=(edge, y), xytext=(-side * 30, 0), textcoords="offset points", fontsize=7,
                  ha="right" if side > 0 else "left", va="center", annotation_clip=False,
                  bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": colour, "alpha": 0.9},
                  arrowprops={"arrowstyle": "-|>", "color": colour, "linewidth": 1.2})


def _draw_fit(axis: plt.Axes, b: np.ndarray, s: np.ndarray, colour: object, row: pd.Series | None,
              label_interval: bool, limits: tuple[float, float]) -> list[float]:
    """The fitted hyperbola (grey when it does not apply) and B_crit's interval as a bar at S = 2 S_min, an end
    beyond the axes an arrow at the edge; the y values drawn."""
    s_min, b_crit = fit_value(row, "s_min"), fit_value(row, "b_crit")
    valid = np.isfinite(s) & (s > 0)
    if s_min is None or b_crit is None or not valid.any():
        return []
    grid = np.geomspace(b[valid].min(), b[valid].max(), 200)
    fitted = s_min * (1.0 + b_crit / grid)
    low, high = fit_value(row, "b_crit_low"), fit_value(row, "b_crit_high")
    degenerate = is_degenerate(row)
    label = "fit does not apply (see the fit's note)" if degenerate else f"fit: S_min {s_min:.3g}, B_crit {b_crit:.3g}"
    if not degenerate and low is not None and high is not None:  # ``95%: 1.8e-08 .. unbounded``
        low_open, high_open = unbounded(b_crit, low, high)
        label += (f" (95%: {'unbounded' if low_open else f'{low:.3g}'} .. {'unbounded' if high_open else f'{high:.3g}'}"
                  + ("; excludes the estimate" if not low <= b_crit <= high else "") + ")")
    axis.plot(grid, fitted, "--", color="0.6" if degenerate else colour, linewidth=1.0, alpha=0.8, label=label)
    if degenerate or low is None or high is None:
        return list(fitted)
    y, (left, right) = 2 * s_min, limits
    inside = max(low, left), min(high, right)
    if inside[0] < inside[1]:
        axis.plot(list(inside), [y, y], "-", color=colour, linewidth=1.0,
                  label="B_crit's 95% interval (arrow: beyond the axis)" if label_interval else None)
    for end, edge, side in ((low, left, -1), (high, right, 1)):
        if left <= end <= right:
            axis.plot([end], [y], "|", color=colour, markersize=8)
        elif (end < edge) if side < 0 else (end > edge):
            _edge_arrow(axis, edge, y, side, f"{end:.3g}", colour)
    if left <= b_crit <= right:
        axis.plot([b_crit], [y], "D", color=colour, markersize=4)
    else:
        side = -1 if b_crit < left else 1
        _edge_arrow(axis, left if side < 0 else right, y * 1.25, side, f"B_crit {b_crit:.3g}", colour)
    return list(fitted) + [y]


def _error_bars(axis: plt.Axes, points: pd.DataFrame, colour: object) -> list[float]:
    """Each point's 95% interval over its replicates, where it has one; the heights it reaches (for the axis)."""
    shown = points.dropna(subset=["steps_to_result_low", "steps_to_result_high"])
    if not len(shown):
        return []
    # about the interval's middle, not the point: an interval that carries the censoring may lie wholly below
    # the recorded point, and a bar from the point would draw it to the point
    b, s = (shown[column].to_numpy(dtype=float) for column in ("batch_size", "steps_to_result"))
    low, high = (shown[f"steps_to_result_{end}"].to_numpy(dtype=float) for end in ("low", "high"))
    bounded = np.isfinite(high)
    axis.errorbar(b[bounded], ((low + high) / 2)[bounded], yerr=((high - low) / 2)[bounded], fmt="none",
                  ecolor=colour, elinewidth=1.0, capsize=3)
    if not bounded.all():  # no high end (the point may not reach): from the low end up past the point, open
        for x, start, point in zip(b[~bounded], low[~bounded], s[~bounded]):
            axis.annotate("", xy=(x, 1.2 * max(point, start)), xytext=(x, start),
                          arrowprops={"arrowstyle": "-|>", "color": colour, "linewidth": 1.0})
    return [float(v) for v in np.concatenate([low, high[np.isfinite(high)]]) if v > 0]


def _mark_thresholds(axis: plt.Axes, b: np.ndarray, s: np.ndarray, colour: object, row: pd.Series | None,
                     label: bool, limits: tuple[float, float]) -> None:
    """The threshold critical batch size: measured, a ring on its point; fitted, a triangle on the fit."""
    measured = fit_value(row, "b_crit_threshold")
    if measured is not None and measured in b:
        axis.plot([measured], [s[b == measured][0]], "o", markersize=11, markerfacecolor="none", color=colour,
                  label="B_crit threshold, measured (largest within the tolerance)" if label else None)
    fitted, s_min, b_crit = fit_value(row, "b_crit_threshold_fit"), fit_value(row, "s_min"), fit_value(row, "b_crit")
    if None in (fitted, s_min, b_crit) or is_degenerate(row) or not limits[0] <= fitted <= limits[1]:
        return
    axis.plot([fitted], [s_min * (1.0 + b_crit / fitted)], "^", markersize=6, color=colour,
              label="B_crit threshold, fitted" if label else None)


def _shade_regimes(axis: plt.Axes, b: np.ndarray, row: pd.Series, limits: tuple[float, float]) -> None:
    """The regimes of a curve from its boundaries; a band changes halfway (on the log axis) between the last
    measured batch size of one regime and the first of the next, so each point lies in its own regime's band."""
    left, right = limits
    end, start = fit_value(row, "perfect_scaling_end"), fit_value(row, "maximal_parallelism_start")

    def halfway_below(boundary: float) -> float:
        below = b[b < boundary]
        return float(np.sqrt(below.max() * boundary)) if len(below) else boundary

    maximal = halfway_below(start) if start is not None else right
    perfect = min(halfway_below(end) if end is not None else right, maximal)
    bands = zip(REGIME_COLOURS.items(), (left, perfect, maximal), (perfect, maximal, right))
    for ((name, colour), low, high), shown in zip(bands, (True, maximal > perfect, start is not None)):
        if shown:
            axis.axvspan(low, high, color=colour, zorder=0, label=name)


def steps_figure(table: pd.DataFrame, workload: str, optimizer: str, directory: Path, tolerance: float = 0.2,
                 fits: pd.DataFrame | None = None, formats: tuple[str, ...] = FIGURE_FORMATS,
                 resamples: tuple[int, int] = (200, 0)) -> list[Path]:
    """The figure of :func:`draw_steps`, written in ``formats`` to ``directory``."""
    return save_figure(draw_steps(table, workload, optimizer, tolerance, fits, resamples), directory,
                 file_stem("steps", workload, optimizer), formats)


def draw_steps(table: pd.DataFrame, workload: str, optimizer: str, tolerance: float = 0.2,
               fits: pd.DataFrame | None = None, resamples: tuple[int, int] = (200, 0)) -> plt.Figure:
    """log2-log2 steps-to-result against batch size, a line per curve through its points (the point rule over
    each batch size's replicates; error bars: their 95% intervals, with ``resamples`` (repeats, seed), where a
    point has 3 replicates or more), the fits of ``fits`` (else of the fit table without intervals, as the table
    reports them) dashed, the densest curve's regimes shaded."""
    group = table[(table["workload"] == workload) & (table["optimizer"] == optimizer)]
    fits = fit_table(group, None, tolerance, repeats=0) if fits is None else fits
    figure, axis = plt.subplots(figsize=(8.4, 4.6))
    lines = curves(group)  # another protocol is another line, never joined to these
    columns = curve_columns(with_curve_axes(group))
    varying = [i for i in range(len(CURVE_KEYS), len(columns)) if len({str(k[i]) for k in lines}) > 1]
    several = several_methods(with_curve_axes(group))
    colours = plt.cm.viridis(np.linspace(0.0, 0.85, max(1, len(lines))))
    limits = (float(group["batch_size"].min()) / AXIS_MARGIN, float(group["batch_size"].max()) * AXIS_MARGIN)
    heights: list[float] = []
    shaded = False
    for colour, (key, curve) in zip(colours, lines.items()):
        points = point_table(curve, *resamples)
        b = points["batch_size"].to_numpy(dtype=float)
        s = points["steps_to_result"].to_numpy(dtype=float)
        valid = np.isfinite(s) & (s > 0)
        label = " ".join([curve_words(key[2], literal(key[3]), several, key[4])]
                         + [f"{columns[i]} {literal(key[i])}" for i in varying])
        axis.plot(b[valid], s[valid], "o-", color=colour, label=label, linewidth=1.6)
        heights += _error_bars(axis, points[valid], colour)
        row = fit_of(fits, dict(zip(columns, key)))
        heights += list(s[valid]) + _draw_fit(axis, b, s, colour, row, not shaded, limits)
        _mark_thresholds(axis, b[valid], s[valid], colour, row, not shaded, limits)
        if not shaded and row is not None and valid.sum() >= 2:
            _shade_regimes(axis, b[valid], row, limits)
            shaded = True
    style_axes(axis, "steps to result")
    axis.set_xlim(*limits)
    if heights:
        axis.set_ylim(min(heights) / AXIS_MARGIN, max(heights) * AXIS_MARGIN)
    axis.set_title(f"{literal(workload)}, {literal(optimizer)}: steps to reach the goal\n(dashed: fitted "
                   f"S_min (1 + B_crit / B); shading: regimes of the densest curve)", fontsize=9)
    axis.legend(fontsize=7, **LEGEND_BESIDE)
    return figure


def comparison_figures(comparison: pd.DataFrame, workload: str, optimizer: str, directory: Path,
                       formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """Curves normalised by their first point, and steps relative to the dense curve."""
    group = comparison[(comparison["workload"] == workload) & (comparison["optimizer"] == optimizer)]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10.5, 4.2), layout="tight")
    # a line per sparsity, pruning method and protocol (the protocol columns that sparsity_comparison kept)
    keys = ["sparsity", "pruning", "parameterization"] + [c for c in curve_columns(group)[len(CURVE_KEYS):]
                                                          if group[c].nunique(dropna=False) > 1]
    lines = list(group.groupby(keys, sort=True, dropna=False))
    colours = plt.cm.viridis(np.linspace(0.0, 0.85, max(1, len(lines))))
    several = several_methods(group)
    for colour, (key, curve) in zip(colours, lines):
        label = " ".join([curve_words(key[0], literal(key[1]), several, key[2])]
                         + [f"{c} {literal(v)}" for c, v in zip(keys[3:], key[3:])])
        curve = curve.sort_values("batch_size").dropna(subset=["steps_to_result"])
        left.plot(curve["batch_size"], curve["normalised_by_first"], "o-", color=colour, label=label)
        right.plot(curve["batch_size"], curve["relative_to_dense"], "o-", color=colour, label=label)
    style_axes(left, "steps / steps at the smallest batch size", "normalised curves (same shape: same scaling)")
    _relative_axes(right, "cost of sparsity at each batch size")
    for axis in (left, right):
        axis.legend(fontsize=8, framealpha=0.9)
    figure.suptitle(f"{literal(workload)}, {literal(optimizer)}", fontsize=10)
    return save_figure(figure, directory, file_stem("sparsity", workload, optimizer), formats)


def pruning_figure(comparison: pd.DataFrame, workload: str, optimizer: str, sparsity: float,
                   directory: Path, formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    figure = draw_pruning(comparison, workload, optimizer, sparsity)
    return save_figure(figure, directory, file_stem("pruning", workload, optimizer, f"sp{sparsity:g}"), formats)


def draw_pruning(comparison: pd.DataFrame, workload: str, optimizer: str, sparsity: float) -> plt.Figure:
    """The methods at one sparsity beside the dense curve: a line per method and parameterization (a shuffled
    mask dashed, in its method's colour; supar dotted, with triangles)."""
    group = comparison[(comparison["workload"] == workload) & (comparison["optimizer"] == optimizer)
                       & np.isclose(comparison["sparsity"].astype(float), sparsity)]
    group = group.assign(parameterization=group.get("parameterization", Parameterization.SP.value))
    figure, (steps_axis, relative_axis, shape_axis) = plt.subplots(1, 3, figsize=(14.5, 4.4), layout="tight")
    dense = group.drop_duplicates("batch_size").sort_values("batch_size").dropna(subset=["dense_steps_to_result"])
    for axis, column in ((steps_axis, "dense_steps_to_result"), (shape_axis, "dense_normalised_by_first")):
        axis.plot(dense["batch_size"], dense[column], "o-", color="black", linewidth=2, label="dense")
    bases = sorted({m[len("shuffle("):-1] if m.startswith("shuffle(") else m for m in group["pruning"]})
    palette = dict(zip(bases, plt.cm.tab10(np.arange(len(bases)) % 10)))
    for (method, parameterization), curve in group.groupby(["pruning", "parameterization"], sort=True):
        shuffle, supar = method.startswith("shuffle("), parameterization != Parameterization.SP
        style = dict(color=palette[method[len("shuffle("):-1] if shuffle else method],
                     label=literal(method) + (f" {parameterization}" if supar else ""),
                     linestyle=("--" if shuffle else "-") if not supar else ("-." if shuffle else ":"),
                     marker="s" if shuffle else "^" if supar else "o")
        valid = curve.sort_values("batch_size").dropna(subset=["steps_to_result"])
        steps_axis.plot(valid["batch_size"], valid["steps_to_result"], **style)
        relative = valid.dropna(subset=["relative_to_dense"])
        relative_axis.plot(relative["batch_size"], relative["relative_to_dense"], **style)
        shape_axis.plot(valid["batch_size"], valid["normalised_by_first"], **style)
    style_axes(steps_axis, "steps to result", "steps to reach the goal")
    style_axes(shape_axis, "steps / steps at the smallest batch size", "normalised curves (same shape: same scaling)")
    _relative_axes(relative_axis, "cost of each method at each batch size")
    shape_axis.legend(fontsize=7, **LEGEND_BESIDE)
    dotted = ", dotted: supar" if (group["parameterization"] != Parameterization.SP).any() else ""
    figure.suptitle(f"{literal(workload)}, {literal(optimizer)}, sparsity {sparsity:g}: pruning methods against the "
                    f"dense network (dashed: the method's mask shuffled within each tensor{dotted})", fontsize=10)
    return figure


def lipschitz_figure(by_study: pd.DataFrame, directory: Path,
                     formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """The Lipschitz constant along each study's best trial's run (median over probe steps; bar: maximum)."""
    figure, axis = plt.subplots(figsize=(6.4, 4.4), layout="tight")
    by_study = with_curve_axes(by_study)
    several = several_methods(by_study)
    for key, group in by_study.groupby(list(CURVE_KEYS), sort=True):
        curve = dict(zip(CURVE_KEYS, key))
        group = group.sort_values("batch_size")
        median = group["lipschitz_median"].to_numpy()
        upper = group["lipschitz_max"].to_numpy() - median
        under = f", {curve['parameterization']}" if curve["parameterization"] != Parameterization.SP else ""
        axis.errorbar(group["batch_size"], median, yerr=np.vstack([np.zeros_like(median), upper]), fmt="o-",
                      capsize=3, label=f"{literal(curve['workload'])}, {literal(curve['optimizer'])}, "
                                        f"{curve_words(curve['sparsity'], literal(curve['pruning']), several)}{under}")
    style_axes(axis, "Lipschitz constant of the gradient", "along the best trial's run: median over probe steps (bar: "
          "maximum)", y_base=10, xlabel="batch size")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return save_figure(figure, directory, "lipschitz", formats)


def noise_scale_figure(table: pd.DataFrame, directory: Path, formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """The noise scale B_simple beside the fitted B_crit against sparsity (McCandlish et al.: B_crit ~ B_simple)."""
    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    table = with_curve_axes(table)
    several = several_methods(table)
    for (workload, optimizer, pruning), group in table.groupby(["workload", "optimizer", "pruning"], sort=True):
        group = group.sort_values("sparsity")
        method = literal(f", {pruning}" if several else "")
        median = group["b_simple_median"].to_numpy(dtype=float)
        spread = np.vstack([median - group["b_simple_p25"].to_numpy(dtype=float),
                            group["b_simple_p75"].to_numpy(dtype=float) - median])
        line = axis.errorbar(group["sparsity"], median, yerr=np.clip(spread, 0, None), fmt="o-", capsize=3,
                             label=f"B_simple, {literal(workload)}, {literal(optimizer)}{method}")
        b_crit = group["b_crit"].to_numpy(dtype=float)
        if np.isfinite(b_crit).any():
            axis.plot(group["sparsity"], b_crit, "s--", color=line[0].get_color(),
                      label=f"fitted B_crit, {literal(optimizer)}{method}")
    style_axes(axis, "batch size (examples)", "gradient noise scale (bars: quartiles over trials) and the fitted critical "
          "batch size", x_base=None, xlabel="sparsity (fraction of parameters pruned)")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return save_figure(figure, directory, "noise_scale", formats)


def _time_grid(count: int) -> tuple[plt.Figure, list[plt.Axes]]:
    """A figure of ``count`` panels, two across, each panel the same size in inches whatever their number."""
    across, rows = min(count, 2), -(-count // 2)
    # in inches: a panel; the gaps (the right panel's y label, a panel's title); the edges (the 3-line title)
    (width, height), (column_gap, row_gap), (left, right, bottom, top) = (5.4, 3.4), (1.0, 0.95), (0.8, 0.3, 0.6, 0.95)
    size = (left + across * width + (across - 1) * column_gap + right,
            bottom + rows * height + (rows - 1) * row_gap + top)
    figure, axes = plt.subplots(rows, across, figsize=size, squeeze=False)
    figure.subplots_adjust(left=left / size[0], right=1 - right / size[0], bottom=bottom / size[1],
                           top=1 - top / size[1], wspace=column_gap / width, hspace=row_gap / height)
    for axis in axes.flat[count:]:
        axis.remove()
    return figure, list(axes.flat[:count])


def time_figures(table: pd.DataFrame, directory: Path, cost: str,
                 formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """Time to result against batch size, log-log: a figure per workload and optimizer, a panel per curve, a line
    per device count, the fastest batch size starred; ``cost`` describes the cost model."""
    keys = [c for c in table.columns if c not in TIME_COLUMNS]
    paths: list[Path] = []
    for (workload, optimizer), group in table.groupby(["workload", "optimizer"], sort=True, dropna=False):
        panels = [(dict(zip(keys, key if isinstance(key, tuple) else (key,))), curve)
                  for key, curve in group.groupby(keys, sort=True, dropna=False)]
        protocol = [k for k in keys[len(CURVE_KEYS):] if len({str(head[k]) for head, _ in panels}) > 1]
        several = several_methods(with_curve_axes(group))
        measured_on = [str(curve["device"].dropna().iloc[0]) if curve["device"].notna().any()
                       else "an unrecorded device" for _, curve in panels]
        one_device = len(set(measured_on)) == 1
        counts = sorted(group["devices"].unique())
        colours = dict(zip(counts, plt.cm.plasma(np.linspace(0.0, 0.8, max(1, len(counts))))))
        figure, axes = _time_grid(len(panels))
        across = min(len(panels), 2)
        for index, ((head, curve), axis, device) in enumerate(zip(panels, axes, measured_on)):
            _time_panel(axis, curve, colours)
            if index + across >= len(panels):  # no panel below this one
                axis.set_xlabel("batch size (examples per step, all devices together)")
            sparsity, method = float(head["sparsity"]), str(head.get("pruning", "snip"))
            named = sparsity > 0 and (several or method != "snip")  # SNIP, the default, is named beside others
            words = [f"sparsity {sparsity:g}" + (f" {literal(method)}" if named else "")]
            words += [f"{k} {literal(head[k])}" for k in protocol]
            words += [] if one_device else [f"(one device: {literal(device)})"]
            axis.set_title(" ".join(words), fontsize=9)
            if index == across - 1:  # the legend beside the first row, off the data
                axis.legend(fontsize=8, **LEGEND_BESIDE)
        measured = f"one device: measured on {literal(measured_on[0])}" if one_device else "one device: measured"
        figure.suptitle(f"{literal(workload)}, {literal(optimizer)}: time to reach the goal (star: the fastest "
                        f"batch size)\n{measured}\nmore devices: {cost}", fontsize=8,
                        y=1.0 - 0.1 / figure.get_figheight(), va="top")
        paths += save_figure(figure, directory, file_stem("time", workload, optimizer), formats)
    return paths


def _time_panel(axis: plt.Axes, curve: pd.DataFrame, colours: dict) -> None:
    """One curve's hours against batch size, a line per device count, in the unit its times read best in."""
    hours = pd.to_numeric(curve["hours"], errors="coerce")
    drawn = curve.assign(hours=hours)[hours.notna()]
    unit, per_unit = duration_unit(float(hours.median())) if drawn.size else ("h", 1.0)
    lines = dict(list(drawn.groupby("devices", sort=True)))
    for count, colour in colours.items():
        if count not in lines:
            continue
        line = lines[count].sort_values("batch_size")
        axis.plot(line["batch_size"].to_numpy(), line["hours"].to_numpy(dtype=float) / per_unit, "o-",
                  color=colour, linewidth=1.6,
                  label=f"{count} device{'s' if count != 1 else ''}" + (" (measured)" if count == 1 else ""))
        best = line.loc[line["hours"].idxmin()]  # as analysis.timing.fastest_table finds it
        axis.plot([best["batch_size"]], [best["hours"] / per_unit], "*", color=colour, markersize=14,
                  markeredgecolor="black", markeredgewidth=0.6)
    style_axes(axis, f"time to result ({unit})", y_base=10, xlabel=None)


# The panels against the goal: (title, y label, the goal table's columns drawn with their intervals, marker, line)
_GOAL_PANELS = (("S_min", "steps", (("s_min", "o", "-"),)),
                ("B_crit", "examples per step", (("b_crit", "o", "-"),)),
                ("E_min = S_min B_crit", "examples", (("e_min", "o", "-"),)),
                ("threshold B_crit (ring: measured; triangle: fitted)", "examples per step",
                 (("b_crit_threshold", "o", "-"), ("b_crit_threshold_fit", "^", "--"))))


def _draw_against_goal(axis: plt.Axes, family: pd.DataFrame, column: str, marker: str, style: str,
                       colour: object, label: str | None) -> None:
    """A family's values of ``column`` against the goal with their 95% intervals as error bars (none where the
    fit table has none or it is practically unbounded; an interval that excludes its estimate: to the estimate)."""
    goal = family["goal"].to_numpy(dtype=float)
    value = pd.to_numeric(family[column], errors="coerce").to_numpy(dtype=float)
    bars = []
    for end, sign in (("low", 1.0), ("high", -1.0)):
        bound = pd.to_numeric(family.get(f"{column}_{end}", np.nan), errors="coerce")
        bound = np.array(bound, dtype=float) * np.ones(len(value))
        bound[(bound < value / UNBOUNDED_FACTOR) | (bound > value * UNBOUNDED_FACTOR)] = np.nan  # says nothing
        bars.append(np.clip(np.nan_to_num(sign * (value - bound), nan=0.0), 0.0, None))
    ring = column == "b_crit_threshold"
    axis.errorbar(goal, value, yerr=bars, fmt=marker + style, color=colour, label=label, capsize=3, linewidth=1.2,
                  markersize=9 if ring else 6, markerfacecolor="none" if ring else colour)


def goals_figure(goals: pd.DataFrame, workload: str, optimizer: str, directory: Path,
                 formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """S_min, B_crit, E_min and the threshold critical batch size against the goal, a line per family of curves
    (the goal table of analysis.regimes.goal_table), harder goals to the right (the axis decreases)."""
    group = goals[(goals["workload"] == workload) & (goals["optimizer"] == optimizer)]
    family = family_columns(group)
    varying = [c for c in family[len(CURVE_KEYS):] if group[c].nunique(dropna=False) > 1]
    lines = list(group.groupby(family, sort=True, dropna=False))
    colours = plt.cm.viridis(np.linspace(0.0, 0.85, max(1, len(lines))))
    several = several_methods(group)
    metric = group["goal_metric"].dropna()
    xlabel = f"goal ({metric.iloc[0]}; harder to the right)" if len(metric) else "goal (decreasing to the right)"
    figure, axes = plt.subplots(1, len(_GOAL_PANELS), figsize=(15.0, 3.8), layout="tight")
    for axis, (title, ylabel, drawn) in zip(axes, _GOAL_PANELS):
        for colour, (key, curve) in zip(colours, lines):
            label = " ".join([curve_words(key[2], literal(key[3]), several, key[4])]
                             + [f"{c} {literal(curve[c].iloc[0])}" for c in varying])
            for column, marker, style in drawn:
                _draw_against_goal(axis, curve.sort_values("goal"), column, marker, style, colour,
                                   label if column == drawn[0][0] else None)
        style_axes(axis, ylabel, title, x_base=10, y_base=10, xlabel=xlabel)
        axis.set_xticks(sorted(group["goal"].unique()), [_plain_number(g) for g in sorted(group["goal"].unique())])
        axis.xaxis.set_minor_formatter(plt.NullFormatter())
        axis.invert_xaxis()
    axes[0].legend(fontsize=7, framealpha=0.9)
    figure.suptitle(f"{literal(workload)}, {literal(optimizer)}: against the goal (bars: 95% bootstrap "
                    f"intervals; an end more than {UNBOUNDED_FACTOR:g}x from its value is left out)", fontsize=10)
    return save_figure(figure, directory, file_stem("goals", workload, optimizer), formats)
