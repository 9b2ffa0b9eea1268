"""What the tuning found (``edps-analyze tuning``): per curve, each best metaparameter of its studies against batch
size (the point rule over the replicates that reached), the log-log slope of the best learning rate in the
perfect-scaling regime with a bootstrap interval over replicates, and per batch size each sparse curve's best
learning rate relative to the dense curve's, under each parameterization (``sp``, ``supar``)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from analysis.bootstrap import Interval, percentile_interval
from analysis.intervals import Basis, grounds, resampled_points
from analysis.regimes import curve_columns, fit_of, fit_table, fit_value, matching, with_curve_axes
from analysis.replicates import MIN_REPLICATES, point_steps, replicate_steps, spread
from analysis.report import (TERMINAL_WIDTH, curve_words, end_words, several_methods, terminal_tables,
                             with_interval, wrapped)
from edps_mlflow.curves import TAG_DEFAULTS
from edps_mlflow.errors import EdpsError

PARAMETERIZATION = "parameterization"  # a curve axis (with_curve_axes fills it: "sp" where a table lacks it)
LEARNING_RATE = "best_learning_rate"
MIN_SLOPE_POINTS = 3  # two points always lie on a line: a slope of two says nothing about the power law


def tuned_columns(table: pd.DataFrame) -> list[str]:
    """The study table's best metaparameters (``best_<name>``) that hold a value somewhere, learning rate first."""
    found = [c for c in table.columns
             if c.startswith("best_") and pd.to_numeric(table[c], errors="coerce").notna().any()]
    return sorted(found, key=lambda c: c != LEARNING_RATE)


def tuning_input(table: pd.DataFrame) -> pd.DataFrame:
    """The study table with every curve axis (the parameterization among them); refused in one line where it has
    no best learning rates or no curve with two batch sizes."""
    table = with_curve_axes(table)
    if LEARNING_RATE not in tuned_columns(table):
        raise EdpsError("the studies have no best learning rate (column best_learning_rate; a study run records "
                        "it as the param best.learning_rate when a trial reaches the goal): nothing to analyse")
    if table.groupby(curve_columns(table), dropna=False)["batch_size"].nunique().max() < 2:
        sizes = ", ".join(map(str, sorted(table["batch_size"].unique())))
        raise EdpsError(f"every curve has one batch size only ({sizes}): the best learning rate against batch size "
                        f"needs two or more; measure more batch sizes")
    return table


def _reached_values(group: pd.DataFrame, column: str) -> pd.DataFrame:
    """``group`` with steps_to_result replaced by ``column``'s values of the replicates that reached (else NaN), so
    that the point rule (analysis.replicates) takes a metaparameter as it takes steps."""
    steps = pd.to_numeric(group["steps_to_result"], errors="coerce")
    return group.assign(steps_to_result=pd.to_numeric(group[column], errors="coerce").where(steps > 0))


def tuning_points(table: pd.DataFrame) -> pd.DataFrame:
    """One row per curve and batch size: its replicates, those that reached, and per best metaparameter the
    geometric mean over the replicates that reached (NaN where half or fewer did), with their min and max."""
    keys, columns, frames = curve_columns(table), tuned_columns(table), []
    for key, group in table.groupby(keys, sort=True, dropna=False):
        frame = point_steps(group)[["batch_size", "replicates", "replicates_reached"]].assign(**dict(zip(keys, key)))
        for column in columns:
            values = point_steps(_reached_values(group, column))
            frame[column], frame[f"{column}_min"], frame[f"{column}_max"] = (
                values["steps_to_result"], values["steps_min"], values["steps_max"])
        frames.append(frame)
    ordered = [*keys, "batch_size", "replicates", "replicates_reached",
               *(f"{c}{end}" for c in columns for end in ("", "_min", "_max"))]
    return pd.concat(frames, ignore_index=True)[ordered]


def log_slope(sizes: np.ndarray, values: np.ndarray) -> float:
    """The least-squares slope of log value against log batch size over the finite points; NaN below
    MIN_SLOPE_POINTS."""
    found = np.isfinite(values) & (values > 0)
    if found.sum() < MIN_SLOPE_POINTS:
        return math.nan
    # Rounded so that equal values give a slope of 0, not a float residue such as -2.95e-15.
    return round(float(np.polyfit(np.log(sizes[found]), np.log(values[found]), 1)[0]), 9) + 0.0


def _slope(replicates: dict[int, np.ndarray], lr: pd.Series, sizes: list[int], repeats: int, seed: int
           ) -> tuple[dict, str]:
    """The slope over ``sizes`` with its 95% percentile interval over resamples of their replicates (no censoring:
    a best learning rate is exact), on the house's grounds (analysis.intervals.grounds), or why none."""
    values = {"slope": log_slope(np.array(sizes, dtype=float), lr.reindex(sizes).to_numpy(float)),
              "slope_low": None, "slope_high": None, "interval_basis": ""}
    found = grounds({b: replicates[b] for b in sizes}, sizes, [])
    if found.basis is Basis.NONE:
        fewest = min(len(replicates[size]) for size in sizes)
        return values, (f"no slope interval: the fewest replicates at a point is {fewest} (an interval over "
                        f"replicates needs {MIN_REPLICATES} at every point); --replicates {MIN_REPLICATES} or more "
                        f"would give one")
    if repeats <= 0:
        return values, ""
    held = frozenset(b for b in sizes if found.basis is Basis.SOME_REPLICATES and len(replicates[b]) < MIN_REPLICATES)
    resampled = resampled_points({b: replicates[b] for b in sizes}, None, repeats, np.random.default_rng(seed), held)
    interval = percentile_interval([log_slope(np.array(sizes, dtype=float), row) for row in resampled], repeats)
    values.update(slope_low=interval.low, slope_high=interval.high, interval_basis=found.basis.value)
    if interval.low is None:
        return values, "no slope interval: fewer than a quarter of the resamples kept 3 points"
    return values, found.note


def slope_table(table: pd.DataFrame, points: pd.DataFrame, tolerance: float = 0.2, repeats: int = 200,
                seed: int = 0) -> pd.DataFrame:
    """Per curve: the log-log slope of the best learning rate against batch size over the points below the fit's
    perfect_scaling_end (all, where perfect scaling holds throughout), with its interval or why none; and over
    every batch size with a best learning rate, for comparison."""
    # the regime boundaries of each curve on its own (no intervals)
    keys, fits, rows = curve_columns(table), fit_table(table, None, tolerance, repeats=0), []
    for key, group in table.groupby(keys, sort=True, dropna=False):
        curve = dict(zip(keys, key))
        fit = fit_of(fits, curve)
        end = fit_value(fit, "perfect_scaling_end")
        replicates = replicate_steps(_reached_values(group, LEARNING_RATE))
        lr = points[matching(points, curve)].set_index("batch_size")[LEARNING_RATE]
        measured = [int(b) for b, v in lr.items() if np.isfinite(v)]
        regime = [b for b in measured if end is None or b < end]
        row = {**curve, "points": len(measured), "perfect_scaling_end": end, "regime_points": len(regime),
               "slope": math.nan, "slope_low": None, "slope_high": None, "interval_basis": ""}
        notes = [f"the regime is taken below the estimate {end:g} of perfect_scaling_end, which is {end_words(fit)}"
                 if fit is not None and end is not None and end_words(fit) != f"{end:g}" else ""]
        if len(regime) < MIN_SLOPE_POINTS:
            below = "every batch size" if end is None else f"batch sizes below {end:g}"
            notes.append(f"no slope: {len(regime)} point(s) lie in the perfect-scaling regime ({below}), a slope "
                         f"needs {MIN_SLOPE_POINTS}")
        else:
            values, note = _slope(replicates, lr, regime, repeats, seed)
            row.update(values)
            notes.append(note)
        if len(measured) >= MIN_SLOPE_POINTS:  # for comparison: every batch size, the regimes beyond included
            values, note = _slope(replicates, lr, measured, repeats, seed)
            row.update({name.replace("slope", "slope_all"): value for name, value in values.items()
                        if name != "interval_basis"})
            notes.append(note)
        row["note"] = "; ".join(dict.fromkeys(filter(None, notes)))
        rows.append(row)
    return pd.DataFrame(rows)


def _mean_ratio_interval(sparse: pd.DataFrame, dense: pd.DataFrame, repeats: int, seed: int) -> Interval:
    """The 95% percentile interval of the geometric mean ratio over the batch sizes both curves measured, over
    resamples of both curves' replicates; none unless every shared point has MIN_REPLICATES in both."""
    ours, theirs = (replicate_steps(_reached_values(rows, LEARNING_RATE)) for rows in (sparse, dense))
    shared = sorted(set(ours) & set(theirs))
    if repeats <= 0 or not shared or min(min(len(ours[b]), len(theirs[b])) for b in shared) < MIN_REPLICATES:
        return Interval(None, None)
    rng = np.random.default_rng(seed)
    ratios = resampled_points({b: ours[b] for b in shared}, None, repeats, rng) / resampled_points(
        {b: theirs[b] for b in shared}, None, repeats, rng)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a resample that lost every point: no mean
        return percentile_interval(np.exp(np.nanmean(np.log(ratios), axis=1)), repeats)


def sparsity_ratios(table: pd.DataFrame, points: pd.DataFrame, repeats: int = 200,
                    seed: int = 0) -> pd.DataFrame:
    """Per sparse curve and batch size: its best learning rate over the dense curve's of the same family (every
    curve column but the sparsity, the method and the parameterization) and parameterization; where a
    parameterization has no dense curve, the ``sp`` one's (SμPar changes nothing at density 1), said in
    ``reference``. Per curve too: the geometric mean ratio over batch sizes, with its 95% interval over
    replicates where both curves have MIN_REPLICATES at every shared point."""
    keys = curve_columns(table)
    family = [c for c in keys if c not in ("sparsity", "pruning", PARAMETERIZATION)]
    frames = []
    for head, group in points.groupby(family, sort=True, dropna=False):
        dense_rows = table[matching(table, dict(zip(family, head))) & (table["sparsity"] == 0.0)]
        dense_of = {name: part.groupby("batch_size")[LEARNING_RATE].first()
                    for name, part in group[group["sparsity"] == 0.0].groupby(PARAMETERIZATION)}
        for (name, _, _), sparse in group[group["sparsity"] > 0].groupby([PARAMETERIZATION, "sparsity", "pruning"]):
            reference = name if name in dense_of else TAG_DEFAULTS[PARAMETERIZATION]
            if reference not in dense_of:
                continue  # no dense curve at all: nothing to compare with
            dense = dense_of[reference].reindex(sparse["batch_size"]).to_numpy(float)
            ratio = sparse[LEARNING_RATE].to_numpy(float) / dense
            interval = _mean_ratio_interval(table[matching(table, sparse.iloc[0][keys].to_dict())],
                                            dense_rows[dense_rows[PARAMETERIZATION] == reference], repeats, seed)
            frames.append(sparse[[*keys, "batch_size", LEARNING_RATE]].assign(
                dense_learning_rate=dense, relative_to_dense=ratio, reference=f"dense {reference}",
                mean_ratio=float(np.exp(np.nanmean(np.log(ratio)))) if np.isfinite(ratio).any() else math.nan,
                mean_ratio_low=interval.low, mean_ratio_high=interval.high))
    columns = [*keys, "batch_size", LEARNING_RATE, "dense_learning_rate", "relative_to_dense", "reference",
               "mean_ratio", "mean_ratio_low", "mean_ratio_high"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def ratio_lines(ratios: pd.DataFrame) -> list[str]:
    """Per parameterization: how far the sparse curves' best learning rate moves from the dense one's: the
    geometric mean ratio per sparse curve with its interval, the range over batch sizes, and the factor the
    means span across the sparsities."""
    lines = []
    for name, part in ratios.dropna(subset=["relative_to_dense"]).groupby(PARAMETERIZATION, sort=True):
        logs = np.log(part["relative_to_dense"].to_numpy(float))
        by_curve = part.groupby(["sparsity", "pruning"], sort=True).first()
        means = [1.0, *by_curve["mean_ratio"]]  # the dense curve's own ratio is 1
        borrowed = (part["reference"] != f"dense {name}").any()
        bare = by_curve["mean_ratio_low"].isna().any()
        lines.append(
            f"{name}: sparse / dense best learning rate, geometric mean over batch sizes per sparse curve: "
            + ", ".join(f"{curve_words(s, m, several_methods(part)).removeprefix('sparsity ')}: "
                        f"{_times(with_interval(row, 'mean_ratio'))}" for (s, m), row in by_curve.iterrows())
            + f" (each point: {math.exp(logs.min()):.3g}x..{math.exp(logs.max()):.3g}x); across the sparsities, "
            f"dense included, the means span a factor {max(means) / min(means):.3g}"
            + (f"; no interval where a point has fewer than {MIN_REPLICATES} replicates" if bare else "")
            + ("; the dense reference is the sp curve: none was measured under this parameterization"
               if borrowed else ""))
    return lines


def _times(value: str) -> str:
    """``2.02x`` of ``2.02``; ``2.02x [1.97, 2.06]`` of ``2.02 [1.97, 2.06]``."""
    return value.replace(" [", "x [", 1) if " [" in value else f"{value}x"


def curve_label(row: pd.Series, varying: list[str], several: bool) -> str:
    return " ".join([curve_words(row["sparsity"], row["pruning"], several),
                     *(f"{_text(row[c])}" if c == PARAMETERIZATION else f"{c} {_text(row[c])}"
                       for c in varying)])


def _text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def varying_columns(table: pd.DataFrame) -> list[str]:
    """The curve columns beyond workload, optimizer, sparsity and method whose values differ in ``table``."""
    return [c for c in curve_columns(table) if c not in ("workload", "optimizer", "sparsity", "pruning")
            and table[c].nunique(dropna=False) > 1]


def _cell(row: pd.Series, column: str) -> str:
    """The point value, with its replicates' min..max (each to 3 digits) where two or more reached."""
    if not np.isfinite(row[column]):
        return "-"
    if row["replicates_reached"] < 2:
        return f"{row[column]:.3g}"
    fewest, most = (float(f"{row[f'{column}_{end}']:.3g}") for end in ("min", "max"))
    return f"{row[column]:.3g} ({spread(fewest, most)})"


def point_grids(points: pd.DataFrame) -> dict[tuple[str, str, str], pd.DataFrame]:
    """Per (workload, optimizer, best metaparameter): batch size down, curves across, each cell the point value
    with the replicates' min..max."""
    varying, several, grids = varying_columns(points), several_methods(points), {}
    columns = [c for c in tuned_columns(points) if not c.endswith(("_min", "_max"))]
    for (workload, optimizer), group in points.groupby(["workload", "optimizer"], sort=True):
        labels = group.apply(lambda row: curve_label(row, varying, several), axis=1)
        for column in columns:
            cells = group.assign(curve=labels, cell=[_cell(row, column) for _, row in group.iterrows()])
            grid = cells.pivot_table(index="batch_size", columns="curve", values="cell", aggfunc="first", sort=False)
            grid.index.name, grid.columns.name = "batch size", None
            grids[(workload, optimizer, column)] = grid.fillna("-")
    return grids


def slope_summary(slopes: pd.DataFrame) -> pd.DataFrame:
    """The slope table for people: curve, points, the regime, the slopes with their 95% intervals, notes."""
    varying, several = varying_columns(slopes), several_methods(slopes)
    return pd.DataFrame([{
        "workload": row["workload"], "optimizer": row["optimizer"], "curve": curve_label(row, varying, several),
        "points": row["points"], "perfect scaling below": _text(row["perfect_scaling_end"])
        if pd.notna(row["perfect_scaling_end"]) else "beyond",
        "in regime": row["regime_points"], "slope in regime": with_interval(row, "slope"),
        "slope, every B": with_interval(row, "slope_all") if "slope_all" in row else "-",
        "note": row["note"]} for _, row in slopes.iterrows()])


def tuning_text(source: str, points: pd.DataFrame, slopes: pd.DataFrame, ratios: pd.DataFrame) -> str:
    """What ``edps-analyze tuning`` prints: the point grids, the slopes with their notes, the ratios to dense."""
    blocks = [wrapped(f"Best metaparameters against batch size, from {source}: per point the geometric mean over "
                      f"the replicates that reached (in parentheses their min..max; '-': half or fewer reached).")]
    for (workload, optimizer, column), grid in point_grids(points).items():
        name = column.removeprefix("best_").replace("_", " ")
        blocks.append(f"{workload} / {optimizer}: {name}\n{grid.to_string(line_width=TERMINAL_WIDTH)}")
    blocks.append(wrapped("Log-log slope of the best learning rate against batch size (about 1 expected for SGD, "
                          "0.5 for Adam) over the points below the fit's perfect_scaling_end, and over every batch "
                          "size for comparison; brackets: 95% bootstrap intervals over replicates."))
    blocks.append(terminal_tables(slope_summary(slopes)))
    several, varying = several_methods(ratios), varying_columns(ratios)
    for (workload, optimizer), group in ratios.groupby(["workload", "optimizer"], sort=True):
        grid = group.assign(curve=group.apply(lambda row: curve_label(row, varying, several), axis=1)).pivot_table(
            index="batch_size", columns="curve", values="relative_to_dense", aggfunc="first", sort=False).sort_index()
        grid.index.name, grid.columns.name = "batch size", None
        blocks.append(f"{workload} / {optimizer}: best learning rate relative to the dense curve's\n"
                      + grid.map(lambda v: f"{v:.3g}x" if np.isfinite(v) else "-").to_string(line_width=TERMINAL_WIDTH)
                      + "\n" + "\n".join(wrapped(line, "- ", "  ") for line in ratio_lines(group)))
    return "\n\n".join(blocks)
