"""A sweep's curves as MLflow's charts draw them: each curve's steps-to-result as a metric of the sweep run whose
step is the batch size (``curve/sgd/sp0.5/steps_to_result``; a ladder's rungs ``.../goal0.05/...``), so that the
run's Model metrics tab draws steps against batch size, one chart per curve.

A point is given once, when every replicate of it has finished, at its point value (analysis.replicates): MLflow
keeps every value logged at a step, so a value logged again as replicates arrive would draw several values at one
batch size. A point that did not reach (no trial, or no majority of its replicates) has no value and no point.
When the sweep finishes, each curve's fit beside it (``fit/sgd/sp0.5/b_crit``), named as the analysis run names it.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from analysis.fit_metrics import curve_metrics
from analysis.regimes import fit_table
from analysis.replicates import point_value
from edps_mlflow.config import StudySpec
from edps_mlflow.curves import CurveId
from edps_mlflow.names import CURVE_STEPS, curve_metric

Point = tuple[CurveId, int]  # a curve and a batch size: its replicates are the studies of other seeds
ChartValue = tuple[str, float, int]  # (metric, value, step = batch size)


class SweepCurves:
    """The points of a sweep's studies, told of each study's result as it finishes (or was found done)."""

    def __init__(self, studies: list[StudySpec]) -> None:
        self.specs = {s.study_key: s for s in studies}
        self.replicates: dict[Point, list[str]] = {}
        for spec in studies:
            self.replicates.setdefault(_point(spec), []).append(spec.study_key)
        self.results: dict[str, Mapping[float, int | None]] = {}  # study key -> goal -> steps-to-result
        self.given: set[Point] = set()

    def finished(self, study_key: str, steps: Mapping[float, int | None]) -> list[ChartValue]:
        """Record a study's steps-to-result per goal; the chart values of the point it completes (none else)."""
        spec = self.specs.get(study_key)
        if spec is None:
            return []
        self.results[study_key] = steps
        point = _point(spec)
        keys = self.replicates[point]
        if point in self.given or not all(k in self.results for k in keys):
            return []
        self.given.add(point)
        values = []
        for goal in spec.ladder:
            value = point_value(np.array([_steps(self.results[k].get(goal)) for k in keys]))
            if not np.isnan(value):
                curve = point[0].chart_name({"goal": goal} if spec.goals else None)
                values.append((curve_metric(curve, CURVE_STEPS), value, spec.batch_size))
        return values

    def fit_metrics(self) -> dict[str, float]:
        """Each curve's fit from the studies told of (a curve with too few points: none), without intervals: the
        analysis run gives those, from the trials."""
        rows = [{**CurveId.of(spec).as_dict(), "batch_size": spec.batch_size, "goal": goal,
                 "check_interval": spec.check_interval, "steps_to_result": _steps(steps)}
                for key, results in self.results.items() for spec in (self.specs[key],)
                for goal, steps in results.items()]
        return curve_metrics(fit_table(pd.DataFrame(rows), repeats=0)) if rows else {}


def goal_steps(spec: StudySpec, steps_to_result: int | None, rungs: Mapping[float, int | None] | None = None
               ) -> dict[float, int | None]:
    """A study's steps-to-result per goal: a ladder's ``rungs``, or its one goal's ``steps_to_result``."""
    return dict(rungs) if spec.goals and rungs else {spec.goal_error: steps_to_result}


def _point(spec: StudySpec) -> Point:
    return CurveId.of(spec), spec.batch_size


def _steps(steps: int | None) -> float:
    return np.inf if steps is None else float(steps)
