"""Pruning methods compared at each sparsity (``edps-analyze compare-pruning``, a section of the report): is the
cost of sparsity the sparsity's, or the method's? Every pruned curve is set beside the dense curve of its
(workload, optimizer, protocol): per batch size (:func:`pruning_comparison`), and per curve
(:func:`pruning_summary`: S_min and B_crit beside the dense curve's, the ratio to dense, the shape test: the
ratio over its first value stays within the tolerance; and its steps over its shuffle's, Frankle et al.'s check).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.bootstrap import BASIS_COLUMNS, interval_basis_warning
from analysis.regimes import curve_columns, dense_in_every_parameterization, fit_of, matching, with_curve_axes
from analysis.replicates import point_steps
from analysis.report import hyperbola_applies, with_interval
from edps_mlflow.curves import TAG_DEFAULTS
from edps_mlflow.pruning import SHUFFLE_PREFIX, shuffled

SUMMARY_COLUMNS = ("s_min", "s_min_low", "s_min_high", "b_crit", "b_crit_low", "b_crit_high")


def _family(table: pd.DataFrame) -> list[str]:
    """The columns a pruned curve shares with its dense reference."""
    return [c for c in curve_columns(table) if c not in ("sparsity", "pruning")]


def _steps(curve: pd.DataFrame) -> pd.Series:
    """batch size -> steps-to-result (NaN without a result): each point by the point rule over its replicates."""
    points = point_steps(curve)
    return pd.Series(points["steps_to_result"].to_numpy(dtype=float), index=points["batch_size"])


def pruning_comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Per pruned curve and batch size: its steps, the dense steps, their ratio, both normalised curves."""
    table = dense_in_every_parameterization(with_curve_axes(table))
    family = _family(table)
    rows = []
    for key, group in table.groupby(family, sort=True, dropna=False):
        head = dict(zip(family, key if isinstance(key, tuple) else (key,)))
        dense = _steps(group[group["sparsity"] == 0.0])
        dense_first = dense.dropna().iloc[0] if dense.notna().any() else math.nan
        for (sparsity, pruning), curve in group[group["sparsity"] > 0].groupby(["sparsity", "pruning"], sort=True):
            steps = _steps(curve)
            first = steps.dropna().iloc[0] if steps.notna().any() else math.nan
            for batch_size, value in steps.items():
                reference = dense.get(batch_size, math.nan)
                rows.append({**head, "sparsity": sparsity, "pruning": pruning, "batch_size": int(batch_size),
                             "steps_to_result": value, "dense_steps_to_result": reference,
                             "relative_to_dense": value / reference if reference > 0 else math.nan,
                             "normalised_by_first": value / first if first > 0 else math.nan,
                             "dense_normalised_by_first": reference / dense_first if dense_first > 0 else math.nan})
    return pd.DataFrame(rows, columns=[*family, "sparsity", "pruning", "batch_size", "steps_to_result",
                                       "dense_steps_to_result", "relative_to_dense", "normalised_by_first",
                                       "dense_normalised_by_first"])


def _fit_of(fits: pd.DataFrame | None, head: dict, sparsity: float, pruning: str) -> dict:
    dense = {"parameterization": TAG_DEFAULTS["parameterization"]} if sparsity == 0.0 else {}  # StudySpec's "sp"
    row = fit_of(fits, {**head, "sparsity": sparsity, "pruning": pruning, **dense})
    if row is None:
        return {}
    # A B_crit the hyperbola does not give is no answer (the fit table prints n/a): nothing to compare either.
    return {**{c: row.get(c) for c in (*SUMMARY_COLUMNS, *BASIS_COLUMNS) if c in row.index},
            "b_crit_applies": hyperbola_applies(row)}


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _geometric_mean(values: pd.Series) -> float:
    values = values[(values > 0) & np.isfinite(values)]
    return float(np.exp(np.log(values).mean())) if len(values) else math.nan


def pruning_summary(table: pd.DataFrame, fits: pd.DataFrame | None = None, tolerance: float = 0.2) -> pd.DataFrame:
    """Per pruned curve: the comparisons of the module's docstring (no overlap of intervals is judged where they
    rest on one reaching trial per study)."""
    table = with_curve_axes(table)
    family = _family(table)
    comparison = pruning_comparison(table)
    dense = table[table["sparsity"] == 0.0]
    dense_method = str(dense["pruning"].iloc[0]) if len(dense) else "snip"  # StudySpec spells the dense study so
    rows = []
    for key, group in comparison.groupby([*family, "sparsity", "pruning"], sort=True, dropna=False):
        head = dict(zip(family, key[:len(family)]))
        sparsity, pruning = key[len(family)], key[len(family) + 1]
        both = group.dropna(subset=["steps_to_result", "dense_steps_to_result"]).sort_values("batch_size")
        ratio = both["relative_to_dense"]
        fit, dense_fit = _fit_of(fits, head, sparsity, pruning), _fit_of(fits, head, 0.0, dense_method)
        row = {**head, "sparsity": sparsity, "pruning": pruning,
               "points": int(group["steps_to_result"].notna().sum()), "common_batch_sizes": len(both),
               **fit, **{f"dense_{c}": v for c, v in dense_fit.items()},
               "relative_to_dense": _geometric_mean(ratio),
               "relative_to_dense_low": float(ratio.min()) if len(ratio) else math.nan,
               "relative_to_dense_high": float(ratio.max()) if len(ratio) else math.nan}
        if len(both) >= 2:
            deviation = np.log(ratio.to_numpy() / ratio.iloc[0])
            worst = int(np.argmax(np.abs(deviation)))
            row["shape_deviation"] = float(np.exp(deviation[worst]))
            row["same_shape"] = bool(np.all(np.abs(deviation) <= math.log1p(tolerance)))
            row["shape"] = ("same shape" if row["same_shape"] else f"differs: x{math.exp(deviation[worst]):.2f} at "
                                                                   f"batch size {int(both['batch_size'].iloc[worst])}")
        else:
            row.update({"shape_deviation": math.nan, "same_shape": None,
                        "shape": f"{len(both)} batch size(s) where it and the dense curve both have a result: too few "
                                 f"to compare"})
        # Intervals that rest on one reaching trial per study (exact early stopping) have no width: two of
        # them not overlapping says nothing, so no answer is given, and the note says why.
        little = [f"{name}: {warning}" for name, warning in (("its", interval_basis_warning(fit)),
                                                              ("dense", interval_basis_warning(dense_fit))) if warning]
        low, high, dense_low, dense_high = (_number(f.get(f"b_crit_{end}")) for f in (fit, dense_fit)
                                            for end in ("low", "high"))
        undecidable = little or any(map(math.isnan, (low, high, dense_low, dense_high))) or not (
            fit.get("b_crit_applies", True) and dense_fit.get("b_crit_applies", True))
        row["b_crit_overlaps_dense"] = None if undecidable else bool(low <= dense_high and dense_low <= high)
        row["note"] = "; ".join(little)
        row["relative_to_shuffle"] = _relative_to_shuffle(comparison, head, sparsity, pruning)
        rows.append(row)
    return pd.DataFrame(rows)


def _relative_to_shuffle(comparison: pd.DataFrame, head: dict, sparsity: float, pruning: str) -> float:
    """Geometric mean over common batch sizes of a method's steps over its shuffle's (NaN: not measured)."""
    if pruning.startswith(SHUFFLE_PREFIX):
        return math.nan
    same = matching(comparison, {**head, "sparsity": sparsity})
    mine = comparison[same & (comparison["pruning"] == pruning)].set_index("batch_size")["steps_to_result"]
    theirs = comparison[same & (comparison["pruning"] == shuffled(pruning))].set_index("batch_size")["steps_to_result"]
    if theirs.empty:
        return math.nan
    joined = pd.concat([mine.rename("mine"), theirs.rename("theirs")], axis=1).dropna()
    return _geometric_mean(joined["mine"] / joined["theirs"])


def _interval(row: pd.Series, name: str, applies: object = True) -> str:
    """As the fit table writes it: ``value [low, high]``, ``-`` without a fit, ``n/a`` where it does not apply."""
    if math.isnan(_number(row.get(name))):
        return "-"
    return with_interval(row, name) if pd.isna(applies) or bool(applies) else "n/a"


def summary_for_people(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with values and intervals as text, one row per pruned curve, the dense curve's fit first."""
    rows = []
    head = [c for c in ("workload", "optimizer") if c in summary.columns]
    several_parameterizations = "parameterization" in summary.columns and summary["parameterization"].nunique() > 1
    for _, row in summary.iterrows():
        ratio = _number(row.get("relative_to_dense"))
        shuffle = _number(row.get("relative_to_shuffle"))
        overlap = _number(row.get("b_crit_overlaps_dense"))  # 1, 0, or NaN: not judged
        rows.append({
            **{c: row[c] for c in head}, "sparsity": f"{row['sparsity']:g}", "method": row["pruning"],
            # Under supar too, a curve says so (sp's and supar's curves of one method read alike otherwise).
            **({"param.": row["parameterization"]} if several_parameterizations else {}),
            "points": row["points"], "S_min": _interval(row, "s_min"),
            "B_crit": _interval(row, "b_crit", row.get("b_crit_applies")),
            "dense B_crit": _interval(row, "dense_b_crit", row.get("dense_b_crit_applies")),
            "B_crit overlaps dense": ("yes" if overlap else "no") if not math.isnan(overlap) else
            NOT_JUDGED if row.get("note") else "-",
            "steps / dense": "-" if math.isnan(ratio) else
            f"{ratio:.3g} ({_number(row['relative_to_dense_low']):.3g}..{_number(row['relative_to_dense_high']):.3g})",
            "shape vs dense": row["shape"],
            "steps / its shuffle": "-" if math.isnan(shuffle) else f"{shuffle:.3g}",
        })
    return pd.DataFrame(rows)


NOT_JUDGED = "not judged*"


def intervals_footnote(summary: pd.DataFrame) -> str | None:
    """The footnote of NOT_JUDGED (None when no curve has it): why the B_crit intervals were not compared."""
    notes = summary["note"] if "note" in summary.columns else pd.Series(dtype=object)
    count = int(notes.fillna("").astype(bool).sum())
    if not count:
        return None
    return (f"* not judged: the B_crit intervals of {count} curve(s) or of the dense curve rest on one reaching trial "
            "in most studies (exact early stopping supersedes the others), so they have almost no width and say "
            "little; more trials per study, or --replicates 3 or more, give intervals that mean something")


def comparison_keys(table: pd.DataFrame) -> list[tuple]:
    """(workload, optimizer, sparsity) of every pruned curve: one figure each."""
    table = with_curve_axes(table)
    sparse = table[table["sparsity"] > 0]
    return sorted({(w, o, float(s)) for w, o, s in zip(sparse["workload"], sparse["optimizer"], sparse["sparsity"])})

