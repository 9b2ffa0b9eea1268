"""What a study leaves in the store: the study run (params, tags, summary metrics, description, ``study.json``,
``trials.csv``) and its nested trial runs with their curves and masks. Runs are created with their kind and key
in one call; numbers that users filter on are metrics too (MLflow compares params and tags as strings); every
write that matters first proves that the study run is still ours (``ownership.lease.OwnedRun``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import pandas as pd

from edps_mlflow import __version__
from edps_mlflow import names as n
from edps_mlflow.config import StudySpec, TrialSpec, study_family
from edps_mlflow.curves import CurveId
from edps_mlflow.descriptions import (provenance_tags, pruning_params, study_description, study_run_name, study_tags,
                                      trial_outcome, trial_run_name)
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string
from edps_mlflow.ladder import goal_results, record_goal_steps, study_goal_metrics, study_goal_tags, trial_goal_metrics
from edps_mlflow.pruning import method_info
from edps_mlflow.results import (Check, ProbedTrials, PruningRecord, RunState, ScoreSource, StudyOutcome, TrialOutcome,
                                  TrialResult, TrialStatus, encode_trial_outcomes, trial_steps_lower_bound)
from edps_mlflow.store.client import StoreClient, log_batch, log_text, search_all
from edps_mlflow.store.experiment import create_run, index_study_run
from edps_mlflow.store.index import MAX_TAG_VALUE
from edps_mlflow.store.ownership.lease import OwnedRun, heartbeat_tags
from edps_mlflow.store.read.trials import StoredTrial
from edps_mlflow.uris import redact_uri

if TYPE_CHECKING:
    from edps_mlflow.pruning.mask import Mask


def create_study_run(client: StoreClient, experiment_id: str, spec: StudySpec, parent_run_id: str | None = None,
                     sweep_key: str | None = None, launcher_run_id: str | None = None, *, epoch: int) -> str:
    """The study run's id, with its kind, keys, epoch (read/fence.py) and a fresh heartbeat from its first moment:
    the run that ``mlflow run`` made for us (``launcher_run_id``), else a new run; nested under ``parent_run_id``
    (a sweep's). Its claim enters it in the study index, under the abort guard (ClaimRules.indexed)."""
    tags = {**_study_run_tags(spec, parent_run_id, sweep_key), n.TAG_EPOCH: str(epoch)}
    return create_run(client, experiment_id, tags, launcher_run_id)


def create_submitted_run(client: StoreClient, experiment_id: str, spec: StudySpec, sweep_run_id: str,
                         sweep_key: str) -> str:
    """A new run for a sweep's study that a job will adopt (``MLFLOW_RUN_ID``), tagged as
    :func:`claim_submitted_run` tags one, in one request."""
    run_id = client.create_run(experiment_id, tags={**_submitted_tags(spec, sweep_run_id, sweep_key),
                                                    **provenance_tags()}).info.run_id
    index_study_run(client, run_id)  # RUNNING in the index from this moment
    return run_id


def claim_submitted_run(client: StoreClient, run_id: str, spec: StudySpec, sweep_run_id: str, sweep_key: str) -> None:
    """Make a run submitted for a sweep's study that study's run (kind, keys, parent, heartbeat) before its entry
    point starts, minutes later maybe: from now on other processes see the study as taken."""
    log_batch(client, run_id, tags=_submitted_tags(spec, sweep_run_id, sweep_key))
    index_study_run(client, run_id)  # RUNNING in the index from this moment


def _study_run_tags(spec: StudySpec, parent_run_id: str | None, sweep_key: str | None) -> dict[str, str]:
    tags = {**study_tags(spec), **heartbeat_tags(), n.MLFLOW_RUN_NAME: study_run_name(spec)}
    if sweep_key:
        tags[n.TAG_SWEEP_KEY] = sweep_key
    if parent_run_id:
        tags[n.MLFLOW_PARENT_RUN_ID] = parent_run_id
    return tags


def _submitted_tags(spec: StudySpec, sweep_run_id: str, sweep_key: str) -> dict[str, str]:
    return {**_study_run_tags(spec, sweep_run_id, sweep_key), n.TAG_SUBMITTED_BY: sweep_run_id}


def log_launch_log(client: StoreClient, run_id: str, path: Path) -> None:
    """The output of a submitted run as its artifact ``mlflow-run.log`` (one try: the log also stays on disk)."""
    with tempfile.TemporaryDirectory(prefix="edps-launch-log-") as folder:
        copy = Path(folder) / n.ARTIFACT_LAUNCH_LOG
        shutil.copyfile(path, copy)
        client.log_artifact(run_id, str(copy))


# ---- what a study leaves in the store ---------------------------------------------------------
def trials_table(outcome: StudyOutcome, ladder: tuple[float, ...] = ()) -> pd.DataFrame:
    """``trials.csv``: one row per trial of the study (trained here or reused); a ladder's (``ladder``: its goals)
    with each trial's steps at every goal, ``steps_to_goal_<goal>``."""
    rows = [{
        "trial_index": record.trial.index, "trial_key": record.trial.trial_key, "status": record.status.value,
        "steps_to_result": record.steps_to_result, "steps_trained": record.steps_trained,
        **{n.goal_steps_column(goal): steps
           for goal, steps in zip(ladder, record_goal_steps(record, len(ladder)) if ladder else ())},
        "best_validation_error": record.best_validation_error, **record.trial.metaparameters,
        "init_seed": record.trial.init_seed, "run_id": record.run_id, "reused": record.reused,
        "seconds": round(record.seconds, 3), "seconds_per_step": record.seconds_per_step,
        "pack_size": record.pack_size, "device": record.device,
    } for record in outcome.records.values()]
    return pd.DataFrame(rows).astype({"steps_to_result": "Int64", **{
        n.goal_steps_column(goal): "Int64" for goal in ladder}})


def trial_outcomes_tag(outcome: StudyOutcome) -> str | None:
    """The tag edps.trial_outcomes of a study (results.encode_trial_outcomes); None when it exceeds MLflow's
    limit on a tag (some thousand trials: the analysis then reads the study's trials.csv)."""
    text = encode_trial_outcomes(TrialOutcome(r.trial.index, r.status, r.steps_to_result, r.steps_trained)
                                 for r in outcome.records.values())
    return text if len(text) <= MAX_TAG_VALUE else None


def study_metrics(outcome: StudyOutcome) -> dict[str, float]:
    """The study run's summary metrics."""
    # The result first: the run page lists metrics in the order they were first logged, and only the
    # identifying ones (batch size, sparsity, goal; logged at the start) come before it.
    metrics: dict[str, float] = {}
    if outcome.steps_to_result is not None:
        metrics[n.METRIC_STEPS_TO_RESULT] = outcome.steps_to_result
    metrics.update({n.trials_metric(status.value): outcome.count(status) for status in TrialStatus})
    metrics.update({n.METRIC_TRIALS_TOTAL: len(outcome.records), n.METRIC_TRIALS_REUSED: outcome.reused,
                    n.METRIC_TRIALS_TRAINED: outcome.trained, n.METRIC_STUDY_SECONDS: outcome.seconds,
                    n.METRIC_PROBE_SECONDS: sum(r.probe_seconds for r in outcome.records.values()),
                    n.METRIC_STUDY_TRIAL_STEPS: outcome.trial_steps})
    lower_bound = trial_steps_lower_bound(outcome.records)
    metrics[n.METRIC_STUDY_TRIAL_STEPS_LOWER_BOUND] = lower_bound
    if lower_bound > 0:  # nothing trained, or nothing needed: no ratio
        metrics[n.METRIC_STUDY_TRIAL_STEPS_RATIO] = outcome.trial_steps / lower_bound
    best = outcome.best_record()
    metrics.update({n.METRIC_BEST_PREFIX + k: v for k, v in (best.trial.metaparameters if best else {}).items()})
    if best is not None and best.seconds_per_step is not None:
        # The study's time per step is its best trial's: the one whose steps make steps-to-result.
        metrics[n.METRIC_SECONDS_PER_STEP] = best.seconds_per_step
        if best.pack_size is not None:
            metrics[n.METRIC_PACK_SIZE] = best.pack_size
    return metrics


def study_json(spec: StudySpec, outcome: StudyOutcome, run_settings: dict[str, Any],
               goal_bounds: tuple[int | float, ...], probed: ProbedTrials | None = None,
               model_size: tuple[int, int] | None = None, pruning: dict[str, Any] | None = None) -> dict[str, Any]:
    """``study.json``: the study, its result and how it was run (``pruning``: results.pruning_summary)."""
    best, info = outcome.best_record(), method_info(spec.pruning)
    return {
        **({"probed_trials": {"mode": probed.mode, "best_trial_index": probed.best_trial_index,
                              "best_probe_run_id": probed.best_probe_run_id, "reused": probed.reused}}
           if probed else {}),
        "version": __version__, "study_key": spec.study_key, "spec": spec.key_fields(),
        "steps_to_result": outcome.steps_to_result,
        "best_trial": None if best is None else {"trial_index": best.trial.index, "run_id": best.run_id,
                                                  "metaparameters": best.trial.metaparameters,
                                                  "seconds_per_step": best.seconds_per_step,
                                                  "pack_size": best.pack_size, "device": best.device},
        "model": None if model_size is None else {"parameters": model_size[0], "parameter_bytes": model_size[1]},
        "pruning": {"method": spec.pruning, "prunes": info.prunes.value, "scope": info.scope.value, "data": info.data,
                    "definition": info.summary, "sparsity": spec.sparsity, **({"scores": pruning} if pruning else {})},
        "counts": {status.value: outcome.count(status) for status in TrialStatus},
        "reused": outcome.reused, "trained": outcome.trained, "trial_steps": outcome.trial_steps,
        "trial_steps_lower_bound": trial_steps_lower_bound(outcome.records),
        "seconds": outcome.seconds, "execution": run_settings, "allowed_validation_errors": goal_bounds[-1],
        **({"goals": [{"goal": r.goal, "steps_to_result": r.steps_to_result, "allowed_validation_errors": bound,
                       "best_trial": None if r.best is None else {"trial_index": r.best.trial.index,
                                                                  "metaparameters": r.best.trial.metaparameters}}
                      for r, bound in zip(goal_results(spec, outcome.records), goal_bounds)]} if spec.goals else {}),
    }


class StudyTracker:
    """The study run and its nested trial runs. Only this class writes to MLflow during a study."""

    def __init__(self, client: StoreClient, experiment_id: str, owned: OwnedRun, sweep_key: str | None,
                 study_key: str) -> None:
        self.client, self.experiment_id, self.owned, self.sweep_key = client, experiment_id, owned, sweep_key
        self.study_key = study_key  # the study run's (a study that probes its best trial: not its trials')
        self.trial_runs: dict[int, str] = {}
        self._creating: str | None = None  # the trial key of a trial run being created (open_trial_runs)
        self.trial_specs: dict[int, TrialSpec] = {}
        self.trial_runs_finished = 0  # METRIC_TRIAL_RUNS_FINISHED: the trial runs this study run finished
        self._monitor: Any = None
        self._scratch = Path(tempfile.mkdtemp(prefix="edps-artifacts-"))

    @property
    def study_run_id(self) -> str:
        return self.owned.run_id

    # ---- opening and closing -------------------------------------------------------------
    def artifact_location(self) -> str:
        """Where this study's artifacts go (the experiment's artifact location, credentials hidden)."""
        return redact_uri(self.client.get_experiment(self.experiment_id).artifact_location)

    def start_system_metrics(self) -> None:
        """CPU, memory (and GPU, with nvidia-ml-py) of this machine on the study run every 10 s, until it ends."""
        try:
            import psutil  # noqa: F401  (MLflow's monitor needs it)
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        except ImportError:
            raise EdpsError("--system-metrics needs psutil: pip install psutil") from None
        self._monitor = SystemMetricsMonitor(self.study_run_id, tracking_uri=str(self.client.tracking_uri))
        self._monitor.start()

    def log_datasets(self, name: str, splits: dict[str, tuple[Any, Any]]) -> None:
        """The study's data as MLflow datasets, one per split: context -> (images, labels) as numpy arrays."""
        from mlflow.data.numpy_dataset import from_numpy
        from mlflow.entities import DatasetInput, InputTag

        inputs = [DatasetInput(from_numpy(images, targets=labels, name=f"{name} {context}")._to_mlflow_entity(),
                               tags=[InputTag(n.MLFLOW_DATA_CONTEXT, context)])
                  for context, (images, labels) in splits.items()]
        for attempt in range(3):
            try:
                self.client.log_inputs(self.study_run_id, datasets=inputs)
                return
            except Exception as error:  # noqa: BLE001  (the store's own integrity error, from its driver)
                # Studies started at once record the same dataset (same name and digest) in one
                # experiment: the store's unique constraint lets one insert it; the others then find it.
                if attempt == 2 or "unique" not in str(error).lower():
                    raise
                time.sleep(0.2 * (attempt + 1))

    def adopt(self, reused: Iterable[StoredTrial]) -> None:
        """Count the finished trial runs this study reuses in its epoch: those of earlier runs of its key would
        count no more once it has logged its start (read/fence.py), and a trial run that the process of such a run
        finishes after this read never does. Before :meth:`log_study_start`."""
        for trial in reused:
            epoch, key = max(trial.epochs, default=(0, ""))
            if key == self.study_key and epoch < self.owned.epoch:
                self.client.set_tag(trial.run_id, f"{n.TAG_EPOCH_PREFIX}{self.owned.epoch}", self.study_key)

    def log_study_start(self, spec: StudySpec, settings: dict[str, Any], reused: int) -> None:
        params = {**{n.PARAM_SPEC_PREFIX + k: v for k, v in spec.key_fields().items()}, **pruning_params(spec)}
        # Execution settings are tags, not params: a resumed study may run with other settings.
        tags = {n.TAG_RUN_SETTING_PREFIX + k: str(v) for k, v in settings.items()}
        tags.update(study_tags(spec))
        tags.update({n.TAG_STOPPING: n.STOPPING_FULL_TRIALS if settings.get("full_trials") else n.STOPPING_EXACT,
                     n.TAG_REUSED: str(reused)})
        if self.sweep_key:
            tags[n.TAG_SWEEP_KEY] = self.sweep_key
        metrics = {n.METRIC_BATCH_SIZE: spec.batch_size, n.METRIC_SPARSITY: spec.sparsity,
                   n.METRIC_GOAL_ERROR: spec.goal_error, n.METRIC_TRIAL_RUNS_FINISHED: self.trial_runs_finished}
        log_batch(self.client, self.study_run_id, params=params, tags=tags, metrics=metrics)

    def record_outcome(self, spec: StudySpec, outcome: StudyOutcome, run_settings: dict[str, Any],
                       goal_bounds: tuple[int | float, ...], probed: ProbedTrials | None = None,
                       model_size: tuple[int, int] | None = None, pruning: dict[str, Any] | None = None) -> None:
        """The summary metrics, best metaparameters (and timing device), probes, network size ``(parameters,
        bytes)``, pruning scores' cost (results.pruning_summary) and the two artifacts; only while the run is ours."""
        self.owned.require()
        best = outcome.best_record()
        params: dict[str, Any] = {n.PARAM_BEST_PREFIX + k: v
                                  for k, v in (best.trial.metaparameters if best else {}).items()}
        metrics = study_metrics(outcome)
        if best is not None and best.seconds_per_step is not None and best.device is not None:
            params[n.PARAM_TIMING_DEVICE] = best.device
        if model_size is not None:
            metrics.update({n.METRIC_MODEL_PARAMETERS: model_size[0], n.METRIC_MODEL_PARAMETER_BYTES: model_size[1]})
        if pruning:
            metrics.update({n.METRIC_PRUNING_SECONDS: pruning["seconds"],
                            n.METRIC_PRUNING_SECONDS_SAVED: pruning["seconds_saved"]})
        tags = {n.MLFLOW_NOTE: study_description(spec, outcome, probed, run_settings.get("unverified_data")),
                n.MLFLOW_RUN_NAME: study_run_name(spec, outcome)}
        rungs = goal_results(spec, outcome.records)
        metrics.update(study_goal_metrics(spec, rungs))
        tags.update(study_goal_tags(spec, outcome, rungs, MAX_TAG_VALUE))
        outcomes = trial_outcomes_tag(outcome)
        if outcomes is not None:
            tags[n.TAG_TRIAL_OUTCOMES] = outcomes
        if probed is not None:
            tags[n.TAG_PROBED_TRIALS] = probed.mode
            if probed.best_probe_run_id:
                tags[n.TAG_BEST_PROBE_RUN] = probed.best_probe_run_id
            if probed.probe_seconds:
                metrics[n.METRIC_PROBE_SECONDS] += probed.probe_seconds  # the best trial's probed run
        log_batch(self.client, self.study_run_id, params=params, metrics=metrics, tags=tags)
        log_text(self.client, self.study_run_id, n.ARTIFACT_TRIALS_CSV,
                 trials_table(outcome, spec.ladder if spec.goals else ()).to_csv(index=False))
        document = study_json(spec, outcome, run_settings, goal_bounds, probed, model_size, pruning)
        log_text(self.client, self.study_run_id, n.ARTIFACT_STUDY_JSON, json.dumps(document, indent=2, sort_keys=True))

    def finish_study(self) -> None:
        """FINISHED, if the study run is still ours (else ``LeaseLost``, and nothing written)."""
        self.owned.finish()
        self.close()
        # After FINISHED, never before: an entry claims only what the store holds (index.py).
        index_study_run(self.client, self.study_run_id)

    def open_trial_runs(self) -> list[str]:
        """The trial runs to mark when the study stops: those it holds, and one whose creation the stop cut off
        after the store made it (an interrupt deferred to the end of a store call is raised before its id is kept),
        found by its key."""
        runs = list(self.trial_runs.values())
        if self._creating is not None:
            with suppress(Exception):  # best effort: the owner's exit covers a run not found
                conditions = filter_string(tags={n.TAG_TRIAL_KEY: self._creating,
                                                 n.MLFLOW_PARENT_RUN_ID: self.study_run_id}, status="RUNNING")
                runs += [run.info.run_id for run in search_all(self.client.without_retries(), self.experiment_id,
                                                               conditions) if run.info.run_id not in runs]
        return runs

    def close(self) -> None:
        """Stop the system-metrics monitor and remove the scratch folder (every artifact is in the store)."""
        if self._monitor is not None:
            self._monitor.finish()
            self._monitor = None
        shutil.rmtree(self._scratch, ignore_errors=True)

    # ---- trials ----------------------------------------------------------------------------
    def start_trial(self, trial: TrialSpec, mask: Mask | None, pruning: PruningRecord | None = None) -> None:
        """Create the nested trial run; ``mask`` and ``pruning`` are None for a trial superseded before pruning."""
        self.owned.require_fresh()  # a woken process whose heartbeat found the study taken over stops here
        spec = trial.study
        tags = {n.TAG_KIND: n.KIND_TRIAL, n.TAG_TRIAL_KEY: trial.trial_key, n.TAG_STUDY_KEY: spec.study_key,
                n.TAG_STUDY_FAMILY: study_family(spec), **CurveId.of(spec).tags(),
                n.TAG_BATCH_SIZE: str(spec.batch_size), n.TAG_VERSION: __version__,
                f"{n.TAG_EPOCH_PREFIX}{self.owned.epoch}": self.study_key}
        if self.sweep_key:
            tags[n.TAG_SWEEP_KEY] = self.sweep_key
        self._creating = trial.trial_key
        run = self.client.create_run(self.experiment_id, tags={
            **tags, **provenance_tags(), n.MLFLOW_PARENT_RUN_ID: self.study_run_id,
            n.MLFLOW_RUN_NAME: trial_run_name(trial)})
        run_id = run.info.run_id
        self.trial_runs[trial.index] = run_id
        self._creating = None
        self.trial_specs[trial.index] = trial
        params = {**trial.metaparameters, n.PARAM_SEED: trial.init_seed, n.PARAM_TRIAL_INDEX: trial.index,
                  n.PARAM_BATCH_SIZE: spec.batch_size, n.PARAM_SPARSITY: spec.sparsity,
                  n.PARAM_OPTIMIZER: spec.optimizer, n.PARAM_WORKLOAD: spec.workload, n.PARAM_GOAL: spec.goal_error,
                  **pruning_params(spec)}
        # One-value facts of a trial are params (its metaparameters are already): the chart view draws a metric
        # as a chart, sections in alphabetical order, and constants would lead it (read/trials.py reads both).
        if pruning is not None:
            params[n.PARAM_PRUNING_SCORES] = pruning.source.value
            if pruning.source is not ScoreSource.NONE:
                params[n.METRIC_PRUNING_SECONDS] = pruning.seconds
            if pruning.source is ScoreSource.CACHED:
                params[n.METRIC_PRUNING_SECONDS_SAVED] = pruning.seconds_saved
        log_batch(self.client, run_id, params=params)
        if mask is None:
            return
        mask_dir = self._scratch / f"trial-{trial.index}" / n.ARTIFACT_MASK_DIR
        for path in mask.save(mask_dir, n.ARTIFACT_MASK_FILE, n.ARTIFACT_MASK_SUMMARY):
            self.client.log_artifact(run_id, str(path), artifact_path=n.ARTIFACT_MASK_DIR)
        shutil.rmtree(mask_dir.parent, ignore_errors=True)

    def log_check(self, trial_index: int, check: Check) -> None:
        metrics = {n.METRIC_TRAIN_LOSS: check.train_loss, n.METRIC_LEARNING_RATE: check.learning_rate}
        if check.validation_error is not None:
            # Its distance to the goal beside it (the chart view sorts a section's charts by name): a flat line of
            # the goal itself would be drawn on an axis of its own, and read only by hovering.
            goal = self.trial_specs[trial_index].study.goal_error
            metrics.update({n.METRIC_VALIDATION_ERROR: check.validation_error,
                            n.METRIC_ERROR_MINUS_GOAL: check.validation_error - goal})
        log_batch(self.client, self.trial_runs[trial_index], metrics=metrics, step=check.step)

    def log_probe(self, trial_index: int, step: int, values: dict[str, float]) -> None:
        finite = {k: v for k, v in values.items() if v == v and abs(v) != float("inf")}
        if finite:
            log_batch(self.client, self.trial_runs[trial_index], metrics=finite, step=step)

    def finish_trial(self, result: TrialResult, device: str | None = None) -> str:
        """End a trial's run with its outcome (and its seconds per step on ``device``), only while the study run is
        ours: a process stalled past its lease must not finish a trial that another process trains again."""
        self.owned.require()
        run_id = self.trial_runs.pop(result.index)
        metrics: dict[str, float] = {n.METRIC_STEPS_TRAINED: result.steps_trained}
        params: dict[str, Any] = {n.METRIC_CHECKS_CUT_SHORT: result.checks_cut_short,
                                  n.METRIC_TRIAL_SECONDS: result.seconds}
        if result.seconds_per_step is not None:
            # repr, not the params' 12 digits: a study that reuses this trial reads them back exactly.
            params.update({n.METRIC_SECONDS_PER_STEP: repr(float(result.seconds_per_step)),
                           n.METRIC_PACK_SIZE: repr(float(result.pack_size))})
            if device is not None:
                params[n.PARAM_DEVICE] = device
        if result.probe_seconds:
            params[n.METRIC_PROBE_SECONDS] = result.probe_seconds
        if result.steps_to_result is not None:
            metrics[n.METRIC_STEPS_TO_RESULT] = result.steps_to_result
        if result.best_validation_error is not None:
            metrics[n.METRIC_BEST_VALIDATION_ERROR] = result.best_validation_error
        tags = {n.TAG_STATUS: result.status.value}
        if result.index in self.trial_specs:
            metrics.update(trial_goal_metrics(self.trial_specs[result.index].study, result))
            tags[n.MLFLOW_RUN_NAME] = trial_run_name(self.trial_specs.pop(result.index), trial_outcome(result))
        # Step 0: the UI charts a metric whose latest step is 0 as a bar (a value), one at a later step as
        # a line, which for a single value is a lone dot.
        log_batch(self.client, run_id, params=params, metrics=metrics, tags=tags)
        self.client.set_terminated(run_id, RunState.FINISHED.value)
        # Counted after the trial run is FINISHED: a kill in between leaves the count short, never long, and
        # readers trust it only once the study run is FINISHED.
        self.trial_runs_finished += 1
        log_batch(self.client, self.study_run_id, metrics={n.METRIC_TRIAL_RUNS_FINISHED: self.trial_runs_finished})
        return run_id

