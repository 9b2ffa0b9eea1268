"""Every MLflow write of the training side, and the names of tags, params and metrics.

Layout in the tracking store (one module holds these names):

- Experiment: ``MLFLOW_EXPERIMENT_NAME`` / ``--experiment`` if given, else one per workload and
  optimizer (``edps/<workload>/<optimizer>``). Under ``mlflow run`` the run it created is the study run.
- Sweep run (``edps sweep``): tags ``edps.kind=sweep``, ``edps.sweep_key``; the parent of its studies.
- Study run: tags ``edps.kind=study``, ``edps.study_key``, ``edps.study_family``, ``edps.workload``,
  ``edps.optimizer``, ``edps.sparsity``, ``edps.batch_size``, ``edps.run.*`` (execution settings,
  which do not change the result); params ``spec.*`` (the resolved study)
  and ``best.*`` (the best trial's metaparameters); metrics ``steps_to_result`` (absent when no trial
  reached), ``trials/<status>``, ``trials/total``, ``trials/reused``, ``batch_size``, ``sparsity``,
  ``goal_error``, ``best/learning_rate`` ...; artifacts ``study.json`` and ``trials.csv``.
- Trial run, nested (``mlflow.parentRunId``): tags ``edps.kind=trial``, ``edps.trial_key``,
  ``edps.status``; params: each metaparameter, ``seed``, ``trial_index``; metrics ``validation/error``,
  ``train/loss``, ``learning_rate`` per check (with ``step``), and ``steps_to_result``,
  ``steps_trained``, ``hp/<metaparameter>``; artifacts ``mask/mask.npz``, ``mask/summary.json``.

Numbers that users filter on are metrics as well as params/tags, because MLflow compares params
and tags only as strings. Metrics go out with ``log_batch``, one request per trial per check.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

from edps_mlflow import __version__
from edps_mlflow.config import StudySpec, TrialSpec, content_key
from edps_mlflow.engine import Check, TrialResult
from edps_mlflow.errors import EdpsError
from edps_mlflow.pruning import Mask

TAG_KIND = "edps.kind"
TAG_STUDY_KEY = "edps.study_key"
TAG_STUDY_FAMILY = "edps.study_family"
TAG_TRIAL_KEY = "edps.trial_key"
TAG_STATUS = "edps.status"
TAG_WORKLOAD = "edps.workload"
TAG_OPTIMIZER = "edps.optimizer"
TAG_SPARSITY = "edps.sparsity"
TAG_BATCH_SIZE = "edps.batch_size"
TAG_VERSION = "edps.version"
TAG_STOPPING = "edps.early_stopping"
TAG_REUSED = "edps.trials_reused"
TAG_SWEEP_KEY = "edps.sweep_key"
KIND_SWEEP = "sweep"
KIND_STUDY = "study"
KIND_TRIAL = "trial"

METRIC_STEPS_TO_RESULT = "steps_to_result"
METRIC_STEPS_TRAINED = "steps_trained"
METRIC_BEST_VALIDATION_ERROR = "best_validation_error"
METRIC_CHECKS_CUT_SHORT = "validation/checks_cut_short"

_BATCH_LIMIT = 1000  # metrics per log_batch call


def sparsity_tag(sparsity: float) -> str:
    return repr(float(sparsity))


def study_family(spec: StudySpec) -> str:
    """Everything of a study but its trial count: trials of such studies can be shared."""
    return content_key({"kind": "study-family", **{k: v for k, v in spec.key_fields().items() if k != "trials"}})


def default_experiment_name(spec: StudySpec) -> str:
    return f"edps/{spec.workload}/{spec.optimizer.value}"


def _now_ms() -> int:
    return int(time.time() * 1000)


class StudyTracker:
    """The study run and its nested trial runs. Only this class writes to MLflow during a study."""

    def __init__(self, client: MlflowClient, experiment_id: str, study_run_id: str, created_run: bool) -> None:
        self.client = client
        self.experiment_id = experiment_id
        self.study_run_id = study_run_id
        self.created_run = created_run
        self.trial_runs: dict[int, str] = {}
        self.sweep_key: str | None = None
        self._scratch = Path(tempfile.mkdtemp(prefix="edps-artifacts-"))

    # ---- opening -------------------------------------------------------------------------
    @classmethod
    def open(cls, spec: StudySpec, experiment_name: str | None, tracking_uri: str | None = None,
             parent_run_id: str | None = None, attach_run_id: str | None = None,
             sweep_key: str | None = None) -> "StudyTracker":
        """The study run: ``attach_run_id`` (resuming a sweep's study), else ``MLFLOW_RUN_ID`` when not in a
        sweep (``mlflow run``), else a new run, nested under ``parent_run_id`` when given."""
        client = MlflowClient(tracking_uri)
        attached = attach_run_id or (None if parent_run_id else os.environ.get("MLFLOW_RUN_ID"))
        try:
            if attached:
                run = client.get_run(attached)
                if run.info.status != "RUNNING":
                    client.update_run(attached, status="RUNNING")
                tracker = cls(client, run.info.experiment_id, attached, created_run=False)
            else:
                experiment_id = resolve_experiment(
                    client, experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME"), default_experiment_name(spec))
                tags = {MLFLOW_RUN_NAME: study_run_name(spec)}
                if parent_run_id:
                    tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
                run = client.create_run(experiment_id, tags=tags)
                tracker = cls(client, experiment_id, run.info.run_id, created_run=True)
        except MlflowException as error:
            raise EdpsError(f"tracking store {client.tracking_uri}: {error.message.splitlines()[0]}") from None
        tracker.sweep_key = sweep_key
        return tracker

    # ---- the study -------------------------------------------------------------------------
    def log_study_start(self, spec: StudySpec, settings: dict[str, Any], reused: int) -> None:
        params = {f"spec.{k}": v for k, v in spec.key_fields().items()}
        # Execution settings are tags, not params: a resumed study may run with other settings.
        tags = {f"edps.run.{k}": str(v) for k, v in settings.items()}
        tags.update({
            TAG_KIND: KIND_STUDY, TAG_STUDY_KEY: spec.study_key, TAG_STUDY_FAMILY: study_family(spec),
            TAG_WORKLOAD: spec.workload, TAG_OPTIMIZER: spec.optimizer.value,
            TAG_SPARSITY: sparsity_tag(spec.sparsity), TAG_BATCH_SIZE: str(spec.batch_size),
            TAG_VERSION: __version__,
            TAG_STOPPING: "full_trials" if settings.get("full_trials") else "exact",
            TAG_REUSED: str(reused),
        })
        if self.sweep_key:
            tags[TAG_SWEEP_KEY] = self.sweep_key
        if not self.created_run:
            tags[MLFLOW_RUN_NAME] = study_run_name(spec)
        metrics = {"batch_size": spec.batch_size, "sparsity": spec.sparsity, "goal_error": spec.goal_error}
        self._log(self.study_run_id, params=params, tags=tags, metrics=metrics)

    def log_study_result(self, summary: dict[str, Any], trials_csv: str, study_json: dict[str, Any]) -> None:
        metrics = dict(summary["metrics"])
        params = {f"best.{k}": v for k, v in summary.get("best_metaparameters", {}).items()}
        metrics.update({f"best/{k}": v for k, v in summary.get("best_metaparameters", {}).items()})
        self._log(self.study_run_id, params=params, metrics=metrics)
        (self._scratch / "trials.csv").write_text(trials_csv)
        (self._scratch / "study.json").write_text(json.dumps(study_json, indent=2, sort_keys=True))
        self.client.log_artifact(self.study_run_id, str(self._scratch / "trials.csv"))
        self.client.log_artifact(self.study_run_id, str(self._scratch / "study.json"))

    def finish_study(self) -> None:
        self.client.set_terminated(self.study_run_id, RunStatus.to_string(RunStatus.FINISHED))

    def abort(self, interrupted: bool) -> None:
        """Leave nothing RUNNING: open trial runs and the study run become KILLED (interrupt) or FAILED."""
        name = RunStatus.to_string(RunStatus.KILLED if interrupted else RunStatus.FAILED)
        for run_id in list(self.trial_runs.values()):
            try:
                self.client.set_terminated(run_id, name)
            except MlflowException:
                pass
        self.trial_runs.clear()
        try:
            self.client.set_terminated(self.study_run_id, name)
        except MlflowException:
            pass

    # ---- trials ----------------------------------------------------------------------------
    def start_trial(self, trial: TrialSpec, mask: Mask | None) -> None:
        """Create the nested trial run; ``mask`` is None for a trial superseded before it was pruned."""
        spec = trial.study
        run = self.client.create_run(self.experiment_id, tags={
            MLFLOW_PARENT_RUN_ID: self.study_run_id,
            MLFLOW_RUN_NAME: trial_run_name(trial),
        })
        run_id = run.info.run_id
        self.trial_runs[trial.index] = run_id
        params = {**trial.metaparameters, "seed": trial.init_seed, "trial_index": trial.index,
                  "batch_size": spec.batch_size, "sparsity": spec.sparsity, "optimizer": spec.optimizer.value,
                  "workload": spec.workload}
        tags = {TAG_KIND: KIND_TRIAL, TAG_TRIAL_KEY: trial.trial_key, TAG_STUDY_KEY: spec.study_key,
                TAG_STUDY_FAMILY: study_family(spec), TAG_WORKLOAD: spec.workload,
                TAG_OPTIMIZER: spec.optimizer.value, TAG_SPARSITY: sparsity_tag(spec.sparsity),
                TAG_BATCH_SIZE: str(spec.batch_size), TAG_VERSION: __version__}
        if self.sweep_key:
            tags[TAG_SWEEP_KEY] = self.sweep_key
        metrics = {f"hp/{k}": v for k, v in trial.metaparameters.items()}
        metrics.update({"batch_size": spec.batch_size, "sparsity": spec.sparsity})
        self._log(run_id, params=params, tags=tags, metrics=metrics)
        if mask is None:
            return
        mask_dir = self._scratch / f"trial-{trial.index}" / "mask"
        for path in mask.save(mask_dir):
            self.client.log_artifact(run_id, str(path), artifact_path="mask")

    def log_check(self, trial_index: int, check: Check) -> None:
        metrics = {"train/loss": check.train_loss, "learning_rate": check.learning_rate}
        if check.validation_error is not None:
            metrics["validation/error"] = check.validation_error
        self._log(self.trial_runs[trial_index], metrics=metrics, step=check.step)

    def log_probe(self, trial_index: int, step: int, values: dict[str, float]) -> None:
        finite = {k: v for k, v in values.items() if v == v and abs(v) != float("inf")}
        if finite:
            self._log(self.trial_runs[trial_index], metrics=finite, step=step)

    def finish_trial(self, result: TrialResult) -> str:
        run_id = self.trial_runs.pop(result.index)
        metrics: dict[str, float] = {METRIC_STEPS_TRAINED: result.steps_trained,
                                     METRIC_CHECKS_CUT_SHORT: result.checks_cut_short,
                                     "trial/seconds": result.seconds}
        if result.probe_seconds:
            metrics["probe/seconds"] = result.probe_seconds
        if result.steps_to_result is not None:
            metrics[METRIC_STEPS_TO_RESULT] = result.steps_to_result
        if result.best_validation_error is not None:
            metrics[METRIC_BEST_VALIDATION_ERROR] = result.best_validation_error
        self._log(run_id, metrics=metrics, tags={TAG_STATUS: result.status.value}, step=result.steps_trained)
        self.client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
        return run_id

    # ---- plumbing --------------------------------------------------------------------------
    def _log(self, run_id: str, params: dict[str, Any] | None = None, tags: dict[str, str] | None = None,
             metrics: dict[str, float] | None = None, step: int = 0) -> None:
        _log_batch(self.client, run_id, params=params, tags=tags, metrics=metrics, step=step)


def resolve_experiment(client: MlflowClient, name: str | None, default_name: str) -> str:
    name = name or default_name
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage != "active":
            raise EdpsError(f"experiment {name!r} is deleted; restore it or choose another name")
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        # Another process created it in the meantime.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def study_run_name(spec: StudySpec) -> str:
    return f"study {spec.workload} {spec.optimizer.value} bs={spec.batch_size} sparsity={spec.sparsity:g}"


def trial_run_name(trial: TrialSpec) -> str:
    values = " ".join(f"{k}={v:.4g}" for k, v in trial.metaparameters.items())
    return f"trial {trial.index:03d} {values}"


def mark_refused(run_id: str, message: str) -> None:
    """Record why a study was refused on the run that ``mlflow run`` created before we started.

    MLflow creates that run before the entry point runs and marks it FAILED when we exit non-zero;
    deleting it would make ``mlflow run`` itself crash, so it stays, FAILED, with the reason as a tag.
    """
    try:
        MlflowClient().set_tag(run_id, "edps.error", message[:5000])
    except MlflowException:
        pass


class SweepTracker:
    """The sweep run: the parent of the sweep's study runs."""

    def __init__(self, client: MlflowClient, experiment_id: str, run_id: str) -> None:
        self.client, self.experiment_id, self.run_id = client, experiment_id, run_id

    @classmethod
    def open(cls, client: MlflowClient, experiment_id: str, existing_run_id: str | None, name: str) -> "SweepTracker":
        """Continue the sweep's existing run (a resumed sweep), else ``MLFLOW_RUN_ID``, else a new run."""
        try:
            run_id = existing_run_id or os.environ.get("MLFLOW_RUN_ID")
            if run_id:
                if client.get_run(run_id).info.status != "RUNNING":
                    client.update_run(run_id, status="RUNNING")
            else:
                run_id = client.create_run(experiment_id, tags={MLFLOW_RUN_NAME: name}).info.run_id
        except MlflowException as error:
            raise EdpsError(f"tracking store {client.tracking_uri}: {error.message.splitlines()[0]}") from None
        return cls(client, experiment_id, run_id)

    def log_start(self, sweep_key: str, workload: str, params: dict[str, Any], plan: dict[str, int]) -> None:
        tags = {TAG_KIND: KIND_SWEEP, TAG_SWEEP_KEY: sweep_key, TAG_WORKLOAD: workload, TAG_VERSION: __version__}
        existing = self.client.get_run(self.run_id).data.params
        # A resumed sweep keeps its params; only new ones are written (MLflow forbids changing one).
        new_params = {f"sweep.{k}": str(v) for k, v in params.items() if f"sweep.{k}" not in existing}
        _log_batch(self.client, self.run_id, params=new_params, tags=tags,
                   metrics={f"plan/{k}": v for k, v in plan.items()})

    def mark_failed(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            self.client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))

    def finish(self, metrics: dict[str, float]) -> None:
        _log_batch(self.client, self.run_id, metrics=metrics)
        self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))

    def abort(self, interrupted: bool) -> None:
        try:
            self.client.set_terminated(self.run_id, RunStatus.to_string(
                RunStatus.KILLED if interrupted else RunStatus.FAILED))
        except MlflowException:
            pass


def _log_batch(client: MlflowClient, run_id: str, params: dict[str, Any] | None = None,
               tags: dict[str, str] | None = None, metrics: dict[str, float] | None = None, step: int = 0) -> None:
    timestamp = _now_ms()
    metric_list = [Metric(k, float(v), timestamp, step) for k, v in (metrics or {}).items()]
    param_list = [Param(k, str(v)) for k, v in (params or {}).items()]
    tag_list = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
    # MLflow's limits per call: 1,000 metrics, 100 params, 100 tags.
    while metric_list or param_list or tag_list:
        client.log_batch(run_id, metrics=metric_list[:_BATCH_LIMIT], params=param_list[:100], tags=tag_list[:100])
        metric_list, param_list, tag_list = metric_list[_BATCH_LIMIT:], param_list[100:], tag_list[100:]


def client_for(tracking_uri: str | None) -> MlflowClient:
    return MlflowClient(tracking_uri)


def resolved_tracking_uri() -> str:
    """The URI MLflow resolves right now (env var, else the default local store), made explicit
    so that worker processes and other machines write to the same store."""
    from mlflow.tracking import get_tracking_uri

    return get_tracking_uri()


def initialise_store(tracking_uri: str) -> None:
    """Touch the store once so that its schema exists before parallel workers open it
    (several processes creating a new sqlite store at once crash in MLflow's migration)."""
    MlflowClient(tracking_uri).search_experiments(max_results=1)
