"""What a newcomer reads in the analysis: a steps figure whose axes follow the measured batch sizes, intervals
that say what they rest on, one name for the end of perfect scaling, the plot and the report drawing the same
fit, times in readable units, studies found wherever they are, and analysis runs that say who ran what.
Generated data through the real plotting code (matplotlib Agg) and a real local store."""

import json
import math
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from analysis.cli import main
from analysis.fit_metrics import curve_metrics
from analysis.plots import draw_steps, steps_figure
from analysis.regimes import fit_table, fit_warnings
from analysis.report import fit_summary
from analysis.timing import duration_words
from edps_mlflow import names as n

from conftest import REPO, fresh_store

BATCH_SIZES = [2, 4, 8, 16, 32, 64, 128, 256]


def _studies(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Three digits-like curves of 8 studies each, every study with one reaching trial and 7 superseded (exact
    early stopping); the sparse curve's B_crit lies beyond the measured batch sizes."""
    rng = np.random.default_rng(seed)
    rows, trials = [], []
    for sparsity, s_min, b_crit, noise in ((0.0, 60, 30, 0.05), (0.5, 70, 40, 0.08), (0.9, 20, 3000, 0.3)):
        for b in BATCH_SIZES:
            steps = float(round(s_min * (1 + b_crit / b) * math.exp(rng.normal(0, noise))))
            key = f"d-s{sparsity}-b{b}"
            rows.append({"workload": "digits-simple-cnn", "optimizer": "sgd", "sparsity": sparsity, "batch_size": b,
                         "goal_error": 0.1, "steps_to_result": steps, "trials_total": 8, "trials_reached": 1,
                         "trials_superseded": 7, "study_key": key, "seconds_per_step": 0.0004 * (1 + b / 64)})
            trials.append({"study_key": key, "trial_index": 0, "status": "reached", "steps_to_result": steps,
                           "steps_trained": steps})
            trials += [{"study_key": key, "trial_index": i, "status": "superseded", "steps_to_result": None,
                        "steps_trained": steps} for i in range(1, 8)]
    return pd.DataFrame(rows), pd.DataFrame(trials)


def _texts(figure) -> tuple[list[str], list[str]]:
    axis = figure.axes[0]
    return [t.get_text() for t in axis.get_legend().get_texts()], [t.get_text() for t in axis.texts]


def test_an_unbounded_interval_is_an_arrow_and_the_axes_follow_the_measured_batch_sizes(tmp_path):
    studies, _ = _studies()
    fits = fit_table(studies, None, repeats=0)
    sparse = fits.index[fits["sparsity"] == 0.9][0]
    # The interval of the issue: B_crit's upper end at 2^65 on a curve measured from 2 to 256.
    fits.loc[sparse, ["b_crit_low", "b_crit_high"]] = [fits.loc[sparse, "b_crit"] / 3, 2.0 ** 65]
    figure = draw_steps(studies, "digits-simple-cnn", "sgd", fits=fits)
    low, high = figure.axes[0].get_xlim()
    assert 1 <= low < 2 and 256 < high <= 512, (low, high)
    legend, annotations = _texts(figure)
    assert any("B_crit" in text and ".. unbounded)" in text for text in legend), legend
    assert f"{2.0 ** 65:.3g}" in annotations  # the arrow at the right edge says where the interval ends
    paths = steps_figure(studies, "digits-simple-cnn", "sgd", tmp_path, fits=fits)
    assert [p.suffix for p in paths] == [".png", ".svg"] and paths[0].read_bytes()[:4] == b"\x89PNG"


def test_an_interval_that_does_not_contain_its_estimate_is_drawn_and_said(tmp_path):
    studies, _ = _studies()
    fits = fit_table(studies, None, repeats=0)
    value = fits.loc[0, "b_crit"]
    # A basic bootstrap interval of a minimum can end short of the estimate, on either side.
    fits.loc[0, ["b_crit_low", "b_crit_high"]] = [value * 1.5, value * 3]
    fits.loc[1, ["b_crit_low", "b_crit_high"]] = [fits.loc[1, "b_crit"] / 4, fits.loc[1, "b_crit"] / 2]
    legend, _ = _texts(draw_steps(studies, "digits-simple-cnn", "sgd", fits=fits))
    assert sum("excludes the estimate" in text for text in legend) == 2, legend
    assert steps_figure(studies, "digits-simple-cnn", "sgd", tmp_path, fits=fits)[0].exists()
    notes = fit_warnings(fits.loc[0].to_dict(), np.array(BATCH_SIZES), studies["steps_to_result"][:8].to_numpy())
    assert any(f"does not contain the estimate {value:.3g}" in note for note in notes), notes


def test_report_says_what_the_intervals_rest_on(tmp_path, capsys):
    studies, trials = _studies()
    studies.to_csv(tmp_path / "steps.csv", index=False)
    trials.to_csv(tmp_path / "trials.csv", index=False)
    main(["report", "--csv", str(tmp_path / "steps.csv"), "--trials-csv", str(tmp_path / "trials.csv"),
          "--sparsity", "0.9", "--bootstrap", "40", "--output", str(tmp_path / "report.md")])
    text = (tmp_path / "report.md").read_text()
    # Superseded trials are no sample of their study: no interval, and the first section says why and what gives one.
    sure = text.split("## How sure each answer is", 1)[1].split("\n## ", 1)[0]
    assert ("digits-simple-cnn sgd sparsity 0.9: no intervals: the fewest replicates at a fitted point is 1 "
            "(intervals over replicates need 3 at every point) and 8 of 8 studies had trials superseded by exact "
            "early stopping") in sure
    assert "--replicates 3 or more, or studies with full_trials=true, would give them" in sure
    assert "the check interval is unknown" in sure and "[" not in text.split("### Fits", 1)[1].split("##", 1)[0]
    assert "perfect_scaling_end is the first measured batch size" in text
    assert (tmp_path / "report_figures" / "steps_digits-simple-cnn_sgd.png").read_bytes()[:4] == b"\x89PNG"
    # The time to result in a readable unit, the raw hours kept for programs.
    assert "hours" not in text.split("## Time to result", 1)[1].split("\n")[2]
    assert " s |" in text


def test_one_name_for_the_end_of_perfect_scaling():
    studies, _ = _studies()
    fits = fit_table(studies, None, repeats=0)
    assert "perfect_scaling_end" in fits.columns and not any("perfect_scaling_last" in c for c in fits.columns)
    summary = fit_summary(fits)
    assert "perfect_scaling_end" in summary.columns
    assert not [c for c in summary.columns if "perfect" in c and c != "perfect_scaling_end"]
    dense = fits[fits["sparsity"] == 0.0].iloc[0]
    assert curve_metrics(fits)["fit/sgd/sp0/perfect_scaling_end"] == dense["perfect_scaling_end"]
    assert summary.loc[0, "perfect_scaling_end"] == str(int(dense["perfect_scaling_end"]))
    # Where the hyperbola does not apply, the analysis run logs no B_crit (a 1e-21 bar), as the table prints n/a.
    rising = pd.DataFrame({"workload": "w", "optimizer": "sgd", "sparsity": 0.0, "batch_size": BATCH_SIZES,
                           "steps_to_result": [100.0 + b for b in BATCH_SIZES]})
    fit = fit_table(rising, None, repeats=0)
    assert fit_summary(fit).loc[0, "B_crit"] == "n/a"
    logged = curve_metrics(fit)
    assert "fit/sgd/sp0/s_min" in logged and not [m for m in logged if "b_crit_threshold_fit" in m or "e_min" in m
                                                  or m.startswith("fit/sgd/sp0/b_crit") and "threshold" not in m]
    # A curve that never leaves perfect scaling says so instead of naming a boundary.
    exact = pd.DataFrame({"workload": "w", "optimizer": "sgd", "sparsity": 0.0, "batch_size": BATCH_SIZES,
                          "steps_to_result": [4096.0 / b for b in BATCH_SIZES]})
    row = fit_table(exact, None, repeats=0).iloc[0]
    assert pd.isna(row["perfect_scaling_end"]) and "perfect_scaling_end lies beyond the measurements" in row["note"]


def test_plot_and_report_draw_the_fit_of_the_same_fit_table(tmp_path, capsys):
    studies, _ = _studies()
    # A sparse curve whose steps rise with batch size: its fit does not apply.
    rising = studies["sparsity"] == 0.9
    studies.loc[rising, "steps_to_result"] = [300.0, 280.0, 290.0, 320.0, 400.0, 500.0, 650.0, 900.0]
    fits = fit_table(studies, None, repeats=0)
    assert "steps rise" in fits[fits["sparsity"] == 0.9].iloc[0]["note"]
    drawn_alone, _ = _texts(draw_steps(studies, "digits-simple-cnn", "sgd"))
    drawn_with_table, _ = _texts(draw_steps(studies, "digits-simple-cnn", "sgd", fits=fits))
    assert drawn_alone == drawn_with_table
    assert sum(text == "fit does not apply (see the fit's note)" for text in drawn_alone) == 1
    assert sum(text.startswith("fit: S_min") for text in drawn_alone) == 2, drawn_alone
    studies.to_csv(tmp_path / "steps.csv", index=False)
    main(["plot", "--csv", str(tmp_path / "steps.csv"), "--out-dir", str(tmp_path / "figures")])
    assert str(tmp_path / "figures" / "steps_digits-simple-cnn_sgd.png") in capsys.readouterr().out


@pytest.mark.parametrize("hours,words", [(0.0001626, "0.585 s"), (0.5, "30 min"), (5.25, "5.25 h"),
                                         (72.0, "3 days"), (None, "-"), (float("nan"), "-")])
def test_time_to_result_in_the_unit_its_size_reads_best_in(hours, words):
    assert duration_words(hours) == words


def test_time_text_uses_units_and_csv_keeps_hours(tmp_path, capsys):
    studies, _ = _studies()
    studies.to_csv(tmp_path / "steps.csv", index=False)
    main(["time", "--csv", str(tmp_path / "steps.csv"), "--sparsity", "0", "--devices", "1",
          "--out-dir", str(tmp_path / "f")])
    out = capsys.readouterr().out
    assert "time to result" in out and " s " in out and "e-05" not in out and "0.0001" not in out
    main(["time", "--csv", str(tmp_path / "steps.csv"), "--sparsity", "0", "--devices", "1", "--format", "json",
          "--out-dir", str(tmp_path / "f")])
    rows = json.loads(capsys.readouterr().out)
    first = rows[0]
    assert first["hours"] == pytest.approx(first["steps_to_result"] * first["seconds_per_step"] / 3600)


# ---- studies wherever they are, and analysis runs that say who ran what ------------------------------
def _study_run(client: MlflowClient, experiment_id: str, batch_size: int, steps: float) -> None:
    """A finished study run as the tracking layer tags it (the reader's contract: tags, metrics, status)."""
    tags = {n.TAG_KIND: n.KIND_STUDY, n.TAG_WORKLOAD: "digits-simple-cnn", n.TAG_OPTIMIZER: "sgd",
            n.TAG_SPARSITY: "0", n.TAG_BATCH_SIZE: str(batch_size), n.TAG_STUDY_KEY: f"key-{batch_size}"}
    run = client.create_run(experiment_id, tags=tags)
    client.log_batch(run.info.run_id, metrics=[Metric(n.METRIC_STEPS_TO_RESULT, steps, 0, 0)],
                     tags=[RunTag(k, v) for k, v in tags.items()])
    client.set_terminated(run.info.run_id, "FINISHED")


def test_studies_in_the_default_experiment_are_found_and_analysis_runs_carry_context(tmp_path, capsys):
    uri = fresh_store(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    client.create_experiment("edps/empty")
    for batch_size, steps in ((16, 600.0), (64, 200.0), (256, 120.0), (1024, 100.0)):
        _study_run(client, "0", batch_size, steps)  # "0": MLflow's Default experiment, where `mlflow run .` logs
    capsys.readouterr()
    main(["table", "--tracking-uri", uri, "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["batch_size"] for r in rows) == [16, 64, 256, 1024]
    assert {r["experiment"] for r in rows} == {"Default"}
    # A name that matches nothing: one line listing what exists and where the studies are.
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--tracking-uri", uri, "--experiment", "edps/digits-simple-cnn"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "no experiment matches 'edps/digits-simple-cnn'" in lines[0], lines
    assert "experiments: 'Default', 'edps/empty' (with study runs: 'Default')" in lines[0], lines
    with pytest.raises(SystemExit):
        main(["fit", "--tracking-uri", uri, "--experiment", "edps/empty"])
    assert "experiments with study runs: 'Default'" in capsys.readouterr().err

    main(["fit", "--tracking-uri", uri, "--bootstrap", "0", "--log-to-mlflow"])
    captured = capsys.readouterr()
    assert "perfect_scaling_end" in captured.out
    (analysis,) = client.search_runs(["0"], f"tags.`{n.TAG_KIND}` = '{n.KIND_ANALYSIS}'")
    tags = analysis.data.tags
    assert tags[n.MLFLOW_SOURCE_NAME] == f"edps-analyze fit --tracking-uri {uri} --bootstrap 0 --log-to-mlflow"
    assert tags[n.MLFLOW_USER] and tags[n.MLFLOW_SOURCE_TYPE] == "LOCAL"
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert tags[n.MLFLOW_GIT_COMMIT] == commit.strip() and tags[n.TAG_CODE_VERSION].endswith(
        ("+g" + commit.strip()[:12], "+g" + commit.strip()[:12] + ".dirty"))
    assert analysis.data.params["experiments"] == "Default"
    assert "fit/sgd/sp0/perfect_scaling_end" in analysis.data.metrics
    # Its charts: the measured curve and the fitted one against the batch size (the metric's step).
    history = {m.step: m.value for m in client.get_metric_history(analysis.info.run_id,
                                                                  "curve/sgd/sp0/steps_to_result")}
    assert history == {16: 600.0, 64: 200.0, 256: 120.0, 1024: 100.0}
    fitted = {m.step: m.value for m in client.get_metric_history(analysis.info.run_id, "curve/sgd/sp0/steps_fit")}
    metrics = analysis.data.metrics
    assert fitted.keys() == history.keys() and fitted[64] == pytest.approx(
        metrics["fit/sgd/sp0/s_min"] * (1 + metrics["fit/sgd/sp0/b_crit"] / 64))
    assert "/model-metrics?workflowType=machine_learning" in captured.err


def test_the_trials_come_with_the_study_table_without_a_second_read_of_the_store(tmp_path):
    from analysis.load import load_studies, load_trials
    from edps_mlflow.results import TrialOutcome, TrialStatus, encode_trial_outcomes

    uri = fresh_store(tmp_path / "store" / "mlflow.db")
    client = MlflowClient(uri)
    for batch_size, steps in ((16, 600.0), (64, 200.0), (256, 120.0), (1024, 100.0)):
        _study_run(client, "0", batch_size, steps)
    outcomes = {}
    for run in client.search_runs(["0"]):
        key = run.data.tags[n.TAG_STUDY_KEY]
        best = int(run.data.metrics[n.METRIC_STEPS_TO_RESULT])
        outcomes[key] = [TrialOutcome(0, TrialStatus.REACHED, best, best),
                         TrialOutcome(1, TrialStatus.REACHED, best + 40, best + 40),
                         TrialOutcome(2, TrialStatus.NOT_REACHED, None, 3000)]
        client.set_tag(run.info.run_id, n.TAG_TRIAL_OUTCOMES, encode_trial_outcomes(outcomes[key]))
    studies = load_studies((), uri)
    filtered = studies[studies["batch_size"] >= 16].reset_index(drop=True)  # as the commands filter the table
    shutil.move(tmp_path / "store", tmp_path / "gone")  # a second read of the store would now fail
    trials = load_trials(filtered, uri)
    assert len(trials) == 12 and list(trials.columns) == ["study_key", "trial_index", "status", "steps_to_result",
                                                          "steps_trained"]
    for key, expected in outcomes.items():
        rows = trials[trials["study_key"] == key].sort_values("trial_index")
        assert list(rows["status"]) == [o.status.value for o in expected]
        assert list(rows["steps_trained"]) == [float(o.steps_trained) for o in expected]
    fits = fit_table(filtered, trials, repeats=50)
    assert fits.loc[0, "interval_studies"] == 4 and pd.notna(fits.loc[0, "s_min_low"])
