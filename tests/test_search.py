import numpy as np
import pytest

from edps_mlflow.search import LEARNING_RATE, MOMENTUM, PAPER_SPACES, sobol_points


def test_first_sobol_points_one_dimension():
    expected = [0.5, 0.75, 0.25, 0.375, 0.875, 0.625, 0.125, 0.1875]
    assert sobol_points(8, 1)[:, 0].tolist() == expected


def test_first_sobol_points_two_dimensions():
    expected = [(0.5, 0.5), (0.75, 0.25), (0.25, 0.75), (0.375, 0.375), (0.875, 0.875), (0.625, 0.125),
                (0.125, 0.625), (0.1875, 0.3125)]
    assert [tuple(row) for row in sobol_points(8, 2).tolist()] == expected


def test_first_learning_rate_is_one_hundredth():
    for optimizer in ("sgd", "momentum", "nesterov"):
        assert PAPER_SPACES[optimizer].points(1)[0]["learning_rate"] == pytest.approx(0.01, rel=1e-12)


def test_space_dimensions_per_optimizer():
    assert PAPER_SPACES["sgd"].names == ("learning_rate",)
    assert PAPER_SPACES["momentum"].names == ("learning_rate", "momentum")
    assert PAPER_SPACES["nesterov"].names == ("learning_rate", "momentum")


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
