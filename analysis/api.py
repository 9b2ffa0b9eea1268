"""The analysis from Python (a notebook: ``from analysis import api``): the study table, the trials and the fits of
a tracking store as pandas DataFrames, read and fitted as ``edps-analyze`` reads and fits them (docs/analysis.md,
"From Python"). Each function takes the tracking URI (None: ``$MLFLOW_TRACKING_URI``, as training) and an
experiment name, a glob pattern, several of them, or None for every experiment that holds study runs; any trouble
is one EdpsError line.
"""

from __future__ import annotations

from typing import Iterable

import pandas as pd

from analysis.csv_io import INTEGER_COLUMNS, TRIAL_COLUMNS, with_integers
from analysis.load import load_studies, load_trials
from analysis.regimes import fit_table
from edps_mlflow.errors import EdpsError
from edps_mlflow.experiment_names import experiment_name_problem

Experiments = str | Iterable[str] | None
# The fit table's columns that ``fits`` always returns (empty where a curve has no fit or no interval).
FIT_COLUMNS = tuple(f"{name}{end}" for name in ("s_min", "b_crit", "e_min", "b_crit_threshold", "b_crit_threshold_fit")
                    for end in ("", "_low", "_high")) + ("perfect_scaling_end", "maximal_parallelism_start", "note")


def _names(experiment: Experiments) -> tuple[str, ...]:
    """The experiment names or patterns, each checked by the rule ``--experiment`` applies."""
    if not (experiment is None or isinstance(experiment, (str, list, tuple, set, frozenset))):
        raise EdpsError(f"experiment must be a name, a pattern, a list of them or None, got {experiment!r}")
    names = (experiment,) if isinstance(experiment, str) else tuple(experiment or ())
    for name in names:
        problem = experiment_name_problem(name) if isinstance(name, str) else "must be a string"
        if problem:
            raise EdpsError(f"experiment {name!r} {problem}")
    return names


def _chosen(tracking_uri: str | None, experiment: Experiments, study_table: pd.DataFrame | None) -> pd.DataFrame:
    """``study_table`` checked to be a study table, else ``experiment``'s studies; its counts as floats again, as
    the fits read them."""
    if study_table is None:
        return load_studies(_names(experiment), _uri(tracking_uri))
    _uri(tracking_uri)
    if not isinstance(study_table, pd.DataFrame):
        raise EdpsError(f"study_table must be a DataFrame that api.studies returned, got {type(study_table).__name__}")
    missing = [column for column in ("study_run_id", "study_key") if column not in study_table.columns]
    if missing and not study_table.empty:
        raise EdpsError(f"study_table lacks {', '.join(missing)}: pass a table that api.studies returned")
    return study_table.astype({c: float for c in INTEGER_COLUMNS if c in study_table.columns
                               and isinstance(study_table[c].dtype, pd.Int64Dtype)})


def _uri(tracking_uri: str | None) -> str | None:
    if not (tracking_uri is None or isinstance(tracking_uri, str)):
        raise EdpsError(f"tracking_uri must be a string or None, got {tracking_uri!r}")
    return tracking_uri


def studies(tracking_uri: str | None = None, experiment: Experiments = None) -> pd.DataFrame:
    """The study table: one row per measurement (a study, or a goal ladder's rung), the latest per study key,
    with the columns of ``edps-analyze export`` (workload, optimizer, sparsity, batch_size, pruning, goal,
    steps_to_result, trial counts, best metaparameters, ..., study_run_id, study_key), counts and steps as
    integers where whole (Int64: empty where missing), as ``export`` writes them."""
    return with_integers(load_studies(_names(experiment), _uri(tracking_uri)))


def trials(tracking_uri: str | None = None, experiment: Experiments = None,
           study_table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every trial of the studies: study_key, trial_index, status, steps_to_result, steps_trained. Of
    ``study_table`` (a table ``studies`` returned, filtered as you like) when given, else of ``experiment``'s."""
    chosen = _chosen(tracking_uri, experiment, study_table)
    return pd.DataFrame(columns=list(TRIAL_COLUMNS)) if chosen.empty else load_trials(chosen, tracking_uri)


def fits(tracking_uri: str | None = None, experiment: Experiments = None, study_table: pd.DataFrame | None = None,
         tolerance: float = 0.2, bootstrap: int = 200, seed: int = 0) -> pd.DataFrame:
    """The fit table of ``edps-analyze fit --format csv``: per curve S_min, B_crit, the regime boundaries and the
    threshold critical batch size, with 95% intervals from ``bootstrap`` resamples (0: none) where replicates or
    complete trials give them, and a note saying why not; ``FIT_COLUMNS`` always, empty where not given. Of
    ``study_table`` when given (a filtered table fits only its curves), else of ``experiment``'s studies."""
    for name, value, low, high in (("bootstrap", bootstrap, 0, 100_000), ("seed", seed, 0, 2**32 - 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise EdpsError(f"{name} must be a whole number from {low:,} to {high:,}, got {value!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance < 10:
        raise EdpsError(f"tolerance must be a number in (0, 10), got {tolerance!r}")
    chosen = _chosen(tracking_uri, experiment, study_table)
    if chosen.empty:
        raise EdpsError("the study table holds no studies (filtered to none?)")
    measured = bootstrap > 0 and "study_run_id" in chosen and chosen["study_run_id"].notna().any()
    table = fit_table(chosen, load_trials(chosen, tracking_uri) if measured else None, tolerance, bootstrap, seed)
    # Every curve's answers as columns whether or not any curve has them, so that a notebook's selection holds.
    return table.reindex(columns=[*table.columns, *(c for c in FIT_COLUMNS if c not in table.columns)])
