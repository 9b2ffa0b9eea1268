"""Tuning-budget curves (``edps-analyze budget``; docs/analysis.md, "Tuning budget"): what a study of n of its N
trials would have measured, n = 1..N, from the stored trials, by the exact order statistics of a subset drawn
without replacement (Dodge et al. 2019), and what the budget does to B_crit.

    points = budget_points(studies, trials)          # a row per (curve, batch size, n)
    fits = budget_fits(points, within=0.1)           # a row per (curve, n): B_crit and where it settles
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.fits import InsufficientData, fit_hyperbola
from analysis.regimes import curve_columns, curves, far_outside, with_curve_axes
from edps_mlflow.errors import EdpsError

# How a superseded trial (stopped by exact early stopping, known only not to have reached by steps_trained) is
# counted: reaching at the next check after it stopped, or never. Every quantity is monotone in each trial's
# steps, so the two scenarios bound it.
SCENARIOS = ("early", "never")
POINT_QUANTITIES = ("p_reach", "expected_steps", "median_steps")


def trial_steps(trials: pd.DataFrame, check_interval: float | None = None,
                max_steps: float | None = None) -> dict[str, np.ndarray]:
    """Each trial's steps to result (inf: never) per scenario. A reaching trial without its steps counts as never,
    as the bootstrap counts it; a superseded one reaches, early, at the first check after steps_trained (checks
    at multiples of the check interval and at max_steps; steps_trained + 1 where the interval is unknown)."""
    status = trials["status"].astype(str).to_numpy()
    steps = pd.to_numeric(trials["steps_to_result"], errors="coerce").to_numpy(dtype=float)
    trained = np.nan_to_num(pd.to_numeric(trials["steps_trained"], errors="coerce").to_numpy(dtype=float))
    never = np.where((status == "reached") & np.isfinite(steps) & (steps > 0), steps, np.inf)
    known = check_interval is not None and math.isfinite(check_interval) and check_interval > 0
    following = (np.floor(trained / check_interval) + 1) * check_interval if known else trained + 1
    if max_steps is not None and math.isfinite(max_steps):
        following = np.minimum(following, max(float(max_steps), 1.0))
    return {"early": np.where(status == "superseded", following, never), "never": never}


def minimum_distribution(steps: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The distribution of the best (smallest) steps of n trials drawn without replacement from ``steps``: the
    sorted steps and the probability that each is the best, p_j = C(N - j, n - 1) / C(N, n) for the j-th
    smallest, by its ratio p_(j+1) / p_j = (N - j - n + 1) / (N - j) from p_1 = n / N (no huge binomials)."""
    ordered = np.sort(np.asarray(steps, dtype=float))
    total = len(ordered)
    if not 1 <= n <= total:
        raise ValueError(f"a study of {n} of {total} trials")
    j = np.arange(1, total, dtype=float)
    ratios = np.clip((total - j - n + 1) / (total - j), 0.0, None)
    return ordered, n / total * np.concatenate([[1.0], np.cumprod(ratios)])


def summarise(distributions: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    """P(reach), the expected steps and the median steps of the replicates' distributions averaged (each weighs
    1/R): the expectation is NaN where it is not finite (some subset holds no reaching trial), the median (the
    lower one) NaN unless more than half of the studies reach."""
    values = np.concatenate([v for v, _ in distributions])
    weights = np.concatenate([p for _, p in distributions]) / len(distributions)
    order = np.argsort(values, kind="stable")
    values, weights = values[order], weights[order]
    finite = np.isfinite(values)
    reach = float(weights[finite].sum())
    expected = float(np.dot(values[finite], weights[finite])) if not (weights[~finite] > 0).any() else math.nan
    median = math.nan
    if reach > 0.5:
        median = float(values[np.argmax(np.cumsum(weights) >= 0.5 - 1e-12)])
    return dict(zip(POINT_QUANTITIES, (min(reach, 1.0), expected, median)))


def _point_rows(replicates: pd.DataFrame, by_key: dict[str, pd.DataFrame]) -> list[dict]:
    """One point's rows, n = 1 .. the fewest trials of its replicates (those with trials)."""
    steps = []
    for _, study in replicates.iterrows():
        trials = by_key.get(str(study.get("study_key")))
        total = _number(study.get("trials_total"))
        if trials is not None and total is not None and len(trials) < total:
            # a study of N trials read as fewer would be a smaller study's budget curve
            raise EdpsError(f"study {study.get('study_key')} (batch size {study.get('batch_size')}) has "
                            f"{len(trials)} of its {total:.0f} trials in the trials table: a tuning budget needs "
                            f"them all")
        if trials is not None and len(trials):
            steps.append(trial_steps(trials, _number(study.get("check_interval")), _number(study.get("max_steps"))))
    if not steps:
        return []
    fewest = min(len(s["never"]) for s in steps)
    superseded = int(sum(np.count_nonzero(s["early"] != s["never"]) for s in steps))
    rows = []
    for n in range(1, fewest + 1):
        row = {"n": n, "trials": fewest, "replicates": len(steps), "superseded": superseded}
        for scenario in SCENARIOS:
            found = summarise([minimum_distribution(s[scenario], n) for s in steps])
            row.update({f"{name}_{scenario}": value for name, value in found.items()})
        rows.append(row)
    return rows


def _number(value: object) -> float | None:
    number = pd.to_numeric(value, errors="coerce")
    return float(number) if pd.notna(number) else None


def budget_points(studies: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """A row per (curve, batch size, n): the curve columns, ``trials`` (N), ``replicates`` (studies with trials at
    the point, averaged over), ``superseded`` (their superseded trials) and POINT_QUANTITIES per scenario."""
    by_key = {str(key): group for key, group in trials.groupby(trials["study_key"].astype(str), sort=False)}
    rows = []
    columns = curve_columns(with_curve_axes(studies))  # the whole table's: a curve's key has one value for each
    for key, group in curves(studies).items():
        for batch_size, replicates in group.groupby("batch_size", sort=True):
            rows += [{**dict(zip(columns, key)), "batch_size": int(batch_size), **row}
                     for row in _point_rows(replicates, by_key)]
    if not rows:
        raise EdpsError("no study has trials to draw a tuning budget from; give the trials (--trials-csv with "
                        "--csv, or studies of the store that recorded their trial outcomes)")
    return pd.DataFrame(rows)


def _hyperbola_b_crit(points: pd.DataFrame, column: str) -> float:
    """B_crit of the hyperbola through the median steps; NaN with fewer than three, or where it lies far outside
    the batch sizes (not determined by them: `fit` says so in its note)."""
    b, s = points["batch_size"].to_numpy(dtype=float), points[column].to_numpy(dtype=float)
    try:
        b_crit = fit_hyperbola(b, s).b_crit
    except InsufficientData:
        return math.nan
    return math.nan if far_outside(b_crit, b[np.isfinite(s)]) else b_crit


def settled_from(b_crit: np.ndarray, within: float) -> float:
    """The smallest n (b_crit[n - 1] is n's value) from which every B_crit lies within ``within`` (a fraction) of
    the last one's, NaN where the last one is not defined."""
    final = b_crit[-1]
    if not np.isfinite(final):
        return math.nan
    close = np.isfinite(b_crit) & (np.abs(b_crit / final - 1.0) <= within)
    first = len(close)
    while first > 0 and close[first - 1]:
        first -= 1
    return float(first + 1)


def budget_fits(points: pd.DataFrame, within: float = 0.1) -> pd.DataFrame:
    """A row per (curve, n), n up to the fewest trials of the curve's points: B_crit of the hyperbola through the
    median steps across batch sizes per scenario (``b_crit_<scenario>``; two fits, not an interval), and the
    smallest n from which it stays within ``within`` of its value at the largest n (``settled_<scenario>``)."""
    columns = list(points.columns[:points.columns.get_loc("batch_size")])  # the curve's, before the point's
    frames = []
    for key, curve in points.groupby(columns, sort=True, dropna=False):
        largest = int(curve.groupby("batch_size")["n"].max().min())
        rows = [{**dict(zip(columns, key)), "n": n, "batch_sizes": int(len(at)), **{
                    f"b_crit_{s}": _hyperbola_b_crit(at, f"median_steps_{s}") for s in SCENARIOS}}
                for n, at in curve[curve["n"] <= largest].groupby("n", sort=True)]
        frame = pd.DataFrame(rows)
        for scenario in SCENARIOS:
            frame[f"settled_{scenario}"] = settled_from(frame[f"b_crit_{scenario}"].to_numpy(dtype=float), within)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _shown(early: float, never: float, form: str) -> str:
    """A value, or its two scenarios as ``early..never`` where they differ (never ``x..x``)."""
    texts = [format(v, form) if np.isfinite(v) else "-" for v in (early, never)]
    return texts[0] if texts[0] == texts[1] else "..".join(texts)


def budget_text(points: pd.DataFrame, fits: pd.DataFrame, within: float) -> str:
    """Per curve: median steps and P(reach) per batch size against n, B_crit against n, and where it settles."""
    columns = list(fits.columns[:fits.columns.get_loc("n")])
    blocks = []
    for key, fitted in fits.groupby(columns, sort=True, dropna=False):
        curve = points[(points[columns].astype(str) == pd.Series(key, index=columns).astype(str)).all(axis=1)]
        table = pd.DataFrame({"n": fitted["n"].to_numpy()})
        for batch_size, point in curve.groupby("batch_size", sort=True):
            point = point.set_index("n").reindex(table["n"])
            table[f"B={batch_size}"] = [" / ".join(cell) for cell in zip(*(
                [_shown(e, v, form) for e, v in zip(point[f"{quantity}_early"], point[f"{quantity}_never"])]
                for quantity, form in (("expected_steps", ".0f"), ("median_steps", ".0f"), ("p_reach", ".3g"))))]
        table["B_crit"] = [_shown(e, v, ".4g") for e, v in zip(fitted["b_crit_early"], fitted["b_crit_never"])]
        settled = [f"n = {int(v)}" if np.isfinite(v) else "not within" for v in fitted.iloc[0][
            ["settled_early", "settled_never"]]]
        superseded = int(curve.groupby("batch_size")["superseded"].first().sum())
        head = " / ".join(f"{c} {v:g}" if isinstance(v, float) else f"{c} {v}" for c, v in zip(columns, key)
                         if pd.notna(v))
        blocks.append(f"{head}\n  {int(curve['trials'].min())} trials per study, replicates per point: "
                      f"{'/'.join(str(r) for r in curve.groupby('batch_size')['replicates'].first())}"
                      + (f"; {superseded} trials superseded: values early..never" if superseded else "; exact")
                      + f"\n  each cell: expected steps, median steps, P(reach) (-: not finite, or at most half reach)"
                      f"\n{table.to_string(index=False)}\n  B_crit within {within:g} of its value at n = "
                      f"{int(fitted['n'].max())} from: {settled[0] if settled[0] == settled[1] else '..'.join(settled)}")
    return "\n\n".join(blocks)
