"""The curves in MLflow's own charts: a sweep run holds each curve's steps-to-result as a metric whose step is the
batch size (each point once, when its replicates are in), named as the analysis run names its curves; its plan
counts are tags, not charts of constants."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis.fit_metrics import curve_metrics
from analysis.publish import chart_metrics
from analysis.regimes import fit_table
from analysis.replicates import point_value
from edps_mlflow import names as n
from edps_mlflow.executors.base import SweepRun
from edps_mlflow.results import StudyReport
from edps_mlflow.store.client import StoreClient, ui_link
from edps_mlflow.store.experiment import resolve_experiment
from edps_mlflow.store.ownership.lease import OwnedRun
from edps_mlflow.store.write.sweep import SweepTracker, create_sweep_run
from edps_mlflow.sweep import PlannedStudy, PlanState, chart_plan, chart_study
from edps_mlflow.sweep_charts import SweepCurves, goal_steps
from edps_mlflow.sweep_spec import SweepSpec

DIGITS = "digits-simple-cnn"
DENSE, SPARSE = "curve/sgd/sp0/steps_to_result", "curve/sgd/sp0.5/steps_to_result"


def test_a_point_is_charted_once_when_its_replicates_are_in_and_not_where_it_did_not_reach():
    spec = SweepSpec.build(DIGITS, ("sgd",), (16, 64), (0.0, 0.5), replicates=3)
    curves = SweepCurves(spec.studies())
    steps = {(0.0, 16): (80, 120, 100), (0.0, 64): (60, None, None), (0.5, 16): (200, 200, 200), (0.5, 64): (90,) * 3}
    given = []
    for study in spec.studies():
        found = curves.finished(study.study_key,
                                goal_steps(study, steps[study.sparsity, study.batch_size][study.seed]))
        # Nothing until the last replicate of the point, whose seed comes last.
        assert not found or study.seed == 2, found
        given += found
    # The point rule's value (analysis.replicates); (sp0, 64): one of three reached, no point.
    assert sorted(given) == sorted([(DENSE, point_value(np.array([80.0, 120, 100])), 16),
                                    (SPARSE, point_value(np.array([200.0] * 3)), 16),
                                    (SPARSE, point_value(np.array([90.0] * 3)), 64)])
    assert curves.finished(spec.studies()[0].study_key, {0.1: 80}) == []  # once
    assert curves.finished("not of this sweep", {0.1: 80}) == []


def test_a_ladder_charts_each_rung_as_a_curve():
    spec = SweepSpec.build(DIGITS, ("sgd",), (32,), goals=(0.5, 0.3))
    (study,) = spec.studies()
    values = SweepCurves([study]).finished(study.study_key, goal_steps(study, None, {0.5: 60, 0.3: None}))
    assert values == [("curve/sgd/sp0/goal0.5/steps_to_result", 60.0, 32)]


def test_the_sweep_run_holds_the_curves_at_their_batch_sizes_and_a_resumed_run_adds_no_point_twice(sqlite_store):
    client, raw = StoreClient(sqlite_store), MlflowClient(sqlite_store)
    experiment_id = resolve_experiment(client, "charts")
    spec = SweepSpec.build(DIGITS, ("sgd",), (16, 64, 256), (0.0, 0.5), goal_error=0.1)
    steps = {(0.0, 16): 400, (0.0, 64): 150, (0.0, 256): 100, (0.5, 16): 700, (0.5, 64): None, (0.5, 256): 160}
    token = "0" * 32
    run_id = create_sweep_run(client, experiment_id, "sweep", spec.sweep_key, DIGITS, token)

    def sweep_run() -> SweepRun:
        tracker = SweepTracker(client, experiment_id, OwnedRun(client, run_id, token, "sweep"))
        tracker.log_start(spec.params(), {"studies": 6, "done": 2, "partial": 0, "todo": 4})
        return SweepRun(client, sqlite_store, "charts", experiment_id, tracker, spec.sweep_key)

    sweep, curves = sweep_run(), SweepCurves(spec.studies())
    plan = [PlannedStudy(s, PlanState.DONE if s.batch_size == 256 else PlanState.TODO, 0,
                         steps[s.sparsity, s.batch_size]) for s in spec.studies()]
    chart_plan(sweep, curves, plan)  # the studies found done are charted at once
    assert [(m.step, m.value) for m in raw.get_metric_history(run_id, DENSE)] == [(256, 100.0)]
    for study in spec.studies():  # then each as it finishes
        chart_study(sweep, curves, False, StudyReport(study.study_key, steps[study.sparsity, study.batch_size], False))
    resumed = sweep_run()  # another process takes the run over: it charts the same plan again
    chart_plan(resumed, SweepCurves(spec.studies()), [PlannedStudy(p.spec, PlanState.DONE, 0, p.steps_to_result)
                                                      for p in plan])
    history = {name: sorted((m.step, m.value) for m in raw.get_metric_history(run_id, name))
               for name in (DENSE, SPARSE)}
    assert history == {DENSE: [(16, 400.0), (64, 150.0), (256, 100.0)], SPARSE: [(16, 700.0), (256, 160.0)]}
    run = raw.get_run(run_id)
    # The plan's counts are tags: the run's charts are its curves (and its end's summary), no bars of constants.
    assert run.data.tags[n.TAG_PLAN_PREFIX + "done"] == "2"
    assert not [key for key in run.data.metrics if key.startswith("plan/")]
    # The analysis run names the same curves alike.
    studies = pd.DataFrame([{"workload": DIGITS, "optimizer": "sgd", "sparsity": s.sparsity, "pruning": s.pruning,
                             "batch_size": s.batch_size, "steps_to_result": steps[s.sparsity, s.batch_size]}
                            for s in spec.studies()])
    assert {name for name, _, _ in chart_metrics(studies, None)} == set(history)
    # The link the sweep prints opens the run's Model metrics tab, where those charts are.
    assert ui_link("http://127.0.0.1:5000", experiment_id, run_id, charts=True).endswith(
        f"/#/experiments/{experiment_id}/runs/{run_id}/model-metrics?workflowType=machine_learning")


def test_the_finished_sweep_run_holds_each_curves_fit_named_as_the_analysis_run_names_it(sqlite_store):
    client, raw = StoreClient(sqlite_store), MlflowClient(sqlite_store)
    experiment_id = resolve_experiment(client, "fits")
    spec = SweepSpec.build(DIGITS, ("sgd",), (16, 64, 256), (0.0, 0.5, 0.9), goal_error=0.1)
    # dense: a hyperbola; 0.5: steps rise, so no B_crit; 0.9: one point reached, too few for anything
    steps = {(0.0, 16): 400, (0.0, 64): 150, (0.0, 256): 100, (0.5, 16): 100, (0.5, 64): 180, (0.5, 256): 500,
             (0.9, 16): 900, (0.9, 64): None, (0.9, 256): None}
    token = "0" * 32
    run_id = create_sweep_run(client, experiment_id, "sweep", spec.sweep_key, DIGITS, token)
    tracker = SweepTracker(client, experiment_id, OwnedRun(client, run_id, token, "sweep"))
    curves = SweepCurves(spec.studies())
    for study in spec.studies():
        curves.finished(study.study_key, goal_steps(study, steps[study.sparsity, study.batch_size]))
    tracker.finish(9, 7, 1.0, fits=curves.fit_metrics())
    logged = {k: v for k, v in raw.get_run(run_id).data.metrics.items() if k.startswith("fit/")}
    studies = pd.DataFrame([{"workload": DIGITS, "optimizer": "sgd", "sparsity": s.sparsity, "pruning": s.pruning,
                             "batch_size": s.batch_size, "steps_to_result": steps[s.sparsity, s.batch_size],
                             "goal_error": 0.1, "check_interval": s.check_interval} for s in spec.studies()])
    assert logged == pytest.approx(curve_metrics(fit_table(studies, repeats=0)))
    assert {"fit/sgd/sp0/s_min", "fit/sgd/sp0/b_crit", "fit/sgd/sp0/b_crit_threshold"} <= set(logged)
    assert "fit/sgd/sp0.5/s_min" in logged and "fit/sgd/sp0.5/b_crit" not in logged
    assert not [k for k in logged if k.startswith("fit/sgd/sp0.9/")]
