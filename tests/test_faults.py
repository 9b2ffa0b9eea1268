"""Faults on purpose: concurrent first use of a store, SIGKILL at random moments, concurrent sweeps,
a tracking server that goes away. Real processes, real signals, the digits workload."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import REPO, clean_environment, run_edps

EDPS = [sys.executable, "-c", "from edps_mlflow.cli import main; main()"]
SMALL_STUDY = ["study", "--trials", "1", "--goal-error", "0.06", "--max-steps", "200", "--check-interval", "20",
               "--workers", "1", "--log-interval", "5"]
# Builds the store as every edps command does, then stops (no torch: a kill lands in initialisation).
INITIALISE = "import sys; from edps_mlflow.tracking import open_store; open_store(sys.argv[1])"


def _popen(args: list[str], cwd: Path, **environment: str) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=cwd, env=clean_environment(PYTHONPATH=str(REPO), **environment),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_four_studies_at_once_on_a_new_store_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    processes = [_popen([*EDPS, *SMALL_STUDY, "--bs", str(bs), "--experiment", "concurrent"], tmp_path,
                        MLFLOW_TRACKING_URI=uri) for bs in (16, 32, 64, 128)]
    outputs = [p.communicate(timeout=240) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0, 0], [err[-1500:] for _, err in outputs]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("concurrent")
    studies = client.search_runs([experiment.experiment_id], "tags.`edps.kind` = 'study'")
    assert sorted(r.data.tags["edps.batch_size"] for r in studies) == ["128", "16", "32", "64"]
    assert all(r.info.status == "FINISHED" for r in studies)


def test_sigkill_during_initialisation_leaves_a_usable_store(tmp_path):
    rng = random.Random(os.getpid())
    moments = sorted(round(rng.uniform(0.5, 6.0), 2) for _ in range(3))
    for number, moment in enumerate(moments):
        database = tmp_path / f"store-{number}" / "mlflow.db"
        database.parent.mkdir()
        uri = f"sqlite:///{database}"
        victim = _popen([sys.executable, "-c", INITIALISE, uri], tmp_path)
        time.sleep(moment)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.communicate()
        # Killed at any moment: no store, or a complete one; never a half-migrated file in its place.
        after = _popen([sys.executable, "-c", INITIALISE, uri], tmp_path)
        _, stderr = after.communicate(timeout=120)
        assert after.returncode == 0, (moment, stderr[-1500:])
        assert MlflowClient(uri).search_experiments()
    # And a real command on the last of them.
    done = run_edps([*SMALL_STUDY, "--bs", "64", "--experiment", "after-kill"], cwd=tmp_path,
                    MLFLOW_TRACKING_URI=uri, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    print(f"killed during initialisation at {moments} s; each store usable afterwards")


def test_a_half_migrated_store_is_one_clear_line(tmp_path):
    database = tmp_path / "mlflow.db"
    connection = sqlite3.connect(database)
    connection.executescript("create table alembic_version (version_num varchar(32) not null);"
                             "insert into alembic_version values ('451aebb31d03');"
                             "create table experiments (experiment_id integer primary key, name text);")
    connection.close()
    result = run_edps(["status", "--experiment", "anything"], cwd=tmp_path, timeout=120,
                      MLFLOW_TRACKING_URI=f"sqlite:///{database}")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "half-migrated" in lines[0] and "remove it" in lines[0], result.stderr
