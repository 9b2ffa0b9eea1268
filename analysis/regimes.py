"""The study table as curves, and the fit table: per curve its hyperbola, regime boundaries, threshold critical
batch size and bootstrap intervals (analysis.fits, analysis.bootstrap; docs/fit.md), with notes that say when
a fit does not mean what it seems; the same against the goal (goal_table); and the sparsity comparison."""

from __future__ import annotations

import math
from contextlib import suppress
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.bootstrap import (Interval, StudyOutcomes, bootstrap, interval_basis, interval_basis_warning,
                                outcomes_by_study)
from analysis.censoring import CENSORED_COLUMNS, threshold_censoring
from analysis.fits import (HyperbolaFit, InsufficientData, fit_hyperbola, fitted_threshold, local_slopes,
                           points, regime_boundaries, threshold_critical_batch)
from analysis.intervals import (NO_FIT_INTERVALS, Basis, collapsed, drop_collapsed, grounds, open_interval,
                                point_intervals, replicate_bootstrap, resampled_points)
from analysis.replicates import (MIN_REPLICATES, POINT_COLUMNS, check_interval, point_steps, point_value,
                                 replicate_steps)
from edps_mlflow.curves import CURVE_AXES, TAG_DEFAULTS

CURVE_KEYS = CURVE_AXES  # what identifies a curve (edps_mlflow.curves.CurveId), declared there once
# Studies of another goal, trial count, check interval or step cap measure something else: where a table has
# these columns, their values are part of a curve's identity.
PROTOCOL_KEYS = ("goal", "trials_total", "check_interval", "max_steps")
UNBOUNDED_FACTOR = 100.0  # an interval end this far from its estimate says nothing about where the value is
# An interval end equal to its estimate up to the fit's precision (about 1e-8 in log space) contains it.
CONTAINS_TOLERANCE = 1e-6


def with_curve_axes(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with every curve axis as a column: a row made before an axis existed (a CSV without
    ``pruning``, or with the cell empty) was measured at its default (curves.TAG_DEFAULTS: SNIP); and its goal,
    where a row has only ``goal_error`` (older tables), from that."""
    filled = {axis: table[axis].fillna(default) if axis in table.columns else default
              for axis, default in TAG_DEFAULTS.items()
              if axis not in table.columns or table[axis].isna().any()}
    if "goal_error" in table.columns and ("goal" not in table.columns or table["goal"].isna().any()):
        goal = table["goal"] if "goal" in table.columns else pd.Series(np.nan, index=table.index)
        filled["goal"] = pd.to_numeric(goal, errors="coerce").fillna(
            pd.to_numeric(table["goal_error"], errors="coerce"))
    return table.assign(**filled) if filled else table


def dense_in_every_parameterization(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (with its curve axes) with its dense studies once more under each other parameterisation it
    holds: StudySpec spells the dense study "sp", which SμPar's sparse curves are compared with too."""
    dense = table[table["sparsity"] == 0.0]
    others = [p for p in table["parameterization"].unique() if p != TAG_DEFAULTS["parameterization"]]
    return pd.concat([table, *(dense.assign(parameterization=p) for p in others)], ignore_index=True) \
        if len(dense) and others else table


def curve_columns(table: pd.DataFrame) -> list[str]:
    """The columns that identify a curve in ``table``: CURVE_KEYS, then the protocol columns it holds."""
    return list(CURVE_KEYS) + [k for k in PROTOCOL_KEYS if k in table.columns and table[k].notna().any()]


def curves(table: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    """Study rows grouped per curve (the values of :func:`curve_columns`), sorted by batch size."""
    table = with_curve_axes(table)
    groups = table.groupby(curve_columns(table), sort=True, dropna=False)
    return {key: group.sort_values("batch_size") for key, group in groups}


def matching(table: pd.DataFrame, values: dict) -> pd.Series:
    """The rows of ``table`` with these values in the columns it has (numbers compared as floats are)."""
    match = pd.Series(True, index=table.index)
    for column, value in ((c, v) for c, v in values.items() if c in table.columns):
        if isinstance(value, float) and math.isnan(value):
            match &= table[column].isna()
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            match &= np.isclose(pd.to_numeric(table[column], errors="coerce").astype(float), float(value))
        else:
            match &= table[column].astype(str) == str(value)
    return match


def fit_of(fits: pd.DataFrame | None, curve: dict) -> pd.Series | None:
    """The row of ``fits`` of the curve with these column values, if any."""
    if fits is None or not len(fits):
        return None
    fits = with_curve_axes(fits)
    match = matching(fits, curve)
    return fits[match].iloc[0] if match.any() else None


def fit_value(row: pd.Series | dict | None, name: str) -> float | None:
    """A number of a fit-table row; None when the row or the value is missing."""
    value = None if row is None else row.get(name)
    return None if value is None or pd.isna(value) else float(value)


def _add_note(row: dict, note: str) -> None:
    row["note"] = f"{row['note']}; {note}" if row["note"] else note


def _curve_row(key: tuple, columns: list[str], siblings: list[tuple], b: np.ndarray, s: np.ndarray,
               tolerance: float) -> tuple[dict, HyperbolaFit | None]:
    """One curve's row of the fit table from its points (batch sizes ``b``, steps ``s``) without intervals, and its
    fit (None: too few points)."""
    base = len(CURVE_KEYS)
    row: dict = {**dict(zip(columns, key)), "points": int(np.isfinite(s).sum()), "note": ""}
    if len(siblings) > 1:
        differing = [c for i, c in enumerate(columns[base:], base) if len({str(k[i]) for k in siblings}) > 1]
        row["note"] = (f"one of {len(siblings)} curves of this workload, optimizer, sparsity and pruning method: "
                       f"the studies differ in {', '.join(differing)}")
    fit = None
    try:
        fit = fit_hyperbola(b, s)
        row.update({"s_min": fit.s_min, "b_crit": fit.b_crit, "e_min": fit.e_min, "rmse_log": fit.rmse_log,
                    "r2_log": fit.r2_log,
                    "b_crit_threshold_fit": fitted_threshold(fit, points(b, s)[0][0], tolerance)})
    except InsufficientData as error:
        _add_note(row, f"no fit: {error}")
    with suppress(InsufficientData):
        bounds = regime_boundaries(b, s, tolerance)
        row.update({"perfect_scaling_end": bounds.perfect_scaling_end,
                    "maximal_parallelism_start": bounds.maximal_parallelism_start,
                    "b_crit_threshold": threshold_critical_batch(b, s, tolerance)})
    row["slopes"] = " ".join(f"{lo}-{hi}:{slope:+.2f}" for lo, hi, slope in local_slopes(b, s))
    return row, fit


@dataclass(frozen=True)
class _Curve:
    """One curve's studies as the intervals read them."""
    group: pd.DataFrame
    replicates: dict[int, np.ndarray]
    check: int | None
    smallest: float  # the smallest batch size with a result


def _add_intervals(row: dict, curve: _Curve, fit: HyperbolaFit, trials_of: dict[str, StudyOutcomes] | None,
                   tolerance: float, repeats: int, seed: int) -> None:
    """The intervals on the grounds the curve has (analysis.intervals.grounds), or the note says why none."""
    fitted = [size for size, steps in curve.replicates.items() if math.isfinite(point_value(steps))]
    keys = curve.group["study_key"] if "study_key" in curve.group.columns else pd.Series(None, index=curve.group.index)
    outcomes = [] if trials_of is None else [trials_of.get(str(k)) if pd.notna(k) else None for k in keys]
    found = grounds(curve.replicates, fitted, outcomes)
    row["interval_basis"] = found.basis.value
    row["interval_replicates"] = min(len(curve.replicates[size]) for size in fitted)
    if found.basis is Basis.NONE:
        _add_note(row, found.note)
        return
    if found.basis is Basis.SOME_REPLICATES:
        _add_note(row, found.note)
    if found.basis in (Basis.REPLICATES, Basis.SOME_REPLICATES):
        # replicates at some points: the others (two replicates included) held at their values, as the note says
        held = frozenset(size for size, steps in curve.replicates.items()
                         if found.basis is Basis.SOME_REPLICATES and len(steps) < MIN_REPLICATES)
        intervals = replicate_bootstrap(curve.replicates, curve.check, repeats, seed, tolerance, held)
    else:
        pairs = list(zip(curve.group["batch_size"].astype(int), outcomes))
        intervals = bootstrap(pairs, repeats, seed, tolerance, fit, curve.check)
        row.update(interval_basis(pairs))
    for name, interval in intervals.items():
        row[f"{name}_low"], row[f"{name}_high"] = interval.low, interval.high
    if intervals["s_min"].low is None:
        _add_note(row, NO_FIT_INTERVALS)
    if row.get("b_crit_low") is not None:  # the fitted threshold increases with B_crit at the measured B_0
        for end in ("low", "high"):
            row[f"b_crit_threshold_fit_{end}"] = fitted_threshold(
                HyperbolaFit(fit.s_min, row[f"b_crit_{end}"], fit.rmse_log, fit.r2_log), curve.smallest, tolerance)
    for reason in drop_collapsed(row, (*intervals, "b_crit_threshold_fit")):
        _add_note(row, reason)


def fit_table(table: pd.DataFrame, trials: pd.DataFrame | None = None, tolerance: float = 0.2,
              repeats: int = 200, seed: int = 0) -> pd.DataFrame:
    """One row per curve from its points (the point rule over each batch size's replicates): hyperbola,
    boundaries, the threshold under censoring, intervals (``repeats`` > 0) where replicates or complete trials
    give them, or why not."""
    table = with_curve_axes(table)
    columns, grouped = curve_columns(table), curves(table)
    trials_of = outcomes_by_study(trials) if trials is not None and len(trials) else None
    rows = []
    for key, group in grouped.items():
        siblings = [other for other in grouped if other[:len(CURVE_KEYS)] == key[:len(CURVE_KEYS)]]
        replicates = replicate_steps(group)
        b, s = np.array(sorted(replicates), dtype=float), np.array([point_value(replicates[k]) for k in
                                                                    sorted(replicates)])
        row, fit = _curve_row(key, columns, siblings, b, s, tolerance)
        curve = _Curve(group, replicates, check_interval(group), points(b, s)[0][0] if np.isfinite(s).any() else 0)
        censoring = threshold_censoring(replicates, curve.check, tolerance)
        if censoring is not None:
            row.update(censoring.columns())
            if not censoring.decided:
                _add_note(row, censoring.words())
        if repeats > 0 and fit is not None:
            _add_intervals(row, curve, fit, trials_of, tolerance, repeats, seed)
        row["note"] = "; ".join([part for part in (row["note"],) if part] + fit_warnings(row, b, s))
        rows.append(row)
    return pd.DataFrame(rows)


def point_table(table: pd.DataFrame, repeats: int = 200, seed: int = 0) -> pd.DataFrame:
    """One row per curve and batch size (analysis.replicates.POINT_COLUMNS) with steps_to_result_low/high where
    the point has MIN_REPLICATES replicates (the resamples of the fit table's replicate bootstrap)."""
    table = with_curve_axes(table)
    columns, frames = curve_columns(table), []
    for key, group in curves(table).items():
        frame = point_steps(group).assign(**dict(zip(columns, key)))
        replicates = replicate_steps(group)
        if repeats > 0:
            resampled = resampled_points(replicates, check_interval(group), repeats, np.random.default_rng(seed))
            found = point_intervals(replicates, resampled, repeats)
            frame["steps_to_result_low"] = [found[size].low for size in frame["batch_size"]]
            frame["steps_to_result_high"] = [found[size].high for size in frame["batch_size"]]
            for i in frame.index:
                if collapsed(frame.at[i, "steps_to_result_low"], frame.at[i, "steps_to_result_high"]):
                    frame.loc[i, ["steps_to_result_low", "steps_to_result_high"]] = None
        frames.append(frame)
    ordered = [*columns, *POINT_COLUMNS, "steps_to_result_low", "steps_to_result_high"]
    return pd.concat(frames, ignore_index=True).reindex(columns=ordered) if frames else pd.DataFrame(columns=ordered)


# What is shown against the goal: each with its interval (<name>_low, <name>_high) where the fit table has one.
GOAL_VALUES = ("s_min", "b_crit", "e_min", "b_crit_threshold", "b_crit_threshold_fit")


def family_columns(fits: pd.DataFrame) -> list[str]:
    """What identifies a family of curves: every curve column but the goal."""
    return [column for column in curve_columns(with_curve_axes(fits)) if column != "goal"]


def goal_table(fits: pd.DataFrame, studies: pd.DataFrame | None = None) -> pd.DataFrame:
    """The fit table's rows of every family with two or more goals, easiest goal first (the largest error or
    loss), with ``goal_metric`` ("error", "loss"; empty where unknown) from the study table."""
    fits = with_curve_axes(fits) if len(fits) else fits
    family = family_columns(fits) if len(fits) else []
    values = [f"{name}{end}" for name in GOAL_VALUES for end in ("", "_low", "_high")]
    columns = [*family, "goal", "goal_metric", "points", *values, "perfect_scaling_end", *CENSORED_COLUMNS,
               "interval_basis", "interval_replicates", "note"]
    if "goal" not in fits.columns:
        return pd.DataFrame(columns=columns)
    ladders = [group.sort_values("goal", ascending=False)
               for _, group in fits[fits["goal"].notna()].groupby(family, sort=True, dropna=False)
               if group["goal"].nunique() >= 2]
    if not ladders:
        return pd.DataFrame(columns=columns)
    table = pd.concat(ladders, ignore_index=True)
    metrics = {}
    if studies is not None and "goal_metric" in studies.columns:
        metrics = studies.dropna(subset=["goal_metric"]).groupby("workload")["goal_metric"].first().to_dict()
    return table.assign(goal_metric=table["workload"].map(metrics)).reindex(columns=columns)


def unbounded(value: float, low: float, high: float) -> tuple[bool, bool]:
    """Whether each end of an interval is practically unbounded (more than UNBOUNDED_FACTOR from the value)."""
    return bool(low < value / UNBOUNDED_FACTOR), bool(high > value * UNBOUNDED_FACTOR)


def contains_estimate(low: float, value: float, high: float) -> bool:
    """Whether the interval holds the estimate; an interval that collapsed onto it (every resample alike) may
    end a few last digits off it, where the resamples' fit stopped."""
    return bool(low <= value <= high or math.isclose(low, value, rel_tol=CONTAINS_TOLERANCE)
                or math.isclose(high, value, rel_tol=CONTAINS_TOLERANCE))


def _interval_warnings(row: dict) -> list[str]:
    warnings = []
    for name in ("s_min", "b_crit"):
        low, high, value = row.get(f"{name}_low"), row.get(f"{name}_high"), row.get(name)
        if value is None or pd.isna(value) or low is None or high is None or pd.isna(low) or pd.isna(high):
            continue
        below, above = unbounded(value, low, high)
        if below and not above and low < value * 1e-9:
            # a resample's fit at B_crit 3.86e-22 is a curve flat from the smallest batch size on
            warnings.append(f"the {name} interval reaches 0 (0 .. {high:.3g}): these points cannot tell it from 0")
        elif below or above:
            warnings.append(f"the {name} interval is practically unbounded ({low:.3g} .. {high:.3g})")
        if not contains_estimate(low, value, high):
            # a basic interval reflects the resamples about the estimate: with nearly every resample's
            # minimum on one side of it, the interval ends on the other side, short of the estimate
            why = ("the estimate is taken at the recorded steps, the top of their censoring, which the resamples "
                   "spread below" if str(row.get("interval_basis")).startswith("replicates") else
                   "the resampled minima and their censoring lie almost all on one side of it")
            warnings.append(f"the {name} interval ({low:.3g} .. {high:.3g}) does not contain the estimate "
                            f"{value:.3g}: {why}")
    basis = interval_basis_warning(row)
    return warnings + ([basis] if basis else [])


def far_outside(b_crit: float, batch_sizes: np.ndarray) -> bool:
    """Whether B_crit lies more than a factor 100 outside the measured batch sizes: not determined by them."""
    return bool(len(batch_sizes)) and (b_crit < min(batch_sizes) / 100 or b_crit > max(batch_sizes) * 100)


def fit_warnings(row: dict, batch_sizes: np.ndarray, steps: np.ndarray) -> list[str]:
    """Why a curve's fit may not mean what it seems: said in the fit's note, drawn grey in the figure."""
    b, s = points(batch_sizes, steps)
    warnings = []
    if 0 < len(b) < 2 + 1:
        warnings.append(f"{len(b)} points for a 2-parameter fit: the fit cannot be checked")
    if len(b) >= 2 and s[-1] > s[0]:
        warnings.append("steps rise with batch size: the hyperbola does not describe this curve")
    b_crit = row.get("b_crit")
    if b_crit is not None and not pd.isna(b_crit) and far_outside(b_crit, b):
        warnings.append(f"B_crit {b_crit:.3g} lies far outside the measured batch sizes {int(b[0])}..{int(b[-1])}: "
                        f"not determined by these points")
    warnings += _interval_warnings(row)
    if (row.get("perfect_scaling_end") is None or pd.isna(row.get("perfect_scaling_end"))) and len(b) >= 2:
        warnings.append(f"perfect scaling through the largest batch size with a result ({int(b[-1])}): "
                        f"perfect_scaling_end lies beyond the measurements")
    end, start = row.get("perfect_scaling_end"), row.get("maximal_parallelism_start")
    if end is not None and start is not None and not pd.isna(end) and not pd.isna(start) and start < end:
        warnings.append(f"maximal data parallelism seems to start ({int(start)}) before perfect scaling ends "
                        f"({int(end)}): the curve is too flat or noisy to separate the regimes")
    return warnings


def is_degenerate(row: pd.Series | dict) -> bool:
    """A fit whose note says it does not describe the curve (drawn grey)."""
    note = str(row.get("note", "") or "")
    return any(flag in note for flag in ("no fit", "steps rise", "far outside", "cannot be checked"))


def _ratio_intervals(curve: dict[int, np.ndarray], dense: dict[int, np.ndarray], check: int | None,
                     repeats: int, seed: int) -> dict[int, Interval]:
    """Per batch size both curves measured, the 95% percentile interval of steps relative to dense over
    resamples of both curves' replicates (each point needs MIN_REPLICATES)."""
    shared = {size: (curve[size], dense[size]) for size in curve if size in dense
              and min(len(curve[size]), len(dense[size])) >= MIN_REPLICATES}
    if not shared or repeats <= 0:
        return {}
    rng = np.random.default_rng(seed)
    ours = resampled_points({k: v[0] for k, v in shared.items()}, check, repeats, rng)
    theirs = resampled_points({k: v[1] for k, v in shared.items()}, check, repeats, rng)
    with np.errstate(divide="ignore", invalid="ignore"):  # a point lost (not reached): inf steps, not left out
        ratios = np.where(np.isnan(ours), np.inf, ours) / np.where(np.isnan(theirs), np.inf, theirs)
    found = {size: open_interval(ratios[:, i], repeats) for i, size in enumerate(sorted(shared))}
    return {size: interval for size, interval in found.items() if not collapsed(interval.low, interval.high)}


def sparsity_comparison(table: pd.DataFrame, repeats: int = 200, seed: int = 0) -> pd.DataFrame:
    """Per curve and batch size (its point, by the point rule): steps relative to the dense curve of its family
    (every curve axis but the sparsity and the method, and the protocol), with a 95% interval where both points
    have MIN_REPLICATES replicates, and each curve normalised by its first point."""
    table = dense_in_every_parameterization(with_curve_axes(table))
    rows = []
    protocol = curve_columns(table)[len(CURVE_KEYS):]
    family = [axis for axis in CURVE_KEYS if axis not in ("sparsity", "pruning")]
    for _, group in table.groupby([*family, *protocol], sort=True, dropna=False):
        head = {axis: group[axis].iloc[0] for axis in family}
        protocol_values = {column: group[column].iloc[0] for column in protocol}
        dense_replicates = replicate_steps(group[group["sparsity"] == 0.0])
        dense = pd.Series({size: point_value(steps) for size, steps in dense_replicates.items()}, dtype=float)
        for (sparsity, pruning), curve in group.groupby(["sparsity", "pruning"], sort=True):
            if sparsity == 0.0 and head["parameterization"] != TAG_DEFAULTS["parameterization"]:
                continue  # sp's dense curve, the reference of this family, is shown once: under sp
            replicates = replicate_steps(curve)
            sizes = np.array(sorted(replicates))
            steps = np.array([point_value(replicates[size]) for size in sizes])
            reached = steps[~np.isnan(steps)]
            first = reached[0] if len(reached) else math.nan
            reference = dense.reindex(sizes).to_numpy(dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                relative = np.where((reference != 0) & ~np.isnan(reference), steps / reference, math.nan)
                normalised = steps / first if first and not math.isnan(first) else np.full(len(steps), math.nan)
            found = _ratio_intervals(replicates, dense_replicates, check_interval(curve), repeats, seed) \
                if sparsity > 0 else {}  # the dense curve against itself: 1, no interval
            rows.append(pd.DataFrame({**head, "sparsity": sparsity, "pruning": pruning, **protocol_values,
                                      "batch_size": sizes.astype(int), "steps_to_result": steps,
                                      "replicates": [len(replicates[size]) for size in sizes],
                                      "relative_to_dense": relative,
                                      "relative_to_dense_low": [found.get(size, Interval(None, None)).low
                                                                for size in sizes],
                                      "relative_to_dense_high": [found.get(size, Interval(None, None)).high
                                                                 for size in sizes],
                                      "normalised_by_first": normalised}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
