"""Summaries of the probes (pandas only): the Lipschitz constant against sparsity, and the
measured gradient noise scale beside the fitted critical batch size."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.regimes import fit_of, with_curve_axes
from edps_mlflow.curves import CURVE_AXES


def lipschitz_by_study(values: pd.DataFrame) -> pd.DataFrame:
    """Per study: the constant along its best trial's run, as the paper measures it (median and maximum)."""
    return with_curve_axes(values).groupby([*CURVE_AXES, "batch_size"], sort=True).agg(
        lipschitz_median=("value", "median"), lipschitz_max=("value", "max"), probe_steps=("value", "size"),
        first_step=("step", "min"), last_step=("step", "max"), trials_used=("trial_run_id", "nunique"),
        source=("source", lambda sources: "; ".join(sorted(set(sources))))).reset_index()


def lipschitz_table(by_study: pd.DataFrame) -> pd.DataFrame:
    """Per curve: the median, the range of the studies' medians, and the largest value seen."""
    return with_curve_axes(by_study).groupby(list(CURVE_AXES), sort=True).agg(
        batch_sizes=("lipschitz_median", "size"), trials_used=("trials_used", "sum"),
        lipschitz_median=("lipschitz_median", "median"), lowest_study_median=("lipschitz_median", "min"),
        highest_study_median=("lipschitz_median", "max"), lipschitz_max=("lipschitz_max", "max")).reset_index()


def lipschitz_verdict(table: pd.DataFrame) -> list[str]:
    """Say, per workload, optimizer (and pruning method, when several were measured), whether the median
    constant rises with sparsity; the dense network, pruned by none, starts every method's line."""
    lines = []
    for (workload, optimizer), family in with_curve_axes(table).groupby(["workload", "optimizer"], sort=True):
        methods = sorted(set(family.loc[family["sparsity"] > 0, "pruning"])) or sorted(set(family["pruning"]))
        for method in methods:
            group = family[(family["pruning"] == method) | (family["sparsity"] == 0)]
            name = f"{workload} / {optimizer}" + (f" / {method}" if len(methods) > 1 else "")
            medians = group.sort_values("sparsity")["lipschitz_median"].to_numpy()
            if len(medians) < 2:
                lines.append(f"{name}: one sparsity only; nothing to compare")
            elif np.all(np.diff(medians) > 0):
                lines.append(f"{name}: the Lipschitz constant rises with sparsity, as the paper says")
            else:
                lines.append(f"{name}: the Lipschitz constant does NOT rise monotonically with "
                             f"sparsity here (medians {', '.join(f'{m:.3g}' for m in medians)})")
    return lines


def noise_scale_table(latest: pd.DataFrame, fits: pd.DataFrame | None) -> pd.DataFrame:
    """Per curve: the median over trials of the last smoothed B_simple, beside the fitted B_crit."""
    rows = []
    for key, group in with_curve_axes(latest).groupby(list(CURVE_AXES), sort=True):
        curve = dict(zip(CURVE_AXES, key))
        fit = fit_of(fits, curve)
        rows.append({**curve, "trials": len(group), "b_simple_median": float(group["value"].median()),
                     "b_simple_p25": float(group["value"].quantile(0.25)),
                     "b_simple_p75": float(group["value"].quantile(0.75)),
                     "b_crit": float(fit["b_crit"]) if fit is not None and "b_crit" in fit.index else np.nan})
    return pd.DataFrame(rows)
