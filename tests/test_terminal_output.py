"""What people read in a terminal and a report: `edps-analyze fit` and `table` within 100 columns with their notes
below the table, a B_crit the hyperbola does not give shown as n/a, integer columns of an export as integers, the
report's notes below its tables, and `edps data list` aligned for a long workload name."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from analysis.cli import main as analyze
from analysis.csv_io import read_csv, write_csv
from analysis.regimes import fit_table
from analysis.report import fit_summary
from edps_mlflow import workloads
from edps_mlflow.cli import main as edps

FIXTURES = Path(__file__).parent / "fixtures"
SIZES = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _flat_curve_csv(folder: Path) -> Path:
    """The synthetic sweep with a curve as flat as dense digits at a loose goal: the same steps at every batch
    size, so the hyperbola's B_crit comes out near zero, far below the measured batch sizes."""
    synthetic = pd.read_csv(FIXTURES / "synthetic_steps.csv")
    flat = pd.DataFrame({"workload": "flat-workload-with-a-long-name", "optimizer": "momentum", "sparsity": 0.0,
                         "batch_size": SIZES, "goal_error": 0.02, "check_interval": 20.0,
                         "steps_to_result": [60.0 + (i % 2) for i in range(len(SIZES))],
                         "study_key": [f"flat-b{size}" for size in SIZES]})
    path = folder / "steps.csv"
    pd.concat([synthetic, flat], ignore_index=True).to_csv(path, index=False)
    return path


def _table(text: str, title: str) -> str:
    """The table under ``title`` with its notes (to the next table's title: a line with " / " in it)."""
    after = text[text.index(f"\n{title}\n") + 1:]
    return after[:next((m.start() for m in re.finditer(r"\n\n[^\n]* / [^\n]*\n", after)), len(after))]


def _lines(capsys: pytest.CaptureFixture) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_fit_fits_100_columns_with_its_notes_numbered_below_each_table(tmp_path, capsys):
    analyze(["fit", "--csv", str(_flat_curve_csv(tmp_path)), "--trials-csv", str(FIXTURES / "synthetic_trials.csv")])
    lines = _lines(capsys)
    assert max(map(len, lines)) <= 100, [line for line in lines if len(line) > 100]
    text = "\n".join(lines)
    synthetic, flat = _table(text, "synthetic / momentum"), _table(text, "flat-workload-with-a-long-name / momentum")
    assert "notes:\n  1. no maximal_parallelism_start interval: every resample gave 2048" in synthetic
    rows = [line for line in synthetic.splitlines() if line.startswith(("0 ", "0.5 ", "0.9 "))]
    assert rows[-1].split()[-1] == "1" and rows[-2].split()[-1] == "-"  # the last block's notes column
    # 3 significant figures, integers as integers: 926 [870, 939], never 926.3 or 9.26e+02
    assert "926 [870, 939]" in synthetic and "61.4 [58.1, 64.9]" in synthetic
    tables = synthetic.split("notes:")[0] + flat.split("notes:")[0]
    assert "e+0" not in tables and "e-" not in tables


def test_a_b_crit_the_hyperbola_does_not_give_is_na_with_the_note_saying_why(tmp_path, capsys):
    studies = read_csv(_flat_curve_csv(tmp_path))
    fits = fit_table(studies[studies["workload"].str.startswith("flat")], repeats=0)
    assert fits["b_crit"].iloc[0] < 0.02  # the number the table printed before: far below the batch sizes
    summary = fit_summary(fits).iloc[0]
    assert (summary["B_crit"], summary["E_min (examples)"], summary["B_crit threshold, fit"]) == ("n/a",) * 3
    assert summary["S_min"] not in ("n/a", "-") and "far outside the measured batch sizes 2..1024" in summary["note"]
    analyze(["fit", "--csv", str(_flat_curve_csv(tmp_path)), "--bootstrap", "0", "--workload",
             "flat-workload-with-a-long-name"])
    text = "\n".join(_lines(capsys))
    table, notes = _table(text, "flat-workload-with-a-long-name / momentum").split("notes:")
    assert "n/a" in table and "e-" not in table and "far outside the measured batch sizes" in notes


def test_table_fits_100_columns_and_wraps_its_note(tmp_path, capsys):
    analyze(["table", "--csv", str(_flat_curve_csv(tmp_path))])
    lines = _lines(capsys)
    assert max(map(len, lines)) <= 100 and "synthetic / momentum" in lines


def test_the_report_puts_the_fits_notes_below_the_table(tmp_path, capsys):
    report = tmp_path / "report.md"
    analyze(["report", "--csv", str(_flat_curve_csv(tmp_path)), "--bootstrap", "0", "--output", str(report)])
    text = report.read_text()
    fits = text[text.index("### Fits", text.index("## flat-workload")):]
    header = fits.splitlines()[2]
    assert header.split("|")[-2].strip() == "notes" and "| note |" not in text
    assert "\nNotes:\n\n1. " in fits and "| n/a |" in fits
    html = tmp_path / "report.html"
    analyze(["report", "--csv", str(_flat_curve_csv(tmp_path)), "--bootstrap", "0", "--output", str(html)])
    assert "<p>Notes:</p><ol><li>" in html.read_text() and "<th>note</th>" not in html.read_text()


def test_export_writes_integer_columns_as_integers(tmp_path):
    studies = read_csv(_flat_curve_csv(tmp_path))
    lines = write_csv(studies).splitlines()
    header = lines[0].replace('"', "").split(",")
    flat = dict(zip(header, lines[-1].split(",")))
    assert (flat["batch_size"], flat["check_interval"], flat["steps_to_result"]) == ("1024", "20", "61")
    synthetic = dict(zip(header, lines[1].split(",")))
    assert synthetic["check_interval"] == '""' and synthetic["steps_to_result"] == "136330"  # missing stays empty
    assert synthetic["sparsity"] == "0.0"  # a float column stays one
    back = read_csv(tmp_path / "steps.csv")
    pd.testing.assert_series_equal(back["steps_to_result"], read_csv(_written(tmp_path, studies))["steps_to_result"],
                                   check_dtype=False)


def _written(folder: Path, studies: pd.DataFrame) -> Path:
    path = folder / "exported.csv"
    write_csv(studies, path)
    return path


TOY = '''
import torch
from torch import nn
from edps_mlflow.data.splits import DataSplits
from edps_mlflow.workloads import InputLayout, Workload

def load_data(data_dir):
    x = torch.zeros(30, 4)
    return DataSplits(x[:20], torch.zeros(20).long(), x[20:], torch.zeros(10).long())

LONG = Workload(name="a-workload-of-ones-own-with-a-long-name", description="", load_data=load_data,
                build_model=lambda: nn.Linear(4, 2), goal_error=0.1, max_steps=200, needs_data_dir=False,
                dataset="a-dataset-with-a-long-name", train_size=20, validation_size=10,
                input_layout=InputLayout.FEATURES, default_trials=2, check_interval=10)
'''


def test_data_list_aligns_its_columns_for_long_names(tmp_path, monkeypatch, capsys):
    (tmp_path / "long_workloads.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(workloads, "_LOADED", {})
    monkeypatch.setattr(workloads, "_BY_REFERENCE", {})
    monkeypatch.setenv(workloads.MODULES_ENV, "long_workloads:LONG")
    edps(["data", "list", "--data-dir", str(tmp_path / "data")])
    lines = _lines(capsys)
    assert any(line.startswith("a-workload-of-ones-own-with-a-long-name a-dataset-with-a-long-name present ")
               for line in lines)
    # every line's dataset, status and detail start where the other lines' do
    starts = {tuple(match.start() for match in re.finditer(r"\S+", line))[1:4] for line in lines}
    assert len(starts) == 1 and len(lines) >= 6, lines
