"""Summaries of the probes (pandas only): the Lipschitz constant against sparsity, and the
measured gradient noise scale beside the fitted critical batch size."""

from __future__ import annotations

import numpy as np
import pandas as pd


def lipschitz_table(values: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, optimizer, sparsity): the median constant, its spread over trials (quartiles
    of the per-trial medians) and over training (10th and 90th percentile of all measurements)."""
    rows = []
    for (workload, optimizer, sparsity), group in values.groupby(["workload", "optimizer", "sparsity"], sort=True):
        per_trial = group.groupby("trial_run_id")["value"].median()
        rows.append({"workload": workload, "optimizer": optimizer, "sparsity": sparsity, "trials": len(per_trial),
                     "measurements": len(group), "lipschitz_median": float(per_trial.median()),
                     "over_trials_p25": float(per_trial.quantile(0.25)),
                     "over_trials_p75": float(per_trial.quantile(0.75)),
                     "over_training_p10": float(group["value"].quantile(0.1)),
                     "over_training_p90": float(group["value"].quantile(0.9))})
    return pd.DataFrame(rows)


def lipschitz_verdict(table: pd.DataFrame) -> list[str]:
    """Say, per workload and optimizer, whether the median constant rises with sparsity."""
    lines = []
    for (workload, optimizer), group in table.groupby(["workload", "optimizer"], sort=True):
        medians = group.sort_values("sparsity")["lipschitz_median"].to_numpy()
        if len(medians) < 2:
            lines.append(f"{workload} / {optimizer}: one sparsity only; nothing to compare")
        elif np.all(np.diff(medians) > 0):
            lines.append(f"{workload} / {optimizer}: the Lipschitz constant rises with sparsity, as the paper says")
        else:
            lines.append(f"{workload} / {optimizer}: the Lipschitz constant does NOT rise monotonically with "
                         f"sparsity here (medians {', '.join(f'{m:.3g}' for m in medians)})")
    return lines


def noise_scale_table(latest: pd.DataFrame, fits: pd.DataFrame | None) -> pd.DataFrame:
    """Per curve: the median over trials of the last smoothed B_simple, beside the fitted B_crit."""
    rows = []
    for (workload, optimizer, sparsity), group in latest.groupby(["workload", "optimizer", "sparsity"], sort=True):
        row = {"workload": workload, "optimizer": optimizer, "sparsity": sparsity, "trials": len(group),
               "b_simple_median": float(group["value"].median()),
               "b_simple_p25": float(group["value"].quantile(0.25)),
               "b_simple_p75": float(group["value"].quantile(0.75)), "b_crit": np.nan}
        if fits is not None and len(fits) and "b_crit" in fits.columns:
            match = fits[(fits["workload"] == workload) & (fits["optimizer"] == optimizer)
                         & (np.isclose(fits["sparsity"], sparsity))]
            if len(match):
                row["b_crit"] = float(match["b_crit"].iloc[0])
        rows.append(row)
    return pd.DataFrame(rows)
