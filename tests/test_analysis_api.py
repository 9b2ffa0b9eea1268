"""The analysis from Python (analysis/api.py): docs/analysis.md's notebook block run as it stands on a store made by a
short real sweep of digits (the goal-ladder store that tests/test_analysis_goals.py builds once per session), and
its errors one EdpsError line."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from analysis import api
from analysis.csv_io import with_integers
from analysis.load import load_studies
from edps_mlflow.errors import EdpsError

from conftest import REPO, built_once
from test_analysis_goals import GOALS, SIZES, _build


def notebook_block() -> str:
    text = (REPO / "docs" / "analysis.md").read_text()
    section = text[text.index("## From Python"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_documented_notebook_block_runs_on_a_real_store(tmp_path_factory, monkeypatch):
    folder = Path(built_once(tmp_path_factory, "goal-ladder-store", _build)["folder"])
    monkeypatch.chdir(folder)  # the block names the store as `sqlite:///mlflow.db`, the one in this folder
    names: dict = {}
    exec(compile(notebook_block(), "docs/analysis.md", "exec"), names)
    table, trials, fits = names["table"], names["trials"], names["fits"]
    assert all(isinstance(frame, pd.DataFrame) for frame in (table, trials, fits))
    pd.testing.assert_frame_equal(table, with_integers(load_studies(("edps/digits-simple-cnn",), names["store"])))
    # Counts as export writes them: integers (trials_reached 3, not 3.0), Int64 where a study has none.
    assert {str(table[c].dtype) for c in ("batch_size", "trials_reached", "steps_to_result")} == {"Int64"}
    assert len(table) == len(GOALS) * len(SIZES) and table["steps_to_result"].notna().any()
    assert set(trials["study_key"]) == set(table["study_key"]) and len(trials) >= len(table)
    assert len(fits) == 1 and fits["goal"].iloc[0] == min(GOALS) and fits["s_min"].iloc[0] > 0


def test_errors_are_one_edps_error_line(tmp_path, sqlite_store):
    missing = f"sqlite:///{tmp_path / 'no-such-folder' / 'mlflow.db'}"
    for call, message in [
        (lambda: api.studies(missing, "edps/x"), "no-such-folder"),
        (lambda: api.studies(sqlite_store, "bad\nname"), "experiment 'bad\\\\nname' must"),
        (lambda: api.studies(sqlite_store, ["edps/x", 3]), "experiment 3 must be a string"),
        (lambda: api.studies(sqlite_store), "holds a study run"),
        (lambda: api.trials(sqlite_store, "edps/none"), "no experiment matches 'edps/none'"),
        (lambda: api.fits(sqlite_store, "edps/x", bootstrap=-1), "bootstrap must be a whole number"),
        (lambda: api.fits(sqlite_store, "edps/x", tolerance="0.2"), "tolerance must be a number in"),
        (lambda: api.fits(study_table=pd.DataFrame(columns=["workload"])), "holds no studies"),
        # Wrong types are told as such, not as an AttributeError or KeyError from inside pandas.
        (lambda: api.studies(123), "tracking_uri must be a string or None, got 123"),
        (lambda: api.studies(sqlite_store, 5), "experiment must be a name, a pattern"),
        (lambda: api.fits(sqlite_store, study_table="x"), "study_table must be a DataFrame"),
        (lambda: api.trials(sqlite_store, study_table=[1, 2]), "study_table must be a DataFrame"),
        (lambda: api.trials(sqlite_store, study_table=pd.DataFrame({"batch_size": [16]})),
         "study_table lacks study_run_id, study_key"),
    ]:
        with pytest.raises(EdpsError, match=message) as raised:
            call()
        assert "\n" not in str(raised.value), str(raised.value)
    assert not (tmp_path / "no-such-folder").exists()  # the analysis never makes a store
    assert api.trials(sqlite_store, study_table=pd.DataFrame()).empty  # a table filtered to nothing: no trials


def test_a_study_table_with_integer_counts_fits_as_its_floats_do():
    sizes = (16, 64, 256, 1024)
    table = pd.DataFrame({"workload": "digits-simple-cnn", "optimizer": "sgd", "sparsity": 0.0, "batch_size": sizes,
                          "steps_to_result": [400.0, 150.0, None, 90.0], "trials_reached": [3.0, 2.0, 0.0, 1.0],
                          "check_interval": 10.0, "study_run_id": None, "study_key": [f"k{s}" for s in sizes]})
    integers = with_integers(table)
    assert str(integers["steps_to_result"].dtype) == "Int64" and integers["steps_to_result"].isna().sum() == 1
    pd.testing.assert_frame_equal(api.fits(study_table=integers, bootstrap=0), api.fits(study_table=table, bootstrap=0))
