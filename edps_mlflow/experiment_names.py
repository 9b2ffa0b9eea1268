"""The one rule for an experiment name a user gives (``--experiment`` of ``edps`` and ``edps-analyze``, where it
may be a glob, and ``MLFLOW_EXPERIMENT_NAME``), checked while the options are parsed, so that a name the store
would refuse ends the command in one line before any store is opened. No torch, no MLflow.

    >>> experiment_name_problem("edps/digits-simple-cnn") is None
    True
"""

from __future__ import annotations

import unicodedata

# MLflow accepts 500 characters, but its database stores' experiments table holds 256 (VARCHAR(256): PostgreSQL
# and MySQL refuse a longer name), so 256 holds for every store.
MAX_EXPERIMENT_NAME_LENGTH = 256

# Controls (Cc) and line and paragraph separators (Zl, Zp): a name holding one prints as two lines or garbage.
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
