"""Summaries of the probes (pandas only): the Lipschitz constant against sparsity, and the
measured gradient noise scale beside the fitted critical batch size."""

from __future__ import annotations

import numpy as np
import pandas as pd


def lipschitz_by_study(values: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, optimizer, sparsity, batch size): the constant along the best trial's run, as the
    paper measures it (median and maximum over its probe steps), and how many trial runs gave the values."""
    rows = []
    keys = ["workload", "optimizer", "sparsity", "batch_size"]
    for (workload, optimizer, sparsity, batch_size), group in values.groupby(keys, sort=True):
        rows.append({"workload": workload, "optimizer": optimizer, "sparsity": sparsity, "batch_size": batch_size,
                     "lipschitz_median": float(group["value"].median()), "lipschitz_max": float(group["value"].max()),
                     "probe_steps": len(group), "first_step": int(group["step"].min()),
                     "last_step": int(group["step"].max()), "trials_used": int(group["trial_run_id"].nunique()),
                     "source": "; ".join(sorted(set(group["source"])))})
    return pd.DataFrame(rows)


def lipschitz_table(by_study: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, optimizer, sparsity): the median over batch sizes of each study's median along its
    best trial's run, the range of those medians and the largest value seen."""
    rows = []
    for (workload, optimizer, sparsity), group in by_study.groupby(["workload", "optimizer", "sparsity"], sort=True):
        rows.append({"workload": workload, "optimizer": optimizer, "sparsity": sparsity,
                     "batch_sizes": len(group), "trials_used": int(group["trials_used"].sum()),
                     "lipschitz_median": float(group["lipschitz_median"].median()),
                     "lowest_study_median": float(group["lipschitz_median"].min()),
                     "highest_study_median": float(group["lipschitz_median"].max()),
                     "lipschitz_max": float(group["lipschitz_max"].max())})
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
