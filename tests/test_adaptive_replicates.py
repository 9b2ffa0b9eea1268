"""The adaptive sweep's replicates (``--adaptive --replicates R``): the deciding points of each question, one value
per point whatever its seeds, replicates only once a question is answered and until its deciding points have R,
R = 1 deciding as before; on synthetic curves (no training), then one small real sweep on digits."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from edps_mlflow.adaptive import (
    AdaptiveSettings,
    Goal,
    StopReason,
    UncertaintyKind,
    assess_curve,
    decide,
    deciding_points,
    point_values,
    powers_of_two,
)
from edps_mlflow.adaptive_sweep import AdaptiveSweepSpec, MeasuredStudy, _replicates, adapt
from edps_mlflow.curves import CurveId
from edps_mlflow.results import TrialOutcome, TrialStatus
from edps_mlflow.sweep import SweepSpec

from conftest import fresh_store, run_edps

RANGE = powers_of_two(2, 1024)
CURVE = CurveId("digits-simple-cnn", "sgd", 0.0)
SEEDS = (0, 1, 2)


def steps(b: int, seed: int = 0) -> float:
    """S(B) = 100 (1 + 32 / B), each seed 10% off the last (seed 0 on the curve)."""
    return round(100 * (1 + 32 / b) * (1 + 0.1 * (seed % 3 - (seed % 3 == 2) * 3)))


def table(seeds_at: dict[int, tuple[int, ...]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A curve's study rows (one per batch size and seed) and trials (four reaching ones per study)."""
    points, trials = [], []
    for b, seeds in seeds_at.items():
        for seed in seeds:
            key, best = f"k{b}-{seed}", steps(b, seed)
            points.append({"workload": CURVE.workload, "optimizer": "sgd", "sparsity": 0.0, "batch_size": b,
                           "seed": seed, "steps_to_result": float(best), "study_key": key})
            trials += [{"study_key": key, "trial_index": i, "status": "reached", "steps_to_result": best + 5 * i,
                        "steps_trained": best + 5 * i} for i in range(4)]
    return pd.DataFrame(points), pd.DataFrame(trials)


def assess(seeds_at: dict[int, tuple[int, ...]], goal: Goal = Goal.B_CRIT, seeds: tuple[int, ...] = SEEDS):
    return assess_curve(CURVE, *table(seeds_at), RANGE, AdaptiveSettings(goal=goal), seeds=seeds)


def values(batch_sizes: tuple[int, ...]) -> pd.DataFrame:
    return pd.DataFrame({"batch_size": batch_sizes, "steps_to_result": [float(steps(b)) for b in batch_sizes]})


def test_each_question_has_its_deciding_points():
    # B_crit 24: the measured batch sizes either side of it, and both ends.
    assert list(deciding_points(values(powers_of_two(8, 1024)), {"b_crit": 24.0}, Goal.B_CRIT)) == [8, 16, 32, 1024]
    # From B_0 = 4 the threshold is 8 (16 x S(16) > 1.2 x 4 x S(4)): the reference, the last that passes, the first
    # that fails.
    threshold = deciding_points(values(powers_of_two(4, 1024)), {}, Goal.THRESHOLD)
    assert threshold == {4: "the threshold (its reference, the smallest batch size)",
                         8: "the threshold (the last batch size in perfect scaling)",
                         16: "the threshold (the first batch size beyond perfect scaling)"}
    # The boundaries: those, either side of the plateau's start (within 20% of S(1024) from 256 up) and the largest.
    assert list(deciding_points(values(powers_of_two(4, 1024)), {}, Goal.BOUNDARIES)) == [4, 8, 16, 128, 256, 1024]
    # A plateau from the smallest batch size up has no batch size before it.
    flat = pd.DataFrame({"batch_size": powers_of_two(4, 1024), "steps_to_result": 100.0})
    assert list(deciding_points(flat, {}, Goal.BOUNDARIES)) == [4, 8, 1024]


def test_a_batch_size_counts_once_whatever_its_seeds():
    replicated = assess({b: SEEDS for b in (256, 512, 1024)})
    assert replicated.measured == (256, 512, 1024) and replicated.counts == ((256, 3), (512, 3), (1024, 3))
    # The walk sees one value per point (the geometric mean): as a table of those values would.
    means = {b: math.exp(sum(math.log(steps(b, s)) for s in SEEDS) / 3) for b in (256, 512, 1024)}
    one = assess_curve(CURVE, pd.DataFrame([{"workload": CURVE.workload, "optimizer": "sgd", "sparsity": 0.0,
                                              "batch_size": b, "steps_to_result": v, "study_key": f"m{b}"}
                                             for b, v in means.items()]), None, RANGE, AdaptiveSettings())
    assert replicated.next_batch_size().batch_size == one.next_batch_size().batch_size == 128


def test_an_open_question_walks_on_replicate_0_without_replicates():
    state = assess({b: (0,) for b in (256, 512, 1024)})
    assert state.open and not state.replicates
    (pick,) = decide([state], 3, 0, 0.0, AdaptiveSettings(), RANGE).picks
    assert (pick.batch_size, pick.seed, pick.reason) == (128, 0, UncertaintyKind.B_CRIT)


def test_an_answered_question_replicates_its_deciding_points_until_they_have_r():
    measured = {b: (0,) for b in powers_of_two(8, 1024)}
    state = assess(measured)
    assert not state.open and state.fit["b_crit"] == pytest.approx(32, rel=0.02)
    b_crit = state.fit["b_crit"]
    below, above = max(b for b in measured if b <= b_crit), min(b for b in measured if b >= b_crit)
    deciding = sorted({8, below, above, 1024})
    assert sorted({r.batch_size for r in state.replicates}) == deciding
    assert {r.seed for r in state.replicates} == {1, 2}
    # Replicate 2 of every deciding point first, the largest (cheapest) first; then replicate 3.
    picks = decide([state], 8, 0, 0.0, AdaptiveSettings(width=5), RANGE).picks
    assert [(p.batch_size, p.seed) for p in picks] == [*((b, 1) for b in reversed(deciding)), (1024, 2)][:5]
    assert all(p.reason is UncertaintyKind.REPLICATE for p in picks)
    assert picks[0].uncertainty == "replicate 2 of 3 at 1024: decides B_crit (the largest batch size)"
    # A limit stops it with the deciding points short said; with R at each, the target is met.
    stopped = decide([state], 8, 0, 0.0, AdaptiveSettings(max_studies=8), RANGE)
    assert stopped.stop is StopReason.MAX_STUDIES
    assert "deciding points short of 3 replicates: 8 (1 of 3)" in stopped.uncertain()[0]
    done = assess({**measured, **{b: SEEDS for b in deciding}})
    assert not done.replicates and not done.open
    assert decide([done], 20, 0, 0.0, AdaptiveSettings(), RANGE).stop is StopReason.TARGET_MET


def measure(studies: list) -> dict[str, MeasuredStudy]:
    """An oracle: each study's four trials from ``steps`` (no training)."""
    found = {}
    for study in studies:
        best = steps(study.batch_size, study.seed)
        trials = tuple(TrialOutcome(i, TrialStatus.REACHED, best + 5 * i, best + 5 * i) for i in range(4))
        found[study.study_key] = MeasuredStudy(study, "run", best, trials)
    return found


def sweep(goal: Goal, replicates: int, width: int = 3):
    grid = SweepSpec.build("digits-simple-cnn", ("sgd",), RANGE, (0.0, 0.5), replicates=replicates)
    return adapt(AdaptiveSweepSpec(grid, AdaptiveSettings(goal=goal, width=width)), measure, lambda: 0.0)


# What the rule decided on this oracle before replicates existed (round, sparsity, batch size; 0: a stop row).
BEFORE = {
    Goal.B_CRIT: [(0, 0.0, 256), (0, 0.0, 512), (0, 0.0, 1024), (0, 0.5, 256), (0, 0.5, 512), (0, 0.5, 1024),
                  (1, 0.0, 128), (1, 0.5, 128), (1, 0.0, 64), (2, 0.5, 64), (2, 0.0, 32), (2, 0.5, 32), (3, 0.0, 16),
                  (3, 0.5, 16), (4, 0.0, 0), (4, 0.5, 0)],
    Goal.THRESHOLD: [(0, 0.0, 256), (0, 0.0, 512), (0, 0.0, 1024), (0, 0.5, 256), (0, 0.5, 512), (0, 0.5, 1024),
                     (1, 0.0, 128), (1, 0.5, 128), (1, 0.0, 64), (2, 0.0, 32), (2, 0.5, 64), (2, 0.0, 16),
                     (3, 0.0, 8), (3, 0.5, 32), (3, 0.0, 4), (4, 0.5, 16), (4, 0.5, 8), (5, 0.5, 4), (6, 0.0, 0),
                     (6, 0.5, 0)]}


@pytest.mark.parametrize("goal", list(BEFORE))
def test_one_replicate_decides_and_measures_as_before(goal):
    result = sweep(goal, 1)
    d = result.decisions
    assert "seed" not in d.columns and result.stop is StopReason.TARGET_MET
    assert [(int(r), float(s), int(b)) for r, s, b in zip(d["round"], d["sparsity"], d["batch_size"].fillna(0))] \
        == BEFORE[goal]
    assert {m.spec.seed for m in result.measured} == {0}


@pytest.mark.parametrize("goal", [Goal.B_CRIT, Goal.THRESHOLD])
def test_replicates_go_only_to_the_deciding_points_and_stop_when_they_have_r(goal):
    plain, result = sweep(goal, 1), sweep(goal, 3)
    assert result.stop is StopReason.TARGET_MET
    keys = [m.spec.study_key for m in result.measured]
    assert len(keys) == len(set(keys)), "no study twice"
    for state in result.states:
        counts = dict(state.counts)
        deciding = deciding_points(_values(result, state.curve), state.fit, goal)
        assert deciding and all(counts[b] == 3 for b in deciding), (counts, deciding)
        assert sum(k > 1 for k in counts.values()) < len(counts), "not the whole curve"
    # Replicate 0 walks as before until the first replicate arrives.
    d, before = result.decisions, plain.decisions
    first = int(d[d["reason"] == "replicate"]["round"].min())
    columns = ["round", "sparsity", "batch_size", "reason"]
    assert d[d["round"] < first][columns].equals(before[before["round"] < first][columns])
    rows = d[d["reason"] == "replicate"]
    assert rows["uncertainty_before"].str.match(r"replicate [23] of 3 at \d+: decides ").all()
    assert set(rows["seed"]) == {1, 2}


def _values(result, curve: CurveId) -> pd.DataFrame:
    mine = [m for m in result.measured if CurveId.of(m.spec) == curve]
    return point_values(pd.DataFrame({"batch_size": [m.spec.batch_size for m in mine],
                                      "steps_to_result": [float(m.steps_to_result) for m in mine]}))


def test_the_answer_says_what_its_intervals_rest_on():
    state = assess({b: SEEDS for b in powers_of_two(16, 1024)})
    assert _replicates(state).startswith("16:3, 32:3")  # without the fit table's basis: the counts alone
    none = replace(state, fit={**state.fit, "interval_basis": "", "interval_replicates": 1})
    assert _replicates(none).endswith("; no intervals (they need 3 replicates at a point, or complete trials)")
    some = replace(state, fit={**state.fit, "interval_basis": "replicates", "interval_replicates": 3})
    assert _replicates(some).endswith("; intervals rest on replicates (the fewest replicates at a point: 3)")
    note = ("intervals over the replicates at batch sizes 16, 32 (3 or more each); the other points, with fewer, "
            "are held at their values, so their seed noise is not in the intervals; the s_min interval ...")
    partial = replace(state, fit={**state.fit, "interval_basis": "replicates at some points",
                                  "interval_replicates": 1, "note": note})
    assert _replicates(partial).endswith("; intervals rest on replicates at some points: intervals over the "
                                         "replicates at batch sizes 16, 32 (3 or more each); the other points, with "
                                         "fewer, are held at their values, so their seed noise is not in the "
                                         "intervals")


# ---- one small real replicated adaptive sweep ---------------------------------------------------------
@pytest.mark.slow
def test_a_real_replicated_adaptive_sweep(tmp_path):
    uri = fresh_store(tmp_path / "mlflow.db")
    arguments = ["sweep", "--adaptive", "--replicates", "2", "--batch-sizes", "8..32", "--sparsities", "0",
                 "--trials", "2", "--goal-error", "0.06", "--max-steps", "600", "--experiment", "replicated",
                 "--log-interval", "30", "--workers", "2", "--target", "1.5", "--max-studies", "5"]
    result = run_edps(arguments, cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "then 2 replicates at each point that decides it" in result.stdout
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("replicated")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    (sweep_run,) = [r for r in runs if r.data.tags.get("edps.kind") == "sweep"]
    path = client.download_artifacts(sweep_run.info.run_id, "adaptive_decisions.csv", str(tmp_path))
    decisions = list(csv.DictReader(io.StringIO(Path(path).read_text())))
    assert all(r["seed"] == "0" for r in decisions[:3])
    studies = {(int(r.data.tags["edps.batch_size"]), r.data.params.get("spec.seed"))
               for r in runs if r.data.tags.get("edps.kind") == "study" and r.info.status == "FINISHED"}
    measures = [(int(r["batch_size"]), r["seed"]) for r in decisions if r["decision"] == "measure"]
    assert sorted(studies) == sorted(set(measures)) and len(measures) == len(set(measures))
    replicate_rows = [r for r in decisions if r["reason"] == "replicate"]
    print(result.stdout[-2000:])
    assert all(r["seed"] == "1" and "replicate 2 of 2 at" in r["uncertainty_before"] for r in replicate_rows)
    assert "replicates per batch size" in result.stdout
