"""``--log-to-mlflow``: the analysis tables and figures as artifacts of an analysis run.

The run (``edps.kind=analysis``) is tagged with the study runs it used (``edps.analysis.study_runs``,
and the full list in ``used_study_runs.txt``), so the figures sit next to the runs in the MLflow UI.
Under ``mlflow run -e analyze`` the run that MLflow created is the analysis run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pandas as pd

from edps_mlflow import names as n
from edps_mlflow.errors import EdpsError
from edps_mlflow.uris import quiet_links_with_credentials, redact_uri


def log_analysis(tracking_uri: str | None, experiment: str, studies: pd.DataFrame, tables: dict[str, pd.DataFrame],
                 files: list[Path]) -> str:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import get_tracking_uri

    uri = tracking_uri or get_tracking_uri()
    quiet_links_with_credentials(uri)
    try:
        return _log_analysis(uri, experiment, studies, tables, files)
    except (MlflowException, ImportError, OSError) as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        raise EdpsError(f"cannot log the analysis to {redact_uri(uri)}: {redact_uri(lines[0])[:300]}") from None


def _log_analysis(tracking_uri: str, experiment: str, studies: pd.DataFrame, tables: dict[str, pd.DataFrame],
                  files: list[Path]) -> str:
    from mlflow.entities import RunStatus
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    client = MlflowClient(tracking_uri)
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        run_id = client.create_run(experiment_id, tags={MLFLOW_RUN_NAME: "analysis"}).info.run_id
    used = [r for r in studies.get("study_run_id", pd.Series(dtype=str)).dropna().astype(str)]
    client.set_tag(run_id, n.TAG_KIND, n.KIND_ANALYSIS)
    client.set_tag(run_id, n.TAG_ANALYSIS_STUDY_RUNS, ",".join(used)[:4900])
    client.set_tag(run_id, n.TAG_ANALYSIS_STUDY_COUNT, str(len(used)))
    with tempfile.TemporaryDirectory() as scratch:
        for name, table in tables.items():
            path = Path(scratch) / f"{name}.csv"
            table.to_csv(path, index=False)
            client.log_artifact(run_id, str(path))
        listing = Path(scratch) / n.ARTIFACT_USED_STUDY_RUNS
        listing.write_text("\n".join(used) + "\n")
        client.log_artifact(run_id, str(listing))
    for path in files:
        client.log_artifact(run_id, str(path), artifact_path=n.ARTIFACT_FIGURES_DIR if path.suffix in (".png", ".svg") else None)
    if not os.environ.get("MLFLOW_RUN_ID"):
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    return run_id
