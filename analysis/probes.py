"""Summaries of the probes (pandas only): the Lipschitz constant against sparsity, and the
measured gradient noise scale beside the fitted critical batch size."""

from __future__ import annotations

import numpy as np
import pandas as pd

from edps_mlflow.curves import CURVE_AXES, TAG_DEFAULTS


def _with_axes(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every curve axis as a column (a row without the pruning method measured SNIP)."""
    filled = {axis: frame[axis].fillna(default) if axis in frame.columns else default
              for axis, default in TAG_DEFAULTS.items()
              if axis not in frame.columns or frame[axis].isna().any()}
    return frame.assign(**filled) if filled else frame


def lipschitz_by_study(values: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, optimizer, sparsity, pruning, batch size): the constant along the best trial's run, as the
    paper measures it (median and maximum over its probe steps), and how many trial runs gave the values."""
    rows = []
    keys = [*CURVE_AXES, "batch_size"]
    for key, group in _with_axes(values).groupby(keys, sort=True):
        rows.append({**dict(zip(keys, key)), "lipschitz_median": float(group["value"].median()),
                     "lipschitz_max": float(group["value"].max()),
                     "probe_steps": len(group), "first_step": int(group["step"].min()),
                     "last_step": int(group["step"].max()), "trials_used": int(group["trial_run_id"].nunique()),
                     "source": "; ".join(sorted(set(group["source"])))})
    return pd.DataFrame(rows)


def lipschitz_table(by_study: pd.DataFrame) -> pd.DataFrame:
    """Per curve (workload, optimizer, sparsity, pruning): the median over batch sizes of each study's median
    along its best trial's run, the range of those medians and the largest value seen."""
    rows = []
    for key, group in _with_axes(by_study).groupby(list(CURVE_AXES), sort=True):
        rows.append({**dict(zip(CURVE_AXES, key)), "batch_sizes": len(group),
                     "trials_used": int(group["trials_used"].sum()),
                     "lipschitz_median": float(group["lipschitz_median"].median()),
                     "lowest_study_median": float(group["lipschitz_median"].min()),
                     "highest_study_median": float(group["lipschitz_median"].max()),
                     "lipschitz_max": float(group["lipschitz_max"].max())})
    return pd.DataFrame(rows)


def lipschitz_verdict(table: pd.DataFrame) -> list[str]:
    """Say, per workload, optimizer (and pruning method, when several were measured), whether the median
    constant rises with sparsity; the dense network, pruned by none, starts every method's line."""
    lines = []
    for (workload, optimizer), family in _with_axes(table).groupby(["workload", "optimizer"], sort=True):
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
    fits = None if fits is None else _with_axes(fits)
    for key, group in _with_axes(latest).groupby(list(CURVE_AXES), sort=True):
        curve = dict(zip(CURVE_AXES, key))
        row = {**curve, "trials": len(group),
               "b_simple_median": float(group["value"].median()),
               "b_simple_p25": float(group["value"].quantile(0.25)),
               "b_simple_p75": float(group["value"].quantile(0.75)), "b_crit": np.nan}
        if fits is not None and len(fits) and "b_crit" in fits.columns:
            match = fits[(fits["workload"] == curve["workload"]) & (fits["optimizer"] == curve["optimizer"])
                         & (np.isclose(fits["sparsity"], curve["sparsity"])) & (fits["pruning"] == curve["pruning"])]
            if len(match):
                row["b_crit"] = float(match["b_crit"].iloc[0])
        rows.append(row)
    return pd.DataFrame(rows)
