"""Every name the project writes to or reads from MLflow: tags, params, metrics, artifacts.

This module imports nothing, so the training side, the status command and the analysis can all
share it without pulling in torch or MLflow. No MLflow name is spelled as a string literal anywhere
else in the project.

Layout in the tracking store:

- Sweep run (``edps sweep``): tags ``edps.kind=sweep``, ``edps.sweep_key``; params ``sweep.*``; the
  parent of its study runs. An adaptive sweep's run (``edps sweep --adaptive``) adds the tag
  ``edps.adaptive.stop``, metrics ``adaptive/*`` and the artifact ``adaptive_decisions.csv``.
- Study run: tags ``edps.kind=study``, ``edps.study_key``, ``edps.study_family``, ``edps.workload``,
  ``edps.optimizer``, ``edps.sparsity``, ``edps.pruning``, ``edps.batch_size``, ``edps.run.*`` (execution
  settings, which do not change the result); params ``spec.*`` (the resolved study), ``pruning.method``
  and ``pruning.prunes`` (the method and what it may prune) and ``best.*`` (the best trial's
  metaparameters); metrics ``steps_to_result`` (absent when no trial reached), ``trials/<status>``,
  ``trials/total`` ...; artifacts ``study.json`` and ``trials.csv``. What readers need about its trials without
  reading them: ``trials/runs_finished`` (the trial runs it has finished, counted as it goes), the tag
  ``edps.trial_families`` (the study families its trial runs are in) and, once it finished, the tag
  ``edps.trial_outcomes`` (each trial's status and steps, the bootstrap's input, in one line).
- Trial run, nested under its study: tags ``edps.kind=trial``, ``edps.trial_key``, ``edps.status`` (and the
  study's axes); params ``pruning.method``, ``pruning.prunes``, ``pruning.scores`` (computed or cached);
  metrics ``validation/error``, ``train/loss``, ``learning_rate`` per check, ``train/seconds_per_step`` and
  ``train/pack_size`` at the end (param ``device``); artifacts under ``mask/``.
- Study and sweep runs renew ``edps.heartbeat`` while they run (their lease); a run that gave way to
  an earlier live run of its key is FAILED with ``edps.yielded_to``.
- A study run submitted through MLflow Projects (``--executor mlflow-project``) is the run MLflow made,
  with MLflow's project tags and the entry point's params, ``edps.submitted_by`` (the sweep run) and the
  artifact ``mlflow-run.log`` (its output, on the local backend).
- Analysis run (``edps-analyze ... --log-to-mlflow``): tag ``edps.kind=analysis``.
- Study index run (``edps.kind=study_index``, named ``edps study index``, FINISHED; one per experiment, made
  with it): one tag ``edps.index.<run id>`` per study run, that run's state, edps tags, parent, params and
  metrics as JSON, written when it starts and after it ends (study_index.py), so that commands that read
  every study read one run; ``edps.index_complete`` once every study run of the experiment is in it.
"""

# ---- MLflow's own tags ---------------------------------------------------------------------
MLFLOW_PARENT_RUN_ID = "mlflow.parentRunId"
MLFLOW_RUN_NAME = "mlflow.runName"
MLFLOW_NOTE = "mlflow.note.content"  # the description shown on a run's or an experiment's page
MLFLOW_USER = "mlflow.user"
MLFLOW_SOURCE_NAME = "mlflow.source.name"
MLFLOW_SOURCE_TYPE = "mlflow.source.type"
MLFLOW_GIT_COMMIT = "mlflow.source.git.commit"
MLFLOW_DATA_CONTEXT = "mlflow.data.context"  # of a logged dataset: training or validation

# ---- tags ----------------------------------------------------------------------------------
TAG_KIND = "edps.kind"
TAG_STUDY_KEY = "edps.study_key"
TAG_STUDY_FAMILY = "edps.study_family"
TAG_TRIAL_KEY = "edps.trial_key"
TAG_SWEEP_KEY = "edps.sweep_key"
TAG_STATUS = "edps.status"
TAG_WORKLOAD = "edps.workload"
TAG_OPTIMIZER = "edps.optimizer"
TAG_SPARSITY = "edps.sparsity"
TAG_BATCH_SIZE = "edps.batch_size"
# The pruning method at initialisation (pruning/: "snip", "random", "shuffle(snip)", ...). Runs made before
# methods existed lack it: they were SNIP's (curves.TAG_DEFAULTS).
TAG_PRUNING = "edps.pruning"
TAG_VERSION = "edps.version"
TAG_CODE_VERSION = "edps.code_version"  # the version with the git commit, and .dirty for uncommitted changes
TAG_GIT_DIRTY = "edps.git_dirty"
TAG_STOPPING = "edps.early_stopping"
TAG_REUSED = "edps.trials_reused"
TAG_ERROR = "edps.error"
# Leases: a running study or sweep renews its heartbeat (unix seconds) on its run; a RUNNING run
# whose heartbeat is older than the lease is dead. The owner token tells two takers of one run apart.
TAG_HEARTBEAT = "edps.heartbeat"
TAG_LEASE_OWNER = "edps.lease_owner"
TAG_YIELDED_TO = "edps.yielded_to"  # a run given up because an earlier live run has the same key
# A study run that MLflow Projects made for a sweep (``--executor mlflow-project``): the sweep run that
# submitted it. The sweep tags it as its study right after submitting, before the entry point starts.
TAG_SUBMITTED_BY = "edps.submitted_by"
TAG_RUN_SETTING_PREFIX = "edps.run."  # + an execution setting (device, workers, ...)
# The key of a study's measurement without its probes (probes never change a result): studies that
# differ only in probes share it, and the analysis counts them once.
TAG_RESULT_KEY = "edps.result_key"
TAG_PROBED_TRIALS = "edps.probed_trials"  # all | best: which trials of the study carried its probes
TAG_BEST_PROBE_RUN = "edps.best_probe_run"  # the trial run with the probes along the best trial's whole run
# What readers need of a study's trials, kept on the study run (registry and analysis read study runs, not
# trial runs): the study families of the trial runs it creates (its training study's, and for a study
# that probes its best trial, the all-trials study's too), comma-separated; and its trials' outcomes
# (results.encode_trial_outcomes), written with its result.
TAG_TRIAL_FAMILIES = "edps.trial_families"
TAG_TRIAL_OUTCOMES = "edps.trial_outcomes"
# The study index (study_index.py): an entry per study run on the index run, under this prefix and the study
# run's id; "true" in TAG_INDEX_COMPLETE when every study run of the experiment has one.
TAG_INDEX_PREFIX = "edps.index."
TAG_INDEX_COMPLETE = "edps.index_complete"
# Experiment tags of `edps doctor`: every run of the experiment that started or ended before this time (ms)
# was checked, and the runs of the problems it found then, which it looks at again.
EXPERIMENT_TAG_CHECKED_UNTIL = "edps.doctor.checked_until"
EXPERIMENT_TAG_RECHECK = "edps.doctor.recheck"
# "true" once a check has searched the whole experiment for runs without their kind or keys: the checks after
# it read every run made since, so they check every run; "false" after a first check that left the searches out.
EXPERIMENT_TAG_SEARCHED_KEYLESS = "edps.doctor.searched_keyless"
# Set in the request that creates an experiment made by edps-mlflow ("edps-mlflow <version>"): every run of
# ours in it was created with its kind, keys and parent in one request, so doctor's first check need not
# search its trial runs for runs without them (doctor.py).
EXPERIMENT_TAG_CREATED_BY = "edps.created_by"
TAG_ADAPTIVE_STOP = "edps.adaptive.stop"  # why an adaptive sweep stopped (adaptive.StopReason)
TAG_ANALYSIS_STUDY_RUNS = "edps.analysis.study_runs"
TAG_ANALYSIS_STUDY_COUNT = "edps.analysis.study_count"
TAG_ANALYSIS_SWEEP_RUNS = "edps.analysis.sweep_runs"

# Values of TAG_KIND.
KIND_SWEEP = "sweep"
KIND_STUDY = "study"
KIND_TRIAL = "trial"
KIND_ANALYSIS = "analysis"
KIND_STUDY_INDEX = "study_index"
# The name of the study index run.
INDEX_RUN_NAME = "edps study index"
# The start time (ms since the epoch) that a study index run is made with, and found by. MLflow searches a
# run's name as a tag (a scan of every run's tags: half a second at 150,000 runs) but its start time as a
# column of the run: the index run is the one run that started at the epoch. In the UI it is listed last.
INDEX_START_TIME = 1

# Values of TAG_STOPPING.
STOPPING_EXACT = "exact"
STOPPING_FULL_TRIALS = "full_trials"

# ---- params ---------------------------------------------------------------------------------
PARAM_SPEC_PREFIX = "spec."  # + a StudySpec key field
PARAM_BEST_PREFIX = "best."  # + a metaparameter of the best trial
PARAM_SWEEP_PREFIX = "sweep."  # + a sweep setting
PARAM_SPEC_TRIALS = PARAM_SPEC_PREFIX + "trials"
PARAM_SEED = "seed"
PARAM_TRIAL_INDEX = "trial_index"
PARAM_BATCH_SIZE = "batch_size"
PARAM_SPARSITY = "sparsity"
PARAM_OPTIMIZER = "optimizer"
PARAM_WORKLOAD = "workload"
# Of study and trial runs: the pruning method and what it may prune ("weights and biases", or "weights"). Not
# "pruning": under `mlflow run` that is the MLproject's parameter, which MLflow logs on the study run as typed.
PARAM_PRUNING = "pruning.method"
PARAM_PRUNING_PRUNES = "pruning.prunes"
# Of a trial run: where its pruning scores came from (results.ScoreSource: computed, cached, none).
PARAM_PRUNING_SCORES = "pruning.scores"
# The device a trial's training time was measured on ("cuda:0 (NVIDIA H200)", "cpu (<model>, 1 thread)"); on a
# study run, the device of its best trial's measurement.
PARAM_DEVICE = "device"  # of a trial run: where its time per step was measured
# Of a study run: its best trial's device. Not "device": under `mlflow run` that is the MLproject's
# parameter, which MLflow logs on the same run (a param cannot change).
PARAM_TIMING_DEVICE = "timing.device"

# ---- metrics --------------------------------------------------------------------------------
METRIC_STEPS_TO_RESULT = "steps_to_result"
METRIC_STEPS_TRAINED = "steps_trained"
METRIC_BEST_VALIDATION_ERROR = "best_validation_error"
METRIC_VALIDATION_ERROR = "validation/error"
METRIC_CHECKS_CUT_SHORT = "validation/checks_cut_short"
METRIC_TRAIN_LOSS = "train/loss"
METRIC_LEARNING_RATE = "learning_rate"
METRIC_TRIAL_SECONDS = "trial/seconds"
METRIC_PROBE_SECONDS = "probe/seconds"
# Seconds spent on pruning scores (computing them, or waiting for and loading them from the score cache), and
# what the cache saved (the kept entries' computing seconds less those): a trial's, summed on its study run.
METRIC_PRUNING_SECONDS = "pruning/seconds"
METRIC_PRUNING_SECONDS_SAVED = "pruning/seconds_saved"
# Measured training seconds per step (no checks, evaluation or probes): a trial's own, and on a study run its
# best trial's. A packed trial's steps were shared with others: the metric is its share of each lockstep step
# (the step's seconds divided by the trials in it), and METRIC_PACK_SIZE says how many shared them on average.
METRIC_SECONDS_PER_STEP = "train/seconds_per_step"
METRIC_PACK_SIZE = "train/pack_size"
# The network's size on a study run (every parameter, pruned or not: data parallelism all-reduces dense
# gradients), for the time-to-result projection over several devices.
METRIC_MODEL_PARAMETERS = "model/parameters"
METRIC_MODEL_PARAMETER_BYTES = "model/parameter_bytes"
# Numbers users filter on are metrics too: MLflow compares params and tags only as strings.
METRIC_BATCH_SIZE = "batch_size"
METRIC_SPARSITY = "sparsity"
METRIC_GOAL_ERROR = "goal_error"
METRIC_TRIALS_PREFIX = "trials/"  # + a trial status, or one of the counts below
METRIC_TRIALS_TOTAL = METRIC_TRIALS_PREFIX + "total"
METRIC_TRIALS_REUSED = METRIC_TRIALS_PREFIX + "reused"
METRIC_TRIALS_TRAINED = METRIC_TRIALS_PREFIX + "trained"
# The trial runs a study run has set FINISHED so far, written after each one (0 when it starts). A SIGKILL
# between a trial's end and this write leaves it one short: readers trust it only on a FINISHED study run,
# which wrote it after its last trial.
METRIC_TRIAL_RUNS_FINISHED = METRIC_TRIALS_PREFIX + "runs_finished"
METRIC_STUDY_SECONDS = "study/seconds"
METRIC_STUDY_TRIAL_STEPS = "study/trial_steps"
# The fewest trial-steps an exact method could have spent (results.trial_steps_lower_bound), and the ratio.
METRIC_STUDY_TRIAL_STEPS_LOWER_BOUND = "study/trial_steps_lower_bound"
METRIC_STUDY_TRIAL_STEPS_RATIO = "study/trial_steps_ratio"
METRIC_BEST_PREFIX = "best/"  # + a metaparameter of the best trial
METRIC_HP_PREFIX = "hp/"  # + a metaparameter of a trial
METRIC_PLAN_PREFIX = "plan/"  # + a plan count of a sweep
METRIC_STUDIES_DONE = "studies/done"
METRIC_STUDIES_WITH_RESULT = "studies/with_result"
METRIC_SWEEP_SECONDS = "sweep/seconds"
METRIC_ADAPTIVE_ROUNDS = "adaptive/rounds"
METRIC_ADAPTIVE_STUDIES = "adaptive/studies"  # studies the adaptive sweep measured (trained or reused)
METRIC_ADAPTIVE_TRIAL_STEPS = "adaptive/trial_steps"  # every trial's steps over those studies
METRIC_PROBE_LIPSCHITZ = "probe/lipschitz"
METRIC_PROBE_NOISE_SCALE = "probe/noise_scale"
METRIC_PROBE_GRAD_NORM_SQ = "probe/grad_norm_sq"
METRIC_PROBE_TRACE_SIGMA = "probe/trace_sigma"
METRIC_FIT_PREFIX = "fit/"  # + <optimizer>/sp<sparsity>/<quantity>, on an analysis run

# ---- artifacts ------------------------------------------------------------------------------
ARTIFACT_STUDY_JSON = "study.json"
ARTIFACT_TRIALS_CSV = "trials.csv"
ARTIFACT_MASK_DIR = "mask"
ARTIFACT_MASK_FILE = "mask.npz"
ARTIFACT_MASK_SUMMARY = "summary.json"
ARTIFACT_LAUNCH_LOG = "mlflow-run.log"  # the output of a submitted run (`mlflow run` and its entry point)
ARTIFACT_USED_STUDY_RUNS = "used_study_runs.txt"
ARTIFACT_FIGURES_DIR = "figures"
ARTIFACT_ADAPTIVE_DECISIONS = "adaptive_decisions.csv"  # on an adaptive sweep run: each decision and why


def trials_metric(status: str) -> str:
    """``trials/<status>``: how many trials of a study ended with ``status``."""
    return METRIC_TRIALS_PREFIX + status


def default_experiment(workload: str) -> str:
    """The experiment of a workload's studies and sweeps unless the user names one.

    Studies and sweeps share it, so that each reuses the other's trials. (Before this layout a lone
    study defaulted to ``edps/<workload>/<optimizer>``; docs/architecture.md says how to migrate.)
    """
    return f"edps/{workload}"
