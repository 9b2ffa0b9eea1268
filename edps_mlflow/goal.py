"""The goal test as the original code computes it: how many validation errors a goal allows.

The original evaluates the whole validation split, takes the mean of the per-example 0/1
correctness in float32 (numpy's mean of a float32 array), converts that accuracy to a Python
float and reaches the goal when ``1 - accuracy <= goal_error`` in float64. Rounding the accuracy
to float32 moves the boundary: at goal 0.12 on 6,000 images, 720 errors give an accuracy of
float32(0.88) = 0.87999999523..., an error just above 0.12, so only 719 are allowed; exact
arithmetic would allow 720.

    >>> allowed_errors(0.12, 6000), allowed_errors(0.30, 5000), allowed_errors(0.03, 179)
    (719, 1499, 5)
"""

from __future__ import annotations

import math

import numpy as np

# Below 2**24 images every count of correct examples is exact in float32, so the original's
# float32 sum is exact and its mean is the correctly rounded float32 of correct / size.
MAX_VALIDATION_SIZE = 2**24 - 1


def original_validation_error(errors: int, validation_size: int) -> float:
    """The validation error the original reports for ``errors`` misclassified examples.

    The float32 quotient of two integers below 2**24, rounded once through float64, equals the
    directly rounded float32 quotient (float64 has more than 2 * 24 + 2 bits), so this is the
    original's ``np.mean`` of float32 zeros and ones without building the array.
    """
    _check_size(validation_size)
    if not 0 <= errors <= validation_size:
        raise ValueError(f"errors must be in [0, {validation_size}], got {errors}")
    accuracy = float(np.float32((validation_size - errors) / validation_size))
    return 1.0 - accuracy


def meets_goal(errors: int, validation_size: int, goal_error: float) -> bool:
    """The original's test: ``1 - float32 mean accuracy <= goal_error``, compared in float64."""
    return original_validation_error(errors, validation_size) <= goal_error


def allowed_errors(goal_error: float, validation_size: int) -> int:
    """The most misclassified validation examples that still meet the goal as the original tests it.

    -1 when not even a perfect score meets the goal (a negative goal).
    """
    _check_size(validation_size)
    if math.isnan(goal_error):
        raise ValueError("goal error must be a number, got nan")
    # The error grows with the number of mistakes, so the answer is a threshold. Exact arithmetic
    # puts it at floor(goal * size); float32 rounding moves the accuracy by less than one example
    # (2**-24 < 1 / size), so a walk of a step or two from there finds it.
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
