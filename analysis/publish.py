"""``--log-to-mlflow``: the analysis as a run (``edps.kind=analysis``, under its sweep when there is one) beside
the studies it analysed: settings as params, fits as metrics (analysis.fit_metrics) and description, the runs
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
from analysis.fit_metrics import curve_metrics, curve_names
from analysis.regimes import CURVE_KEYS, PROTOCOL_KEYS, is_degenerate, point_table
from analysis.report import fit_summary, markdown_table
from edps_mlflow import names as n
from edps_mlflow.descriptions import provenance_tags
from edps_mlflow.errors import EdpsError
from edps_mlflow.process_settings import launcher_run_id
from edps_mlflow.store.client import log_batch, log_points, resolve_tracking_uri
from edps_mlflow.store.trouble import store_error_text
from edps_mlflow.uris import quiet_links_with_credentials, redact_uri

def chart_metrics(studies: pd.DataFrame, fits: pd.DataFrame | None) -> list[tuple[str, float, int]]:
    """(metric, value, batch size): each curve's measured steps-to-result (its point value) and, where its fit
    describes it, the fitted S(B) = S_min (1 + B_crit / B) at the same batch sizes, so that the run's charts draw
    both against the batch size. A point without a value (not reached) has none."""
    points = point_table(studies, repeats=0)
    names = curve_names(points)
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
