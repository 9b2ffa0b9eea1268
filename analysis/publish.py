"""``--log-to-mlflow``: the analysis as a run (``edps.kind=analysis``, under its sweep when there is one) beside
the studies it analysed: settings as params, fits as metrics (:func:`curve_metrics`) and description, the runs
it used as tags, the tables, figures and report as artifacts, and the context tags a study run has.
"""

from __future__ import annotations

import shlex
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from analysis.csv_io import csv_text
from analysis.regimes import CURVE_KEYS, PROTOCOL_KEYS, is_degenerate, point_table, with_curve_axes
from analysis.report import fit_summary, hyperbola_applies, markdown_table
from edps_mlflow import names as n
from edps_mlflow.curves import CurveId
from edps_mlflow.descriptions import provenance_tags
from edps_mlflow.errors import EdpsError
from edps_mlflow.process_settings import launcher_run_id
from edps_mlflow.store.client import log_batch, log_points, resolve_tracking_uri
from edps_mlflow.store.trouble import store_error_text
from edps_mlflow.uris import quiet_links_with_credentials, redact_uri

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
    names = _curve_names(fits)
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


def _curve_names(table: pd.DataFrame) -> dict[Any, str]:
    """Each row's curve in metric names (CurveId.chart_name), by the table's index."""
    several = table["workload"].nunique() > 1 if len(table) else False
    varying = [c for c in PROTOCOL_KEYS if c in table.columns and table[c].nunique(dropna=True) > 1]
    return {index: CurveId.from_values(row).chart_name({c: row[c] for c in varying}, several)
            for index, row in with_curve_axes(table).iterrows()}


def chart_metrics(studies: pd.DataFrame, fits: pd.DataFrame | None) -> list[tuple[str, float, int]]:
    """(metric, value, batch size): each curve's measured steps-to-result (its point value) and, where its fit
    describes it, the fitted S(B) = S_min (1 + B_crit / B) at the same batch sizes, so that the run's charts draw
    both against the batch size. A point without a value (not reached) has none."""
    points = point_table(studies, repeats=0)
    names = _curve_names(points)
    keys = [c for c in (*CURVE_KEYS, *PROTOCOL_KEYS) if fits is not None and c in fits.columns and c in points]
    fitted = {tuple(str(row[c]) for c in keys): row for _, row in (fits if keys else pd.DataFrame()).iterrows()}
    found = []
    for index, point in points.iterrows():
        size = int(point["batch_size"])
        if pd.notna(point["steps_to_result"]):
            found.append((n.curve_metric(names[index], n.CURVE_STEPS), float(point["steps_to_result"]), size))
        fit = fitted.get(tuple(str(point[c]) for c in keys))
        if fit is not None and not is_degenerate(fit) and pd.notna(fit.get("s_min")) and pd.notna(fit.get("b_crit")):
            found.append((n.curve_metric(names[index], n.CURVE_STEPS_FIT),
                          float(fit["s_min"] * (1 + fit["b_crit"] / size)), size))
    return found


def run_name(studies: pd.DataFrame) -> str:
    """What was analysed, the varying part first: ``analysis digits-simple-cnn sgd,momentum 12 studies``."""
    workloads, optimizers = (",".join(sorted(studies[c].dropna().unique())) for c in ("workload", "optimizer"))
    return f"analysis {workloads} {optimizers} {len(studies)} studies"


def log_analysis(tracking_uri: str | None, experiment: str, studies: pd.DataFrame, tables: dict[str, pd.DataFrame],
                 files: list[Path], settings: dict[str, Any] | None = None,
                 argv: list[str] | None = None) -> tuple[str, str]:
    uri = resolve_tracking_uri(tracking_uri)
    quiet_links_with_credentials(uri)
    try:
        return _log_analysis(uri, experiment, studies, tables, files, settings or {}, argv)
    except (MlflowException, ImportError, OSError) as error:
        raise EdpsError(f"cannot log the analysis to {redact_uri(uri)}: {store_error_text(error, uri)}") from None


def _log_analysis(tracking_uri: str, experiment: str, studies: pd.DataFrame, tables: dict[str, pd.DataFrame],
                  files: list[Path], settings: dict[str, Any], argv: list[str] | None = None) -> tuple[str, str]:
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    used = list(studies["study_run_id"].dropna().astype(str))
    sweeps = sorted(set(studies["sweep_run_id"].dropna().astype(str)))
    tags = {n.TAG_KIND: n.KIND_ANALYSIS, n.TAG_ANALYSIS_STUDY_RUNS: ",".join(used)[:4900],
            n.TAG_ANALYSIS_STUDY_COUNT: str(len(used)), n.TAG_ANALYSIS_SWEEP_RUNS: ",".join(sweeps)[:4900],
            n.MLFLOW_RUN_NAME: run_name(studies), **provenance_tags(bool(launcher_run_id()), command=" ".join(
                ["edps-analyze", *(shlex.quote(redact_uri(a)) for a in (argv or []))])[:500])}
    if "fit" in tables:
        fits = markdown_table(fit_summary(tables["fit"]))
        tags[n.MLFLOW_NOTE] = (f"Fits of steps-to-result against batch size (S(B) = S_min (1 + B_crit / B); regime "
                               f"boundaries with a {settings.get('tolerance', 0.2):.0%} tolerance; brackets: 95% "
                               f"bootstrap intervals over replicates or complete trials, where they exist). The "
                               f"figures are under `figures/`, the whole report in the "
                               f"report artifact.\n\n{fits}\n")[:20_000]
    with suppress(MlflowException):  # its sweep run is gone: not nested
        if len(sweeps) == 1 and client.get_run(sweeps[0]).info.experiment_id == experiment_id:
            tags[n.MLFLOW_PARENT_RUN_ID] = sweeps[0]
    run_id = launcher_run_id() or client.create_run(experiment_id, tags=tags).info.run_id
    log_batch(client, run_id, params={k: str(v)[:500] for k, v in settings.items()}, tags=tags,
              metrics=curve_metrics(tables["fit"]) if "fit" in tables else {})
    log_points(client, run_id, chart_metrics(studies, tables.get("fit")))
    with tempfile.TemporaryDirectory() as scratch:
        for name, table in tables.items():
            (Path(scratch) / f"{name}.csv").write_text(csv_text(table), encoding="utf-8", newline="")
        (Path(scratch) / n.ARTIFACT_USED_STUDY_RUNS).write_text("\n".join(used) + "\n")
        client.log_artifacts(run_id, scratch)
    for path in files:
        client.log_artifact(run_id, str(path),
                            artifact_path=n.ARTIFACT_FIGURES_DIR if path.suffix in (".png", ".svg") else None)
    if not launcher_run_id():
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    return run_id, client.get_run(run_id).info.experiment_id
