"""What a researcher sees: the MLflow UI, driven in headless Chromium, on what a real sweep and a real
analysis logged to a real `mlflow server`.

Skips with its reason when Debian's `chromium` is not installed (`.ci/run` installs it).
"""

import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment, run_edps

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")


def rendered(url: str, profile: Path) -> str:
    """The DOM of ``url`` after the single-page app has had time to render it."""
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--virtual-time-budget=30000", "--dump-dom", url],
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.slow
def test_printed_links_open_the_runs_and_the_report_renders_its_figures(mlflow_server, tmp_path):
    experiment = "ui-test"
    for batch_size in ("64", "256"):
        study = run_edps(["study", "--bs", batch_size, "--trials", "2", "--max-steps", "100", "--goal-error", "0.1",
                          "--workers", "1", "--experiment", experiment], cwd=tmp_path, MLFLOW_TRACKING_URI=mlflow_server)
        assert study.returncode == 0, study.stderr[-3000:]
    link = re.search(r"MLflow UI: (\S+)", study.stdout).group(1)
    assert link.startswith(f"{mlflow_server}/#/experiments/")

    # The printed link opens the study run, named with what varies first ...
    assert link.endswith("?workflowType=machine_learning")
    page = rendered(link, tmp_path / "profile-run")
    assert "bs=256 sp=0 sgd digits-simple-cnn" in page
    # ... in the model-training pages (without the view parameter MLflow files it under "Evaluations").
    assert "Model training" in page and "Evaluations" not in page
    # Its metrics table leads with the result (the table keeps the order metrics were first logged).
    assert page.index(">steps_to_result<") < page.index(">trials/reached<")
    # Its title and description lead with the result; the description links the trial that reached it (the page
    # lists only the 10 newest trial runs).
    client = MlflowClient(mlflow_server)
    study_run = client.get_run(link.split("/runs/")[1].split("?")[0])
    if "steps_to_result" in study_run.data.metrics:
        assert re.search(r'href="#/experiments/\d+/runs/\w+\?workflowType=machine_learning">trial \d+</a>', page)
        assert f": {study_run.data.metrics['steps_to_result']:.0f} steps by t0" in study_run.data.tags["mlflow.runName"]
    # Summary values sit at step 0, which the UI charts as bars, not as lone dots on a line chart.
    trial = client.search_runs([client.get_experiment_by_name(experiment).experiment_id],
                               "tags.`edps.kind` = 'trial'", max_results=1)[0]
    assert [point.step for point in client.get_metric_history(trial.info.run_id, "steps_trained")] == [0]
    # ... and its experiment, in the machine-learning view, lists both studies.
    experiment_link = link.split("/runs/")[0] + "/runs?workflowType=machine_learning"
    page = rendered(experiment_link, tmp_path / "profile-runs")
    assert "bs=64 sp=0 sgd" in page and "bs=256 sp=0 sgd" in page

    report = subprocess.run(
        [sys.executable, "-c", "from analysis.cli import main; main()", "report", "--experiment", experiment,
         "--bootstrap", "0", "--output", str(tmp_path / "report.html"), "--log-to-mlflow"],
        cwd=tmp_path, env=clean_environment(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=mlflow_server),
        capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    charts_link = re.search(r"MLflow UI: (\S+)", report.stderr).group(1)
    # The printed link opens the analysis run's charts, a section per curve (steps against batch size).
    assert charts_link.endswith("/model-metrics?workflowType=machine_learning")
    assert "curve/sgd/sp0" in rendered(charts_link, tmp_path / "profile-charts")
    run_link = charts_link.replace("/model-metrics", "")
    run_id = run_link.split("?")[0].rsplit("/", 1)[-1]
    client = MlflowClient(mlflow_server)
    assert client.get_run(run_id).data.tags["edps.kind"] == "analysis"

    # The artifact viewer renders report.html as a page (not as text) ...
    viewer = rendered(run_link.replace("?", "/artifacts/report.html?"), tmp_path / "profile-report")
    assert "mlflow-html-iframe" in viewer
    # ... and the file it renders carries its figures inline: nothing for the viewer to resolve.
    with urllib.request.urlopen(f"{mlflow_server}/get-artifact?path=report.html&run_uuid={run_id}",
                                timeout=30) as response:
        html = response.read().decode()
    images = re.findall(r"<img[^>]*\ssrc='([^']*)'", html)
    assert images and all(src.startswith("data:image/png;base64,") for src in images)
