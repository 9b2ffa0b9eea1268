"""Ctrl-C or a crash during a study leaves no run RUNNING (real processes, real signals)."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment, fresh_store

LONG_STUDY = ["study", "--bs", "16", "--trials", "8", "--goal-error", "0.001", "--max-steps", "20000",
              "--log-interval", "1", "--experiment", "interrupt-test", "--workers", "2"]


def _start(tmp_path):
    # The store exists before the process under test starts: a client made while that process creates
    # the store's tables would create them too, and one of the two would crash.
    uri = fresh_store(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    process = subprocess.Popen(
        [sys.executable, "-c", "from edps_mlflow.cli import main; main()", *LONG_STUDY], cwd=tmp_path,
        env=clean_environment(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=uri), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(1)
        assert process.poll() is None, process.communicate()
        experiment = client.get_experiment_by_name("interrupt-test") if (tmp_path / "mlflow.db").exists() else None
        if experiment and len(client.search_runs([experiment.experiment_id], "tags.`edps.kind` = 'trial'")) >= 2:
            time.sleep(2)  # let a few checks be logged
            return process, client, experiment.experiment_id
    process.kill()
    pytest.fail("the study did not start its trials in time")


def _statuses(client, experiment_id):
    runs = client.search_runs([experiment_id], run_view_type=ViewType.ALL)
    return {run.info.run_id: (run.data.tags.get("edps.kind"), run.info.status) for run in runs}


@pytest.mark.slow
def test_ctrl_c_marks_every_open_run_killed(tmp_path):
    process, client, experiment_id = _start(tmp_path)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    statuses = _statuses(client, experiment_id)
    assert statuses and all(status != "RUNNING" for _, status in statuses.values()), statuses
    assert [s for kind, s in statuses.values() if kind == "study"] == ["KILLED"]


@pytest.mark.slow
def test_a_crashed_worker_fails_the_study_without_leaving_runs_running(tmp_path):
    process, client, experiment_id = _start(tmp_path)
    workers = [child for child in psutil.Process(process.pid).children(recursive=True)
               if "spawn_main" in " ".join(child.cmdline())]
    assert workers, "the study trains in worker processes"
    workers[0].kill()
    process.communicate(timeout=60)
    assert process.returncode != 0
    statuses = _statuses(client, experiment_id)
    assert all(status != "RUNNING" for _, status in statuses.values()), statuses
    assert [s for kind, s in statuses.values() if kind == "study"] == ["FAILED"]


# A SIGTERM that lands while the main thread runs a callback Python cannot raise out of (here a weak
# reference's; in a sweep worker stopped by its parent, an import lock's): without care the interrupt is
# printed as "Exception ignored in ..." with a traceback and lost.
SWALLOWING_CALLBACK = """
import os
import signal
import time
import weakref

from edps_mlflow.interrupts import raise_interrupt

signal.signal(signal.SIGTERM, raise_interrupt)


class Thing:
    pass


def callback(ref):
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):  # the handler runs here, inside the callback
        pass


try:
    thing = Thing()
    ref = weakref.ref(thing, callback)
    del thing
    time.sleep(5)
    print("went on")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_an_interrupt_inside_a_callback_still_stops_the_process_without_a_traceback(tmp_path):
    (tmp_path / "swallow.py").write_text(SWALLOWING_CALLBACK)
    done = subprocess.run([sys.executable, "swallow.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=clean_environment(PYTHONPATH=str(REPO)))
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "interrupted", "")
