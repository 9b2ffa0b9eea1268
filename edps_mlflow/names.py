"""Every name the project writes to or reads from MLflow: tags, params, metrics, artifacts. No MLflow name is
spelled as a string literal anywhere else. This module imports nothing of the project, so the training side, the status
command and the analysis all share it; docs/tracking.md shows where each name lands in the store.
"""

import re

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
# The pruning method ("snip", "shuffle(snip)", ...); runs made before methods existed lack it (curves.TAG_DEFAULTS).
TAG_PRUNING = "edps.pruning"
# "sp" or "supar" (parameterization.py); runs made before the choice lack it and were "sp" (curves.TAG_DEFAULTS).
TAG_PARAMETERIZATION = "edps.parameterization"
TAG_VERSION = "edps.version"
TAG_CODE_VERSION = "edps.code_version"  # the version with the git commit, and .dirty for uncommitted changes
TAG_GIT_DIRTY = "edps.git_dirty"
TAG_STOPPING = "edps.early_stopping"
TAG_REUSED = "edps.trials_reused"
TAG_ERROR = "edps.error"
# Leases: a RUNNING run whose heartbeat (unix s) is older than the lease is dead; the owner tells two takers apart.
TAG_HEARTBEAT = "edps.heartbeat"
TAG_LEASE_OWNER = "edps.lease_owner"
TAG_OWNER_PROCESS = "edps.owner_process"  # pid, start time and machine of the owner (ownership/owner.py)
TAG_YIELDED_TO = "edps.yielded_to"  # a run given up because an earlier live run has the same key
# Fencing (docs/reliability.md): a study run's epoch, one more than its key's runs had before it. A trial run has
# one tag per epoch that counts it (its study run's, and that of a later run of the key that reused it), holding
# the study key whose epoch it is. A sweep run has its owners' ends, each under its owner token: "<status> <ms>".
TAG_EPOCH = "edps.epoch"
TAG_EPOCH_PREFIX = "edps.epoch."
TAG_END_PREFIX = "edps.end."
# On a study run that MLflow Projects made for a sweep: the sweep run that submitted it.
TAG_SUBMITTED_BY = "edps.submitted_by"
TAG_RUN_SETTING_PREFIX = "edps.run."  # + an execution setting (device, workers, ...)
# Data files that are not the published ones, trained on with --accept-unverified-data (study and trial runs).
TAG_UNVERIFIED_DATA = TAG_RUN_SETTING_PREFIX + "unverified_data"
# A study's key without its probes (which never change a result): the analysis counts such studies once.
TAG_RESULT_KEY = "edps.result_key"
TAG_PROBED_TRIALS = "edps.probed_trials"  # all | best: which trials of the study carried its probes
TAG_BEST_PROBE_RUN = "edps.best_probe_run"  # the trial run with the probes along the best trial's whole run
# On the study run, what readers need of its trials: their runs' study families, their outcomes (results.py).
TAG_TRIAL_FAMILIES = "edps.trial_families"
TAG_TRIAL_OUTCOMES = "edps.trial_outcomes"
# The study index: an entry per study run under this prefix and its run id; complete when every one has one.
TAG_INDEX_PREFIX = "edps.index."
TAG_INDEX_COMPLETE = "edps.index_complete"
# Experiment tags of `edps doctor`: the time (ms) up to which every run was checked, the runs to look at again.
EXPERIMENT_TAG_CHECKED_UNTIL = "edps.doctor.checked_until"
EXPERIMENT_TAG_RECHECK = "edps.doctor.recheck"
# "true" once a check has searched the whole experiment for runs without their kind or keys.
EXPERIMENT_TAG_SEARCHED_KEYLESS = "edps.doctor.searched_keyless"
# "edps-mlflow <version>" on an experiment we created: every run of ours in it has its kind and keys (doctor.py).
EXPERIMENT_TAG_CREATED_BY = "edps.created_by"
TAG_ADAPTIVE_STOP = "edps.adaptive.stop"  # why an adaptive sweep stopped (adaptive.StopReason)
# A study of a goal ladder (several goals, easiest first; docs/tracking.md) has TAG_GOALS ("0.1,0.05,0.03"), and
# per rung: the key of the one-goal study that rung answers, its best trial's index, and its trials' outcomes
# (results.py's format; the hardest rung's are TAG_TRIAL_OUTCOMES). A one-goal study has none of these.
TAG_GOALS = "edps.goals"
TAG_GOAL_KEY_PREFIX = "edps.goal_key."  # + goal_text(goal)
TAG_GOAL_BEST_TRIAL_PREFIX = "edps.goal_best_trial."  # + goal_text(goal)
TAG_GOAL_OUTCOMES_PREFIX = "edps.goal_outcomes."  # + goal_text(goal), every rung but the hardest
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
# A study index run starts at this time (ms) and is found by it: a column, where its name is a scan of all tags.
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
PARAM_GOAL = "goal"  # a trial run's goal: the validation error (or loss) to reach; a ladder's hardest
# Not "pruning": under `mlflow run` that is the MLproject's parameter, which MLflow logs on the study run as typed.
PARAM_PRUNING = "pruning.method"
PARAM_PRUNING_PRUNES = "pruning.prunes"
PARAM_PRUNING_SCORES = "pruning.scores"
PARAM_DEVICE = "device"  # of a trial run: where its time per step was measured ("cpu (<model>, 1 thread)")
# A study run's best trial's device; not "device", the MLproject's parameter (a param cannot change).
PARAM_TIMING_DEVICE = "timing.device"

# ---- metrics --------------------------------------------------------------------------------
METRIC_STEPS_TO_RESULT = "steps_to_result"
METRIC_STEPS_TRAINED = "steps_trained"
METRIC_BEST_VALIDATION_ERROR = "best_validation_error"
METRIC_VALIDATION_ERROR = "validation/error"
# validation/error less the goal (a ladder's hardest), at each check of a trial: at or below 0, the goal is met.
METRIC_ERROR_MINUS_GOAL = "validation/error_minus_goal"
# A trial run's one-value numbers (checks_cut_short, trial/seconds, probe/seconds, pruning/seconds*,
# train/seconds_per_step, train/pack_size) are params under these names; older trial runs have them as metrics.
METRIC_CHECKS_CUT_SHORT = "validation/checks_cut_short"
METRIC_TRAIN_LOSS = "train/loss"
METRIC_LEARNING_RATE = "learning_rate"
METRIC_TRIAL_SECONDS = "trial/seconds"
METRIC_PROBE_SECONDS = "probe/seconds"
# Seconds spent on pruning scores, and what the score cache saved: a trial's, summed on its study run.
METRIC_PRUNING_SECONDS = "pruning/seconds"
METRIC_PRUNING_SECONDS_SAVED = "pruning/seconds_saved"
# Training seconds per step (a packed trial's share of each lockstep step), and how many trials shared a step.
METRIC_SECONDS_PER_STEP = "train/seconds_per_step"
METRIC_PACK_SIZE = "train/pack_size"
# The network's size, pruned or not (data parallelism all-reduces dense gradients), for time-to-result.
METRIC_MODEL_PARAMETERS = "model/parameters"
METRIC_MODEL_PARAMETER_BYTES = "model/parameter_bytes"
# Numbers users filter on are metrics too: MLflow compares params and tags only as strings.
METRIC_BATCH_SIZE = "batch_size"
METRIC_SPARSITY = "sparsity"
METRIC_GOAL_ERROR = "goal_error"
# A ladder's steps-to-result at each rung, on the study run (and on a trial run, each rung it reached): the UI
# draws them as one section of charts. steps_to_result itself is the hardest rung's.
METRIC_GOAL_STEPS_PREFIX = "steps_to_result/goal_"  # + goal_text(goal)
METRIC_TRIALS_PREFIX = "trials/"  # + a trial status, or one of the counts below
METRIC_TRIALS_TOTAL = METRIC_TRIALS_PREFIX + "total"
METRIC_TRIALS_REUSED = METRIC_TRIALS_PREFIX + "reused"
METRIC_TRIALS_TRAINED = METRIC_TRIALS_PREFIX + "trained"
# The trial runs a study run has finished so far, written after each: trusted only on a FINISHED study run.
METRIC_TRIAL_RUNS_FINISHED = METRIC_TRIALS_PREFIX + "runs_finished"
METRIC_STUDY_SECONDS = "study/seconds"
METRIC_STUDY_TRIAL_STEPS = "study/trial_steps"
# The fewest trial-steps an exact method could have spent (results.trial_steps_lower_bound), and the ratio.
METRIC_STUDY_TRIAL_STEPS_LOWER_BOUND = "study/trial_steps_lower_bound"
METRIC_STUDY_TRIAL_STEPS_RATIO = "study/trial_steps_ratio"
METRIC_BEST_PREFIX = "best/"  # + a metaparameter of the best trial
METRIC_HP_PREFIX = "hp/"  # + a metaparameter, on trial runs made before they were params only
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
METRIC_FIT_PREFIX = "fit/"  # + <curve>/<quantity> (curve_metric), on an analysis run and a finished sweep run

# ---- curves in MLflow's charts: a sweep run's and an analysis run's ---------------------------
# One metric per curve, its step the batch size: a run's Model metrics tab draws steps against batch size.
METRIC_CURVE_PREFIX = "curve/"  # + curves.CurveId.chart_name() + "/" + one of the two below
CURVE_STEPS = "steps_to_result"  # measured: a point's value (analysis.replicates) once every replicate is in
CURVE_STEPS_FIT = "steps_fit"  # an analysis run's fitted S(B) at the same batch sizes
# A sweep's plan counts (studies, done, partial, todo) when it started: tags, not charts of constants.
TAG_PLAN_PREFIX = "edps.plan."


def curve_metric(curve: str, quantity: str, prefix: str = METRIC_CURVE_PREFIX) -> str:
    """``curve/sgd/sp0.5/steps_to_result`` (``prefix`` fit/: the analysis' fit quantities), in MLflow's alphabet."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", f"{prefix}{curve}/{quantity}")


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
    """The experiment of a workload's studies and sweeps unless the user names one: shared, so that each reuses
    the other's trials."""
    return f"edps/{workload}"


def goal_text(goal: float) -> str:
    """A goal as written in names and tags: the shortest text that reads back as the same float."""
    return repr(float(goal))


def goals_text(goals: tuple[float, ...]) -> str:
    """A ladder as TAG_GOALS holds it: ``0.1,0.05,0.03``."""
    return ",".join(goal_text(g) for g in goals)


def parse_goals_text(text: str) -> tuple[float, ...]:
    """The ladder of a TAG_GOALS value (ValueError when it is not one)."""
    return tuple(float(part) for part in text.split(","))


def goal_steps_metric(goal: float) -> str:
    """``steps_to_result/goal_<goal>``: a ladder's steps-to-result at one rung."""
    return METRIC_GOAL_STEPS_PREFIX + goal_text(goal)


def goal_steps_column(goal: float) -> str:
    """``steps_to_goal_<goal>``: a ladder trial's steps at one rung, a column of its study's trials.csv."""
    return "steps_to_goal_" + goal_text(goal)


def goal_key_tag(goal: float) -> str:
    return TAG_GOAL_KEY_PREFIX + goal_text(goal)


def goal_best_trial_tag(goal: float) -> str:
    return TAG_GOAL_BEST_TRIAL_PREFIX + goal_text(goal)


def goal_outcomes_tag(goal: float) -> str:
    return TAG_GOAL_OUTCOMES_PREFIX + goal_text(goal)


def rung_outcomes_tag(goals: tuple[float, ...], goal: float) -> str:
    """The tag of a ladder rung's trial outcomes: the hardest rung's are the study's own (TAG_TRIAL_OUTCOMES)."""
    return TAG_TRIAL_OUTCOMES if goal == goals[-1] else goal_outcomes_tag(goal)
