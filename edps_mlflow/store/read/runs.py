"""Study and sweep runs as they stand: their leases, the studies of a workload with their trials done so far
(a sweep's plan), and the runs left behind by dead processes; as plain records, never MLflow's entities."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Iterable

from edps_mlflow import names as n
from edps_mlflow.filters import filter_string
from edps_mlflow.results import RunState, TrialOutcome, decode_trial_outcomes
from edps_mlflow.store import index
from edps_mlflow.store.client import StoreClient, search_all, searcher
from edps_mlflow.store.ownership.owner import exited_owner
from edps_mlflow.store.read.fence import Fence, epoch_of, trial_epochs

_RUNNING = filter_string(status=RunState.RUNNING.value)


@dataclass(frozen=True)
class LeasedRun:
    """A study or sweep run with its lease: RUNNING and renewed within the lease means a live owner."""

    run_id: str
    kind: str | None
    key: str
    state: RunState
    start_time: int  # ms
    renewed: float  # unix seconds of the last heartbeat (the start time when there is none)
    parent_run_id: str | None
    steps_to_result: int | None
    full_trials: bool
    epoch: int  # a study run's fencing token (fence.py); 0 for other runs
    planned: bool  # a study run that logged its start, after it adopted the trials it reuses (fence.py)
    owner: str | None  # the process that owns it (ownership/owner.py)

    def live(self, lease: float, now: float | None = None) -> bool:
        """RUNNING, renewed within the lease, and not owned by a process of this machine that has exited."""
        return (self.state is RunState.RUNNING and (now or time.time()) - self.renewed < lease
                and exited_owner(self.owner) is None)

    @property
    def order(self) -> tuple[int, str]:
        """Which of two runs of one key came first (the earlier one is kept)."""
        return (self.start_time, self.run_id)


def leased(run: Any) -> LeasedRun:
    """A run (MLflow's, or the study index's view of one) with its lease."""
    tags = run.data.tags
    try:
        renewed = float(tags[n.TAG_HEARTBEAT])
    except (KeyError, ValueError):
        renewed = (run.info.start_time or 0) / 1000
    steps = run.data.metrics.get(n.METRIC_STEPS_TO_RESULT)
    kind = tags.get(n.TAG_KIND)
    key_tag = n.TAG_SWEEP_KEY if kind == n.KIND_SWEEP else n.TAG_STUDY_KEY
    return LeasedRun(
        run_id=run.info.run_id, kind=kind, key=tags.get(key_tag, ""),
        state=RunState(run.info.status), start_time=run.info.start_time or 0, renewed=renewed,
        parent_run_id=tags.get(n.MLFLOW_PARENT_RUN_ID), steps_to_result=int(steps) if steps is not None else None,
        full_trials=tags.get(n.TAG_STOPPING) == n.STOPPING_FULL_TRIALS, epoch=epoch_of(tags),
        planned=n.TAG_STOPPING in tags, owner=tags.get(n.TAG_OWNER_PROCESS))


def get_leased(client: StoreClient, run_id: str) -> LeasedRun:
    return leased(client.get_run(run_id))


def keyed_runs(client: StoreClient, experiment_id: str, kind: str, key: str) -> list[LeasedRun]:
    """Every study (or sweep) run with ``key``, earliest first."""
    key_tag = n.TAG_SWEEP_KEY if kind == n.KIND_SWEEP else n.TAG_STUDY_KEY
    runs = search_all(client, experiment_id, filter_string(tags={n.TAG_KIND: kind, key_tag: key}))
    return sorted((leased(r) for r in runs), key=lambda r: r.order)


def latest_finished_study(client: StoreClient, experiment_id: str, study_key: str,
                          full_trials: bool) -> LeasedRun | None:
    """The latest FINISHED study run of the key in the same early-stopping mode that counts (fence.py; None: not
    done)."""
    runs = keyed_runs(client, experiment_id, n.KIND_STUDY, study_key)
    fence = Fence.of(runs)
    done = [r for r in runs if fence.counts(r) and r.full_trials == full_trials]
    return done[-1] if done else None


def ladder_answer(client: StoreClient, experiment_id: str, study_key: str, goal: float,
                  full_trials: bool) -> LeasedRun | None:
    """The latest FINISHED goal-ladder study run that counts (fence.py) with a rung answering the one-goal study
    ``study_key`` at ``goal``, with that rung's steps-to-result (None: no such run)."""
    runs = search_all(client, experiment_id, filter_string(
        tags={n.TAG_KIND: n.KIND_STUDY, n.goal_key_tag(goal): study_key}, status=RunState.FINISHED.value))
    for run in sorted(runs, key=lambda r: leased(r).order, reverse=True):
        ladder = leased(run)
        if ladder.full_trials == full_trials and Fence.of(keyed_runs(client, experiment_id, n.KIND_STUDY,
                                                                     ladder.key)).counts(ladder):
            steps = run.data.metrics.get(n.goal_steps_metric(goal))
            return replace(ladder, steps_to_result=int(steps) if steps is not None else None)
    return None


def sweep_runs(client: StoreClient, experiment_id: str, sweep_key: str,
               views: list[index.RunView] | None = None) -> list[LeasedRun]:
    """The sweep runs of ``sweep_key``, earliest first: the parents of the key's study runs (``views``) and its
    RUNNING sweep runs, else a search by key. One that parents no study and has ended did nothing: missed."""
    search = searcher(client, [experiment_id])
    wanted = {n.TAG_SWEEP_KEY: sweep_key}
    keyed = index.study_runs(search, wanted) if views is None else index.with_tags(views, wanted)
    parents = {run.data.tags.get(n.MLFLOW_PARENT_RUN_ID) for run in keyed}
    candidates = [*index.by_ids(search, parents - {None}), *search(_RUNNING, False)]
    found = {run.info.run_id: leased(run) for run in candidates
             if run.data.tags.get(n.TAG_KIND) == n.KIND_SWEEP and run.data.tags.get(n.TAG_SWEEP_KEY) == sweep_key}
    if not found:
        return keyed_runs(client, experiment_id, n.KIND_SWEEP, sweep_key)
    return sorted(found.values(), key=lambda r: r.order)


def expired_runs(client: StoreClient, experiment_id: str, lease: float) -> list[LeasedRun]:
    """The experiment's runs left RUNNING by dead owners (:func:`expired`)."""
    return expired([leased(r) for r in search_all(client, experiment_id, _RUNNING)], lease, time.time())


def expired(runs: Iterable[LeasedRun], lease: float, now: float) -> list[LeasedRun]:
    """The runs left RUNNING by dead owners: study and sweep runs whose lease ran out or whose owner on this machine
    exited, and trial runs whose study run is not live (left behind by a killed process). ``runs``: LeasedRun, or
    doctor's RunFacts."""
    owners = (n.KIND_STUDY, n.KIND_SWEEP)
    running = [r for r in runs if r.state is RunState.RUNNING]
    live = {r.run_id for r in running if r.kind in owners and r.live(lease, now)}
    return [r for r in running if (r.kind in owners and r.run_id not in live)
            or (r.kind == n.KIND_TRIAL and r.parent_run_id not in live)]


def running_trial_runs(client: StoreClient, experiment_id: str, study_run_id: str) -> list[str]:
    """The ids of the trial runs of one study run that are still RUNNING (one search by tag)."""
    return [run.info.run_id for run in search_all(client, experiment_id, filter_string(
        tags={n.TAG_KIND: n.KIND_TRIAL, n.MLFLOW_PARENT_RUN_ID: study_run_id}, status=RunState.RUNNING.value))]


@dataclass(frozen=True)
class Rung:
    """One rung of a finished ladder study run: its goal, the one-goal study it answers, its steps and trials."""

    goal: float
    study_key: str
    steps_to_result: int | None
    trial_outcomes_text: str | None


@dataclass(frozen=True)
class StoredStudy:
    run_id: str
    study_key: str
    state: RunState
    steps_to_result: int | None
    full_trials: bool  # measured with every trial run to its own end
    start_time: int = 0  # ms
    trial_outcomes_text: str | None = None
    live: bool = False  # RUNNING with its lease renewed in time
    # Trials done so far: those it reused when it started (its tag edps.trials_reused) and the trial runs it
    # finished since (its metric trials/runs_finished)
    trials_so_far: int = 0
    epoch: int = 0  # as LeasedRun's, for the Fence (fence.py)
    planned: bool = False
    rungs: tuple[Rung, ...] = ()  # a goal ladder's, easiest first
    rung: float | None = None  # an answer of a ladder's easier rung (answers): that goal, whose trials it lists
    kind = n.KIND_STUDY

    @property
    def key(self) -> str:
        return self.study_key

    @property
    def finished(self) -> bool:
        return self.state is RunState.FINISHED

    @property
    def order(self) -> tuple[int, str]:
        return (self.start_time, self.run_id)

    @property
    def trial_outcomes(self) -> tuple[TrialOutcome, ...] | None:
        """Its trials from its tag (None: written before the tag, or left out of a long index entry;
        trials.study_trial_outcomes reads them from the run)."""
        decoded = decode_trial_outcomes(self.trial_outcomes_text)
        return tuple(decoded) if decoded is not None else None

    def answers(self) -> list["StoredStudy"]:
        """The study and, for a ladder, the one-goal study of each rung as that rung answers it: its key, steps and
        trials (the hardest rung's are the study's own)."""
        return [self, *(replace(self, study_key=r.study_key, steps_to_result=r.steps_to_result,
                                trial_outcomes_text=r.trial_outcomes_text, rungs=(),
                                rung=None if r is self.rungs[-1] else r.goal) for r in self.rungs)]


def _rungs(tags: dict[str, str], metrics: dict[str, float]) -> tuple[Rung, ...]:
    try:
        goals = n.parse_goals_text(tags[n.TAG_GOALS])
    except (KeyError, ValueError):
        return ()
    rungs = []
    for goal in goals:
        steps = metrics.get(n.goal_steps_metric(goal))
        # None where the tag is missing (too many trials for it, or left out of a long index entry): readers that
        # need the trials read them from the run (trials.study_trial_outcomes).
        outcomes = tags.get(n.rung_outcomes_tag(goals, goal))
        if n.goal_key_tag(goal) in tags:
            rungs.append(Rung(goal, tags[n.goal_key_tag(goal)], int(steps) if steps is not None else None, outcomes))
    return tuple(rungs)


def stored_studies(runs: Iterable[Any], lease: float) -> list[StoredStudy]:
    """Study runs (MLflow's, or the study index's views of them) as readers of studies see them; those of a key
    are read together: a run FINISHED by a process that had lost it (fence.py) is FAILED, as the taker marked it."""
    now, runs = time.time(), list(runs)
    found = [leased(run) for run in runs]
    fence = Fence.of(found)
    studies = []
    for run, leased_run in zip(runs, found):
        tags, metrics = run.data.tags, run.data.metrics
        reused = tags.get(n.TAG_REUSED, "0")
        stale = leased_run.state is RunState.FINISHED and not fence.counts(leased_run)
        studies.append(StoredStudy(
            run_id=leased_run.run_id, study_key=leased_run.key, state=RunState.FAILED if stale else leased_run.state,
            start_time=leased_run.start_time, steps_to_result=leased_run.steps_to_result,
            full_trials=leased_run.full_trials, trial_outcomes_text=tags.get(n.TAG_TRIAL_OUTCOMES),
            live=leased_run.live(lease, now), epoch=leased_run.epoch, planned=leased_run.planned,
            rungs=_rungs(tags, metrics),
            trials_so_far=(int(reused) if reused.isdigit() else 0) + int(metrics.get(n.METRIC_TRIAL_RUNS_FINISHED, 0))))
    return studies


def study_views(client: StoreClient, experiment_id: str) -> list[index.RunView]:
    """Every study run of the experiment (index.study_runs): one read, which a command passes to each question."""
    return index.study_runs(searcher(client, [experiment_id]))


def study_runs(client: StoreClient, experiment_id: str, workload: str, lease: float,
               views: list[index.RunView] | None = None) -> list[StoredStudy]:
    """Every study run of a workload in the experiment; ``lease`` tells a live run; ``views``: the experiment's
    study runs as :func:`study_views` read them, instead of reading them again."""
    runs = index.with_tags(study_views(client, experiment_id) if views is None else views, {n.TAG_WORKLOAD: workload})
    return stored_studies(runs, lease)


def planned_trial_counts(client: StoreClient, experiment_id: str, stored: list[StoredStudy],
                         study_keys: Iterable[str]) -> dict[str, int]:
    """study key -> its finished trials, for studies with study runs (``stored``: the workload's) but none
    finished: a live study's latest run says it; a dead one's run may be one short, and earlier runs may have
    finished some (those that count: fence.py)."""
    latest = {run.study_key: run for run in sorted(stored, key=lambda r: r.order)}
    fence = Fence.of(stored)
    counts: dict[str, int] = {}
    for key in dict.fromkeys(study_keys):
        run = latest.get(key)
        if run is not None and run.live:
            counts[key] = run.trials_so_far
            continue
        # Else its FINISHED trial runs: one search per key (callers ask for a few).
        found = search_all(client, experiment_id, filter_string(tags={n.TAG_KIND: n.KIND_TRIAL, n.TAG_STUDY_KEY: key},
                                                                status=RunState.FINISHED.value))
        counts[key] = len({trial.data.tags.get(n.TAG_TRIAL_KEY) for trial in found
                           if fence.counts_trial(trial_epochs(trial.data.tags))})
    return counts


def trial_runs_finished(client: StoreClient, experiment_id: str, run_ids: Iterable[str]) -> dict[str, int]:
    """study run id -> the trial runs it has finished so far, in a search by id (a queued sweep's progress)."""
    return {run.info.run_id: int(run.data.metrics.get(n.METRIC_TRIAL_RUNS_FINISHED, 0))
            for run in index.by_ids(searcher(client, [experiment_id]), run_ids)}
