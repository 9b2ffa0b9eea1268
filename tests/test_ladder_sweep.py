"""Sweeps of goal ladders: every study of a grid or an adaptive sweep is the ladder, a one-goal sweep of a rung
after a ladder sweep trains nothing, an adaptive sweep treats each rung as a curve of its own (and stops only when
every rung is answered), `edps status` shows each rung's steps."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from edps_mlflow import names as n
from edps_mlflow.adaptive import AdaptiveSettings, StopReason, assess_curve, decide, decision_rows, powers_of_two
from edps_mlflow.curves import CurveId
from edps_mlflow.sweep_spec import SweepSpec

from conftest import edps_here, run_edps

DIGITS = "digits-simple-cnn"
LADDER = ["--workload", DIGITS, "--trials", "4", "--batch-sizes", "64,128", "--experiment", "ladders",
          "--log-interval", "5"]


def _curve(steps: dict[int, float], goal: float):
    points = pd.DataFrame([{"workload": DIGITS, "optimizer": "sgd", "sparsity": 0.0, "pruning": "snip",
                            "batch_size": b, "steps_to_result": s, "study_key": f"k{b}"} for b, s in steps.items()])
    trials = pd.DataFrame([{"study_key": f"k{b}", "trial_index": i, "status": "reached",
                            "steps_to_result": round(s * (1 + 0.05 * i)), "steps_trained": round(s * (1 + 0.05 * i))}
                           for b, s in steps.items() for i in range(6)])
    return assess_curve(CurveId(DIGITS, "sgd", 0.0), points, trials, powers_of_two(2, 1024), AdaptiveSettings(), goal)


def test_the_rungs_of_a_curve_are_curves_of_their_own_and_share_their_studies():
    resolved = _curve({b: 100 * (1 + 32 / b) for b in powers_of_two(8, 1024)}, 0.2)
    open_ = _curve({b: 300 * (1 + 32 / b) for b in (256, 512, 1024)}, 0.1)
    also_open = _curve({b: 200 * (1 + 32 / b) for b in (256, 512, 1024)}, 0.15)
    assert not resolved.open and open_.open and resolved.label().endswith("goal<=0.2")
    # One rung answered, another not: the sweep goes on for the open one, at one study per batch size.
    decision = decide([resolved, open_, also_open], 9, 0, 0.0, AdaptiveSettings(width=1), powers_of_two(2, 1024))
    assert decision.stop is None and [(p.batch_size, p.goal) for p in decision.picks] == [(128, 0.1)]
    wide = decide([resolved, open_, also_open], 9, 0, 0.0, AdaptiveSettings(width=3), powers_of_two(2, 1024))
    assert len({p.batch_size for p in wide.picks}) == len(wide.picks)
    # Every rung answered: the target is met, with a stop row per rung.
    done = decide([resolved, _curve({b: 300 * (1 + 32 / b) for b in powers_of_two(8, 1024)}, 0.1)], 9, 0, 0.0,
                  AdaptiveSettings())
    assert done.stop is StopReason.TARGET_MET
    assert [(r["goal"], r["decision"]) for r in decision_rows(2, done, 9, 0)] == [
        (0.2, "stop: target met"), (0.1, "stop: target met")]


def test_a_ladder_sweep_keeps_one_goal_sweep_keys():
    one = SweepSpec.build(DIGITS, ("sgd",), (64, 128), (0.0,), trials=4, goal_error=0.1)
    ladder = SweepSpec.build(DIGITS, ("sgd",), (64, 128), (0.0,), trials=4, goals=(0.2, 0.1))
    assert one.sweep_key != ladder.sweep_key and all(s.goals == (0.2, 0.1) for s in ladder.studies())
    assert [s.rung(0.1).study_key for s in ladder.studies()] == [s.study_key for s in one.studies()]
    assert ladder.params()["goals"] == "0.2,0.1" and "goals" not in one.params()


@pytest.mark.parametrize("goals", ["", "0.1,0.2", "0.1,0.1", "0.2,x", "1.5,0.1"])
def test_a_bad_ladder_is_refused_before_any_work(sqlite_uri, goals):
    code, printed = edps_here(["sweep", *LADDER, "--goals", goals], sqlite_uri)
    assert code == 2 and len(printed.strip().splitlines()) == 1 and "goal" in printed
    assert not Path(sqlite_uri.removeprefix("sqlite:///")).exists()


@pytest.mark.slow
def test_a_one_goal_sweep_after_a_ladder_sweep_trains_nothing_and_adaptive_answers_every_rung(sqlite_store, tmp_path):
    ladder = run_edps(["sweep", *LADDER, "--goals", "0.2,0.1"], tmp_path)
    assert ladder.returncode == 0, ladder.stderr
    client = MlflowClient(sqlite_store)
    experiment_id = client.get_experiment_by_name("ladders").experiment_id

    def runs(kind: str) -> list:
        return [r for r in client.search_runs([experiment_id], run_view_type=ViewType.ALL, max_results=1000)
                if r.data.tags.get(n.TAG_KIND) == kind]

    studies = runs(n.KIND_STUDY)
    assert len(studies) == 2 and all(r.data.tags[n.TAG_GOALS] == "0.2,0.1" for r in studies)
    rung_steps = sorted(int(r.data.metrics[n.goal_steps_metric(0.2)]) for r in studies)
    trials = len(runs(n.KIND_TRIAL))

    one = run_edps(["sweep", *LADDER, "--goal-error", "0.2"], tmp_path)
    assert one.returncode == 0, one.stderr
    assert "plan: 2 done, 0 partly done (finished trials are reused), 0 to do" in one.stdout
    assert len(runs(n.KIND_TRIAL)) == trials and len(runs(n.KIND_STUDY)) == 2
    sweep = max(runs(n.KIND_SWEEP), key=lambda r: r.info.start_time)
    note = sweep.data.tags["mlflow.note.content"]  # the sweep's description: the rungs' steps
    assert sweep.info.status == "FINISHED" and "goal 0.2" in note
    assert all(f" {steps} " in note.split("**sgd**")[1] for steps in rung_steps)

    code, printed = edps_here(["status", "--experiment", "ladders"], sqlite_store)
    assert code == 0 and "goal:steps per rung" in printed and "0.2:" in printed and "0.1:" in printed

    # The adaptive sweep of the same ladder reuses both studies and trains only the start's third batch size.
    adaptive = run_edps(["sweep", "--adaptive", *LADDER[:4], "--batch-sizes", "64..256", "--experiment", "ladders",
                         "--goals", "0.2,0.1", "--target", "threshold", "--max-studies", "6"], tmp_path)
    assert adaptive.returncode == 0, adaptive.stderr
    assert len(runs(n.KIND_STUDY)) == 3
    assert "sgd sparsity=0 goal<=0.2: batch sizes 64,128,256" in adaptive.stdout
    assert "sgd sparsity=0 goal<=0.1: batch sizes 64,128,256" in adaptive.stdout
    run = next(r for r in runs(n.KIND_SWEEP) if n.TAG_ADAPTIVE_STOP in r.data.tags)
    decisions = pd.read_csv(client.download_artifacts(run.info.run_id, n.ARTIFACT_ADAPTIVE_DECISIONS, str(tmp_path)))
    stops = decisions[decisions["decision"].str.startswith("stop")]
    assert sorted(stops["goal"]) == [0.1, 0.2] and all(math.isnan(g) for g in decisions["goal"][:3])
    assert run.data.tags[n.TAG_ADAPTIVE_STOP] == stops["decision"].iloc[0].removeprefix("stop: ")


def test_status_shows_every_goal_measured_at_a_point_the_latest_study_of_each():
    """A ladder and a later one-goal study at another goal share a cell: both goals stay in view, easiest first,
    and a later one-goal study of a rung replaces that rung only (the cell once showed the latest study alone)."""
    from edps_mlflow.results import RunState
    from edps_mlflow.status import tables_of
    from edps_mlflow.store.read.status import StudyRow

    curve = CurveId("digits-simple-cnn", "sgd", 0.0)

    def row(start: int, steps: int, goal: float, rungs: tuple = ()) -> StudyRow:
        return StudyRow(curve, 64, f"key{start}", RunState.FINISHED, steps, 6, 6, start, rungs=rungs, goal=goal)

    ladder = row(1, 60, 0.05, ((0.2, 20), (0.1, 60), (0.05, 60)))
    cell = lambda rows: next(iter(tables_of(rows).values())).loc[64, "sparsity 0"]  # noqa: E731
    assert cell([ladder]) == "0.2:20 0.1:60 0.05:60"
    assert cell([ladder, row(2, 80, 0.07)]) == "0.2:20 0.1:60 0.07:80 0.05:60"
    assert cell([ladder, row(2, 40, 0.1)]) == "0.2:20 0.1:40 0.05:60"
    assert cell([row(1, 80, 0.07), row(2, 60, 0.07)]) == "60"  # one goal: the plain cell, as before
