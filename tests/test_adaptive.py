"""The adaptive sweep: its decision rule on synthetic curves (no training), its limits and bad input,
and one small real sweep on digits (decision table, replay without training, reuse by a grid sweep)."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from edps_mlflow.adaptive import (
    AdaptiveSettings,
    Budget,
    BudgetKind,
    Goal,
    StopReason,
    UncertaintyKind,
    assess_curve,
    decide,
    decision_rows,
    perfect_doublings,
    powers_of_two,
    start_grid,
)
from edps_mlflow.cli import main
from edps_mlflow.curves import CurveId
from edps_mlflow.errors import EdpsError

from conftest import built_once, edps_here, fresh_store, run_edps

RANGE = powers_of_two(2, 1024)


def hyperbola(s_min: float, b_crit: float):
    return lambda b: s_min * (1 + b_crit / b)


def synthetic(curve_steps, batch_sizes, trials: int = 6, spread: float = 0.05, reach=lambda b: True,
              sparsity: float = 0.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A curve's study table and trial table: at each batch size ``trials`` reaching trials, the best at
    ``curve_steps(b)``, the others ``spread`` slower each (a study where none reaches: no result)."""
    points, rows = [], []
    for b in batch_sizes:
        key = f"k{sparsity}-{b}"
        best = round(curve_steps(b))
        reached = reach(b)
        points.append({"workload": "digits-simple-cnn", "optimizer": "sgd", "sparsity": sparsity, "batch_size": b,
                       "steps_to_result": float(best) if reached else math.nan, "study_key": key})
        for i in range(trials):
            steps = round(best * (1 + spread * i))
            rows.append({"study_key": key, "trial_index": i, "status": "reached" if reached else "not_reached",
                         "steps_to_result": steps if reached else None, "steps_trained": steps if reached else 5000})
    return pd.DataFrame(points), pd.DataFrame(rows)


def assess(curve_steps, batch_sizes, target: float = 2.0, **kwargs):
    points, trials = synthetic(curve_steps, batch_sizes, **kwargs)
    return assess_curve(CurveId("digits-simple-cnn", "sgd", kwargs.get("sparsity", 0.0)), points, trials, RANGE,
                        AdaptiveSettings(target=target))


# ---- the budget and the settings ----------------------------------------------------------------
@pytest.mark.parametrize("text,kind,amount", [
    ("2e6steps", BudgetKind.TRIAL_STEPS, 2e6), ("150000steps", BudgetKind.TRIAL_STEPS, 150000),
    ("30m", BudgetKind.SECONDS, 1800), ("90s", BudgetKind.SECONDS, 90), ("1.5h", BudgetKind.SECONDS, 5400),
    (" 2h ", BudgetKind.SECONDS, 7200)])
def test_budget_parses(text, kind, amount):
    budget = Budget.parse(text)
    assert budget.kind is kind and budget.amount == amount
    assert Budget.parse(budget.text()) == budget


@pytest.mark.parametrize("text", ["", "30", "steps", "0steps", "-5m", "2e6 step", "30min", "infh", "nans", "1e999steps",
                                  "3d", "2e6steps30m"])
def test_budget_refuses(text):
    with pytest.raises(EdpsError, match="budget"):
        Budget.parse(text)


@pytest.mark.parametrize("arguments,message", [
    ({"target": 1.0}, "target must be a factor greater than 1"),
    ({"target": 0.5}, "target must be a factor greater than 1"),
    ({"target": math.nan}, "target must be a factor greater than 1"),
    ({"target": True}, "target must be a factor greater than 1"),
    ({"max_studies": 0}, "max studies must be a positive integer"),
    ({"max_studies": 2.5}, "max studies must be a positive integer"),
])
def test_settings_refuse(arguments, message):
    with pytest.raises(EdpsError, match=message):
        AdaptiveSettings(**arguments)


def test_the_walk_starts_at_the_largest_batch_sizes():
    assert start_grid(powers_of_two(2, 1024)) == (256, 512, 1024)
    assert start_grid(powers_of_two(16, 32)) == (16, 32)
    assert powers_of_two(3, 100) == (4, 8, 16, 32, 64)


@pytest.mark.parametrize("text,goal,factor", [
    ("b_crit", Goal.B_CRIT, 2.0), ("b_crit:1.5", Goal.B_CRIT, 1.5), ("3", Goal.B_CRIT, 3.0),
    ("threshold", Goal.THRESHOLD, 2.0), ("boundaries", Goal.BOUNDARIES, 2.0)])
def test_target_parses(text, goal, factor):
    assert AdaptiveSettings.parse_target(text) == (goal, factor)


@pytest.mark.parametrize("text", ["", "fastest", "threshold:2", "b_crit:x", "b_crit:"])
def test_target_refuses(text):
    with pytest.raises(EdpsError, match="is not b_crit, b_crit:<factor>"):
        AdaptiveSettings.parse_target(text)


# ---- the decision rule on synthetic curves --------------------------------------------------------
def test_a_curve_walks_down_only_as_far_as_b_crit_needs():
    # S(B) = 100 (1 + 32 / B): from the top, each round one doubling down, until B_crit / 2 = 16 is measured.
    state = assess(hyperbola(100, 32), (256, 512, 1024), spread=0.0)
    (walk,) = state.open
    # From three points near the plateau the estimate is rough (30.7, the steps being whole numbers): the walk
    # is expected to end at the first power of two below 30.7 / 2.
    assert walk.kind is UncertaintyKind.B_CRIT and walk.batch_size == 128 and walk.walk_to == 8
    assert "the smallest measured batch size 256 is above B_crit / 2 = 15.4" in walk.description
    assert assess(hyperbola(100, 32), powers_of_two(32, 1024), spread=0.0).next_batch_size().batch_size == 16
    done = assess(hyperbola(100, 32), powers_of_two(16, 1024), spread=0.0)
    assert not done.open, done.summary()
    assert done.fit["b_crit"] == pytest.approx(32, rel=0.01)
    assert decide([done], 7, 1000, 0.0, AdaptiveSettings()).stop is StopReason.TARGET_MET
    # A tighter target walks further: B_crit / 4 = 8.
    tight = assess(hyperbola(100, 32), powers_of_two(16, 1024), target=4.0, spread=0.0)
    assert tight.next_batch_size().batch_size == 8


def test_free_workers_measure_ahead_of_the_walk_but_not_below_where_the_fit_expects_it_to_end():
    state = assess(hyperbola(100, 32), (256, 512, 1024), spread=0.0)
    decision = decide([state], 3, 100, 0.0, AdaptiveSettings(width=4), RANGE)
    assert [p.batch_size for p in decision.picks] == [128, 64, 32, 16]
    assert "ahead of the walk" in decision.picks[1].uncertainty
    near = assess(hyperbola(100, 32), powers_of_two(32, 1024), spread=0.0)
    assert [p.batch_size for p in decide([near], 6, 100, 0.0, AdaptiveSettings(width=4), RANGE).picks] == [16]
    # More curves than workers: one each, the largest excess first.
    other = assess(hyperbola(300, 8), (256, 512, 1024), sparsity=0.9, spread=0.0)
    two = decide([near, other], 9, 100, 0.0, AdaptiveSettings(width=2), RANGE)
    assert sorted(p.batch_size for p in two.picks) == [16, 128] and two.picks[0].excess >= two.picks[1].excess


def test_the_threshold_goal_walks_down_to_perfect_scaling_and_brackets_it():
    # 100 (1 + 32 / B) scales perfectly (x at most 1.2 per doubling) from 4 to 8 and 8 to 16, not 16 to 32.
    threshold = AdaptiveSettings(goal=Goal.THRESHOLD)
    points, trials = synthetic(hyperbola(100, 32), powers_of_two(8, 1024), spread=0.0)
    assert perfect_doublings(points) == 1
    state = assess_curve(CurveId("digits-simple-cnn", "sgd", 0.0), points, trials, RANGE, threshold)
    (walk,) = state.open
    assert walk.kind is UncertaintyKind.PERFECT_SCALING and walk.batch_size == 4
    points, trials = synthetic(hyperbola(100, 32), powers_of_two(4, 1024), spread=0.0)
    assert perfect_doublings(points) == 2
    state = assess_curve(CurveId("digits-simple-cnn", "sgd", 0.0), points, trials, RANGE, threshold)
    # From B_0 = 4: 16 x S(16) = 4800 > 1.2 x 4 x S(4) = 4320, so the threshold is 8, bracketed by 16.
    assert not state.open and (state.fit["b_crit_threshold"], state.fit["perfect_scaling_end"]) == (8, 16)
    # Free workers measure ahead only as far as the walk must still go (two perfect doublings below the
    # start at least), not down to 2 at once: 16 workers measure 128 and 64 in the first walk round.
    points, trials = synthetic(hyperbola(100, 64), (256, 512, 1024), spread=0.0)
    start = assess_curve(CurveId("digits-simple-cnn", "sgd", 0.0), points, trials, RANGE, threshold)
    wide = replace(threshold, width=16)
    assert [p.batch_size for p in decide([start], 3, 0, 0.0, wide, RANGE).picks] == [128, 64]


def test_a_curve_that_the_range_cannot_pin_says_so_and_stops_spending():
    # Perfect scaling through the whole range: B_crit lies above it, and its walk ends at 2.
    state = assess(lambda b: 100_000 / b, RANGE, spread=0.0)
    assert state.open and state.next_batch_size() is None
    assert "the range ends at 2" in state.summary()
    decision = decide([state], 10, 1, 0.0, AdaptiveSettings())
    assert decision.stop is StopReason.EXHAUSTED
    assert decision.uncertain() and decision.uncertain()[0].startswith("sgd sparsity=0: ")
    # The boundaries goal asks for a plateau, which the range cannot show: said, not chased.
    top = assess(lambda b: 100_000 / b, (256, 512, 1024), spread=0.0)
    points, trials = synthetic(lambda b: 100_000 / b, (256, 512, 1024), spread=0.0)
    boundaries = assess_curve(CurveId("digits-simple-cnn", "sgd", 0.0), points, trials, RANGE,
                              AdaptiveSettings(goal=Goal.BOUNDARIES))
    assert not any(u.kind is UncertaintyKind.PLATEAU for u in top.uncertainties)
    plateau = next(u for u in boundaries.open if u.kind is UncertaintyKind.PLATEAU)
    assert plateau.batch_size is None and "the range ends there" in plateau.description


def test_a_curve_without_a_fit_walks_down_one_guess_at_a_time():
    # Only the smallest measured batch size reaches the goal (the plateau's two studies missed it by luck):
    # no hyperbola yet, so the walk goes on down, and free workers may measure one doubling ahead, no more.
    state = assess(hyperbola(100, 32), (256, 512, 1024), reach=lambda b: b == 256)
    (only,) = state.uncertainties
    assert only.kind is UncertaintyKind.NO_FIT and "1 of 3 measured batch sizes have a result" in only.description
    assert (only.batch_size, only.walk_to) == (128, 64)
    decision = decide([state], 3, 0, 0.0, AdaptiveSettings(width=8), RANGE)
    assert [p.batch_size for p in decision.picks] == [128, 64]


def test_a_walk_stops_below_a_batch_size_that_reached_nothing_within_the_cap():
    # Smaller batch sizes take more steps: when the smallest measured one reached nothing within the step
    # cap, the ones below cannot either. The curve says so and spends nothing more.
    for reach in (lambda b: b >= 1024, lambda b: b >= 512, lambda b: False):
        state = assess(hyperbola(100, 32), (256, 512, 1024), reach=reach)
        assert state.open and all(u.batch_size is None for u in state.open), state.uncertainties
        assert "no trial at batch size 256 reached the goal within the step cap" in state.summary()
        assert "raise --max-steps" in state.summary()
        assert decide([state], 3, 0, 0.0, AdaptiveSettings(width=4), RANGE).stop is StopReason.EXHAUSTED
    threshold = AdaptiveSettings(goal=Goal.THRESHOLD)
    points, trials = synthetic(hyperbola(100, 64), (32, 64, 128, 256, 512, 1024), reach=lambda b: b >= 64)
    state = assess_curve(CurveId("digits-simple-cnn", "sgd", 0.0), points, trials, RANGE, threshold)
    assert all(u.batch_size is None for u in state.open if u.kind is UncertaintyKind.PERFECT_SCALING)


def test_a_curve_the_hyperbola_does_not_describe_stays_uncertain():
    # Steps that rise with batch size (a sparse curve with too few trials): the fit answers nothing; the
    # walk goes on down for four doublings (a plateau rises too), then the curve is called too noisy and stops
    # spending before the dearest batch sizes.
    state = assess(lambda b: 600 * b ** 0.05, (256, 512, 1024), spread=0.0)
    doubtful = next(u for u in state.open if u.kind is UncertaintyKind.DOUBTFUL_FIT)
    assert "steps rise with batch size" in doubtful.description and doubtful.batch_size == 128
    assert assess(lambda b: 600 * b ** 0.05, powers_of_two(32, 1024), spread=0.0).next_batch_size().batch_size == 16
    noisy = assess(lambda b: 600 * b ** 0.05, powers_of_two(16, 1024), spread=0.0)
    (only,) = noisy.open
    assert only.batch_size is None and "too noisy to pin" in only.description
    assert decide([noisy], 7, 0, 0.0, AdaptiveSettings()).stop is StopReason.EXHAUSTED


def test_limits_stop_a_round_before_it_starts():
    dense = assess(hyperbola(100, 32), (256, 512, 1024))
    sparse = assess(hyperbola(300, 8), (256, 512, 1024), sparsity=0.9)
    decision = decide([dense, sparse], 6, 50_000, 10.0, AdaptiveSettings(width=2), RANGE)
    assert decision.stop is None and len(decision.picks) == 2
    assert {p.curve for p in decision.picks} == {CurveId("digits-simple-cnn", "sgd", 0.0),
                                                 CurveId("digits-simple-cnn", "sgd", 0.9)}
    rows = decision_rows(1, decision, 6, 50_000)
    assert [r["batch_size"] for r in rows] == [p.batch_size for p in decision.picks]
    assert all(r["decision"] == "measure" and r["reason"] and r["uncertainty_before"] for r in rows)
    # --max-studies leaves room for one study: the largest excess gets it.
    one = decide([dense, sparse], 6, 50_000, 10.0, AdaptiveSettings(max_studies=7, width=2), RANGE)
    assert [p.curve for p in one.picks] == [decision.picks[0].curve]
    assert decide([dense, sparse], 7, 50_000, 10.0, AdaptiveSettings(max_studies=7)).stop is StopReason.MAX_STUDIES
    steps = AdaptiveSettings(budget=Budget.parse("5e4steps"))
    assert decide([dense, sparse], 6, 50_000, 10.0, steps).stop is StopReason.BUDGET_STEPS
    assert decide([dense, sparse], 6, 49_999, 10.0, steps).stop is None
    clock = AdaptiveSettings(budget=Budget.parse("10s"))
    assert decide([dense, sparse], 6, 0, 10.0, clock).stop is StopReason.BUDGET_TIME
    # A limit does not hide that the target is met.
    done = assess(hyperbola(100, 32), powers_of_two(16, 1024), spread=0.0)
    assert decide([done], 99, 10**9, 10**6, AdaptiveSettings(max_studies=1, budget=Budget.parse("1s"))).stop \
        is StopReason.TARGET_MET


def test_the_rule_is_deterministic():
    first = assess(hyperbola(100, 32), (256, 512, 1024))
    second = assess(hyperbola(100, 32), (256, 512, 1024))
    assert first == second


# ---- bad input on the command line --------------------------------------------------------------
SWEEP = ["sweep", "--trials", "2", "--max-steps", "200"]


@pytest.mark.parametrize("arguments,message", [
    (["--target", "3"], "--target only apply to an adaptive sweep: add --adaptive"),
    (["--budget", "30m", "--max-studies", "9"], "--max-studies, --budget only apply to an adaptive sweep"),
    (["--adaptive", "--batch-sizes", "12,64"], "an adaptive sweep measures powers of two: batch size 12 is not one"),
    (["--adaptive", "--max-studies", "2"], "--max-studies 2 is smaller than the start (3 batch sizes x 1 curves = 3"),
    (["--adaptive", "--budget", "10x"], "budget '10x' is not <number>steps"),
    (["--adaptive", "--budget", "0steps"], "a budget must be a positive finite amount"),
    (["--adaptive", "--target", "1"], "target must be a factor greater than 1"),
    (["--adaptive", "--target", "b_crit:nan"], "target must be a factor greater than 1"),
    (["--adaptive", "--target", "fastest"], "target 'fastest' is not b_crit, b_crit:<factor>"),
    (["--adaptive", "--max-studies", "0"], "max studies must be a positive integer"),
])
def test_adaptive_bad_input_is_refused_in_one_line(arguments, message, sqlite_uri, monkeypatch, capsys):
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")  # no re-exec: we run in this process
    with pytest.raises(SystemExit) as exit_info:
        main([*SWEEP, *arguments])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edps: error: ") and message in lines[0], lines
    assert not Path(sqlite_uri.removeprefix("sqlite:///")).exists()


# ---- one small real adaptive sweep ------------------------------------------------------------------
# Two workers in every run: a round's width (its studies) is part of the adaptive sweep's key.
TINY = ["--batch-sizes", "8..256", "--sparsities", "0", "--trials", "2", "--goal-error", "0.06", "--max-steps", "600",
        "--experiment", "adaptive-test", "--log-interval", "5", "--workers", "2"]


def _runs(uri: str, kind: str) -> list:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("adaptive-test")
    return [r for r in client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL, max_results=5000)
            if r.data.tags.get("edps.kind") == kind]


def _measured(uri: str) -> dict[int, float | None]:
    """batch size -> steps_to_result of the finished study runs."""
    return {int(r.data.tags["edps.batch_size"]): r.data.metrics.get("steps_to_result")
            for r in _runs(uri, "study") if r.info.status == "FINISHED"}


def _build_adaptive_store(directory: Path) -> list:
    uri = fresh_store(directory / "mlflow.db")
    first = run_edps(["sweep", "--adaptive", "--max-studies", "3", *TINY], cwd=directory, MLFLOW_TRACKING_URI=uri)
    assert first.returncode == 0, first.stderr[-3000:]
    trained_first = len(_runs(uri, "trial"))
    second = run_edps(["sweep", "--adaptive", "--max-studies", "5", *TINY], cwd=directory, MLFLOW_TRACKING_URI=uri)
    assert second.returncode == 0, second.stderr[-3000:]
    return [str(directory), uri, first.stdout, second.stdout, trained_first]


@pytest.fixture(scope="module")
def adaptive_store(tmp_path_factory):
    """The start alone (--max-studies 3), then the same sweep allowed 5 studies, in one store (once per
    session, whichever worker asks first)."""
    directory, uri, first, second, trained_first = built_once(tmp_path_factory, "adaptive-sweep",
                                                              _build_adaptive_store)
    return Path(directory), uri, first, second, trained_first


@pytest.mark.slow
def test_adaptive_sweep_decides_replays_and_is_reused(adaptive_store):
    tmp_path, uri, first, second, trained_first = adaptive_store
    # The start only (the three largest batch sizes): stopped by --max-studies, with what is left said.
    assert "round 0: start at batch sizes 64, 128, 256" in first
    assert "stopped: max studies after 1 round(s), 3 studies" in first and "still uncertain: " in first
    assert trained_first == 6

    # A larger limit is another adaptive sweep (its own key): it replays the start from the store (nothing
    # retrained) and walks down: two batch sizes a round (two workers), the second ahead of the walk.
    assert "round 1: sgd sparsity=0 measures bs 32: " in second
    sweeps = {r.data.tags["edps.sweep_key"]: r for r in _runs(uri, "sweep")}
    assert len(sweeps) == 2 and all(r.info.status == "FINISHED" for r in sweeps.values())
    run = max(sweeps.values(), key=lambda r: r.info.start_time)
    stop = run.data.tags["edps.adaptive.stop"]
    assert stop in ("max studies", "target met", "exhausted")
    measured = int(run.data.metrics["adaptive/studies"])
    assert 4 <= measured <= 5 and run.data.metrics["adaptive/trial_steps"] > 0
    assert len(_measured(uri)) == measured, "one finished study run per measured batch size"
    trials = [r.data.tags["edps.trial_key"] for r in _runs(uri, "trial") if r.info.status == "FINISHED"]
    assert len(trials) == len(set(trials)) == 2 * measured, "no trial trained twice"

    # The decision table: the start, then each choice with its reason and the uncertainty before.
    client = MlflowClient(uri)
    path = client.download_artifacts(run.info.run_id, "adaptive_decisions.csv", str(tmp_path))
    table = list(csv.DictReader(io.StringIO(Path(path).read_text())))
    measures = [r for r in table if r["decision"] == "measure"]
    assert [int(r["batch_size"]) for r in measures[:3]] == [64, 128, 256]
    assert all(r["reason"] == "start: the largest batch sizes" for r in measures[:3])
    assert len(measures) == measured and all(r["reason"] and r["uncertainty_before"] for r in measures[3:])
    assert all(int(r["batch_size"]) < 64 for r in measures[3:]), "the walk goes down from the start"
    assert table[-1]["decision"] == f"stop: {stop}"
    note = run.data.tags["mlflow.note.content"]
    assert f"**Stopped: {stop}.**" in note and "| round | decision |" in note

    # Run again: the finished sweep is replayed from the store and nothing is trained.
    code, printed = edps_here(["sweep", "--adaptive", "--max-studies", "5", *TINY], uri)
    assert code == 0 and "already complete" in printed, printed[-3000:]
    assert len(_runs(uri, "trial")) == 2 * measured
    assert client.get_run(run.info.run_id).info.end_time == run.info.end_time

    # A grid sweep of the same protocol reuses every study the adaptive sweeps measured.
    grid = run_edps(["sweep", *TINY], cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    assert grid.returncode == 0, grid.stderr[-3000:]
    assert f"plan: {measured} done, 0 partly done (finished trials are reused), {6 - measured} to do" in grid.stdout


@pytest.mark.slow
def test_adaptive_sweep_on_ray_makes_the_local_decisions(adaptive_store, tmp_path):
    pytest.importorskip("ray")
    _, local_uri, _, local, _ = adaptive_store
    uri = fresh_store(tmp_path / "mlflow.db")
    # The start and one adaptive round on Ray, both in one Ray instance (the executor's session).
    result = run_edps(["sweep", "--adaptive", "--max-studies", "5", *TINY, "--executor", "ray"],
                      cwd=tmp_path, timeout=600, MLFLOW_TRACKING_URI=uri, RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    assert result.stdout.count("ray: started a local instance") == 1, result.stdout[-3000:]  # for both rounds
    rounds = [line for line in result.stdout.splitlines() if line.startswith("round ")]
    local_rounds = [line for line in local.splitlines() if line.startswith("round ")]
    assert len(rounds) == 2 and rounds == local_rounds[:2]
    # The same studies as the local sweep measured in those rounds: the same keys, the same results.
    ray, local_measured = _measured(uri), _measured(local_uri)
    assert len(ray) == 5 and ray == {b: local_measured[b] for b in ray}
    # ... and the store as the local executor leaves it: one run per study and trial, nothing left RUNNING.
    code, printed = edps_here(["doctor", "--experiment", "adaptive-test"], uri)
    assert code == 0, printed


def test_a_round_is_as_wide_as_the_executor_runs_studies_at_once():
    from edps_mlflow.executors import get_executor
    from edps_mlflow.executors.base import executor_workers
    from edps_mlflow.resources import available_cores, gpu_count
    from edps_mlflow.sweep_spec import SweepOptions

    local, ray = get_executor("local"), get_executor("ray")
    assert executor_workers(local, SweepOptions(workers=3, device="cpu")) == 3
    assert executor_workers(local, SweepOptions(device="cpu")) == available_cores()
    assert executor_workers(ray, SweepOptions(executor="ray", workers=5)) == 5
    assert executor_workers(ray, SweepOptions(executor="ray")) == available_cores()
    if gpu_count():  # one worker per GPU, whatever --workers says
        assert executor_workers(local, SweepOptions(workers=64)) == gpu_count()
