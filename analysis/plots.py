"""Figures from tidy tables only (no MLflow, no training): PNG and SVG, readable in print."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.layout_engine import PlaceHolderLayoutEngine  # noqa: E402
from matplotlib.ticker import Locator, LogFormatter  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from analysis import forked, png  # noqa: E402
from analysis.filenames import FIGURE_FORMATS, file_stem  # noqa: E402
from analysis.regimes import (  # noqa: E402
    CURVE_KEYS,
    curve_columns,
    curves,
    fit_table,
    is_degenerate,
    unbounded,
    with_curve_axes,
)
from analysis.report import curve_words, several_methods  # noqa: E402

REGIME_COLOURS = {"perfect scaling": "#d9ead3", "diminishing returns": "#fff2cc", "maximal data parallelism": "#f4cccc"}


def _literal(value: object) -> str:
    """A value read from the store or a CSV (a workload, an optimizer, a device) as text for a title or a
    legend: a '$' in it is a dollar sign, not the start of matplotlib's math mode (where a stray '^' or
    '\\frac' would fail the whole figure)."""
    return str(value).replace("$", r"\$")


def _plain_number(value: float) -> str:
    """A tick value as people write it: ``64``, ``0.5``, ``0.2``."""
    if float(value).is_integer() and abs(value) < 1e7:
        return str(int(value))
    if abs(value) >= 1e7:
        return f"{value:.4g}"
    return f"{value:.10g}"  # 1/64 is 0.015625, not 0.01562


class PlainLogFormatter(LogFormatter):
    """Labels the ticks that matplotlib's log formatter labels (the same choice of minor ticks on a short
    axis), as plain numbers instead of powers (``64``, not ``2^6``): the powers go through mathtext, whose
    parsing was a third of the time the report spent drawing."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return _plain_number(x) if super().__call__(x, pos) else ""


class InView(Locator):
    """The ticks of ``locator`` that lie within the axis's view. matplotlib makes, formats and lays out a tick
    (five artists) for every place its locator returns and draws only those in view; a log axis's locators
    return a decade and more on either side, about half the ticks of the report's figures and a fifth of the
    time spent drawing them."""

    # Relative, in data units: a tick a little beyond the view's end is kept, as matplotlib keeps it (it draws
    # ticks within 1e-10 of the view's width in log units, up to 1.5e-7 relative on the widest float axis);
    # a tick kept beyond what it draws is still left out by matplotlib.
    SLACK = 1e-6

    def __init__(self, locator: Locator) -> None:
        self.locator = locator

    def set_axis(self, axis) -> None:
        super().set_axis(axis)
        self.locator.set_axis(axis)

    def __call__(self) -> np.ndarray:
        low, high = sorted(self.axis.get_view_interval())
        places = np.asarray(self.locator(), dtype=float)
        return places[(places >= low - abs(low) * self.SLACK) & (places <= high + abs(high) * self.SLACK)]

    def tick_values(self, vmin: float, vmax: float) -> np.ndarray:
        return self.locator.tick_values(vmin, vmax)

    def nonsingular(self, v0: float, v1: float) -> tuple[float, float]:
        return self.locator.nonsingular(v0, v1)

    def view_limits(self, vmin: float, vmax: float) -> tuple[float, float]:
        return self.locator.view_limits(vmin, vmax)


def _log_scale(axis: plt.Axes, which: str, base: float = 10) -> None:
    """``which`` ("x" or "y") of ``axis`` on a log scale of ``base``, its ticks labelled by PlainLogFormatter
    (as matplotlib's log scale sets its own formatters: the minor ticks labelled only on a short axis), and
    made only where they are drawn (InView)."""
    (axis.set_xscale if which == "x" else axis.set_yscale)("log", base=base)
    ticks = axis.xaxis if which == "x" else axis.yaxis
    ticks.set_major_locator(InView(ticks.get_major_locator()))
    ticks.set_minor_locator(InView(ticks.get_minor_locator()))
    ticks.set_major_formatter(PlainLogFormatter(base))
    ticks.set_minor_formatter(PlainLogFormatter(base, labelOnlyBase=False))


def _set_title(axis: plt.Axes, text: str, **style: object) -> None:
    """The title of ``axis``, set once its y scale is. matplotlib places a title anew at each draw, measuring
    the y axis's tick labels for an offset text ("1e-5") to clear; a log axis has none (and no axis here has
    x ticks on top), so its title is fixed where that would place it, just above the axes, and each draw skips
    the measuring (a tenth of the time spent writing the figures)."""
    if axis.get_yscale() == "log":
        style["y"] = 1.0
    axis.set_title(text, **style)


def _log2_axes(axis: plt.Axes, ylabel: str) -> None:
    _log_scale(axis, "x", 2)
    _log_scale(axis, "y", 2)
    axis.set_xlabel("batch size (examples per step)")
    axis.set_ylabel(ylabel)
    axis.grid(True, which="major", alpha=0.3)


PNG_DPI = 150


def _tight_box(figure: plt.Figure) -> Bbox:
    """The box that savefig's bbox_inches="tight" crops the PNG of ``figure`` to, from a dry draw of its own:
    for the figures that :func:`_in_margin` cannot draw in a margin. It is measured at the PNG's resolution,
    as "tight" would, because hinted text is wider or narrower at another."""
    dpi = figure.dpi
    figure.set_dpi(PNG_DPI)
    try:
        figure.draw_without_rendering()  # places the titles, tick labels and legends that the box must hold
        return figure.get_tightbbox().padded(plt.rcParams["savefig.pad_inches"])
    finally:
        figure.set_dpi(dpi)


# The blank margin, in inches on every side, that a figure is drawn in before it is cropped to its ink: wide
# enough for a legend beside the axes with long labels. Only the crop is encoded; the margin costs a few
# milliseconds of clearing.
DRAW_MARGIN = 3.0


@contextmanager
def _in_margin(figure: plt.Figure) -> Iterator[bool]:
    """``figure`` grown by DRAW_MARGIN on every side with everything where it was, in inches from the axes (so
    that what "tight" would reach beyond the figure, a legend beside the axes, is drawn inside it); put back
    at the end. False, and left as it is, for a figure with parts this does not know how to move: a layout
    engine that places the axes at each draw, an axes locator, figure-level artists other than texts."""
    engine = figure.get_layout_engine()
    texts_movable = all(text.get_transform() == figure.transSubfigure for text in figure.texts)
    if (engine is not None and not isinstance(engine, PlaceHolderLayoutEngine)) or not texts_movable \
            or figure.legends or figure.artists or figure.lines or figure.patches or figure.images \
            or figure.subfigs or any(axis.get_axes_locator() is not None for axis in figure.axes):
        yield False
        return
    width, height = figure.get_size_inches()
    grown = width + 2 * DRAW_MARGIN, height + 2 * DRAW_MARGIN

    def moved(x: float, y: float) -> tuple[float, float]:  # figure fractions, the same place in inches
        return (x * width + DRAW_MARGIN) / grown[0], (y * height + DRAW_MARGIN) / grown[1]

    def moved_box(box: Bbox) -> Bbox:
        return Bbox([moved(box.x0, box.y0), moved(box.x1, box.y1)])

    places = [(axis, axis.get_position(original=True), axis.get_position(original=False)) for axis in figure.axes]
    spots = [(text, text.get_position()) for text in figure.texts]
    figure.set_size_inches(*grown, forward=False)
    for axis, original, active in places:
        axis.set_position(moved_box(original), which="original")
        axis.set_position(moved_box(active), which="active")
    for text, (x, y) in spots:
        text.set_position(moved(x, y))
    try:
        yield True
    finally:
        figure.set_size_inches(width, height, forward=False)
        for axis, original, active in places:
            axis.set_position(original, which="original")
            axis.set_position(active, which="active")
        for text, spot in spots:
            text.set_position(spot)


def _ink_box(pixels: np.ndarray, pad: int) -> tuple[int, int, int, int] | None:
    """(top, bottom, left, right) of what was drawn in ``pixels`` (RGBA rows; the background is the colour of
    its corner, where nothing is drawn), ``pad`` pixels wider on every side; None when the ink or its pad
    reaches the edge, where something may have been cut."""
    colours = np.ascontiguousarray(pixels).view(np.uint32)[:, :, 0]  # a pixel's four bytes as one number
    ink = colours != colours[0, 0]
    rows, columns = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    if not len(rows):
        return None
    top, bottom, left, right = rows[0] - pad, rows[-1] + 1 + pad, columns[0] - pad, columns[-1] + 1 + pad
    if top <= 0 or left <= 0 or bottom >= pixels.shape[0] or right >= pixels.shape[1]:
        return None
    return int(top), int(bottom), int(left), int(right)


def _loose_artists(figure: plt.Figure) -> list:
    """The parts of ``figure`` that may stand apart from the rest: texts, annotations and legends."""
    loose = list(figure.texts) + list(figure.legends)
    for axis in figure.axes:
        loose += list(axis.texts) + ([axis.get_legend()] if axis.get_legend() is not None else [])
    return loose


def _write_png_in_one_draw(figure: plt.Figure, paths: list[Path]) -> Bbox | None:
    """The PNG of ``figure`` (grown by :func:`_in_margin`) from one draw, cropped to its ink and the pad that
    savefig's bbox_inches="tight" leaves; the crop as a box in inches for the other files. "tight" lays the
    figure out in a dry draw before each file's, which was a third of the time spent writing; the ink is
    found by looking at the pixels instead. None when the ink reached the margin's end (nothing written)."""
    dpi, canvas = figure.dpi, figure.canvas
    figure.set_dpi(PNG_DPI)
    try:
        agg = FigureCanvasAgg(figure)
        agg.draw()
        pixels = np.asarray(agg.buffer_rgba())
        # A text or legend wholly beyond the margin leaves no ink to find: their boxes, laid out by the draw.
        renderer, canvas_box = agg.get_renderer(), figure.bbox
        beyond = any(not canvas_box.contains(box.x0, box.y0) or not canvas_box.contains(box.x1, box.y1)
                     for box in (artist.get_window_extent(renderer) for artist in _loose_artists(figure)))
    finally:
        figure.set_canvas(canvas)
        figure.set_dpi(dpi)
    crop = None if beyond else _ink_box(pixels, round(plt.rcParams["savefig.pad_inches"] * PNG_DPI))
    if crop is None:
        return None
    top, bottom, left, right = crop
    software = f"Matplotlib version{matplotlib.__version__}, https://matplotlib.org/"  # as matplotlib's PNGs say
    for path in paths:
        png.write(path, pixels[top:bottom, left:right], PNG_DPI, software)
    height = pixels.shape[0]
    return Bbox([[left / PNG_DPI, (height - bottom) / PNG_DPI], [right / PNG_DPI, (height - top) / PNG_DPI]])


def _write(figure: plt.Figure, paths: list[Path]) -> None:
    """``figure`` to ``paths`` (PNG at PNG_DPI, SVG), each cropped to the same box, the PNG's: its ink and pad
    from one draw in a margin, else "tight"'s box from a dry draw. The SVG gets that box rather than a dry
    draw of its own: on the report's figures its margins came out between 0.005 inch narrower and 0.18 inch
    wider than its own "tight" box would make them, well within the 0.1 inch pad, so nothing is cut."""
    pngs, others = [p for p in paths if p.suffix == ".png"], [p for p in paths if p.suffix != ".png"]
    with _in_margin(figure) as grown:
        box = _write_png_in_one_draw(figure, pngs) if grown else None
        if box is not None:
            for path in others:
                figure.savefig(path, bbox_inches=box)
            return
    box = _tight_box(figure)
    for path in pngs:
        figure.savefig(path, dpi=PNG_DPI, bbox_inches=box, pil_kwargs={"compress_level": 1})
    for path in others:
        figure.savefig(path, bbox_inches=box)


def _save(figure: plt.Figure, directory: Path, stem: str, formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """The files of ``figure`` in ``formats`` (of FIGURE_FORMATS), written now or by a child (analysis.forked)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{stem}.{suffix}" for suffix in formats]
    # Out of pyplot's list first: the figure is only written, never shown, and pickled without that list's
    # claim on it a child does not enter it in its own.
    plt.close(figure)
    forked.save(_write, figure, paths)
    return paths


def _fit_row(fits: pd.DataFrame | None, columns: list[str], key: tuple) -> pd.Series | None:
    """The fit of the curve ``key`` (its values of ``columns``), if the fits hold it."""
    if fits is None or not len(fits):
        return None
    match = pd.Series(True, index=fits.index)
    for column, value in zip(columns, key):
        if column not in fits.columns:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            match &= np.isclose(pd.to_numeric(fits[column], errors="coerce").astype(float), float(value))
        else:
            match &= fits[column].astype(str) == str(value)
    return fits[match].iloc[0] if match.any() else None


# How far the axes reach beyond the smallest and largest measured batch sizes (a factor on the log2 axis).
AXIS_MARGIN = 2 ** 0.4


def _x_limits(batch_sizes: np.ndarray) -> tuple[float, float]:
    """The batch-size axis follows the measured batch sizes (an interval beyond them is an arrow)."""
    return float(batch_sizes.min()) / AXIS_MARGIN, float(batch_sizes.max()) * AXIS_MARGIN


def _value(row: pd.Series | None, name: str) -> float | None:
    value = None if row is None else row.get(name)
    return float(value) if value is not None and pd.notna(value) else None


def _interval_words(value: float, low: float, high: float) -> str:
    """``95%: 1.8e-08 .. unbounded``: the interval as the legend says it, 'unbounded' for an end that is."""
    low_open, high_open = unbounded(value, low, high)
    words = (f"95%: {'unbounded' if low_open else f'{low:.3g}'} .. {'unbounded' if high_open else f'{high:.3g}'}")
    return words + ("; excludes the estimate" if not low <= value <= high else "")


def _edge_arrow(axis: plt.Axes, edge: float, y: float, side: int, text: str, colour: object) -> None:
    """An arrow at the axis edge (``side`` -1: left, +1: right) pointing out, with the value it stands for."""
    axis.annotate(text, xy=(edge, y), xytext=(-side * 30, 0), textcoords="offset points", fontsize=7,
                  ha="right" if side > 0 else "left", va="center", annotation_clip=False,
                  bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": colour, "alpha": 0.9},
                  arrowprops={"arrowstyle": "-|>", "color": colour, "linewidth": 1.2})


def _draw_fit(axis: plt.Axes, b: np.ndarray, s: np.ndarray, colour: object, row: pd.Series | None,
              label_interval: bool, limits: tuple[float, float]) -> list[float]:
    """The curve's fit from the fit table (``row``): the hyperbola, labelled with its values, and B_crit's
    interval as a horizontal bar at S(B_crit) = 2 S_min. A fit that does not describe its curve is drawn
    grey and says so, without its values. Within the axes the bar is drawn as it is, even when it does not
    contain the estimate (the legend says so); an end beyond the axes is an arrow at the edge with its
    value. Returns the y values drawn, for the axis limits."""
    s_min, b_crit = _value(row, "s_min"), _value(row, "b_crit")
    valid = np.isfinite(s) & (s > 0)
    if s_min is None or b_crit is None or not valid.any():
        return []
    grid = np.geomspace(b[valid].min(), b[valid].max(), 200)
    fitted = s_min * (1.0 + b_crit / grid)
    low, high = _value(row, "b_crit_low"), _value(row, "b_crit_high")
    degenerate = is_degenerate(row)
    if degenerate:
        label = "fit does not apply (see the fit's note)"
    else:
        label = f"fit: S_min {s_min:.3g}, B_crit {b_crit:.3g}"
        if low is not None and high is not None:
            label += f" ({_interval_words(b_crit, low, high)})"
    axis.plot(grid, fitted, "--", color="0.6" if degenerate else colour, linewidth=1.0, alpha=0.8, label=label)
    if degenerate or low is None or high is None:
        return list(fitted)
    y, (left, right) = 2 * s_min, limits
    inside = max(low, left), min(high, right)
    if inside[0] < inside[1]:
        axis.plot(list(inside), [y, y], "-", color=colour, linewidth=1.0,
                  label="B_crit's 95% interval (arrow: beyond the axis)" if label_interval else None)
    for end in (low, high):
        if left <= end <= right:
            axis.plot([end], [y], "|", color=colour, markersize=8)
    if left <= b_crit <= right:
        axis.plot([b_crit], [y], "D", color=colour, markersize=4)
    for end, edge, side in ((low, left, -1), (high, right, 1)):
        if (end < edge) if side < 0 else (end > edge):
            _edge_arrow(axis, edge, y, side, f"{end:.3g}", colour)
    if not left <= b_crit <= right:
        side = -1 if b_crit < left else 1
        _edge_arrow(axis, left if side < 0 else right, y * 1.25, side, f"B_crit {b_crit:.3g}", colour)
    return list(fitted) + [y]


def _mark_thresholds(axis: plt.Axes, b: np.ndarray, s: np.ndarray, colour: object, row: pd.Series | None,
                     label: bool, limits: tuple[float, float]) -> None:
    """The critical batch size in the threshold form (analysis.regimes): the measured one ringed on its point,
    the fitted hyperbola's value a triangle on the fitted curve (not drawn when the fit does not apply)."""
    measured = _value(row, "b_crit_threshold")
    if measured is not None and measured in b:
        axis.plot([measured], [s[b == measured][0]], "o", markersize=11, markerfacecolor="none", color=colour,
                  label="B_crit threshold, measured (largest within the tolerance)" if label else None)
    fitted, s_min, b_crit = _value(row, "b_crit_threshold_fit"), _value(row, "s_min"), _value(row, "b_crit")
    if None in (fitted, s_min, b_crit) or is_degenerate(row) or not limits[0] <= fitted <= limits[1]:
        return
    axis.plot([fitted], [s_min * (1.0 + b_crit / fitted)], "^", markersize=6, color=colour,
              label="B_crit threshold, fitted" if label else None)


def _shade_regimes(axis: plt.Axes, b: np.ndarray, row: pd.Series, limits: tuple[float, float]) -> None:
    """The regimes of a curve from its fit-table boundaries; a band changes halfway (on the log axis)
    between the last measured batch size of one regime and the first of the next, so each measured point
    lies in the band of its own regime."""
    left, right = limits
    end, start = _value(row, "perfect_scaling_end"), _value(row, "maximal_parallelism_start")

    def halfway_below(boundary: float) -> float:
        below = b[b < boundary]
        return float(np.sqrt(below.max() * boundary)) if len(below) else boundary

    perfect = halfway_below(end) if end is not None else right
    maximal = halfway_below(start) if start is not None else right
    perfect = min(perfect, maximal)
    axis.axvspan(left, perfect, color=REGIME_COLOURS["perfect scaling"], zorder=0, label="perfect scaling")
    if maximal > perfect:
        axis.axvspan(perfect, maximal, color=REGIME_COLOURS["diminishing returns"], zorder=0,
                     label="diminishing returns")
    if start is not None:
        axis.axvspan(maximal, right, color=REGIME_COLOURS["maximal data parallelism"], zorder=0,
                     label="maximal data parallelism")


def steps_figure(table: pd.DataFrame, workload: str, optimizer: str, directory: Path, tolerance: float = 0.2,
                 fits: pd.DataFrame | None = None, formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """The figure of :func:`draw_steps`, in ``formats`` (PNG and SVG) in ``directory``."""
    return _save(draw_steps(table, workload, optimizer, tolerance, fits), directory,
                 file_stem("steps", workload, optimizer), formats)


def draw_steps(table: pd.DataFrame, workload: str, optimizer: str, tolerance: float = 0.2,
               fits: pd.DataFrame | None = None) -> plt.Figure:
    """log2-log2 steps-to-result against batch size, one line per sparsity, fitted hyperbolas dashed and
    labelled with their values (grey when a fit does not apply), B_crit's interval, regimes of the densest
    curve shaded; the legend sits beside the axes, off the data. Fits, intervals and boundaries come from
    ``fits`` (the fit table), else from the fit table without intervals, so that every figure of a curve
    draws the fit that its table reports."""
    group = table[(table["workload"] == workload) & (table["optimizer"] == optimizer)]
    if fits is None:
        fits = fit_table(group, None, tolerance, repeats=0)
    figure, axis = plt.subplots(figsize=(8.4, 4.6))
    # One line per curve as the fits see it: studies of another protocol (goal, trials, check
    # interval, step cap) are another line, never joined to these.
    lines = curves(group)
    columns = curve_columns(with_curve_axes(group))
    varying = [i for i in range(len(CURVE_KEYS), len(columns)) if len({str(k[i]) for k in lines}) > 1]
    several = several_methods(with_curve_axes(group))
    colours = plt.cm.viridis(np.linspace(0.0, 0.85, max(1, len(lines))))
    limits = _x_limits(group["batch_size"].to_numpy(dtype=float))
    heights: list[float] = []
    shaded = False
    for colour, (key, curve) in zip(colours, lines.items()):
        b = curve["batch_size"].to_numpy(dtype=float)
        s = curve["steps_to_result"].to_numpy(dtype=float)
        valid = np.isfinite(s) & (s > 0)
        label = " ".join([curve_words(key[2], _literal(key[3]), several)]
                         + [f"{columns[i]} {_literal(key[i])}" for i in varying])
        axis.plot(b[valid], s[valid], "o-", color=colour, label=label, linewidth=1.6)
        heights += list(s[valid])
        row = _fit_row(fits, columns, key)
        heights += _draw_fit(axis, b, s, colour, row, not shaded, limits)
        _mark_thresholds(axis, b[valid], s[valid], colour, row, not shaded, limits)
        if not shaded and row is not None and valid.sum() >= 2:
            _shade_regimes(axis, b[valid], row, limits)
            shaded = True
    _log2_axes(axis, "steps to result")
    axis.set_xlim(*limits)
    if heights:
        axis.set_ylim(min(heights) / AXIS_MARGIN, max(heights) * AXIS_MARGIN)
    _set_title(axis, f"{_literal(workload)}, {_literal(optimizer)}: steps to reach the goal\n(dashed: fitted "
                     f"S_min (1 + B_crit / B); shading: regimes of the densest curve)", fontsize=9)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, framealpha=0.9)
    return figure


def comparison_figures(comparison: pd.DataFrame, workload: str, optimizer: str, directory: Path,
                       formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """Curves normalised by their first point, and steps relative to the dense curve."""
    group = comparison[(comparison["workload"] == workload) & (comparison["optimizer"] == optimizer)]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10.5, 4.2))
    # One line per sparsity, pruning method and protocol (the protocol columns that sparsity_comparison kept).
    keys = ["sparsity", "pruning"] + [c for c in curve_columns(group)[len(CURVE_KEYS):]
                                      if group[c].nunique(dropna=False) > 1]
    lines = list(group.groupby(keys, sort=True, dropna=False))
    colours = plt.cm.viridis(np.linspace(0.0, 0.85, max(1, len(lines))))
    several = several_methods(group)
    for colour, (key, curve) in zip(colours, lines):
        label = " ".join([curve_words(key[0], _literal(key[1]), several)]
                         + [f"{c} {_literal(v)}" for c, v in zip(keys[2:], key[2:])])
        curve = curve.sort_values("batch_size").dropna(subset=["steps_to_result"])
        left.plot(curve["batch_size"], curve["normalised_by_first"], "o-", color=colour, label=label)
        right.plot(curve["batch_size"], curve["relative_to_dense"], "o-", color=colour, label=label)
    _log2_axes(left, "steps / steps at the smallest batch size")
    _set_title(left, "normalised curves (same shape: same scaling)", fontsize=9)
    _log_scale(right, "x", 2)
    right.set_xlabel("batch size (examples per step)")
    right.set_ylabel("steps relative to the dense network")
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.grid(True, alpha=0.3)
    _set_title(right, "cost of sparsity at each batch size", fontsize=9)
    for axis in (left, right):
        axis.legend(fontsize=8, framealpha=0.9)
    figure.suptitle(f"{_literal(workload)}, {_literal(optimizer)}", fontsize=10)
    # Fixed margins rather than tight_layout, which measured every label of both axes (a tenth of a second a
    # figure, in the process that draws the next): the labels here are the same but for their numbers, and
    # the file is cropped to what was drawn, whatever the margins (_write).
    figure.subplots_adjust(left=0.08, right=0.98, bottom=0.13, top=0.85, wspace=0.3)
    return _save(figure, directory, file_stem("sparsity", workload, optimizer), formats)


def pruning_figure(comparison: pd.DataFrame, workload: str, optimizer: str, sparsity: float,
                   directory: Path, formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """The methods at one sparsity beside the dense curve (analysis.pruning_methods): steps-to-result against
    batch size, steps relative to dense, and each curve normalised by its first point (a shuffled mask dashed,
    in its method's colour)."""
    group = comparison[(comparison["workload"] == workload) & (comparison["optimizer"] == optimizer)
                       & np.isclose(comparison["sparsity"].astype(float), sparsity)]
    figure, (steps_axis, relative_axis, shape_axis) = plt.subplots(1, 3, figsize=(14.5, 4.4))
    dense = group.drop_duplicates("batch_size").sort_values("batch_size").dropna(subset=["dense_steps_to_result"])
    steps_axis.plot(dense["batch_size"], dense["dense_steps_to_result"], "o-", color="black", linewidth=2,
                    label="dense")
    shape_axis.plot(dense["batch_size"], dense["dense_normalised_by_first"], "o-", color="black", linewidth=2,
                    label="dense")
    bases = sorted({m[len("shuffle("):-1] if m.startswith("shuffle(") else m for m in group["pruning"]})
    palette = dict(zip(bases, plt.cm.tab10(np.arange(len(bases)) % 10)))
    for method, curve in group.groupby("pruning", sort=True):
        shuffle = method.startswith("shuffle(")
        colour = palette[method[len("shuffle("):-1] if shuffle else method]
        style = dict(color=colour, linestyle="--" if shuffle else "-", marker="s" if shuffle else "o",
                     label=_literal(method))
        curve = curve.sort_values("batch_size")
        valid = curve.dropna(subset=["steps_to_result"])
        steps_axis.plot(valid["batch_size"], valid["steps_to_result"], **style)
        relative = valid.dropna(subset=["relative_to_dense"])
        relative_axis.plot(relative["batch_size"], relative["relative_to_dense"], **style)
        shape_axis.plot(valid["batch_size"], valid["normalised_by_first"], **style)
    _log2_axes(steps_axis, "steps to result")
    _log2_axes(shape_axis, "steps / steps at the smallest batch size")
    _log_scale(relative_axis, "x", 2)
    for axis in (steps_axis, relative_axis, shape_axis):
        drawn = [y for line in axis.get_lines() for y in np.asarray(line.get_ydata(), dtype=float)]
        if not any(np.isfinite(y) and y > 0 for y in drawn):  # nothing reached the goal: nothing to put on a log axis
            axis.set_xscale("linear")
            axis.set_yscale("linear")
    _set_title(steps_axis, "steps to reach the goal", fontsize=9)
    relative_axis.set_xlabel("batch size (examples per step)")
    relative_axis.set_ylabel("steps relative to the dense network")
    relative_axis.axhline(1.0, color="grey", linewidth=0.8)
    relative_axis.grid(True, alpha=0.3)
    _set_title(relative_axis, "cost of each method at each batch size", fontsize=9)
    _set_title(shape_axis, "normalised curves (same shape: same scaling)", fontsize=9)
    shape_axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, framealpha=0.9)
    figure.suptitle(f"{_literal(workload)}, {_literal(optimizer)}, sparsity {sparsity:g}: pruning methods against the "
                    f"dense network (dashed: the method's mask shuffled within each tensor)", fontsize=10)
    figure.tight_layout()
    return _save(figure, directory, file_stem("pruning", workload, optimizer, f"sp{sparsity:g}"), formats)


def lipschitz_figure(by_study: pd.DataFrame, directory: Path,
                     formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """The Lipschitz constant along each study's best trial's run against batch size, one line per
    sparsity (markers: the median over probe steps; bars reach the maximum)."""
    figure, axis = plt.subplots(figsize=(6.4, 4.4))
    by_study = with_curve_axes(by_study)
    several = several_methods(by_study)
    for (workload, optimizer, sparsity, pruning), group in by_study.groupby(list(CURVE_KEYS), sort=True):
        group = group.sort_values("batch_size")
        median = group["lipschitz_median"].to_numpy()
        upper = group["lipschitz_max"].to_numpy() - median
        axis.errorbar(group["batch_size"], median, yerr=np.vstack([np.zeros_like(median), upper]), fmt="o-",
                      capsize=3, label=f"{_literal(workload)}, {_literal(optimizer)}, "
                                        f"{curve_words(sparsity, _literal(pruning), several)}")
    _log_scale(axis, "x", 2)
    _log_scale(axis, "y")
    axis.set_xlabel("batch size")
    axis.set_ylabel("Lipschitz constant of the gradient")
    _set_title(axis, "along the best trial's run: median over probe steps (bar: maximum)", fontsize=9)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    figure.tight_layout()
    return _save(figure, directory, "lipschitz", formats)


def noise_scale_figure(table: pd.DataFrame, directory: Path,
                       formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """The measured noise scale B_simple (median and quartiles over trials) beside the fitted B_crit,
    against sparsity: McCandlish et al. predict B_crit ~ B_simple."""
    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    table = with_curve_axes(table)
    several = several_methods(table)
    for (workload, optimizer, pruning), group in table.groupby(["workload", "optimizer", "pruning"], sort=True):
        group = group.sort_values("sparsity")
        method = f", {pruning}" if several else ""
        median = group["b_simple_median"].to_numpy(dtype=float)
        spread = np.vstack([median - group["b_simple_p25"].to_numpy(dtype=float),
                            group["b_simple_p75"].to_numpy(dtype=float) - median])
        line = axis.errorbar(group["sparsity"], median, yerr=np.clip(spread, 0, None), fmt="o-", capsize=3,
                             label=f"B_simple, {_literal(workload)}, {_literal(optimizer)}{_literal(method)}")
        b_crit = group["b_crit"].to_numpy(dtype=float)
        if np.isfinite(b_crit).any():
            axis.plot(group["sparsity"], b_crit, "s--", color=line[0].get_color(),
                      label=f"fitted B_crit, {_literal(optimizer)}{_literal(method)}")
    _log_scale(axis, "y", 2)
    axis.set_xlabel("sparsity (fraction of parameters pruned)")
    axis.set_ylabel("batch size (examples)")
    _set_title(axis, "gradient noise scale (bars: quartiles over trials) and the fitted critical batch size",
               fontsize=9)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return _save(figure, directory, "noise_scale", formats)


# The time figures' grid, in inches: a panel per curve, two across, the cost model above them all.
TIME_PANEL = (5.4, 3.4)  # width, height of one panel's axes
TIME_GAPS = (1.0, 0.95)  # between columns (the right panel's y label), between rows (a panel's title)
TIME_EDGES = (0.8, 0.3, 0.6, 0.95)  # left, right, bottom, top (the figure's three-line title)
TIME_PANELS_ACROSS = 2


def _panel_boxes(count: int) -> tuple[tuple[float, float], list[tuple[float, float, float, float]]]:
    """The figure size and, per panel in reading order, its axes as [left, bottom, width, height] fractions."""
    across = min(count, TIME_PANELS_ACROSS)
    rows = -(-count // across)
    (width, height), (column_gap, row_gap), (left, right, bottom, top) = TIME_PANEL, TIME_GAPS, TIME_EDGES
    size = (left + across * width + (across - 1) * column_gap + right,
            bottom + rows * height + (rows - 1) * row_gap + top)
    boxes = []
    for index in range(count):
        row, column = divmod(index, across)
        x = left + column * (width + column_gap)
        y = bottom + (rows - 1 - row) * (height + row_gap)
        boxes.append((x / size[0], y / size[1], width / size[0], height / size[1]))
    return size, boxes


def time_figures(table: pd.DataFrame, fastest: pd.DataFrame, directory: Path, cost: str,
                 formats: tuple[str, ...] = FIGURE_FORMATS) -> list[Path]:
    """Time to result against batch size, log-log: one figure per workload and optimizer, as the steps
    figures are, with a panel per curve (sparsity, pruning method, protocol) in the unit (s, min, h, days)
    its times read best in, one line per device count, each line's fastest batch size starred. ``table``
    and ``fastest`` come from analysis.timing; ``cost`` describes the cost model for the title."""
    from analysis.timing import TIME_COLUMNS, duration_unit

    keys = [c for c in table.columns if c not in TIME_COLUMNS]
    # (the curve's values as text, device count) -> the fastest batch size and its hours; looked up, not
    # filtered for, per line (a filter of the whole table per line was most of the time spent drawing these)
    curve_texts = zip(*(fastest[k].astype(str) for k in keys)) if len(fastest) else iter(())
    stars = {(text, count): (batch, hours) for text, count, batch, hours
             in zip(curve_texts, fastest["devices"], fastest["batch_size"], fastest["hours"])}
    paths: list[Path] = []
    for (workload, optimizer), group in table.groupby(["workload", "optimizer"], sort=True, dropna=False):
        panels = list(group.groupby(keys, sort=True, dropna=False))
        heads = [dict(zip(keys, key if isinstance(key, tuple) else (key,))) for key, _ in panels]
        protocol = [k for k in keys[len(CURVE_KEYS):] if len({str(head[k]) for head in heads}) > 1]
        several = several_methods(with_curve_axes(group))
        measured_on = [str(curve["device"].dropna().iloc[0]) if curve["device"].notna().any()
                       else "an unrecorded device" for _, curve in panels]
        one_device = len(set(measured_on)) == 1
        counts = sorted(group["devices"].unique())
        colours = dict(zip(counts, plt.cm.plasma(np.linspace(0.0, 0.8, max(1, len(counts))))))
        size, boxes = _panel_boxes(len(panels))
        figure = plt.figure(figsize=size)
        across = min(len(panels), TIME_PANELS_ACROSS)
        for index, ((_, curve), head, box, device) in enumerate(zip(panels, heads, boxes, measured_on)):
            axis = figure.add_axes(box)
            hours = pd.to_numeric(curve["hours"], errors="coerce")
            drawn = curve.assign(hours=hours)[hours.notna()]
            unit, per_unit = duration_unit(float(hours.median())) if drawn.size else ("h", 1.0)
            lines = dict(list(drawn.groupby("devices", sort=True)))
            curve_text = tuple(str(value) for value in head.values())
            for count in counts:
                if count not in lines:
                    continue
                line = lines[count].sort_values("batch_size")
                axis.plot(line["batch_size"].to_numpy(), line["hours"].to_numpy(dtype=float) / per_unit, "o-",
                          color=colours[count], linewidth=1.6,
                          label=f"{count} device{'s' if count != 1 else ''}" + (" (measured)" if count == 1 else ""))
                batch, best = stars.get((curve_text, count), (None, None))
                if best is not None and pd.notna(best):
                    axis.plot([batch], [best / per_unit], "*", color=colours[count], markersize=14,
                              markeredgecolor="black", markeredgewidth=0.6)
            _log_scale(axis, "x", 2)
            _log_scale(axis, "y")
            if index + across >= len(panels):  # no panel below this one
                axis.set_xlabel("batch size (examples per step, all devices together)")
            axis.set_ylabel(f"time to result ({unit})")
            axis.grid(True, which="major", alpha=0.3)
            sparsity, method = float(head["sparsity"]), str(head.get("pruning", "snip"))
            # the method is named beside others, and always when it is not SNIP, the default
            named = sparsity > 0 and (several or method != "snip")
            words = [f"sparsity {sparsity:g}" + (f" {_literal(method)}" if named else "")]
            words += [f"{k} {_literal(head[k])}" for k in protocol]
            if not one_device:
                words.append(f"(one device: {_literal(device)})")
            _set_title(axis, " ".join(words), fontsize=9)
            if index == across - 1:  # the legend beside the first row, off the data
                axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                            framealpha=0.9)
        measured = f"one device: measured on {_literal(measured_on[0])}" if one_device else "one device: measured"
        figure.suptitle(f"{_literal(workload)}, {_literal(optimizer)}: time to reach the goal (star: the fastest "
                        f"batch size)\n{measured}\nmore devices: {cost}", fontsize=8,
                        y=1.0 - 0.1 / size[1], va="top")
        paths += _save(figure, directory, file_stem("time", workload, optimizer), formats)
    return paths
