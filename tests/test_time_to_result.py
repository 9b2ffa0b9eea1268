"""Time to result: the cost model on a hand-built table (exact numbers), bad input, and `edps-analyze time`
and the report on a real store made by a tiny digits sweep."""

from __future__ import annotations

import base64
import io
import json
import math
import re

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis.cli import main
from analysis.timing import CostModel, fastest_table, step_seconds, time_table
from edps_mlflow.errors import EdpsError

from conftest import edps_here, fresh_store, run_edps

# Three measured batch sizes of one curve; a network of 10^6 float32 parameters (4 MB of gradients).
STUDIES = pd.DataFrame({
    "workload": "w", "optimizer": "sgd", "sparsity": 0.0, "batch_size": [8, 32, 128],
    "steps_to_result": [1000.0, 300.0, 200.0], "seconds_per_step": [0.001, 0.002, 0.008], "pack_size": 1.0,
    "device": "cpu (test, 1 thread)", "model_parameters": 1e6, "model_parameter_bytes": 4e6})
MODEL = CostModel(bandwidth=1e9, latency=1e-5, devices=(1, 2, 3, 4))


def test_step_seconds_interpolate_in_log_space_and_never_extrapolate():
    b, t = [8, 32, 128], [0.001, 0.002, 0.008]
    assert step_seconds(b, t, 32) == 0.002
    assert step_seconds(b, t, 16) == pytest.approx(math.sqrt(0.001 * 0.002), rel=1e-12)  # halfway in log b
    assert step_seconds(b, t, 11) == pytest.approx(0.001 * (11 / 8) ** 0.5, rel=1e-12)  # slope 1/2 on 8..32
    assert step_seconds(b, t, 4) is None and step_seconds(b, t, 256) is None


def test_cost_model_exact_numbers():
    table = time_table(STUDIES, MODEL).set_index(["batch_size", "devices"])
    hours = table["hours"]
    # One device: steps x the measured seconds per step, nothing else.
    assert hours[(8, 1)] == pytest.approx(1000 * 0.001 / 3600, rel=1e-12)
    assert hours[(32, 1)] == pytest.approx(300 * 0.002 / 3600, rel=1e-12)
    assert hours[(128, 1)] == pytest.approx(200 * 0.008 / 3600, rel=1e-12)
    # Ring all-reduce of 4 MB at 1 GB/s and 10 us: 2 (N-1)/N x 4e6 / 1e9 + 2 (N-1) x 1e-5.
    assert table.loc[(32, 2), "allreduce_seconds_per_step"] == pytest.approx(0.004 + 0.00002, rel=1e-12)
    assert table.loc[(32, 4), "allreduce_seconds_per_step"] == pytest.approx(0.006 + 0.00006, rel=1e-12)
    # Two devices at B=32: 16 each, between the measured 8 and 32.
    assert hours[(32, 2)] == pytest.approx(300 * (math.sqrt(0.001 * 0.002) + 0.00402) / 3600, rel=1e-12)
    assert hours[(128, 2)] == pytest.approx(200 * (0.004 + 0.00402) / 3600, rel=1e-12)
    # Three devices at B=32: the slowest device has ceil(32/3) = 11 examples.
    assert table.loc[(32, 3), "per_device_batch"] == 11
    assert hours[(32, 3)] == pytest.approx(
        300 * (0.001 * (11 / 8) ** 0.5 + 2 * 2 / 3 * 4e-3 + 4 * 1e-5) / 3600, rel=1e-12)
    assert hours[(128, 4)] == pytest.approx(200 * (0.002 + 0.00606) / 3600, rel=1e-12)
    # B=8 over 2+ devices would need per-device batches below the smallest measured one: not projected.
    for count in (2, 3, 4):
        assert pd.isna(hours[(8, count)]) and "outside the timed batch sizes 8-128" in table.loc[(8, count), "note"]
    fastest = fastest_table(time_table(STUDIES, MODEL)).set_index("devices")
    assert fastest.loc[1, "batch_size"] == 32 and fastest.loc[2, "batch_size"] == 128
    assert fastest.loc[2, "speedup_over_one_device"] == pytest.approx(0.6 / (200 * 0.00802), rel=1e-12)
    assert "largest projected batch size" in fastest.loc[2, "note"]


def test_no_projection_without_the_model_size_nor_without_timing():
    table = time_table(STUDIES.drop(columns=["model_parameter_bytes"]), MODEL)
    assert table[table["devices"] == 1]["hours"].notna().all()
    assert table[table["devices"] > 1]["hours"].isna().all()
    assert table[table["devices"] > 1]["note"].str.contains("model's size is not recorded").all()
    with pytest.raises(EdpsError, match="no study records its training seconds per step"):
        time_table(STUDIES.assign(seconds_per_step=None), MODEL)


@pytest.mark.parametrize("bandwidth,latency,devices", [
    (0, 1e-5, (1,)), (-1.0, 1e-5, (1,)), (math.nan, 1e-5, (1,)), (1e9, -1.0, (1,)), (1e9, math.inf, (1,)),
    (1e9, 0.0, ()), (1e9, 0.0, (0,)), (1e9, 0.0, (2, 2)), (1e9, 0.0, (1.5,)), (1e9, 0.0, (True,))])
def test_cost_model_refuses_bad_values(bandwidth, latency, devices):
    with pytest.raises(EdpsError):
        CostModel(bandwidth=bandwidth, latency=latency, devices=devices)


@pytest.mark.parametrize("arguments,message", [
    (["--bandwidth", "0"], "--bandwidth"), (["--bandwidth", "-3"], "--bandwidth"),
    (["--bandwidth", "nan"], "finite"), (["--latency", "-1"], "--latency"),
    (["--devices", "0"], "positive integers"), (["--devices", "1,x"], "positive integers"),
    (["--devices", "2.5"], "positive integers"), (["--devices", ""], "positive integers"),
    (["--devices", "-2"], "positive integers"), (["--devices", "1,2,2"], "each count once")])
def test_bad_cost_options_are_one_line(arguments, message, tmp_path, capsys):
    path = tmp_path / "steps.csv"
    STUDIES.to_csv(path, index=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["time", "--csv", str(path), "--out-dir", str(tmp_path / "figures"), *arguments])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "figures").exists()  # refused before any work


def test_empty_store_and_untimed_studies_are_one_line(tmp_path, capsys):
    uri = fresh_store(tmp_path / "empty.db")
    MlflowClient(uri).create_experiment("empty")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["time", "--tracking-uri", uri, "--experiment", "empty"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "hold no finished study runs" in lines[0]
    path = tmp_path / "untimed.csv"
    STUDIES.drop(columns=["seconds_per_step"]).to_csv(path, index=False)
    with pytest.raises(SystemExit):
        main(["time", "--csv", str(path), "--out-dir", str(tmp_path / "figures")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "no study records its training seconds per step" in lines[0]


def test_csv_round_trip_and_markdown(tmp_path, capsys):
    path = tmp_path / "steps.csv"
    STUDIES.to_csv(path, index=False)
    main(["time", "--csv", str(path), "--devices", "1,2,4", "--bandwidth", "1", "--format", "markdown",
          "--out-dir", str(tmp_path / "figures")])
    captured = capsys.readouterr()
    assert "| workload | optimizer | sparsity | devices | fastest batch size |" in captured.out
    assert "| w | sgd | 0 | 2 | 128 | 64 |" in captured.out
    assert (tmp_path / "figures" / "time_w_sgd.png").read_bytes()[:4] == b"\x89PNG"
    assert str(tmp_path / "figures" / "time_w_sgd.svg") in captured.err


@pytest.mark.slow
def test_time_on_a_real_sweep(tmp_path, capsys):
    """A tiny digits sweep logs each trial's seconds per step and device; a packed study and one that reuses
    trials record their best trial's; `edps-analyze time` and the report turn them into hours."""
    uri = fresh_store(tmp_path / "mlflow.db")
    protocol = ["--goal-error", "0.08", "--max-steps", "600", "--experiment", "t"]
    result = run_edps(["sweep", "--batch-sizes", "16,64", "--sparsities", "0", "--trials", "3", *protocol],
                      cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    assert result.returncode == 0, result.stderr[-3000:]
    # The studies in this process (a process of their own would add only its start-up).
    code, printed = edps_here(["study", "--bs", "32", "--trials", "3", "--pack-size", "3", "--workers", "1",
                               *protocol], uri)
    assert code == 0, printed[-3000:]
    # Another protocol (4 trials) at batch size 64: three trials reused from the sweep, one trained.
    code, printed = edps_here(["study", "--bs", "64", "--trials", "4", "--workers", "1", *protocol], uri)
    assert code == 0 and "reusing 3 finished trials" in printed, printed[-3000:]
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("t").experiment_id
    trials = client.search_runs([experiment_id], "tags.`edps.kind` = 'trial'")
    assert len(trials) == 10
    for trial in trials:
        if trial.data.metrics["steps_trained"] == 0:  # superseded before it trained a step: nothing to time
            assert "train/seconds_per_step" not in trial.data.params and "device" not in trial.data.params
            continue
        assert float(trial.data.params["train/seconds_per_step"]) > 0  # a trial's one-value numbers are params
        # One worker per core with one thread each, or one worker with every core (--workers 1).
        assert re.fullmatch(r"cpu \(.+, [12] threads?\)", trial.data.params["device"]), trial.data.params["device"]
        packed = trial.data.tags["edps.batch_size"] == "32"
        assert (float(trial.data.params["train/pack_size"]) > 1) == packed
    for study in client.search_runs([experiment_id], "tags.`edps.kind` = 'study'"):
        document = json.loads(open(client.download_artifacts(study.info.run_id, "study.json", str(tmp_path))).read())
        best = document["best_trial"]
        # The study's time per step is its best trial's, reused or not.
        assert study.data.metrics["train/seconds_per_step"] == float(
            client.get_run(best["run_id"]).data.params["train/seconds_per_step"])
        assert best["seconds_per_step"] == study.data.metrics["train/seconds_per_step"]
        assert study.data.params["timing.device"] == best["device"]
        assert study.data.metrics["model/parameters"] == document["model"]["parameters"] == 6090
        assert study.data.metrics["model/parameter_bytes"] == 4 * 6090
        table = pd.read_csv(client.download_artifacts(study.info.run_id, "trials.csv", str(tmp_path)))
        trained = table[table["steps_trained"] > 0]
        assert trained["seconds_per_step"].gt(0).all() and trained["device"].str.startswith("cpu (").all()

    main(["time", "--tracking-uri", uri, "--experiment", "t", "--format", "csv", "--devices", "1,2,4",
          "--out-dir", str(tmp_path / "figures")])
    rows = pd.read_csv(io.StringIO(capsys.readouterr().out))
    curve = rows[rows["trials_total"] == 3].set_index(["batch_size", "devices"])
    assert set(curve.index) == {(b, n) for b in (16, 32, 64) for n in (1, 2, 4)}
    measured = {int(s.data.tags["edps.batch_size"]): s.data.metrics
                for s in client.search_runs([experiment_id], "tags.`edps.kind` = 'study'")
                if s.data.params["spec.trials"] == "3"}
    for batch_size, metrics in measured.items():
        assert curve.loc[(batch_size, 1), "hours"] == pytest.approx(
            metrics["steps_to_result"] * metrics["train/seconds_per_step"] / 3600, rel=1e-9)
    # 64 over 2 devices: 32 each, measured; plus the all-reduce of 24,360 bytes at 10 GB/s and 10 us.
    assert curve.loc[(64, 2), "hours"] == pytest.approx(
        measured[64]["steps_to_result"] * (measured[32]["train/seconds_per_step"] + 24360 / 10e9 + 2e-5) / 3600,
        rel=1e-9)
    assert pd.isna(curve.loc[(16, 2), "hours"])  # 8 per device: below the smallest timed batch size
    assert "timed in packs of up to" in curve.loc[(16, 1), "note"]  # batch size 32 was timed in a pack of 3
    assert (tmp_path / "figures" / "time_digits-simple-cnn_sgd.png").exists()

    (tmp_path / "r").mkdir()
    main(["report", "--tracking-uri", uri, "--experiment", "t", "--bootstrap", "0", "--devices", "1,2,4",
          "--output", str(tmp_path / "r" / "report.html")])
    page = (tmp_path / "r" / "report.html").read_text()
    assert "<h2>Time to result: the fastest batch size per number of devices" in page
    figure = (tmp_path / "r" / "report_figures" / "time_digits-simple-cnn_sgd.png").read_bytes()
    sources = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert any(base64.b64decode(source) == figure for source in sources)
    main(["report", "--tracking-uri", uri, "--experiment", "t", "--bootstrap", "0",
          "--output", str(tmp_path / "r" / "report.md")])
    text = (tmp_path / "r" / "report.md").read_text()
    assert "## Time to result: every batch size" in text and "report_figures/time_digits-simple-cnn_sgd.png" in text


def test_a_time_figure_per_workload_and_optimizer_with_a_panel_per_curve(tmp_path, monkeypatch):
    """Two optimizers, each with a dense curve, SNIP at 0.9 and random at 0.9: two figures of three panels, each
    panel titled by its curve, with a line per device count and its fastest batch size starred."""
    from analysis import plots

    curves = []
    for optimizer in ("momentum", "sgd"):
        for sparsity, pruning, slower in ((0.0, "snip", 1.0), (0.9, "snip", 1.5), (0.9, "random", 2.0)):
            curves.append(STUDIES.assign(optimizer=optimizer, sparsity=sparsity, pruning=pruning,
                                         steps_to_result=STUDIES["steps_to_result"] * slower))
    table = time_table(pd.concat(curves, ignore_index=True), MODEL)
    drawn = {}
    monkeypatch.setattr(plots, "_write", lambda figure, paths: drawn.update({paths[0].name: figure}))
    paths = plots.time_figures(table, tmp_path, MODEL.describe(), ("png",))
    assert [p.name for p in paths] == ["time_w_momentum.png", "time_w_sgd.png"] == sorted(drawn)
    figure = drawn["time_w_sgd.png"]
    assert [axis.get_title() for axis in figure.axes] == ["sparsity 0", "sparsity 0.9 random", "sparsity 0.9 snip"]
    assert "w, sgd: time to reach the goal" in figure.texts[0].get_text()  # the title holds the cost model
    assert MODEL.describe() in figure.texts[0].get_text()
    first_row = [axis.get_position().y0 for axis in figure.axes]
    assert first_row[0] == first_row[1] > first_row[2]  # two across, the third below the first
    assert [axis.get_legend() is not None for axis in figure.axes] == [False, True, False]
    for axis, slower in zip(figure.axes, (1.0, 2.0, 1.5)):
        lines = [line for line in axis.get_lines() if line.get_linestyle() == "-"]
        assert [line.get_label() for line in lines] == ["1 device (measured)", "2 devices", "3 devices", "4 devices"]
        unit = axis.get_ylabel()[len("time to result ("):-1]
        per_unit = {"s": 1 / 3600, "min": 1 / 60, "h": 1.0, "days": 24.0}[unit]
        measured = lines[0].get_ydata()
        assert measured == pytest.approx(STUDIES["steps_to_result"] * slower * STUDIES["seconds_per_step"]
                                         / 3600 / per_unit)
        stars = [line for line in axis.get_lines() if line.get_marker() == "*"]
        assert stars[0].get_ydata()[0] == pytest.approx(min(measured))  # one device's fastest batch size
        assert len(stars) == len(lines)
