"""The curve identity (edps_mlflow/curves.py): every part that groups studies into curves asks CurveId,
so two studies on different curves are never merged. (No axis beyond workload, optimizer and sparsity
exists yet; these tests show the parts use the one declaration, and that the existing axes keep curves
apart.)"""

from __future__ import annotations

import pandas as pd

from analysis import regimes
from edps_mlflow import adaptive, status
from edps_mlflow import names as n
from edps_mlflow.adaptive import AdaptiveSettings
from edps_mlflow.adaptive_sweep import AdaptiveSweepSpec
from edps_mlflow.config import StudySpec
from edps_mlflow.curves import CURVE_AXES, CurveId
from edps_mlflow.registry import StudyRow, neighbour_best_point
from edps_mlflow.results import RunState
from edps_mlflow.sweep import SweepSpec
from edps_mlflow.descriptions import study_tags
from edps_mlflow.store import open_store

DIGITS = "digits-simple-cnn"


def test_a_curve_is_read_back_from_the_tags_a_study_run_is_written_with():
    spec = StudySpec.build(DIGITS, "momentum", 0.9, 64)
    curve = CurveId.of(spec)
    assert curve == CurveId(DIGITS, "momentum", 0.9) and curve.label() == "momentum sparsity=0.9"
    assert curve.tags().items() <= study_tags(spec).items()
    assert CurveId.from_tags(study_tags(spec)) == curve
    assert CurveId.from_values(curve.as_dict()) == curve and CurveId(DIGITS, "sgd", -0.0) == CurveId(DIGITS, "sgd", 0)


def test_the_analysis_and_the_adaptive_sweep_use_the_curve_axes():
    assert regimes.CURVE_KEYS == CURVE_AXES
    grid = SweepSpec.build(DIGITS, ("sgd", "nesterov"), (16, 32, 64, 128, 256, 512, 1024), (0.0, 0.9))
    sweep = AdaptiveSweepSpec(grid, AdaptiveSettings())
    assert sweep.curves == [CurveId(DIGITS, o, s) for o in ("sgd", "nesterov") for s in (0.0, 0.9)]
    assert CurveId.of(sweep.study(sweep.curves[3], 64)) == sweep.curves[3]
    assert adaptive.DECISION_COLUMNS[2:4] == ("optimizer", "sparsity")


def _row(optimizer: str, sparsity: float, batch_size: int, steps: int | None) -> StudyRow:
    return StudyRow(curve=CurveId(DIGITS, optimizer, sparsity), batch_size=batch_size,
                    study_key=f"{optimizer}{sparsity}", state=RunState.FINISHED, steps_to_result=steps, trials=4, finished_trials=4, start_time=1)


def test_status_never_shares_a_cell_between_curves():
    tables = status.tables_of([_row("sgd", 0.0, 64, 100), _row("sgd", 0.9, 64, 300), _row("momentum", 0.0, 64, 50)])
    assert set(tables) == {(DIGITS, "sgd"), (DIGITS, "momentum")}
    assert tables[(DIGITS, "sgd")].loc[64].to_dict() == {"sparsity 0": "100", "sparsity 0.9": "300"}
    assert tables[(DIGITS, "momentum")].loc[64].to_dict() == {"sparsity 0": "50"}


def test_fits_group_by_the_curve():
    table = pd.DataFrame([{"workload": DIGITS, "optimizer": o, "sparsity": s, "batch_size": b,
                           "steps_to_result": 1000.0 * (1 + 64 / b)}
                          for o in ("sgd", "momentum") for s in (0.0, 0.9) for b in (16, 32, 64, 128)])
    assert sorted(regimes.curves(table)) == sorted(CurveId(DIGITS, o, s).values()
                                                    for o in ("sgd", "momentum") for s in (0.0, 0.9))


def test_the_neighbour_hint_comes_from_the_studys_own_curve(sqlite_store):
    client = open_store(sqlite_store)
    experiment_id = client.create_experiment("curves")

    def finished_study(spec: StudySpec, learning_rate: float) -> None:
        run = client.create_run(experiment_id, tags=study_tags(spec))
        client.log_metric(run.info.run_id, n.METRIC_STEPS_TO_RESULT, 100)
        client.log_param(run.info.run_id, n.PARAM_BEST_PREFIX + "learning_rate", learning_rate)
        client.set_terminated(run.info.run_id, "FINISHED")

    sparse = StudySpec.build(DIGITS, "sgd", 0.9, 256)
    finished_study(StudySpec.build(DIGITS, "sgd", 0.0, 256), 0.5)  # same batch size, another curve
    finished_study(StudySpec.build(DIGITS, "sgd", 0.9, 16), 0.25)  # far, on the curve
    assert neighbour_best_point(client, experiment_id, sparse) == (16, {"learning_rate": 0.25})
