"""The one rule for an experiment name that a user gives: ``--experiment`` of ``edps`` (study, sweep,
status, doctor) and of ``edps-analyze`` (where it may be a glob pattern), and ``MLFLOW_EXPERIMENT_NAME``
where ``edps`` creates the experiment it names. The command lines check it while they parse their options,
so a name the store would refuse ends the command in one line before any store is created or opened.
No torch, no MLflow (importing either takes seconds).

    >>> experiment_name_problem("edps/digits-simple-cnn") is None
    True
"""

from __future__ import annotations

import unicodedata

# MLflow 3.17 refuses a name longer than 500 characters when it creates an experiment
# (mlflow/utils/validation.py: MAX_EXPERIMENT_NAME_LENGTH), but the experiments table it migrates
# every database store to holds 256 (name VARCHAR(256) in store/tracking/dbmodels/models.py): sqlite
# ignores the width, PostgreSQL and MySQL refuse a longer name. 256 holds for every store.
MAX_EXPERIMENT_NAME_LENGTH = 256

# Unicode categories of characters that end or break a line, or are invisible controls: a name holding one
# prints as two lines (or garbage) in every listing, error and UI. Cc: C0 and C1 controls (newline, tab,
# carriage return, NUL, escape, DEL); Zl, Zp: the line and paragraph separators U+2028, U+2029.
_REFUSED_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})


def experiment_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an experiment, as the end of a sentence ("must ..."); None when it can.
    Glob characters (``*``, ``?``, ``[``) are allowed: the analysis reads such a name as a pattern, and an
    experiment's own name may hold them."""
    if not name.strip():
        return "must not be empty"
    if len(name) > MAX_EXPERIMENT_NAME_LENGTH:
        return (f"must be at most {MAX_EXPERIMENT_NAME_LENGTH} characters (the longest experiment name every "
                f"MLflow store holds), got {len(name)}")
    for position, character in enumerate(name, 1):
        if unicodedata.category(character) in _REFUSED_CATEGORIES:
            return (f"must not hold a control character or a line separator (a newline, a tab, ...); character "
                    f"{position} is {ascii(character)}")
    return None
