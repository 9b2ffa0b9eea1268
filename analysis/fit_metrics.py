"""A fit table as metrics, named alike on the analysis run (analysis.publish) and the sweep run
(edps_mlflow.sweep_charts): ``fit/<curve>/<quantity>``, the curve as CurveId.chart_name names it."""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis.regimes import PROTOCOL_KEYS, with_curve_axes
from analysis.report import hyperbola_applies
from edps_mlflow import names as n
from edps_mlflow.curves import CurveId

_FIT_METRICS = ("s_min", "s_min_low", "s_min_high", "b_crit", "b_crit_low", "b_crit_high", "e_min", "e_min_low",
                "e_min_high", "r2_log",
                "perfect_scaling_end", "maximal_parallelism_start", "b_crit_threshold", "b_crit_threshold_low",
                "b_crit_threshold_high", "b_crit_threshold_fit", "b_crit_threshold_fit_low",
                "b_crit_threshold_fit_high", "interval_replicates", "b_crit_threshold_censored_low",
                "b_crit_threshold_censored_high", "b_crit_threshold_decided")
# What the hyperbola gives: no metric where its note says it does not apply, as the tables print n/a.
_HYPERBOLA_METRICS = tuple(f"{name}{end}" for name in ("b_crit", "e_min", "b_crit_threshold_fit")
                           for end in ("", "_low", "_high"))
# What the intervals rest on, as a metric (a metric holds numbers): 2 replicates, 1 complete trials, 0 none.
INTERVAL_BASIS_CODES = {"replicates": 2.0, "complete trials": 1.0, "replicates at some points": 0.5}


def curve_metrics(fits: pd.DataFrame) -> dict[str, float]:
    """``fit/<curve>/<quantity>``, the curve as CurveId.chart_name names it: ``fit/sgd/sp0.9/b_crit``, the workload
    first when several are analysed, a pruning method other than SNIP's after the sparsity, the protocol values
    (goal, trials, ...) where curves differ only in them."""
    names = curve_names(fits)
    metrics: dict[str, float] = {}
    for index, row in fits.iterrows():
        values = {column: row.get(column) for column in _FIT_METRICS}
        if "interval_basis" in row.index:  # interval metrics only where the fit table has them: the basis beside
            values["interval_basis"] = INTERVAL_BASIS_CODES.get(str(row["interval_basis"]), 0.0)
            if not values["interval_basis"]:
                values["interval_replicates"] = None  # no interval rests on them
        if not hyperbola_applies(row):
            values.update(dict.fromkeys(_HYPERBOLA_METRICS))
        for column, value in values.items():
            if value is not None and pd.notna(value):
                metrics[n.curve_metric(names[index], column, n.METRIC_FIT_PREFIX)] = float(value)
    return metrics


def curve_names(table: pd.DataFrame) -> dict[Any, str]:
    """Each row's curve in metric names (CurveId.chart_name), by the table's index."""
    several = table["workload"].nunique() > 1 if len(table) else False
    varying = [c for c in PROTOCOL_KEYS if c in table.columns and table[c].nunique(dropna=True) > 1]
    return {index: CurveId.from_values(row).chart_name({c: row[c] for c in varying}, several)
            for index, row in with_curve_axes(table).iterrows()}
