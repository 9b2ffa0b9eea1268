"""The goal test replays the original's float32 validation error."""

import math

import numpy as np
import pytest

from edps_mlflow.goal import allowed_errors, meets_goal, original_validation_error


def original_reaches_goal(errors: int, validation_size: int, goal_error: float) -> bool:
    """The original's arithmetic step by step: per-example float32 correctness in batches of 100,
    ``np.mean(...).astype(float)``, ``err = 1 - accuracy``, ``err <= goal_error``."""
    correct = np.ones(validation_size, dtype=np.float32)
    correct[:errors] = 0.0
    accuracy: list[np.float32] = []
    for start in range(0, validation_size, 100):
        accuracy.extend(correct[start:start + 100])
    error = 1 - np.mean(accuracy).astype(float)
    return error <= goal_error


def brute_force_allowed(goal_error: float, validation_size: int) -> int:
    reaching = [e for e in range(validation_size + 1) if original_reaches_goal(e, validation_size, goal_error)]
    return max(reaching, default=-1)


@pytest.mark.parametrize("goal_error,validation_size,expected", [
    (0.12, 6000, 719),   # exact arithmetic: 720
    (0.10, 6000, 599),   # exact arithmetic: 600
    (0.30, 5000, 1499),  # exact arithmetic: 1,500
    (0.02, 6000, 120),
    (0.01, 6000, 60),
    (0.40, 5000, 2000),
    (0.03, 179, 5),      # the digits workload
])
def test_paper_goals(goal_error, validation_size, expected):
    assert allowed_errors(goal_error, validation_size) == expected


@pytest.mark.parametrize("goal_error,validation_size", [(0.12, 6000), (0.30, 5000), (0.03, 179), (0.1, 1000)])
def test_every_error_count_against_the_original(goal_error, validation_size):
    assert allowed_errors(goal_error, validation_size) == brute_force_allowed(goal_error, validation_size)


def test_float32_rounding_is_what_decides():
    # 720 / 6000 errors is 0.12 exactly, but float32(0.88) lies below 0.88.
    assert original_validation_error(720, 6000) > 0.12 and not meets_goal(720, 6000, 0.12)
    assert original_validation_error(719, 6000) < 0.12 and meets_goal(719, 6000, 0.12)
    # The goal stays float64: float32(1 - 0.7) would equal float32(0.3) and let 1,500 through.
    assert np.float32(1) - np.float32(0.7) <= np.float32(0.3)
    assert not meets_goal(1500, 5000, 0.30)


def test_brute_force_over_many_sizes_and_goals():
    rng = np.random.default_rng(0)
    differs_from_exact = 0
    for case in range(600):
        if case % 2:
            validation_size, goal_error = int(rng.integers(1, 20_000)), float(rng.uniform(0, 1))
        else:
            # A round goal on a size it divides puts the exact threshold on a whole error count,
            # where float32 decides (goals people type, validation splits of round sizes).
            digits = int(rng.integers(1, 4))
            goal_error = round(float(rng.uniform(0, 1)), digits)
            validation_size = 10**digits * int(rng.integers(1, 20_000 // 10**digits))
        allowed = allowed_errors(goal_error, validation_size)
        assert 0 <= allowed <= validation_size
        assert original_reaches_goal(allowed, validation_size, goal_error)
        if allowed < validation_size:
            assert not original_reaches_goal(allowed + 1, validation_size, goal_error)
        differs_from_exact += allowed != math.floor(goal_error * validation_size + 1e-9)
    # The property test does reach the cases where float32 moves the threshold.
    assert differs_from_exact > 0


def test_small_sizes_every_goal_on_a_grid():
    for validation_size in range(1, 60):
        for goal_error in (0.0, 0.01, 0.05, 0.1, 0.12, 0.2, 0.25, 0.3, 1 / 3, 0.5, 0.7, 0.9, 0.99, 1.0):
            assert allowed_errors(goal_error, validation_size) == brute_force_allowed(goal_error, validation_size)


def test_edges():
    assert allowed_errors(-0.01, 100) == -1
    assert allowed_errors(0.0, 100) == 0
    assert allowed_errors(1.0, 100) == 100
    assert allowed_errors(math.inf, 100) == 100
    for size in (0, 2**24):
        with pytest.raises(ValueError):
            allowed_errors(0.1, size)
    with pytest.raises(ValueError):
        allowed_errors(math.nan, 100)


def test_workload_delegates():
    from edps_mlflow.workloads import get_workload

    digits = get_workload("digits-simple-cnn")
    assert digits.allowed_errors(0.03, 179) == 5
    assert get_workload("fashion-mnist-simple-cnn").allowed_errors(0.12, 6000) == 719
