"""Replicates on the training side: `edps study --replicates R` and `edps sweep --replicates R` train R studies
per point at seeds --seed .. --seed + R - 1, every executor hands each study its own seed, a larger R reuses
the replicates already done, and `edps status` and the sweep run read a point over its replicates."""

from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from edps_mlflow.cli import cli
from edps_mlflow.cli_options import spec_arguments
from edps_mlflow.config import StudySpec
from edps_mlflow.curves import CurveId
from edps_mlflow.executors.base import SweepRun, study_label, study_tasks
from edps_mlflow.mlproject import study_command, study_parameters
from edps_mlflow.replicates import replicates_line
from edps_mlflow.results import RunState
from edps_mlflow.status import format_status, tables_of
from edps_mlflow.store.read.status import StudyRow
from edps_mlflow.sweep import PlannedStudy, PlanState, dispatch, sweep_description
from edps_mlflow.sweep_spec import SweepOptions, SweepSpec

from conftest import edps_here

DIGITS = "digits-simple-cnn"
SPEC = SweepSpec.build(DIGITS, ("sgd",), (16, 64), (0.0, 0.5), seed=5, replicates=3)
SWEEP_RUN = SweepRun(None, "sqlite:///unused.db", "e", "1", SimpleNamespace(run_id="sweep-run"), SPEC.sweep_key)


def test_every_executor_hands_each_study_its_own_seed():
    """Local and Ray train ``StudyTask.spec``; MLflow Projects and the queued executors run the main entry point
    with ``study_parameters``: each carries the study's seed, and the command reads back the study's key."""
    studies = SPEC.studies()
    assert [s.seed for s in studies] == [5] * 4 + [6] * 4 + [7] * 4  # the first replicate of every point first
    assert [t.spec for t in study_tasks(studies, SWEEP_RUN, SweepOptions(), 1)] == studies
    for study in studies:
        parameters = study_parameters(study, "sweep-run", SPEC.sweep_key, None, False, None, None)
        assert parameters["seed"] == str(study.seed)
        words = study_command(parameters)
        given = cli.commands["study"].make_context("study", words[words.index("study") + 1:]).params
        assert given["replicates"] == 1
        assert StudySpec.build(**spec_arguments(SimpleNamespace(**given))).study_key == study.study_key
    # The progress line keys its studies by label: replicates of one point are told apart by their seed.
    assert len({study_label(s) for s in studies}) == len(studies)
    assert study_label(SweepSpec.build(DIGITS, ("sgd",), (16,)).studies()[0]) == "sgd sparsity=0 bs=16"


def test_a_sweep_dispatches_the_first_replicate_of_every_point_first():
    class Recording:
        def run(self, studies, sweep, options, progress, out):
            self.order = [(s.seed, s.batch_size) for s in studies]
            return []

    executor = Recording()
    dispatch(SweepSpec.build(DIGITS, ("sgd",), (16, 64), replicates=2).studies(), SweepOptions(), SWEEP_RUN,
             None, None, executor)
    assert executor.order == [(0, 64), (0, 16), (1, 64), (1, 16)]


def test_the_sweep_run_says_how_many_replicates():
    spec = SweepSpec.build(DIGITS, ("sgd",), (16, 64), replicates=3)
    steps = {(0, 16): 80, (1, 16): 120, (2, 16): 120, (0, 64): 60, (1, 64): None, (2, 64): None}
    plan = [PlannedStudy(s, PlanState.DONE, 2, steps[s.seed, s.batch_size]) for s in spec.studies()]
    text = sweep_description(spec, plan)
    assert "6 studies (2 points x 3 replicates, seeds 0..2)" in text
    assert "| 16 | 105 (3/3) |" in text and "| 64 | - (1/3) |" in text
    assert spec.params()["replicates"] == 3
    assert "replicates" not in SweepSpec.build(DIGITS, ("sgd",), (16, 64)).params()


def test_the_summary_line_of_edps_study_replicates():
    assert replicates_line({0: 80, 1: 120, 2: 120}) == (
        "replicates: steps-to-result seed 0: 80, seed 1: 120, seed 2: 120; the point: 104.8 (geometric mean of the "
        "3 of 3 that reached, 80..120)")
    assert replicates_line({3: 80, 4: 120}).endswith("80..120); fewer than 3 reached: too few for an interval")
    assert "the point: no value: 1 of 2 reached, not more than half" in replicates_line({0: 80, 1: None})
    # replicates alike have no range to write: never 60..60
    assert replicates_line({0: 60, 1: 60, 2: 60}).endswith("the point: 60.0 (geometric mean of the 3 of 3 that "
                                                           "reached, all 60)")


def _row(batch_size, seed, steps, state=RunState.FINISHED, start=0, finished_trials=6, live=False):
    return StudyRow(CurveId(DIGITS, "sgd", 0.0, "snip"), batch_size, f"key{batch_size}-{seed}", state, steps, 6,
                    finished_trials, start, live=live, goal=0.1, seed=seed)


def test_status_reads_a_point_over_its_replicates():
    rows = [_row(16, 0, 80), _row(16, 1, 120), _row(16, 2, 120),  # three replicates
            _row(32, 0, 50), _row(32, 1, None), _row(32, 2, None),  # not more than half reached
            _row(64, 0, 40), _row(64, 1, None, RunState.RUNNING, finished_trials=2, live=True),  # one still training
            _row(128, 3, 30, start=1), _row(128, 3, 31, start=2),  # one seed twice: its latest, as ever
            _row(256, 0, 20)]  # a plain study reads as it always did
    grid = next(iter(tables_of(rows).values()))
    assert grid.loc[16, "sparsity 0"] == "105 (3/3 seeds, 80..120)"
    assert grid.loc[32, "sparsity 0"] == "- (1/3 seeds)"
    assert grid.loc[64, "sparsity 0"] == "40 (1/1 seeds); seed 1: 2/6 trials (running)"
    assert grid.loc[128, "sparsity 0"] == "31"
    assert grid.loc[256, "sparsity 0"] == "20"
    alike = next(iter(tables_of([_row(64, seed, 60) for seed in range(3)]).values()))
    assert alike.loc[64, "sparsity 0"] == "60 (3/3 seeds, all 60)"  # digits: every seed at 60, never 60..60
    shown = format_status(tables_of(rows))  # its heading wrapped to 100 columns
    assert max(map(len, shown.splitlines())) <= 100
    assert "(replicates: the geometric mean of the seeds that reached" in " ".join(shown.split())
    assert "replicates" not in format_status(tables_of([_row(256, 0, 20)]))


@pytest.mark.slow
def test_a_larger_sweep_trains_only_the_new_replicates_and_status_reads_them(sqlite_store):
    grid = ["sweep", "--batch-sizes", "64", "--trials", "2", "--max-steps", "200", "--goal-error", "0.1",
            "--workers", "2", "--experiment", "rep"]
    code, printed = edps_here([*grid, "--replicates", "2"], sqlite_store)
    assert code == 0, printed
    assert "2 studies (1 point x 2 replicates, seeds 0..1)" in printed and "2 to do" in printed
    client = MlflowClient(sqlite_store)
    experiment_id = client.get_experiment_by_name("rep").experiment_id

    def studies():
        return {r.info.run_id: r.data.params["spec.seed"]
                for r in client.search_runs([experiment_id], "tags.`edps.kind` = 'study'")}

    first = studies()
    assert sorted(first.values()) == ["0", "1"]
    code, printed = edps_here([*grid, "--replicates", "3"], sqlite_store)
    assert code == 0 and "plan: 2 done, 0 partly done (finished trials are reused), 1 to do" in printed, printed
    assert "bs=64 seed=2: steps_to_result" in printed and "bs=64: steps_to_result" not in printed
    after = studies()
    assert sorted(seed for run, seed in after.items() if run not in first) == ["2"]
    sweep = client.search_runs([experiment_id], "tags.`edps.kind` = 'sweep'", order_by=["start_time DESC"])[0]
    assert sweep.data.params["sweep.replicates"] == "3"
    assert "(1 point x 3 replicates, seeds 0..2)" in sweep.data.tags["mlflow.note.content"]
    # Its chart: the point once, when its third replicate was in (two were reused), at the batch size.
    history = client.get_metric_history(sweep.info.run_id, "curve/sgd/sp0/steps_to_result")
    assert [m.step for m in history] == [64], history
    code, printed = edps_here(["status", "--experiment", "rep"], sqlite_store)
    assert code == 0 and printed.count("(3/3 seeds") == 1, printed


@pytest.mark.slow
def test_edps_study_replicates_one_after_another_and_reuses_them(sqlite_store):
    study = ["study", "--bs", "64", "--trials", "2", "--max-steps", "200", "--goal-error", "0.1", "--experiment",
             "rep", "--seed", "3"]
    code, printed = edps_here([*study, "--replicates", "2"], sqlite_store)
    assert code == 0, printed
    assert "replicate 1 of 2 (seed 3)" in printed and "replicate 2 of 2 (seed 4)" in printed
    summary = printed.strip().splitlines()[-1]
    assert summary.startswith("replicates: steps-to-result seed 3: ") and "fewer than 3 reached" in summary, summary
    code, again = edps_here([*study, "--replicates", "2"], sqlite_store)
    assert code == 0 and again.count("study already done") == 2 and again.strip().splitlines()[-1] == summary
