"""What our runs are called and how they describe themselves: run names, descriptions, a study run's identifying
tags and every run's provenance tags; plain strings from specs and outcomes (no mlflow, no torch)."""

from __future__ import annotations

from typing import Iterable, Sequence

from edps_mlflow import __version__, provenance
from edps_mlflow import names as n
from edps_mlflow.config import StudySpec, TrialSpec, study_family, trial_families
from edps_mlflow.curves import CurveId
from edps_mlflow.ladder import goal_results, goals_sentence
from edps_mlflow.parameterization import Parameterization
from edps_mlflow.pruning import method_info
from edps_mlflow.results import ProbedTrials, StudyOutcome, TrialResult, TrialStatus
from edps_mlflow.workloads import get_workload


# The UI's run list shows about 20 characters of a name: names put what varies first, in short words.
_SHORT = {"learning_rate": "lr", "momentum": "m", "decay_steps": "decay", "end_learning_rate_factor": "end",
          "beta2": "b2", "weight_decay": "wd", "warmup_steps": "warmup"}


def pruning_words(spec: StudySpec) -> str:
    """``sp=0.9 random``: the sparsity and the method that pruned it (none named when nothing is pruned), then
    ``supar`` under SμPar."""
    return f"sp={spec.sparsity:g}" + (f" {spec.pruning}" if spec.sparsity > 0 else "") + \
        (f" {spec.parameterization.value}" if spec.parameterization is not Parameterization.SP else "")


def study_run_name(spec: StudySpec, outcome: StudyOutcome | None = None) -> str:
    """``bs=16 sp=0.9 snip sgd digits-simple-cnn``; once it has an ``outcome``, its result and the trial that
    reached it (``: 400 steps by t003``, ``: no result``): the title of its run page, the first thing it shows."""
    name = f"bs={spec.batch_size} {pruning_words(spec)} {spec.optimizer} {spec.workload}"
    if outcome is None:
        return name
    best = outcome.best_record()
    return name + (": no result" if best is None else f": {outcome.steps_to_result} steps by t{best.trial.index:03d}")


def trial_run_name(trial: TrialSpec, outcome: str | None = None) -> str:
    """``t001 reached@400 lr=0.1 bs=16 sp=0.9 snip``: the index and how it ended (the reached trial stays
    findable by ``reached``), then its metaparameters, then the study (the same for every sibling)."""
    values = " ".join(f"{_SHORT.get(k, k)}={v:.3g}" for k, v in trial.metaparameters.items())
    study = f"bs={trial.study.batch_size} {pruning_words(trial.study)}"
    probed = "probed" if trial.study.probes else None
    return " ".join(part for part in (f"t{trial.index:03d}", outcome, probed, values, study) if part)


def trial_outcome(result: TrialResult) -> str:
    if result.status is TrialStatus.REACHED:
        return f"reached@{result.steps_to_result}"
    return result.status.value.replace("_", " ")


def study_description(spec: StudySpec, outcome: StudyOutcome, probed: ProbedTrials | None = None,
                      unverified_data: str | None = None) -> str:
    """The study run's description (Markdown, shown on its page): its result and the run of the trial that reached
    it first (the run page lists only its 10 newest trials), whether it trained on unverified data (the tag's key
    is cut to a few letters on the page), then what was studied and how."""
    best = outcome.best_record()
    words = get_workload(spec.workload).goal_words
    ladder = goals_sentence(spec, goal_results(spec, outcome.records), words)
    goal = f"{words} <= {spec.goal_error:g}"
    result = (f"**steps-to-result {outcome.steps_to_result}** ({goal}), reached by [trial {best.trial.index}]"
              f"(#/experiments/{outcome.experiment_id}/runs/{best.run_id}?workflowType=machine_learning): "
              + ", ".join(f"{k} {v:.4g}" for k, v in best.trial.metaparameters.items())
              if best else f"**no trial reached the goal** ({goal} within {spec.max_steps} steps)")
    counts = ", ".join(f"{outcome.count(status)} {status.value.replace('_', ' ')}" for status in TrialStatus)
    if unverified_data:
        result += (f".\n\n**Unverified data** (not the published files; `--accept-unverified-data true`): "
                   f"{unverified_data}")
    return (f"{result}.\n\n{spec.workload}, {spec.optimizer}, batch size {spec.batch_size}, sparsity "
            f"{spec.sparsity:g}{pruned_by(spec)}. {len(outcome.records)} trials ({counts}; {outcome.reused} reused "
            f"from earlier runs). Goal: {goal}, checked every {spec.check_interval} steps; cap {spec.max_steps} "
            f"steps. Each trial is a nested run; `trials.csv` lists them all."
            + (f"\n\n{probed.sentence()}" if probed else "") + (f"\n\n{ladder}" if ladder else ""))


EXPERIMENT_DESCRIPTION = (
    "Steps-to-result against batch size and sparsity, measured by edps-mlflow. A **sweep** run (optional) is "
    "the parent of its **study** runs; a study tunes one (workload, optimizer, sparsity, batch size) with "
    "quasi-random **trial** runs nested under it, and its `steps_to_result` is the fewest steps any trial "
    "needed to reach the goal. Switch the UI to *Model training* to see the runs; filter with "
    "`tags.edps.kind = 'study'` for the grid. `edps-analyze report --log-to-mlflow` adds an analysis run.")


def provenance_tags(launched_by_mlflow: bool = False, command: str | None = None) -> dict[str, str]:
    """Who ran what code: MLflow's context tags (user, source: ``command``, else this process's command line;
    git commit) and the code version. A run that `mlflow run` created already has its own source tags; only
    the code version is added then."""
    code = provenance.code_version()
    tags = {n.TAG_CODE_VERSION: code.label, n.TAG_GIT_DIRTY: str(code.dirty).lower()}
    if not launched_by_mlflow:
        tags.update({n.MLFLOW_USER: provenance.user(), n.MLFLOW_SOURCE_NAME: command or provenance.command_line(),
                     n.MLFLOW_SOURCE_TYPE: "LOCAL"})
        if code.commit:
            tags[n.MLFLOW_GIT_COMMIT] = code.commit
    return tags


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table, each cell as ``str`` writes it (the run descriptions' and the analysis report's)."""
    lines = ["| " + " | ".join(map(str, cells)) + " |" for cells in [header, *rows]]
    return "\n".join([lines[0], "|" + "---|" * len(header), *lines[1:]])


def pruned_by(spec: StudySpec) -> str:
    """`` (pruned by snip: weights and biases)``, or nothing for the dense network."""
    under = ", under SμPar (docs/parameterization.md)" if spec.parameterization is not Parameterization.SP else ""
    return f" (pruned by {spec.pruning}: {method_info(spec.pruning).prunes.value}{under})" if spec.sparsity > 0 else ""


def pruning_params(spec: StudySpec) -> dict[str, str]:
    """The method and what it may prune, as study and trial runs log them."""
    return {n.PARAM_PRUNING: spec.pruning, n.PARAM_PRUNING_PRUNES: method_info(spec.pruning).prunes.value}


def study_tags(spec: StudySpec) -> dict[str, str]:
    """A study run's identifying tags: its kind, keys, its curve's axes (curves.CurveId) and batch size, and
    the study families its trial runs go to (doctor reads those, not every trial run)."""
    return {n.TAG_KIND: n.KIND_STUDY, n.TAG_STUDY_KEY: spec.study_key, n.TAG_STUDY_FAMILY: study_family(spec),
            **CurveId.of(spec).tags(), n.TAG_BATCH_SIZE: str(spec.batch_size),
            n.TAG_VERSION: __version__, n.TAG_RESULT_KEY: spec.result_key,
            n.TAG_TRIAL_FAMILIES: ",".join(trial_families(spec))}
