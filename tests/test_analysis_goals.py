"""The analysis across targets: a goal ladder's study run is a row per rung, deduped with the one-goal study of
that rung, with its own trials; the fit table per goal; S_min, B_crit, E_min and the threshold critical batch
size against the goal (edps-analyze goals, the report's section, the figure); a CSV's goal column."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest

from analysis.cli import main
from edps_mlflow import names as n
from edps_mlflow.results import decode_trial_outcomes
from edps_mlflow.store.index import MAX_TAG_VALUE, RunDataView, RunInfoView, RunView, entry_of

from conftest import built_once, fresh_store, run_edps
from test_analysis_inputs import run

GOALS = (0.3, 0.2, 0.1)
SIZES = (32, 64, 128)


def analyze(argv: list[str], capsys) -> tuple[str, str]:
    """What a command that succeeds prints (a failure ends it with SystemExit, failing the test)."""
    main(argv)
    captured = capsys.readouterr()
    return captured.out, captured.err


def _build(folder: Path) -> dict:
    """A one-goal study of the ladder's middle rung at 64, then the ladder over three batch sizes (it wins)."""
    uri = fresh_store(folder / "mlflow.db")
    for args in (["study", "--bs", "64", "--goal-error", "0.2", "--trials", "3"],
                 ["sweep", "--batch-sizes", ",".join(map(str, SIZES)), "--goals", ",".join(map(str, GOALS)),
                  "--trials", "3"]):
        done = run_edps(args, folder, timeout=600, MLFLOW_TRACKING_URI=uri)
        assert done.returncode == 0, done.stderr[-2000:]
    return {"uri": uri, "folder": str(folder)}


@pytest.fixture(scope="module")
def ladder(tmp_path_factory) -> dict:
    return built_once(tmp_path_factory, "goal-ladder-store", _build)


@pytest.fixture()
def store(ladder, monkeypatch) -> str:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", ladder["uri"])
    return ladder["uri"]


@pytest.mark.slow
def test_a_ladder_is_a_row_per_rung_deduped_with_a_one_goal_study_of_a_rung(store):
    from mlflow.tracking import MlflowClient

    from analysis.load import load_studies

    table = load_studies((), store)
    assert len(table) == len(GOALS) * len(SIZES)  # the one-goal study of (64, 0.2) is the ladder's rung
    assert set(table["goal_metric"]) == {"error"} and (table["goal"] == table["goal_error"]).all()
    client = MlflowClient(store)
    for run_id, rows in table.groupby("study_run_id"):
        run = client.get_run(run_id)
        assert run.data.tags[n.TAG_GOALS] == ",".join(map(n.goal_text, GOALS))
        assert sorted(rows["goal"]) == sorted(GOALS)
        for _, row in rows.iterrows():
            assert row["steps_to_result"] == run.data.metrics[n.goal_steps_metric(row["goal"])]
            assert row["study_key"] == run.data.tags[n.goal_key_tag(row["goal"])]
    assert len(set(table["study_key"])) == len(table)


@pytest.mark.slow
def test_each_rung_has_its_own_trials_from_its_tag_or_from_trials_csv(store):
    from mlflow.tracking import MlflowClient

    from analysis.load import _downloaded_trials, _outcome_tags, load_studies, load_trials

    table = load_studies((), store)
    trials = load_trials(table, store)
    client = MlflowClient(store)
    for _, row in table.iterrows():
        tags = client.get_run(row["study_run_id"]).data.tags
        hardest = row["goal"] == GOALS[-1]
        text = tags[n.TAG_TRIAL_OUTCOMES if hardest else n.goal_outcomes_tag(row["goal"])]
        expected = {(o.trial_index, o.status.value, o.steps_to_result) for o in decode_trial_outcomes(text)}
        mine = trials[trials["study_key"] == row["study_key"]]
        assert {(int(t.trial_index), t.status, None if pd.isna(t.steps_to_result) else int(t.steps_to_result))
                for t in mine.itertuples()} == expected
        # without the tag, the same trials from trials.csv's steps_to_goal_<g>
        [frame] = _downloaded_trials(client, [(row["study_run_id"], row["study_key"], row["goal"],
                                               _outcome_tags(tags))])
        assert {(int(t.trial_index), t.status, None if pd.isna(t.steps_to_result) else int(t.steps_to_result))
                for t in frame.itertuples()} == expected


@pytest.mark.slow
def test_fit_goals_report_and_figure_against_the_goal(store, ladder, capsys):
    folder = Path(ladder["folder"]) / "analysis"
    out, _ = analyze(["fit", "--tracking-uri", store, "--bootstrap", "50", "--format", "csv"], capsys)
    fits = pd.read_csv(io.StringIO(out))
    assert sorted(fits["goal"]) == sorted(GOALS)
    assert fits["e_min"].tolist() == pytest.approx((fits["s_min"] * fits["b_crit"]).tolist())
    out, err = analyze(["goals", "--tracking-uri", store, "--bootstrap", "50", "--format", "csv",
                        "--out-dir", str(folder)], capsys)
    goals = pd.read_csv(io.StringIO(out))
    assert goals["goal"].tolist() == list(GOALS)  # easiest first
    assert {"b_crit_low", "e_min_low", "b_crit_threshold_fit_high", "b_crit_threshold"} <= set(goals.columns)
    assert (folder / "goals_digits-simple-cnn_sgd.png").stat().st_size > 0 and "goals_" in err
    report = folder / "report.md"
    analyze(["report", "--tracking-uri", store, "--bootstrap", "20", "--output", str(report)], capsys)
    text = report.read_text()
    assert "## Against the goal" in text and "E_min (examples)" in text
    assert "goals_digits-simple-cnn_sgd.png" in text


def _loss_curves(folder: Path, goal: str = "goal") -> Path:
    """A published family: one curve per loss target (nats), S = S_min (1 + B_crit / B) with B_crit rising."""
    rows = [{"workload": "lm", "optimizer": "adam", "sparsity": 0.0, "batch_size": b, goal: target,
             "steps_to_result": round(s_min * (1 + b_crit / b))}
            for target, s_min, b_crit in ((3.5, 400, 64), (3.0, 900, 128), (2.5, 2000, 256))
            for b in (16, 32, 64, 128, 256, 512, 1024)]
    path = folder / "losses.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_fit_csv_with_a_goal_column_of_losses_fits_each_goal(tmp_path, capsys):
    path = _loss_curves(tmp_path)
    out, _ = analyze(["fit", "--csv", str(path), "--bootstrap", "0", "--format", "csv"], capsys)
    fits = pd.read_csv(io.StringIO(out)).set_index("goal")
    assert sorted(fits.index) == [2.5, 3.0, 3.5]
    assert fits.loc[3.0, "b_crit"] == pytest.approx(128, rel=0.02)
    assert fits.loc[2.5, "e_min"] == pytest.approx(2000 * 256, rel=0.03)
    out, _ = analyze(["goals", "--csv", str(path), "--bootstrap", "0", "--out-dir", str(tmp_path)], capsys)
    assert "E_min" in out and (tmp_path / "goals_lm_adam.png").exists()


@pytest.mark.parametrize("cell,demand", [("0", "a finite number > 0"), ("-2", "a finite number > 0"),
                                         ("three", "numeric")])
def test_a_bad_goal_in_a_csv_is_refused_in_one_line(tmp_path, capsys, cell, demand):
    path = _loss_curves(tmp_path)
    lines = path.read_text().splitlines()
    lines[3] = lines[3].replace(",3.5,", f",{cell},")
    path.write_text("\n".join(lines) + "\n")
    code, line = run(["fit", "--csv", str(path), "--bootstrap", "0"], capsys)  # one line, exit code 2
    assert code == 2 and f"column goal must be {demand}; row 4" in line


def test_goals_needs_two_goals(tmp_path, capsys):
    path = tmp_path / "one.csv"
    path.write_text("workload,optimizer,sparsity,batch_size,steps_to_result,goal_error\n"
                    "w,sgd,0,4,400,0.1\nw,sgd,0,16,120,0.1\nw,sgd,0,64,60,0.1\n")
    code, line = run(["goals", "--csv", str(path)], capsys)
    assert code == 2 and "fewer than two goals" in line


def test_an_index_entry_drops_the_easier_rungs_outcomes_before_the_hardest(tmp_path):
    outcomes = "v1 " + " ".join(f"{i}:s100" for i in range(400))  # about 2,800 characters each
    tags = {n.TAG_GOALS: "0.3,0.2,0.1", n.TAG_TRIAL_OUTCOMES: outcomes, n.TAG_STUDY_KEY: "k",
            **{n.goal_outcomes_tag(g): outcomes for g in (0.3, 0.2)}}
    view = RunView(RunInfoView("r1", "1", "FINISHED", 1, 2), RunDataView(tags, {}, {}))
    entry = entry_of(view)
    assert entry is not None and len(entry) <= MAX_TAG_VALUE
    assert n.TAG_TRIAL_OUTCOMES in entry and n.TAG_GOAL_OUTCOMES_PREFIX not in entry


def test_the_table_has_a_column_per_goal_not_the_fewest_steps_of_any(tmp_path, capsys):
    # A ladder is a row per rung: one cell per batch size took the easiest rung's steps, naming no goal.
    out, _ = analyze(["table", "--csv", str(_loss_curves(tmp_path))], capsys)
    _, header, _, *rows = out.splitlines()  # title, columns, index name, a row per batch size
    assert header.split() == ["goal", "3.5", "sparsity", "0", "goal", "3", "sparsity", "0", "goal", "2.5",
                              "sparsity", "0"]  # easiest first
    assert rows[0].split() == ["16", "2000", "8100", "34000"]
