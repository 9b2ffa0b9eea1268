from pathlib import Path

import numpy as np
import pytest

from edps_mlflow.optimizers import get_optimizer
from edps_mlflow.search import LEARNING_RATE, MAX_SOBOL_DIMENSIONS, MOMENTUM, sobol_points

# The original code's sobol_lib.i4_sobol_generate(4, 100, skip=2), one row per point. The original's
# direction numbers for a dimension do not depend on how many dimensions are generated, so its
# d-dimensional sequence is the first d columns (checked against the original for d = 1..4).
ORIGINAL_POINTS = np.loadtxt(Path(__file__).parent / "fixtures" / "original_sobol_points.csv", delimiter=",")


def test_first_sobol_points_one_dimension():
    expected = [0.5, 0.75, 0.25, 0.375, 0.875, 0.625, 0.125, 0.1875]
    assert sobol_points(8, 1)[:, 0].tolist() == expected


def test_first_sobol_points_two_dimensions():
    expected = [(0.5, 0.5), (0.75, 0.25), (0.25, 0.75), (0.375, 0.375), (0.875, 0.875), (0.625, 0.125),
                (0.125, 0.625), (0.1875, 0.3125)]
    assert [tuple(row) for row in sobol_points(8, 2).tolist()] == expected


def test_first_sobol_points_four_dimensions():
    # Bratley and Fox's direction numbers: from the third dimension on they differ from scipy's.
    expected = [(0.5, 0.5, 0.5, 0.5), (0.75, 0.25, 0.75, 0.25), (0.25, 0.75, 0.25, 0.75),
                (0.375, 0.375, 0.625, 0.125), (0.875, 0.875, 0.125, 0.625), (0.625, 0.125, 0.375, 0.375),
                (0.125, 0.625, 0.875, 0.875), (0.1875, 0.3125, 0.3125, 0.6875)]
    assert [tuple(row) for row in sobol_points(8, 4).tolist()] == expected


@pytest.mark.parametrize("dimensions", [1, 2, 3, 4])
def test_hundred_points_match_the_original(dimensions):
    assert ORIGINAL_POINTS.shape == (100, 4)
    # The points are multiples of 2**-7 here, exact in the fixture's ten decimals.
    np.testing.assert_array_equal(sobol_points(100, dimensions), ORIGINAL_POINTS[:, :dimensions])


def test_every_dimension_is_stratified():
    # A Sobol sequence's first 2**k points (with the skipped zero point) fill every 2**-k cell of each axis.
    points = sobol_points(63, MAX_SOBOL_DIMENSIONS)
    for column in points.T:
        cells = np.sort(np.concatenate([[0.0], column]) * 64)
        np.testing.assert_array_equal(cells, np.arange(64))


def test_sobol_points_refuse_what_the_original_cannot_generate():
    for count, dimensions in ((0, 1), (1, 0), (1, MAX_SOBOL_DIMENSIONS + 1)):
        with pytest.raises(ValueError):
            sobol_points(count, dimensions)


def test_cifar10_nesterov_second_trial_schedule():
    from edps_mlflow.workloads import get_workload

    space = get_workload("cifar10-resnet8").search_space("nesterov")
    assert space.names == ("learning_rate", "momentum", "decay_steps", "end_learning_rate_factor")
    # Trial 1 is the point (0.75, 0.25, 0.75, 0.25): decay 30,000 + 0.75 * 30,000 steps, end factor 10**-3.25.
    trial = space.points(2)[1]
    assert trial["decay_steps"] == 52_500
    assert trial["end_learning_rate_factor"] == pytest.approx(10 ** -3.25, rel=1e-12)
    assert round(trial["end_learning_rate_factor"], 6) == 0.000562
    assert trial["learning_rate"] == pytest.approx(10 ** -1, rel=1e-12)


def test_first_learning_rate_is_one_hundredth():
    for optimizer in ("sgd", "momentum", "nesterov"):
        assert get_optimizer(optimizer).space.points(1)[0]["learning_rate"] == pytest.approx(0.01, rel=1e-12)


def test_space_dimensions_per_optimizer():
    assert get_optimizer("sgd").space.names == ("learning_rate",)
    assert get_optimizer("momentum").space.names == ("learning_rate", "momentum")
    assert get_optimizer("nesterov").space.names == ("learning_rate", "momentum")


def test_ranges_and_inverse():
    assert LEARNING_RATE.value(0.0) == pytest.approx(1e-4) and LEARNING_RATE.value(1.0) == pytest.approx(1.0)
    # The original's reverse-log scale maps 0 to the top of the range.
    assert MOMENTUM.value(0.0) == pytest.approx(0.9999) and MOMENTUM.value(1.0) == pytest.approx(0.9)
    assert MOMENTUM.value(0.75) == pytest.approx(1 - 10 ** (0.75 * (-1 + 4) - 4))
    for dimension in (LEARNING_RATE, MOMENTUM):
        for unit in np.linspace(0, 1, 7):
            assert dimension.unit(dimension.value(unit)) == pytest.approx(unit, abs=1e-9)
    # 1 - momentum is log-uniform: the midpoint is the geometric mean of the gaps.
    assert 1 - MOMENTUM.value(0.5) == pytest.approx(np.sqrt(0.1 * 1e-4))
