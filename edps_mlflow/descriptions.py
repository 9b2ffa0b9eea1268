"""What our runs are called and how they describe themselves: run names, the study run's description, the
experiment's description, the identifying tags of a study run, and the provenance tags of every run.

Names are read in the MLflow UI's run list, which shows about 20 characters, so they put what varies first.
No mlflow, no torch: plain strings from specs and outcomes.
"""

from __future__ import annotations

from edps_mlflow import __version__, provenance
from edps_mlflow import names as n
from edps_mlflow.config import StudySpec, TrialSpec, study_family
from edps_mlflow.results import ProbedTrials, StudyOutcome, TrialResult, TrialStatus
from edps_mlflow.workloads import get_workload


def sparsity_tag(sparsity: float) -> str:
    return repr(float(sparsity))


# Run names put what varies first, so that they still read when the UI truncates them.
_SHORT = {"learning_rate": "lr", "momentum": "m", "decay_steps": "decay", "end_learning_rate_factor": "end",
          "beta2": "b2", "weight_decay": "wd", "warmup_steps": "warmup"}


def study_run_name(spec: StudySpec) -> str:
    """``bs=16 sp=0.9 sgd digits-simple-cnn``."""
    return f"bs={spec.batch_size} sp={spec.sparsity:g} {spec.optimizer.value} {spec.workload}"


def trial_run_name(trial: TrialSpec, outcome: str | None = None) -> str:
    """``t001 reached@400 lr=0.1 bs=16 sp=0.9``: the UI's run-name column shows about 20 characters, so
    the name leads with what tells a study's trials apart (the index) and how it ended (the reached trial
    stays findable by ``reached``), then its metaparameters, then the study (the same for every sibling)."""
    values = " ".join(f"{_SHORT.get(k, k)}={v:.3g}" for k, v in trial.metaparameters.items())
    study = f"bs={trial.study.batch_size} sp={trial.study.sparsity:g}"
    probed = "probed" if trial.study.probes else None
    return " ".join(part for part in (f"t{trial.index:03d}", outcome, probed, values, study) if part)


def trial_outcome(result: TrialResult) -> str:
    if result.status is TrialStatus.REACHED:
        return f"reached@{result.steps_to_result}"
    return result.status.value.replace("_", " ")


def study_description(spec: StudySpec, outcome: StudyOutcome, probed: ProbedTrials | None = None) -> str:
    """The study run's description (Markdown, shown on its page)."""
    best = outcome.best_record()
    result = (f"**steps-to-result {outcome.steps_to_result}** (trial {best.trial.index}: "
              + ", ".join(f"{k} {v:.4g}" for k, v in best.trial.metaparameters.items()) + ")"
              if best else "**no trial reached the goal**")
    counts = ", ".join(f"{outcome.count(status)} {status.value.replace('_', ' ')}" for status in TrialStatus)
    return (f"{spec.workload}, {spec.optimizer.value}, batch size {spec.batch_size}, sparsity {spec.sparsity:g}: "
            f"{result}.\n\n{len(outcome.records)} trials ({counts}; {outcome.reused} reused from earlier runs). "
            f"Goal: {get_workload(spec.workload).goal_words} <= {spec.goal_error:g}, checked every "
            f"{spec.check_interval} steps; "
            f"cap {spec.max_steps} steps. Each trial is a nested run; `trials.csv` lists them all."
            + (f"\n\n{probed.sentence()}" if probed else ""))


EXPERIMENT_DESCRIPTION = (
    "Steps-to-result against batch size and sparsity, measured by edps-mlflow. A **sweep** run (optional) is "
    "the parent of its **study** runs; a study tunes one (workload, optimizer, sparsity, batch size) with "
    "quasi-random **trial** runs nested under it, and its `steps_to_result` is the fewest steps any trial "
    "needed to reach the goal. Switch the UI to *Model training* to see the runs; filter with "
    "`tags.edps.kind = 'study'` for the grid. `edps-analyze report --log-to-mlflow` adds an analysis run.")


def provenance_tags(launched_by_mlflow: bool = False) -> dict[str, str]:
    """Who ran what code: MLflow's context tags (user, source, git commit) and the code version. A run
    that `mlflow run` created already has its own source tags; only the code version is added then."""
    code = provenance.code_version()
    tags = {n.TAG_CODE_VERSION: code.label, n.TAG_GIT_DIRTY: str(code.dirty).lower()}
    if not launched_by_mlflow:
        tags.update({n.MLFLOW_USER: provenance.user(), n.MLFLOW_SOURCE_NAME: provenance.command_line(),
                     n.MLFLOW_SOURCE_TYPE: "LOCAL"})
        if code.commit:
            tags[n.MLFLOW_GIT_COMMIT] = code.commit
    return tags


def study_tags(spec: StudySpec) -> dict[str, str]:
    return {n.TAG_KIND: n.KIND_STUDY, n.TAG_STUDY_KEY: spec.study_key, n.TAG_STUDY_FAMILY: study_family(spec),
            n.TAG_WORKLOAD: spec.workload, n.TAG_OPTIMIZER: spec.optimizer.value,
            n.TAG_SPARSITY: sparsity_tag(spec.sparsity), n.TAG_BATCH_SIZE: str(spec.batch_size),
            n.TAG_VERSION: __version__, n.TAG_RESULT_KEY: spec.result_key}
