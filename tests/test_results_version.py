"""When to bump RESULTS_VERSION: a fingerprint of what a study's result is made of.

Keys hash a spec and RESULTS_VERSION, not the code; a change to the code that gives a spec a different
result while its key stays the same would let the store hand out old results as if the new code had made
them. This test trains a tiny digits study the way a study does (Sobol points, trial seeds, initialisation,
SNIP at sparsity 0.9, the batch order, the engine, the goal test) and compares what comes out with what was
recorded. When it fails, the results changed: bump RESULTS_VERSION (edps_mlflow/config.py; this re-keys
the store, so every study is trained again), record the new fingerprint here and the new keys in
tests/test_golden_keys.py. A change that does not reach this fingerprint, alone or packed (the cost, logging,
scheduling) needs no bump. A change of the data needs none either: the data's fingerprint is in the keys.

Cheap (about a second of training) and deterministic on CPU: losses are compared to 4 significant
digits and validation errors as counts, so thread counts and kernels that differ in the last bits of a
float do not fail it.
"""

from __future__ import annotations

import pytest
import torch

from edps_mlflow.config import RESULTS_VERSION, StudySpec, TrialSpec
from edps_mlflow.engine import LocalStepBound, train_trials
from edps_mlflow.study import ExecutionOptions, engine_settings
from edps_mlflow.trials import prepare_trial
from edps_mlflow.workloads import get_workload

BUMP = "results changed: bump RESULTS_VERSION and update this fingerprint (and the golden keys)"

# The fingerprint of RESULTS_VERSION "0.1.0". Per trial: its Sobol point, weights kept by SNIP, the status,
# steps to result, and (step, train loss, validation errors) at each check.
RECORDED = {
    "results_version": "0.1.0",
    "trials": [
        {"point": {"learning_rate": 0.01, "momentum": 0.9968377223}, "kept": 609, "status": "not_reached",
         "steps_to_result": None, "checks": [(20, "2.44", 149), (40, "2.303", 151), (60, "2.227", 144)]},
        {"point": {"learning_rate": 0.1, "momentum": 0.9994376587}, "kept": 609, "status": "reached",
         "steps_to_result": 40, "checks": [(20, "2.249", 125), (40, "1.577", 66)]},
    ],
}


class _Checks:
    def __init__(self) -> None:
        self.checks: dict[int, list[tuple[int, str, int]]] = {}

    def on_check(self, trial_index, check) -> None:
        errors = round(check.validation_error * VALIDATION) if check.validation_error is not None else None
        self.checks.setdefault(trial_index, []).append((check.step, f"{check.train_loss:.4g}", errors))

    def on_probe(self, trial_index, step, values) -> None:
        pass

    def on_finish(self, result) -> None:
        pass


VALIDATION = 179


def fingerprint(packed: bool = False) -> dict:
    workload = get_workload("digits-simple-cnn")
    data = workload.load_data(None)
    # Momentum at batch 32 (channels-last) and sparsity 0.9: SNIP, the momentum buffers and the mask all count.
    spec = StudySpec("digits-simple-cnn", "momentum", 0.9, 32, trials=2, goal_error=0.5, max_steps=60,
                     check_interval=20, seed=3)
    points = workload.search_space(spec.optimizer).points(spec.trials)
    setups = [prepare_trial(workload, data, TrialSpec(spec, index, point)) for index, point in enumerate(points)]
    observer = _Checks()
    # Full trials, one at a time (the single-trial fast path) or packed in lockstep: every check of each is seen.
    chunks = [setups] if packed else [[setup] for setup in setups]
    results = [result for chunk in chunks for result in train_trials(
        workload, data, chunk, engine_settings(spec, workload, data.validation_size, ExecutionOptions()),
        LocalStepBound(spec.max_steps, spec.check_interval, exact_early_stopping=False), observer)]
    return {"results_version": RESULTS_VERSION, "trials": [
        {"point": {k: float(f"{v:.10g}") for k, v in point.items()},
         "kept": int(sum(int(t.sum()) for t in setup.mask.tensors.values())),
         "status": result.status.value, "steps_to_result": result.steps_to_result,
         "checks": observer.checks[result.index]}
        for point, setup, result in zip(points, setups, results)]}


@pytest.fixture
def one_thread():
    """As a study's worker trains (one thread each on CPU); restored after, so nothing leaks."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("packed", [False, True], ids=["alone", "packed"])
def test_results_fingerprint_is_the_recorded_one(one_thread, packed):
    """Packed trials (vmapped gradients, the optimizer's packed update) reach the same fingerprint as lone ones:
    pack size is no part of a key, so neither path may move a result the other keeps."""
    assert get_workload("digits-simple-cnn").load_data(None).validation_size == VALIDATION
    found = fingerprint(packed)
    assert found["results_version"] == RECORDED["results_version"], \
        "RESULTS_VERSION was bumped: record the new fingerprint here and the new keys in test_golden_keys.py"
    assert found == RECORDED, f"{BUMP}; found {found}"
