"""The goal test as the original code computes it: ``1 - accuracy <= goal_error`` with the accuracy a float32
mean, which moves the boundary (goal 0.12 on 6,000 images allows 719 errors, not 720: docs/protocol.md).

    >>> allowed_errors(0.12, 6000), allowed_errors(0.30, 5000), allowed_errors(0.03, 179)
    (719, 1499, 5)
"""

from __future__ import annotations

import math

import numpy as np

# Below 2**24 images every count is exact in float32: the original's mean is the rounded float32 of correct / size.
MAX_VALIDATION_SIZE = 2**24 - 1


def original_validation_error(errors: int, validation_size: int) -> float:
    """The validation error the original reports for ``errors`` misclassified examples: its float32 ``np.mean``
    of zeros and ones, without the array (float64 holds more than 2 * 24 + 2 bits, so one rounding is exact)."""
    _check_size(validation_size)
    if not 0 <= errors <= validation_size:
        raise ValueError(f"errors must be in [0, {validation_size}], got {errors}")
    accuracy = float(np.float32((validation_size - errors) / validation_size))
    return 1.0 - accuracy


def meets_goal(errors: int, validation_size: int, goal_error: float) -> bool:
    """The original's test: ``1 - float32 mean accuracy <= goal_error``, compared in float64."""
    return original_validation_error(errors, validation_size) <= goal_error


def allowed_errors(goal_error: float, validation_size: int) -> int:
    """The most misclassified validation examples that still meet the goal as the original tests it; -1 when not
    even a perfect score does (a negative goal)."""
    _check_size(validation_size)
    if math.isnan(goal_error):
        raise ValueError("goal error must be a number, got nan")
    # A threshold near floor(goal * size): float32 rounding moves it by less than one example, so a walk finds it.
    if math.isfinite(goal_error):
        errors = min(validation_size, max(-1, math.floor(goal_error * validation_size)))
    else:
        errors = validation_size if goal_error > 0 else -1
    while errors < validation_size and meets_goal(errors + 1, validation_size, goal_error):
        errors += 1
    while errors >= 0 and not meets_goal(errors, validation_size, goal_error):
        errors -= 1
    return errors


def _check_size(validation_size: int) -> None:
    if not 1 <= validation_size <= MAX_VALIDATION_SIZE:
        raise ValueError(f"validation size must be in [1, {MAX_VALIDATION_SIZE}], got {validation_size}")
