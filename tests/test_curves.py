"""The curve identity (edps_mlflow/curves.py): every part that groups studies into curves asks CurveId,
so two studies on different curves are never merged: the workload, optimizer, sparsity and pruning method
(the axis added last, whose tag runs made before it lack) keep curves apart everywhere."""

from __future__ import annotations

import pandas as pd

from analysis import regimes
from edps_mlflow import adaptive, status
from edps_mlflow import names as n
from edps_mlflow.adaptive import AdaptiveSettings
from edps_mlflow.adaptive_sweep import AdaptiveSweepSpec
from edps_mlflow.config import StudySpec
from edps_mlflow.curves import CURVE_AXES, CurveId
from edps_mlflow.store.read.status import StudyRow
from edps_mlflow.store.read.trials import neighbour_best_point
from edps_mlflow.results import RunState
from edps_mlflow.sweep import SweepSpec
from edps_mlflow.descriptions import study_tags
from edps_mlflow.store.client import open_store

DIGITS = "digits-simple-cnn"


def test_a_curve_is_read_back_from_the_tags_a_study_run_is_written_with():
    spec = StudySpec.build(DIGITS, "momentum", 0.9, 64)
    curve = CurveId.of(spec)
    assert curve == CurveId(DIGITS, "momentum", 0.9, "snip") and curve.label() == "momentum sparsity=0.9 pruning=snip"
    assert curve.tags().items() <= study_tags(spec).items()
    assert CurveId.from_tags(study_tags(spec)) == curve
    assert CurveId.from_values(curve.as_dict()) == curve and CurveId(DIGITS, "sgd", -0.0) == CurveId(DIGITS, "sgd", 0)
    # A run made before pruning methods existed has no pruning tag: it was SNIP's, on the same curve.
    legacy = {tag: text for tag, text in study_tags(spec).items() if tag != n.TAG_PRUNING}
    assert CurveId.from_tags(legacy) == curve and n.TAG_PRUNING not in curve.search_tags()
    grasp = CurveId.of(StudySpec.build(DIGITS, "momentum", 0.9, 64, pruning="grasp"))
    assert grasp != curve and CurveId.from_tags(study_tags(StudySpec.build(DIGITS, "momentum", 0.9, 64,
                                                                           pruning="grasp"))) == grasp
    # Nothing is pruned at sparsity 0: one dense curve, whatever the method asked for, and its label names none.
    dense = CurveId.of(StudySpec.build(DIGITS, "sgd", 0.0, 64, pruning="synflow"))
    assert dense == CurveId(DIGITS, "sgd", 0.0, "snip") and dense.label() == "sgd sparsity=0"


def test_the_analysis_and_the_adaptive_sweep_use_the_curve_axes():
    assert regimes.CURVE_KEYS == CURVE_AXES
    grid = SweepSpec.build(DIGITS, ("sgd", "nesterov"), (16, 32, 64, 128, 256, 512, 1024), (0.0, 0.9),
                           prunings=("snip", "random"))
    sweep = AdaptiveSweepSpec(grid, AdaptiveSettings())
    assert sweep.curves == [CurveId(DIGITS, o, s, m) for o in ("sgd", "nesterov")
                            for s, m in ((0.0, "snip"), (0.9, "snip"), (0.9, "random"))]
    assert CurveId.of(sweep.study(sweep.curves[5], 64)) == sweep.curves[5]
    assert adaptive.DECISION_COLUMNS[2:5] == ("optimizer", "sparsity", "pruning")


def _row(optimizer: str, sparsity: float, batch_size: int, steps: int | None, pruning: str = "snip") -> StudyRow:
    return StudyRow(curve=CurveId(DIGITS, optimizer, sparsity, pruning), batch_size=batch_size,
                    study_key=f"{optimizer}{sparsity}{pruning}", state=RunState.FINISHED, steps_to_result=steps,
                    trials=4, finished_trials=4, start_time=1)


def test_status_never_shares_a_cell_between_curves():
    tables = status.tables_of([_row("sgd", 0.0, 64, 100), _row("sgd", 0.9, 64, 300), _row("momentum", 0.0, 64, 50)])
    assert set(tables) == {(DIGITS, "sgd", "snip", "sp"), (DIGITS, "momentum", "snip", "sp")}
    assert tables[(DIGITS, "sgd", "snip", "sp")].loc[64].to_dict() == {"sparsity 0": "100", "sparsity 0.9": "300"}
    assert tables[(DIGITS, "momentum", "snip", "sp")].loc[64].to_dict() == {"sparsity 0": "50"}
    # SNIP alone (every store made before methods existed): titled as it always was.
    assert "digits-simple-cnn / sgd: steps-to-result" in status.format_status(tables)


def test_status_shows_a_grid_per_method_each_with_the_dense_column():
    tables = status.tables_of([_row("sgd", 0.0, 64, 100), _row("sgd", 0.9, 64, 300),
                               _row("sgd", 0.9, 64, 250, "random"), _row("sgd", 0.9, 64, 280, "shuffle(snip)")])
    assert set(tables) == {(DIGITS, "sgd", m, "sp") for m in ("snip", "random", "shuffle(snip)")}
    assert tables[(DIGITS, "sgd", "random", "sp")].loc[64].to_dict() == {"sparsity 0": "100", "sparsity 0.9": "250"}
    assert tables[(DIGITS, "sgd", "shuffle(snip)", "sp")].loc[64].to_dict() == {"sparsity 0": "100", "sparsity 0.9": "280"}
    assert "digits-simple-cnn / sgd / pruned by random:" in status.format_status(tables)


def test_fits_group_by_the_curve():
    table = pd.DataFrame([{"workload": DIGITS, "optimizer": o, "sparsity": s, "batch_size": b,
                           "steps_to_result": 1000.0 * (1 + 64 / b)}
                          for o in ("sgd", "momentum") for s in (0.0, 0.9) for b in (16, 32, 64, 128)])
    # A table without the pruning column (a CSV written before methods existed) is SNIP's.
    assert sorted(regimes.curves(table)) == sorted(CurveId(DIGITS, o, s).values()
                                                    for o in ("sgd", "momentum") for s in (0.0, 0.9))
    methods = pd.concat([table.assign(pruning="snip"), table[table["sparsity"] > 0].assign(pruning="grasp")])
    assert sorted(regimes.curves(methods)) == sorted(
        [CurveId(DIGITS, o, s).values() for o in ("sgd", "momentum") for s in (0.0, 0.9)]
        + [CurveId(DIGITS, o, 0.9, "grasp").values() for o in ("sgd", "momentum")])


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
    finished_study(StudySpec.build(DIGITS, "sgd", 0.9, 128, pruning="random"), 0.125)  # near, another method
    assert neighbour_best_point(client, experiment_id, sparse) == (16, {"learning_rate": 0.25})
    assert neighbour_best_point(client, experiment_id, StudySpec.build(DIGITS, "sgd", 0.9, 256, pruning="random")) \
        == (128, {"learning_rate": 0.125})
