"""Breadth-first scheduling: the same trajectories as depth-first, the same study result, and the
trial-steps lower bound it is measured against."""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest

from edps_mlflow.config import Schedule, StudySpec, TrialSpec
from edps_mlflow.engine import ChunkRun, LocalStepBound, SharedPace, interleave, train_trials
from edps_mlflow.pool import shared_int, shared_ints
from edps_mlflow.results import TrialRecord, TrialStatus, best_reached_step, trial_steps_lower_bound
from edps_mlflow.trial_workers import SharedStepBound, shares

from helpers import DIGITS, digits_data, engine_settings, setups_for, study_spec


class _Log:
    """Every check of every trial, and how each ended."""

    def __init__(self) -> None:
        self.checks: dict[int, list[tuple[int, float, float | None]]] = defaultdict(list)
        self.results = {}

    def on_check(self, index, check):
        self.checks[index].append((check.step, check.train_loss, check.validation_error))

    def on_probe(self, index, step, values):
        pass

    def on_finish(self, result):
        self.results[result.index] = result


def _chunks(spec: StudySpec, trials: int, pack: int):
    setups = setups_for(spec, DIGITS.search_space(spec.optimizer).points(trials))
    return [setups[i:i + pack] for i in range(0, trials, pack)]


def _depth_first(spec, chunks, exact: bool) -> _Log:
    """Today's way: each chunk trained to its end by train_trials before the next starts."""
    log, bound = _Log(), LocalStepBound(spec.max_steps, spec.check_interval, exact)
    for chunk in chunks:
        train_trials(DIGITS, digits_data(), chunk, engine_settings(spec), bound, log)
    return log


def _breadth_first(spec, chunks, exact: bool) -> _Log:
    log, bound = _Log(), LocalStepBound(spec.max_steps, spec.check_interval, exact)
    runs = [ChunkRun(DIGITS, digits_data(), chunk, engine_settings(spec), log) for chunk in chunks]
    interleave(runs, bound)
    return log


@pytest.mark.parametrize("pack", [1, 3])  # the single fast path, and packed chunks in lockstep
def test_breadth_first_trains_every_trial_exactly_as_depth_first(pack):
    spec = study_spec(optimizer="momentum", batch_size=16, goal_error=0.06, max_steps=160, check_interval=20)
    chunks = _chunks(spec, 6, pack)
    depth, breadth = _depth_first(spec, chunks, exact=False), _breadth_first(spec, chunks, exact=False)
    # Bit for bit: every check of every trial (step, training loss, validation error).
    assert dict(breadth.checks) == dict(depth.checks)
    assert {i: (r.status, r.steps_to_result) for i, r in breadth.results.items()} == \
           {i: (r.status, r.steps_to_result) for i, r in depth.results.items()}


@pytest.mark.parametrize("pack", [1, 2])
def test_breadth_first_early_stopping_keeps_the_result_and_costs_no_more(pack):
    # Trials reach at 60 (the result), 100 and 140; five never do, and train to the cap in the full run: a
    # cap of 200 keeps every case (reached, cut, not reached) at a third of the cost of 600.
    spec = study_spec(optimizer="sgd", batch_size=64, goal_error=0.06, max_steps=200, check_interval=20)
    chunks = _chunks(spec, 8, pack)
    full = _depth_first(spec, chunks, exact=False)
    depth, breadth = _depth_first(spec, chunks, exact=True), _breadth_first(spec, chunks, exact=True)

    def result(log):
        return best_reached_step((r.status, r.steps_to_result) for r in log.results.values())

    assert result(full) is not None and result(breadth) == result(depth) == result(full)
    for index, checks in breadth.checks.items():
        assert checks == full.checks[index][:len(checks)]  # a prefix of the trial's own full trajectory
        status = breadth.results[index].status
        if status is not TrialStatus.SUPERSEDED:  # ended by itself: as it does with full trials
            assert (status, breadth.results[index].steps_to_result) == \
                   (full.results[index].status, full.results[index].steps_to_result)
        if full.results[index].steps_to_result == result(full):
            assert status is TrialStatus.REACHED  # a trial reaching at the best step is never cut off
    steps = {name: sum(r.steps_trained for r in log.results.values())
             for name, log in (("breadth", breadth), ("depth", depth))}
    assert steps["breadth"] <= steps["depth"]


def _record(spec: StudySpec, index: int, status: TrialStatus, trained: int, reused: bool = False) -> TrialRecord:
    return TrialRecord(TrialSpec(spec, index, {"learning_rate": 0.1}), status,
                       trained if status is TrialStatus.REACHED else None, trained, None, f"run{index}", reused)


def test_trial_steps_lower_bound():
    spec = StudySpec("digits-simple-cnn", "sgd", 0.0, 256, 8, 0.03, 5000, 20, 0)
    s = TrialStatus
    # The example: one trial reaches at 80; every other must pass 60 (or end before).
    records = {0: _record(spec, 0, s.SUPERSEDED, 1120), 1: _record(spec, 1, s.REACHED, 80),
               2: _record(spec, 2, s.DIVERGED, 20), 3: _record(spec, 3, s.REACHED, 1140),
               4: _record(spec, 4, s.SUPERSEDED, 60)}
    assert trial_steps_lower_bound(records) == 60 + 80 + 20 + 60 + 60
    # Ties: one trial proves the best; the other needs only the limit. Reused trials cost nothing.
    records = {0: _record(spec, 0, s.REACHED, 80), 1: _record(spec, 1, s.REACHED, 80),
               2: _record(spec, 2, s.SUPERSEDED, 60, reused=True)}
    assert trial_steps_lower_bound(records) == 80 + 60
    # A reused best: every trained trial needs only the limit.
    records = {0: _record(spec, 0, s.REACHED, 80, reused=True), 1: _record(spec, 1, s.SUPERSEDED, 60)}
    assert trial_steps_lower_bound(records) == 60
    # No trial reached: each to its own end (the cap, or divergence).
    records = {0: _record(spec, 0, s.NOT_REACHED, 5000), 1: _record(spec, 1, s.DIVERGED, 40)}
    assert trial_steps_lower_bound(records) == 5040
    # The best at a cap that is not a multiple of the check interval: the limit rounds up to a check.
    capped = StudySpec("digits-simple-cnn", "sgd", 0.0, 256, 8, 0.03, 130, 20, 0)
    records = {0: _record(capped, 0, s.REACHED, 130), 1: _record(capped, 1, s.SUPERSEDED, 120)}
    assert trial_steps_lower_bound(records) == 130 + 120
    assert trial_steps_lower_bound({}) == 0


class _HeldUp:
    """A chunk whose process loses its core for a while just as it starts to train from ``step`` (on a shared
    machine: other jobs, or the parent writing to the store)."""

    def __init__(self, run: ChunkRun, step: int, seconds: float) -> None:
        self.run, self.held_step, self.seconds = run, step, seconds

    step = property(lambda self: self.run.step)
    done = property(lambda self: self.run.done)
    last_loss = property(lambda self: self.run.last_loss)

    def advance(self, bound) -> None:
        if self.run.step == self.held_step:
            time.sleep(self.seconds)
        self.run.advance(bound)


def test_paced_workers_stop_within_an_interval_when_the_best_trials_worker_falls_behind():
    """The lone study of test_a_first_study_costs_what_proving_its_minimum_costs on two trial workers (threads
    here, with the workers' shared best step and pace), the best trial's worker held up as it trains to the
    best step: the other worker may finish the interval it was training then, and starts no other. Paced
    round by round, it trained its whole round meanwhile (580 trial-steps against 500)."""
    spec = study_spec(batch_size=256, trials=8, goal_error=0.03, max_steps=1000, check_interval=20)
    chunks = _chunks(spec, 8, 1)
    alone = _breadth_first(spec, chunks, exact=True)
    best = best_reached_step((r.status, r.steps_to_result) for r in alone.results.values())
    best_index = next(i for i, r in alone.results.items() if r.steps_to_result == best)
    log = _Log()
    bound = SharedStepBound(shared_int(SharedStepBound.initial_value(spec.max_steps, spec.check_interval, None)),
                            spec.max_steps, spec.check_interval, True)
    places = shared_ints(2, 0)

    def run(chunk):
        trained = ChunkRun(DIGITS, digits_data(), chunk, engine_settings(spec), log)
        held = best_index in [setup.index for setup in chunk]
        return _HeldUp(trained, best - spec.check_interval, 2.0) if held else trained

    runs = [[run(chunk) for chunk in share] for share in shares(chunks, 2, Schedule.BREADTH_FIRST)]
    with ThreadPoolExecutor(2) as threads:
        for future in [threads.submit(interleave, share, bound, SharedPace(places, slot))
                       for slot, share in enumerate(runs)]:
            future.result()
    assert best_reached_step((r.status, r.steps_to_result) for r in log.results.values()) == best
    records = {i: _record(spec, i, r.status, r.steps_trained) for i, r in log.results.items()}
    trained = sum(r.steps_trained for r in log.results.values())
    assert trained <= trial_steps_lower_bound(records) + spec.check_interval


def test_breadth_first_falls_back_to_depth_first_when_held_trials_would_not_fit(monkeypatch):
    from edps_mlflow import resources, study
    from edps_mlflow.resources import held_bytes_per_trial

    spec = study_spec(optimizer="momentum", sparsity=0.5)
    schedule, held, warning = study.choose_schedule(spec, DIGITS, 8, Schedule.BREADTH_FIRST, "cpu", 1618)
    assert (schedule, warning) == (Schedule.BREADTH_FIRST, None)
    assert held == held_bytes_per_trial(6090, optimizer="momentum", sparse=True, train_size=1618)
    monkeypatch.setattr(resources, "breadth_first_fits", lambda held_bytes, device: False)
    schedule, _, warning = study.choose_schedule(spec, DIGITS, 8, Schedule.BREADTH_FIRST, "cpu", 1618)
    assert schedule is Schedule.DEPTH_FIRST and "depth-first" in warning


@pytest.mark.parametrize("workers", [1, 2])  # in this process; the default on two cores
def test_a_first_study_costs_what_proving_its_minimum_costs(sqlite_store, workers):
    """The issue's example (bs 256, 8 trials in Sobol order, a check every 20 steps): depth-first it spent
    ~8.5x the lower bound; breadth-first it must stay within 10%, and the study run says so. Each other
    worker may finish the interval it trains while the best trial, first in its round, reaches."""
    import io

    from mlflow import MlflowClient

    from edps_mlflow import names
    from edps_mlflow.study import ExecutionOptions, run_study

    spec = StudySpec("digits-simple-cnn", "sgd", 0.0, 256, 8, 0.03, 1000, 20, 0)
    outcome = run_study(spec, ExecutionOptions(workers=workers, threads=1, experiment="breadth"), out=io.StringIO())
    metrics = MlflowClient(sqlite_store).get_run(outcome.study_run_id).data.metrics
    assert metrics[names.METRIC_STUDY_TRIAL_STEPS] == outcome.trial_steps
    assert metrics[names.METRIC_STUDY_TRIAL_STEPS_LOWER_BOUND] == trial_steps_lower_bound(outcome.records)
    assert outcome.steps_to_result is not None
    assert metrics[names.METRIC_STUDY_TRIAL_STEPS_RATIO] <= 1.1
    assert outcome.trial_steps <= trial_steps_lower_bound(outcome.records) + (workers - 1) * spec.check_interval
