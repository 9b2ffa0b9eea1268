"""The critical batch size in the threshold form (Zhang et al. 2025) with Merrill et al.'s bracket, and the
fitted hyperbola's value of it, with bootstrap intervals: on exact and generated curves and on the checked-in
fixtures, through the fit table, the report, the analysis run's metrics and the adaptive sweep's answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.csv_io import read_csv
from analysis.fits import (HyperbolaFit, InsufficientData, fit_hyperbola, fitted_threshold, regime_boundaries,
                           threshold_critical_batch)
from analysis.fit_metrics import curve_metrics
from analysis.regimes import fit_table
from analysis.report import fit_summary

FIXTURES = Path(__file__).parent / "fixtures"
BATCH_SIZES = 2.0 ** np.arange(1, 13)


@pytest.mark.parametrize("b_crit", [20.0, 100.0, 600.0])
@pytest.mark.parametrize("tolerance", [0.1, 0.2, 0.5])
def test_on_an_exact_hyperbola_the_threshold_brackets_the_fitted_value(b_crit, tolerance):
    steps = 1000.0 * (1.0 + b_crit / BATCH_SIZES)
    fitted = fitted_threshold(fit_hyperbola(BATCH_SIZES, steps), BATCH_SIZES[0], tolerance)
    # Solved by hand: S(B) B <= (1 + x) S(B_0) B_0  <=>  B <= (1 + x) B_0 + x B_crit.
    assert fitted == pytest.approx((1 + tolerance) * 2 + tolerance * b_crit, rel=1e-4)
    passing = threshold_critical_batch(BATCH_SIZES, steps, tolerance)
    failing = regime_boundaries(BATCH_SIZES, steps, tolerance).perfect_scaling_end
    assert passing <= fitted < failing and failing == 2 * passing  # Merrill et al.'s bracket holds the value


def test_the_threshold_counts_only_the_batch_sizes_before_the_first_failure():
    b = np.array([2, 4, 8, 16, 32, 64])
    # 16 fails (steps 200 > 1.2 x 1000 x 2 / 16 = 150), 32 passes again by noise: the threshold stays 8.
    steps = np.array([1000, 510, 260, 200, 70, 60])
    assert threshold_critical_batch(b, steps) == 8
    assert regime_boundaries(b, steps).perfect_scaling_end == 16
    # Nothing fails: the largest measured batch size, and no failing one.
    assert threshold_critical_batch(b, 2000.0 / b) == 64
    assert regime_boundaries(b, 2000.0 / b).perfect_scaling_end is None
    # Points without a result are not measured points.
    assert threshold_critical_batch(np.array([2, 4, 8]), np.array([1000, np.nan, 260])) == 8
    with pytest.raises(InsufficientData, match="the threshold needs at least 2"):
        threshold_critical_batch(np.array([2, 4]), np.array([1000, np.nan]))


def _trials(s_min: float, b_crit: float, trials: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A curve measured with ``trials`` noisy reaching trials per batch size: (study rows, trial rows)."""
    rng = np.random.default_rng(seed)
    studies, rows = [], []
    for batch_size in BATCH_SIZES[:9]:
        key = f"k{int(batch_size)}"
        steps = np.round(s_min * (1 + b_crit / batch_size) * np.exp(np.abs(rng.normal(0, 0.15, trials))))
        rows += [{"study_key": key, "trial_index": i, "status": "reached", "steps_to_result": float(v),
                  "steps_trained": float(v)} for i, v in enumerate(steps)]
        studies.append({"workload": "w", "optimizer": "adam", "sparsity": 0.0, "batch_size": int(batch_size),
                        "steps_to_result": float(steps.min()), "study_key": key})
    return pd.DataFrame(studies), pd.DataFrame(rows)


def test_generated_curves_get_intervals_for_both_forms():
    studies, trials = _trials(500.0, 60.0, 12, seed=3)
    row = fit_table(studies, trials, repeats=200).iloc[0]
    assert row["b_crit_threshold_low"] <= row["b_crit_threshold"] <= row["b_crit_threshold_high"]
    # Grid values: the interval's ends are measured batch sizes.
    assert {row["b_crit_threshold_low"], row["b_crit_threshold_high"]} <= set(BATCH_SIZES[:9])
    # The fitted value's interval is B_crit's carried through (1 + x) B_0 + x B_crit.
    expected = [fitted_threshold(HyperbolaFit(1.0, row[f"b_crit_{end}"], 0.0, 1.0), 2.0) for end in ("low", "high")]
    assert [row["b_crit_threshold_fit_low"], row["b_crit_threshold_fit_high"]] == pytest.approx(expected)
    assert row["b_crit_threshold_fit"] == pytest.approx(1.2 * 2 + 0.2 * row["b_crit"])
    # The true value, 1.2 x 2 + 0.2 x 60 = 14.4, lies within the measured bracket's neighbourhood.
    assert 8 <= row["b_crit_threshold"] <= 16


def test_the_checked_in_fixture_through_the_table_the_report_and_the_metrics():
    table = read_csv(FIXTURES / "synthetic_steps.csv")
    trials = read_csv(FIXTURES / "synthetic_trials.csv", columns=("study_key", "trial_index", "status",
                                                                     "steps_to_result", "steps_trained"))
    fits = fit_table(table, trials, repeats=100)
    for _, row in fits.iterrows():
        b = table[table["sparsity"] == row["sparsity"]]["batch_size"].to_numpy()
        # The largest passing batch size is the measured one just below the smallest failing one.
        if pd.notna(row["perfect_scaling_end"]):
            assert row["b_crit_threshold"] == b[b < row["perfect_scaling_end"]].max()
        assert row["b_crit_threshold_fit_low"] <= row["b_crit_threshold_fit_high"]
    dense = fits[fits["sparsity"] == 0.0].iloc[0]
    summary = fit_summary(fits)
    words = summary.loc[summary["sparsity"] == "0", "B_crit threshold (passes..fails)"].iloc[0]
    assert words.startswith(f"{int(dense['b_crit_threshold'])} ({int(dense['b_crit_threshold'])}.."
                            f"{int(dense['perfect_scaling_end'])}) [")
    assert summary.loc[0, "B_crit threshold, fit"].startswith(f"{dense['b_crit_threshold_fit']:.3g} [")  # 3 digits
    metrics = curve_metrics(fits)
    assert metrics["fit/momentum/sp0/b_crit_threshold"] == dense["b_crit_threshold"]
    assert metrics["fit/momentum/sp0/b_crit_threshold_fit_high"] == dense["b_crit_threshold_fit_high"]


def test_the_adaptive_sweeps_answer_reports_both_forms():
    from edps_mlflow.adaptive_sweep import _threshold, _interval

    fit = {"b_crit_threshold": 16.0, "perfect_scaling_end": 32.0, "b_crit_threshold_fit": 21.5,
           "b_crit_threshold_fit_low": 18.0, "b_crit_threshold_fit_high": 30.0}
    assert _threshold(fit) == "16 (16..32)"
    assert _threshold({**fit, "perfect_scaling_end": None}) == "16 (>16)"
    assert _interval(fit, "b_crit_threshold_fit") == "21.5 (18..30)"
