"""Malformed analysis input: every bad CSV is refused in one line naming the file and the row or
column; studies measured under different protocols are never fitted as one curve."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.cli import main
from analysis.load import STUDY_COLUMNS
from analysis.regimes import fit_table

FIXTURES = Path(__file__).parent / "fixtures"
STEPS = (FIXTURES / "synthetic_steps.csv").read_text()
TRIALS = (FIXTURES / "synthetic_trials.csv").read_text()
FUZZ = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
GARBAGE_CELLS = ["", "nan", "NaN", "inf", "-inf", "1e400", "-1", "0", "2.5", "abc", "\"", "'", "\\", "\x01", "é",
                 "1,2", "  ", "None", "null", "0x10", "1e3", "-0.0", "reached", "superseded", "diverge"]


def run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    if code != 0:
        lines = captured.err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("edps-analyze: error: "), captured.err
        return code, lines[0]
    return code, ""


def write(directory: Path, name: str, content: str | bytes) -> str:
    path = directory / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'never.db'}")
    return tmp_path


@FUZZ
@given(content=st.binary(max_size=300), command=st.sampled_from(["fit", "table"]))
def test_random_bytes(content, command, folder, capsys):
    path = write(folder, "random.csv", content)
    run([command, "--csv", path, "--bootstrap", "0"] if command == "fit" else [command, "--csv", path], capsys)


ROW_VALUES = st.one_of(st.sampled_from(GARBAGE_CELLS), st.sampled_from(["synthetic", "sgd", "0.5", "64", "1000"]))


@FUZZ
@given(header=st.lists(st.sampled_from(STUDY_COLUMNS + ("extra",)), min_size=0, max_size=10),
       rows=st.lists(st.lists(ROW_VALUES, min_size=0, max_size=11), max_size=5),
       command=st.sampled_from(["fit", "table"]))
def test_random_columns_and_cells(header, rows, command, folder, capsys):
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    path = write(folder, "columns.csv", buffer.getvalue())
    code, line = run([command, "--csv", path], capsys)
    if code:
        assert path in line
    if len(set(header)) < len(header):
        assert code == 2 and "appears more than once" in line


NUMERIC_STUDY_COLUMNS = ("sparsity", "batch_size", "goal_error", "steps_to_result", "trials_total")
NOT_A_VALUE = {"sparsity": ["nan", "inf", "-0.5", "1", "abc", "1e400"],
               "batch_size": ["0", "-4", "2.5", "nan", "inf", "sixteen", "1e400"],
               "goal_error": ["0", "1", "-0.1", "nan", "inf", "x"],
               "steps_to_result": ["0", "-5", "nan", "inf", "many"],
               "trials_total": ["0", "-1", "1.5", "nan", "inf"]}


@FUZZ
@given(data=st.data(), command=st.sampled_from(["fit", "table"]))
def test_one_bad_cell_is_named(data, command, folder, capsys):
    table = pd.read_csv(io.StringIO(STEPS), dtype=str, keep_default_na=False)
    column = data.draw(st.sampled_from(NUMERIC_STUDY_COLUMNS))
    row = data.draw(st.integers(min_value=0, max_value=len(table) - 1))
    value = data.draw(st.sampled_from(NOT_A_VALUE[column]))
    table.loc[row, column] = value
    path = write(folder, "one-bad-cell.csv", table.to_csv(index=False))
    code, line = run([command, "--csv", path], capsys)
    assert code == 2 and path in line and f"column {column}" in line and f"row {row + 2}" in line, line


CASES = [
    ("empty.csv", "", "is empty"),
    ("blank.csv", "\n\n", "is empty"),
    ("header-only.csv", STEPS.splitlines()[0] + "\n", "has a header but no rows"),
    ("duplicate.csv", "workload,optimizer,sparsity,batch_size,batch_size,steps_to_result\nw,sgd,0,4,4,10\n",
     "the column 'batch_size' appears more than once"),
    ("zero-batch.csv", "workload,optimizer,sparsity,batch_size,steps_to_result\nw,sgd,0,0,10\n",
     "column batch_size must be an integer >= 1; row 2 has '0'"),
    ("negative-batch.csv", "workload,optimizer,sparsity,batch_size,steps_to_result\nw,sgd,0,-8,10\n",
     "column batch_size must be an integer >= 1; row 2 has '-8'"),
    ("inf-steps.csv", "workload,optimizer,sparsity,batch_size,steps_to_result\nw,sgd,0,8,inf\n",
     "column steps_to_result must be a finite number > 0; row 2 has 'inf'"),
    ("nan-sparsity.csv", "workload,optimizer,sparsity,batch_size,steps_to_result\nw,sgd,nan,8,10\n",
     "column sparsity must be a finite number in [0, 1); row 2 has 'nan'"),
    ("no-sparsity.csv", "workload,optimizer,sparsity,batch_size,steps_to_result\nw,sgd,,8,10\n",
     "column sparsity needs a value in every row; row 2 has none"),
    ("ragged.csv", "workload,optimizer,sparsity,batch_size,steps_to_result\nw,sgd,0,8,10,11,12\n",
     "is not a readable CSV file"),
    ("latin1.csv", "workload,optimizer,sparsity,batch_size,steps_to_result\nw\xe9,sgd,0,8,10\n".encode("latin-1"),
     "row 2 is not UTF-8 text"),
    ("directory", None, "is not a file"),
]


@pytest.mark.parametrize("name,content,message", CASES)
def test_malformed_study_csv(name, content, message, folder, capsys):
    if content is None:
        (folder / name).mkdir()
        path = str(folder / name)
    else:
        path = write(folder, name, content)
    for command in (["fit", "--bootstrap", "0"], ["table"]):
        code, line = run([*command, "--csv", path], capsys)
        assert code == 2 and path in line and message in line, line


TRIAL_CASES = [
    ("trials-other-keys.csv", TRIALS.replace("synthetic-", "other-"),
     "none of its study_key values matches a study"),
    ("trials-bad-status.csv", TRIALS.replace(",reached,", ",finished,", 1),
     "column status must be one of diverged, not_reached, reached, superseded; row 2 has 'finished'"),
    ("trials-no-key.csv", "\n".join(",".join(line.split(",")[1:]) for line in TRIALS.splitlines()) + "\n",
     "lacks the column(s) study_key"),
    ("trials-inf.csv", TRIALS.replace("138740.0,138740.0", "inf,138740.0", 1),
     "column steps_to_result must be a finite number > 0; row 2 has 'inf'"),
]


@pytest.mark.parametrize("name,content,message", TRIAL_CASES)
def test_malformed_trials_csv(name, content, message, folder, capsys):
    path = write(folder, name, content)
    code, line = run(["fit", "--csv", str(FIXTURES / "synthetic_steps.csv"), "--trials-csv", path,
                      "--bootstrap", "5"], capsys)
    assert code == 2 and message in line, line
    if "matches" in message:
        assert path in line


def test_study_table_without_study_keys_cannot_take_a_trials_csv(folder, capsys):
    table = pd.read_csv(io.StringIO(STEPS)).drop(columns=["study_key"])
    path = write(folder, "no-keys.csv", table.to_csv(index=False))
    code, line = run(["fit", "--csv", path, "--trials-csv", str(FIXTURES / "synthetic_trials.csv"),
                      "--bootstrap", "5"], capsys)
    assert code == 2 and "needs a study_key column" in line


def _curve(batch_sizes, steps, **extra) -> pd.DataFrame:
    return pd.DataFrame({"workload": "w", "optimizer": "sgd", "sparsity": 0.0, "batch_size": batch_sizes,
                         "steps_to_result": steps, "study_key": [f"k{b}{extra}" for b in batch_sizes], **extra})


@pytest.mark.parametrize("column,values", [("goal_error", (0.05, 0.02)), ("trials_total", (8, 16)),
                                           ("check_interval", (10, 100)), ("max_steps", (1000, 5000))])
def test_studies_of_other_protocols_are_separate_curves(column, values):
    sizes = [4, 16, 64, 256]
    table = pd.concat([_curve(sizes, [4000.0, 1100.0, 400.0, 300.0], **{column: values[0]}),
                       _curve(sizes, [9000.0, 2500.0, 900.0, 700.0], **{column: values[1]})], ignore_index=True)
    fits = fit_table(table, repeats=0)
    assert len(fits) == 2 and sorted(fits[column]) == sorted(values)
    assert all(f"the studies differ in {column}" in note for note in fits["note"])
    single = fit_table(table[table[column] == values[0]], repeats=0)
    assert len(single) == 1 and single["note"].iloc[0] == "" and single[column].iloc[0] == values[0]
    assert single["s_min"].iloc[0] == pytest.approx(fits.set_index(column).loc[values[0], "s_min"])


def test_csv_without_protocol_columns_still_reads(folder, capsys):
    path = write(folder, "minimal.csv", "workload,optimizer,sparsity,batch_size,steps_to_result\n"
                 "w,sgd,0,4,4000\nw,sgd,0,16,1100\nw,sgd,0,64,400\nw,sgd,-0.0,256,300\n")
    code, _ = run(["fit", "--csv", path, "--bootstrap", "0", "--format", "csv"], capsys)
    assert code == 0


def test_plot_and_report_of_two_protocols_and_a_repeated_row(folder, capsys):
    """Figures and the sparsity comparison keep protocols apart too; a batch size listed twice is no crash."""
    sizes = [4, 16, 64, 256]
    table = pd.concat([_curve(sizes, [4000.0, 1100.0, 400.0, 300.0], goal_error=0.05),
                       _curve(sizes, [9000.0, 2500.0, 900.0, 700.0], goal_error=0.02),
                       _curve([16], [1000.0], goal_error=0.05)], ignore_index=True)
    path = write(folder, "two-protocols.csv", table.to_csv(index=False))
    code, _ = run(["report", "--csv", path, "--bootstrap", "0", "--output", str(folder / "r.md")], capsys)
    assert code == 0
    text = (folder / "r.md").read_text()
    assert text.count("the studies differ in goal_error") >= 2
