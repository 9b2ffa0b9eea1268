"""A goal ladder's results: each goal's best trial and steps-to-result, taken from one set of trials (a trial
records the first check at or below every goal it meets), and what the study run and its trial runs carry of
them (names.py). A one-goal study is a ladder of one and writes nothing here. Plain data: no torch, no MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from edps_mlflow import names as n
from edps_mlflow.config import StudySpec
from edps_mlflow.results import StudyOutcome, TrialOutcome, TrialRecord, TrialResult, TrialStatus, encode_trial_outcomes


@dataclass(frozen=True)
class GoalResult:
    """One rung: its goal, its steps-to-result (None: no trial met it) and the trial that made it."""

    goal: float
    steps_to_result: int | None
    best: TrialRecord | None


def record_goal_steps(record: TrialRecord, rungs: int) -> tuple[int | None, ...]:
    """A trial's steps at each rung; a record without them (a one-goal study's) has its steps-to-result only."""
    if len(record.goal_steps) == rungs:
        return record.goal_steps
    return (None,) * (rungs - 1) + (record.steps_to_result,)


def goal_results(spec: StudySpec, records: Mapping[int, TrialRecord]) -> list[GoalResult]:
    """Every rung's result, easiest first: the fewest steps over the trials that met it, the lowest index among
    ties, as :meth:`StudyOutcome.best_record` picks the hardest's."""
    results = []
    for rung, goal in enumerate(spec.ladder):
        met = [(steps[rung], r.trial.index, r) for r in records.values()
               if (steps := record_goal_steps(r, len(spec.ladder)))[rung] is not None]
        steps, _, best = min(met, key=lambda m: m[:2]) if met else (None, None, None)
        results.append(GoalResult(goal, steps, best))
    return results


def goal_outcomes(records: Mapping[int, TrialRecord], rung: int, rungs: int) -> list[TrialOutcome]:
    """The trials as a one-goal study of this rung would list them: reached where they met it, else as they ended
    (a trial that met the hardest goal met every rung)."""
    outcomes = []
    for record in records.values():
        steps = record_goal_steps(record, rungs)[rung]
        status = TrialStatus.REACHED if steps is not None else record.status
        outcomes.append(TrialOutcome(record.trial.index, status, steps, record.steps_trained))
    return outcomes


def study_goal_metrics(spec: StudySpec, results: list[GoalResult]) -> dict[str, float]:
    """Each rung's steps-to-result under a name that says its goal (a ladder's only)."""
    if not spec.goals:
        return {}
    return {n.goal_steps_metric(r.goal): r.steps_to_result for r in results if r.steps_to_result is not None}


def study_goal_tags(spec: StudySpec, outcome: StudyOutcome, results: list[GoalResult],
                    limit: int) -> dict[str, str]:
    """The ladder, each rung's one-goal key and best trial, and every rung's trial outcomes but the hardest's
    (that is the study's own tag); outcomes longer than ``limit`` are left to ``trials.csv``."""
    if not spec.goals:
        return {}
    tags = {n.TAG_GOALS: n.goals_text(spec.goals)}
    for rung, result in enumerate(results):
        tags[n.goal_key_tag(result.goal)] = spec.rung(result.goal).study_key
        if result.best is not None:
            tags[n.goal_best_trial_tag(result.goal)] = str(result.best.trial.index)
        if rung < len(results) - 1:
            text = encode_trial_outcomes(goal_outcomes(outcome.records, rung, len(results)))
            if len(text) <= limit:
                tags[n.goal_outcomes_tag(result.goal)] = text
    return tags


def trial_goal_metrics(spec: StudySpec, result: TrialResult) -> dict[str, float]:
    """A ladder trial's steps at each rung it met (read back by :func:`stored_goal_steps`)."""
    if not spec.goals:
        return {}
    return {n.goal_steps_metric(goal): steps for goal, steps in zip(spec.ladder, result.goal_steps)
            if steps is not None}


def stored_goal_steps(spec: StudySpec, metrics: Mapping[str, float],
                      steps_to_result: int | None) -> tuple[int | None, ...]:
    """A stored trial's steps at each rung, from its run's metrics."""
    easier = [metrics.get(n.goal_steps_metric(goal)) for goal in spec.ladder[:-1]]
    return tuple(int(steps) if steps is not None else None for steps in easier) + (steps_to_result,)


def goals_sentence(spec: StudySpec, results: list[GoalResult], goal_words: str) -> str:
    """The ladder's results in words (a ladder's only): "validation error <= 0.1: 120 steps (trial 3); ..."."""
    if not spec.goals:
        return ""
    parts = [f"<= {r.goal:g}: " + (f"{r.steps_to_result} steps (trial {r.best.trial.index})" if r.best is not None
                                   else "not reached") for r in results]
    return f"Goal ladder, {goal_words} " + "; ".join(parts) + "."
