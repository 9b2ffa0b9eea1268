"""The digits workload's sparse curves have the paper's shape with its default protocol: steps-to-result
falls with batch size, then levels off (docs/digits-workload.md says why it once rose at sparsity 0.9)."""

import pytest

from edps_mlflow.config import StudySpec
from edps_mlflow.study import ExecutionOptions, run_study

BATCH_SIZES = (16, 64, 256)
# How much a plateau point may sit above the one before it: the validation split has 179 images, so a
# study's steps move by a check or two between neighbouring batch sizes once the curve is flat.
PLATEAU_SLACK = 1.25


@pytest.mark.slow
@pytest.mark.parametrize("sparsity", [0.5, 0.9])
def test_sparse_digits_curves_fall_to_a_plateau(sqlite_store, sparsity):
    steps = {}
    for batch_size in BATCH_SIZES:  # the workload's trials, goal, cap and check interval
        spec = StudySpec.build("digits-simple-cnn", "sgd", sparsity, batch_size)
        outcome = run_study(spec, ExecutionOptions(experiment="shape", log_interval=600.0))
        assert outcome.steps_to_result is not None, f"no trial reached the goal at batch size {batch_size}"
        steps[batch_size] = outcome.steps_to_result
    small, middle, large = (steps[b] for b in BATCH_SIZES)
    assert middle < small, steps  # falls
    assert large <= PLATEAU_SLACK * middle, steps  # and levels off instead of rising again
