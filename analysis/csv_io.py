"""The study and trial tables as CSV (docs/analysis.md lists the columns): every cell checked on reading, the
first bad one named by file, row and column in one line; a text cell that a spreadsheet would run as a formula
written with a leading ``'`` (:func:`spreadsheet_text`) and read back without it.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from edps_mlflow.errors import EdpsError
from edps_mlflow.parameterization import parse_parameterization
from edps_mlflow.pruning import parse_method
from edps_mlflow.results import TrialStatus

REQUIRED_COLUMNS = ("workload", "optimizer", "sparsity", "batch_size", "steps_to_result")
# The metaparameters of a study's best trial that the study table holds, as best_<name> (its params best.<name>).
BEST_METAPARAMETERS = ("learning_rate", "momentum", "beta2", "beta2_half_life", "weight_decay", "tau")
# goal: what the study reached for (an error rate, a loss, or in a CSV any positive label of a target);
# goal_metric: "error" or "loss" where the workload is known; goal_error: the goal, as older tables have it.
STUDY_COLUMNS = ("workload", "optimizer", "sparsity", "batch_size", "pruning", "parameterization", "goal", "goal_metric",
                 "goal_error", "check_interval", "max_steps", "seed", "steps_to_result", "trials_total", "trials_reached",
                 "trials_not_reached",
                 "trials_diverged", "trials_superseded", *(f"best_{name}" for name in BEST_METAPARAMETERS),
                 "seconds_per_step",
                 "pack_size", "device", "model_parameters", "model_parameter_bytes", "experiment", "study_run_id",
                 "study_key", "sweep_run_id")
TRIAL_COLUMNS = ("study_key", "trial_index", "status", "steps_to_result", "steps_trained")

# What a number in each column may be: (lowest, highest, lowest included, must be an integer); an empty cell
# is a missing value, except in the columns of _REQUIRED_VALUES.
_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    # goal_error holds a loss-goal workload's loss too (its metric goal_error): positive, as goal.
    **dict.fromkeys(("sparsity", "best_momentum", "best_beta2"), (0.0, 1.0, True, False)),
    "goal_error": (0.0, math.inf, False, False),
    **dict.fromkeys(("batch_size", "check_interval", "max_steps", "trials_total", "model_parameters",
                     "model_parameter_bytes"), (1, math.inf, True, True)),
    **dict.fromkeys(("seed", "trial_index", "trials_reached", "trials_not_reached", "trials_diverged",
                     "trials_superseded"),
                    (0, math.inf, True, True)),
    **dict.fromkeys(("steps_to_result", "best_learning_rate", "best_beta2_half_life", "best_tau", "seconds_per_step",
                     "goal"),
                    (0.0, math.inf, False, False)),
    "steps_trained": (0, math.inf, True, False), "best_weight_decay": (0.0, math.inf, True, False),
    "pack_size": (1.0, math.inf, True, False)}
_REQUIRED_VALUES = ("workload", "optimizer", "sparsity", "batch_size", "study_key", "trial_index", "status")
MAX_CSV_BYTES = 256 * 2**20  # a sweep of 10,000 studies is about 2 MB
# What a spreadsheet runs as a formula when a cell starts with it (OWASP, CSV injection); a number such as -0.5
# starts with a sign but is read as a number, never run.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def read_csv(path: str | Path, columns: tuple[str, ...] = REQUIRED_COLUMNS) -> pd.DataFrame:
    """A study (or trial) table from CSV, every cell checked."""
    text = _read_text(Path(path))
    header = _header(path, text, columns)
    try:
        # everything as text: numbers are converted and checked cell by cell
        table = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[""],
                            skipinitialspace=True, index_col=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError, csv.Error) as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        raise EdpsError(f"{path} is not a readable CSV file: {lines[0]}") from None
    if len(table.columns) != len(header):
        raise EdpsError(f"{path}: the header has {len(header)} columns but was read as {len(table.columns)}")
    table.columns = header
    if table.empty:
        raise EdpsError(f"{path} has a header but no rows")
    for column in table.columns:
        if column in _REQUIRED_VALUES:
            empty = table[column].isna() | (table[column].astype(str).str.strip() == "")
            if empty.any():
                raise EdpsError(f"{path}: column {column} needs a value in every row; row {_line(empty)} has none")
        table[column] = _checked_numbers(path, table, column) if column in _RANGES \
            else table[column].map(unquoted_text)
    if "status" in table.columns:
        known = {status.value for status in TrialStatus}
        bad = table["status"].notna() & ~table["status"].isin(known)
        if bad.any():
            raise EdpsError(f"{path}: column status must be one of {', '.join(sorted(known))}; "
                            f"row {_line(bad)} has {table['status'].iloc[_line(bad) - 2]!r}")
    for column, parse in _AXIS_NAMES.items():
        if column in table.columns:
            table[column] = _checked_names(path, table[column], parse)
    if "batch_size" in table.columns:
        table["batch_size"] = table["batch_size"].astype(int)
        for column in STUDY_COLUMNS:
            if column not in table.columns:
                table[column] = None
    return table


def _header(path: str | Path, text: str, columns: tuple[str, ...]) -> list[str]:
    """The header's column names, checked against the rows' lengths (pandas would drop extra cells silently)."""
    try:
        records = [record for record in csv.reader(io.StringIO(text)) if record]
    except csv.Error as error:
        raise EdpsError(f"{path} is not a readable CSV file: {error}") from None
    header = [name.strip() for name in (records[0] if records else [])]
    if not any(header):
        raise EdpsError(f"{path} is empty: it needs a header line with the columns {', '.join(columns)}")
    repeated = [name for index, name in enumerate(header) if name in header[:index]]
    if repeated:
        raise EdpsError(f"{path}: the column {repeated[0]!r} appears more than once in the header")
    missing = [c for c in columns if c not in header]
    if missing:
        raise EdpsError(f"{path} lacks the column(s) {', '.join(missing)}; required: {', '.join(columns)}")
    for number, record in enumerate(records[1:], 2):
        if len(record) > len(header):
            raise EdpsError(f"{path} is not a readable CSV file: row {number} has {len(record)} cells, "
                            f"the header {len(header)}")
    return header


# The curve axes whose cells are names, each with its parser to the canonical spelling.
_AXIS_NAMES: dict[str, Callable[[str], str]] = {"pruning": parse_method,
                                                "parameterization": lambda text: parse_parameterization(text).value}


def _checked_names(path: str | Path, column: pd.Series, parse: Callable[[str], str]) -> pd.Series:
    """Each name of an axis (a pruning method, a parameterization) in its canonical spelling; an empty cell stays
    empty (a study before the axis existed: with_curve_axes gives its default); an unknown name is an EdpsError
    naming the row."""
    names = []
    for row, value in enumerate(column, 2):
        try:
            names.append(parse(str(value)) if pd.notna(value) and str(value).strip() else None)
        except EdpsError as error:
            raise EdpsError(f"{path}: column {column.name}, row {row}: {error}") from None
    return pd.Series(names, index=column.index, dtype=object)


def _read_text(path: Path) -> str:
    try:
        if not path.is_file():
            raise EdpsError(f"no such CSV file: {path}" if not path.exists() else f"{path} is not a file")
        if path.stat().st_size > MAX_CSV_BYTES:
            raise EdpsError(f"{path} is larger than {MAX_CSV_BYTES // 2**20} MiB; not a study table")
        data = path.read_bytes()
    except OSError as error:
        raise EdpsError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        row = data[:error.start].count(b"\n") + 1
        raise EdpsError(f"{path}: row {row} is not UTF-8 text (byte {error.start})") from None


def _line(mask: pd.Series) -> int:
    """The file's row of the first True entry (row 1 is the header; blank lines are not counted)."""
    return int(mask.to_numpy().argmax()) + 2


def _checked_numbers(path: str | Path, table: pd.DataFrame, column: str) -> pd.Series:
    low, high, low_included, integer = _RANGES[column]
    text = table[column]
    numbers = pd.to_numeric(text.str.strip(), errors="coerce")
    in_range = numbers.notna() & numbers.map(lambda v: math.isfinite(v) if v == v else False)
    if integer:
        in_range &= numbers == numbers.round()
    in_range &= (numbers >= low if low_included else numbers > low) & (numbers < high if high == 1.0 else True)
    bad = text.notna() & ~in_range
    if not bad.any():  # steps written as 60 read as the 60.0 they were: a table reads back as it was written
        return numbers if integer else numbers.astype(float)
    row = _line(bad)
    value = text.iloc[row - 2]
    if not _is_float(value):
        demand = "numeric"
    else:
        bounds = (f"in [{low:g}, {high:g})" if high == 1.0 and low_included else f"in ({low:g}, {high:g})"
                  if high == 1.0 else f">= {low:g}" if low_included else f"> {low:g}")
        demand = f"{'an integer' if integer else 'a finite number'} {bounds}"
    raise EdpsError(f"{path}: column {column} must be {demand}; row {row} has {value!r}")


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _quoted_for_spreadsheets(text: str) -> bool:
    """Whether ``text`` is written with a leading "'": it would run as a formula, or it starts with "'"s before
    such a text (so that reading back, which removes one "'", gives every text back as it was)."""
    rest = text.lstrip("'")
    return rest.startswith(_FORMULA_STARTS) and not _NUMBER.fullmatch(rest)


def spreadsheet_text(value: Any) -> Any:
    """A cell as the analysis writes it: text that a spreadsheet would run as a formula gets a leading "'", the
    spreadsheets' own mark of a text cell (``=HYPERLINK(...)`` becomes ``'=HYPERLINK(...)``)."""
    return "'" + value if isinstance(value, str) and _quoted_for_spreadsheets(value) else value


def unquoted_text(value: Any) -> Any:
    """The inverse of :func:`spreadsheet_text`, applied to the text cells :func:`read_csv` reads."""
    if isinstance(value, str) and value.startswith("'") and _quoted_for_spreadsheets(value[1:]):
        return value[1:]
    return value


# Counts and sizes: written as integers (check_interval 20, never 20.0), steps too where every one is whole.
INTEGER_COLUMNS = (*(column for column, (*_, integer) in _RANGES.items() if integer), "steps_to_result",
                   "steps_trained")


def with_integers(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each of INTEGER_COLUMNS that holds only whole numbers as integers (Int64 where some are
    missing)."""
    whole = {}
    for column in (c for c in INTEGER_COLUMNS if c in table.columns):
        values = pd.to_numeric(table[column], errors="coerce")
        present = values.dropna()
        if table[column].notna().sum() == len(present) and np.isfinite(present).all() and (present % 1 == 0).all():
            whole[column] = values.astype("Int64")
    return table.assign(**whole)


def csv_text(table: pd.DataFrame) -> str:
    """``table`` as every CSV is written: text cells quoted (a newline stays in its cell in every reader) and inert,
    integer columns as integers."""
    return with_integers(table.map(spreadsheet_text)).to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC)


def write_csv(table: pd.DataFrame, path: str | Path | None = None) -> str:
    """The study table's columns as CSV (what :func:`read_csv` reads back), written to ``path`` when given."""
    text = csv_text(table[[c for c in STUDY_COLUMNS if c in table.columns]])
    if path is not None:
        try:
            with open(path, "w", encoding="utf-8", newline="") as file:  # a "\r" inside a cell stays as it is
                file.write(text)
        except OSError as error:
            raise EdpsError(f"cannot write {path}: {error.strerror or error}") from None
    return text
