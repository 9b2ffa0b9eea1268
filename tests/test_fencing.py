"""Fencing of a writer stalled past its lease (docs/reliability.md, "A process stalled past its lease"): a process
stopped at the very moment of its final write to a trial run (after its check that the study is still its own,
before the write) and woken after another process took the study over and finished it, sends that write, and
nothing counts it: the other study's result stands, a third study reuses only the other's trials, `edps status`
and the analysis show the other's, and `edps doctor` says the late write is harmless. A sweep stopped before it
made any run and woken after another sweep finished the grid writes nothing to that sweep's run.

The stop is the process's own: a ``sitecustomize.py`` that the test writes into a folder on the stopped process's
PYTHONPATH wraps MLflow's client call that ends a trial run (or, for the sweep, that first looks for the sweep's
runs) and SIGSTOPs the process right before sending it. Real processes, a real sqlite store and a real
`mlflow server`, short leases.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis.load import load_studies, load_trials
from conftest import REPO, clean_environment, edps_here, fresh_store, run_edps, sqlite_locked
from test_paused import _wake

LEASE = "6"  # seconds: heartbeats every second

# Wraps MlflowClient in the stopped process only (EDPS_TEST_STOP_AT set): SIGSTOP right before the first call
# that matches. "trial-end": the set_terminated that finishes a trial run (its outcome logged just before);
# "trial-outcome": the log_batch of a trial run's outcome (after the study's check that the run is its own);
# "sweep-claim": the first search for the sweep's runs. On sqlite, never while this process holds the database's
# lock (the heartbeat thread may be writing): a stopped process would keep it, and no other could write.
SITECUSTOMIZE = '''
import os
import signal
import sqlite3
import time

STOP_AT = os.environ.get("EDPS_TEST_STOP_AT")
if STOP_AT:
    from mlflow.tracking import MlflowClient

    stopped = []

    def stop():
        stopped.append(True)
        database = os.environ.get("EDPS_TEST_DATABASE")
        for _ in range(200):
            if not database:
                break
            connection = sqlite3.connect(database, timeout=0.01)
            try:
                connection.execute("BEGIN EXCLUSIVE")
                connection.rollback()
                break
            except sqlite3.OperationalError:
                time.sleep(0.01)
            finally:
                connection.close()
        os.kill(os.getpid(), signal.SIGSTOP)

    set_terminated, log_batch, search_runs = (MlflowClient.set_terminated, MlflowClient.log_batch,
                                              MlflowClient.search_runs)

    def stopping_set_terminated(self, run_id, status=None, end_time=None):
        if (STOP_AT == "trial-end" and not stopped and status == "FINISHED"
                and self.get_run(run_id).data.tags.get("edps.kind") == "trial"):
            stop()
        return set_terminated(self, run_id, status, end_time)

    def stopping_log_batch(self, run_id, metrics=(), params=(), tags=(), *args, **kwargs):
        if STOP_AT == "trial-outcome" and not stopped and any(tag.key == "edps.status" for tag in tags):
            stop()
        return log_batch(self, run_id, metrics, params, tags, *args, **kwargs)

    def stopping_search_runs(self, experiment_ids, filter_string="", *args, **kwargs):
        if STOP_AT == "sweep-claim" and not stopped and "'sweep'" in filter_string:
            stop()
        return search_runs(self, experiment_ids, filter_string, *args, **kwargs)

    MlflowClient.set_terminated = stopping_set_terminated
    MlflowClient.log_batch = stopping_log_batch
    MlflowClient.search_runs = stopping_search_runs
'''

STUDY = ["study", "--bs", "64", "--trials", "2", "--goal-error", "0.1", "--max-steps", "200", "--check-interval",
         "20", "--workers", "1"]


def _start_stopping(args: list[str], tmp_path: Path, uri: str, stop_at: str, **environment: str) -> subprocess.Popen:
    """`edps <args>` in a process that SIGSTOPs itself at ``stop_at`` (SITECUSTOMIZE)."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return subprocess.Popen([sys.executable, "-c", "from edps_mlflow.cli import main; main()", *args], cwd=tmp_path,
                            env=clean_environment(PYTHONPATH=f"{hooks}{os.pathsep}{REPO}", MLFLOW_TRACKING_URI=uri,
                                                  EDPS_LEASE_SECONDS=LEASE, EDPS_TEST_STOP_AT=stop_at, **environment),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_until_stopped(process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the process ended before it stopped itself: {process.communicate()}")
        if Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            return
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail("the process never reached the write it was to stop at")


def _runs(client: MlflowClient, experiment_id: str, kind: str) -> list:
    return client.search_runs([experiment_id], f"tags.`edps.kind` = '{kind}'", max_results=1000)


@pytest.mark.slow
@pytest.mark.parametrize("stop_at, store", [("trial-end", "sqlite"), ("trial-outcome", "server")])
def test_a_trial_end_written_after_a_takeover_counts_nowhere(stop_at, store, tmp_path, request):
    if store == "sqlite":
        uri = fresh_store(tmp_path / "mlflow.db")
        database = {"EDPS_TEST_DATABASE": str(tmp_path / "mlflow.db")}
    else:
        uri, database = request.getfixturevalue("mlflow_server"), {}
    experiment = f"fenced-{stop_at}-{time.time_ns()}"
    study = [*STUDY, "--experiment", experiment]
    client = MlflowClient(uri)
    stalled = _start_stopping(study, tmp_path, uri, stop_at, **database)
    _wait_until_stopped(stalled)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    [stalled_study] = [run.info.run_id for run in _runs(client, experiment_id, "study")]
    if store == "sqlite":
        assert not sqlite_locked(tmp_path / "mlflow.db")
    time.sleep(float(LEASE) + 1)

    # Another process finds the lease expired, marks the stalled runs FAILED and trains the whole study again.
    taker = run_edps([*study, "--wait"], cwd=tmp_path, timeout=600, MLFLOW_TRACKING_URI=uri, EDPS_LEASE_SECONDS=LEASE)
    assert taker.returncode == 0, taker.stderr[-3000:]
    [taken] = [run for run in _runs(client, experiment_id, "study") if run.info.status == "FINISHED"]
    steps = taken.data.metrics.get("steps_to_result")
    taker_trials = {run.info.run_id for run in _runs(client, experiment_id, "trial")
                    if run.data.tags.get("mlflow.parentRunId") == taken.info.run_id}

    # The stalled process wakes and sends the write it was stopped before: it lands, then the process stops.
    woken = _wake(stalled)
    assert woken.returncode == 3 and "lost its lease" in woken.stderr, woken.stdout[-2000:] + woken.stderr[-3000:]
    late = [run for run in _runs(client, experiment_id, "trial") if run.info.status == "FINISHED"
            and run.data.tags.get("mlflow.parentRunId") == stalled_study]
    assert len(late) == 1, "the late write landed (the fence, not a check, makes it harmless)"
    late_run = late[0].info.run_id

    # Nothing counts it: the other study stands, a third study of the family reuses only the other's trials, ...
    assert client.get_run(stalled_study).info.status == "FAILED"
    code, printed = edps_here([*STUDY[:4], "3", *STUDY[5:], "--experiment", experiment], uri,
                              EDPS_LEASE_SECONDS=LEASE)
    assert code == 0 and "reusing 2 finished trials" in printed, printed
    third = client.search_runs([experiment_id], "tags.`edps.kind` = 'study' and params.`spec.trials` = '3'")[0]
    table = pd.read_csv(client.download_artifacts(third.info.run_id, "trials.csv", str(tmp_path / "third")))
    assert set(table.loc[table["reused"], "run_id"]) <= taker_trials and late_run not in set(table["run_id"])
    # ... `edps status` shows the other study's result, the analysis its trials ...
    code, printed = edps_here(["status", "--experiment", experiment], uri)
    assert code == 0 and (str(int(steps)) if steps is not None else "-") in printed, printed
    studies = load_studies((experiment,), uri)
    row = studies[studies["study_key"] == taken.data.tags["edps.study_key"]]
    assert list(row["study_run_id"]) == [taken.info.run_id]
    assert len(load_trials(row, uri)) == 2
    # ... and doctor says what the late write is, and that it is harmless: not a trial trained twice.
    code, printed = edps_here(["doctor", "--experiment", experiment], uri, EDPS_LEASE_SECONDS=LEASE)
    assert code == 0, printed
    assert f"{late_run}: " in printed and "nothing counts it" in printed and "trained twice" not in printed, printed


@pytest.mark.slow
def test_a_sweep_woken_after_another_finished_its_grid_writes_nothing_to_its_run(mlflow_server, tmp_path):
    experiment = f"fenced-sweep-{time.time_ns()}"
    sweep = ["sweep", "--batch-sizes", "64", "--sparsities", "0", "--trials", "2", "--goal-error", "0.1",
             "--max-steps", "200", "--check-interval", "20", "--workers", "1", "--experiment", experiment]
    client = MlflowClient(mlflow_server)
    stalled = _start_stopping(sweep, tmp_path, mlflow_server, "sweep-claim")
    _wait_until_stopped(stalled)
    taker = run_edps(sweep, cwd=tmp_path, timeout=600, MLFLOW_TRACKING_URI=mlflow_server, EDPS_LEASE_SECONDS=LEASE)
    assert taker.returncode == 0, taker.stderr[-3000:]
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    [finished] = _runs(client, experiment_id, "sweep")
    assert finished.info.status == "FINISHED"

    woken = _wake(stalled)
    time.sleep(1)  # anything the woken process still wrote would be in the store by now
    [after] = _runs(client, experiment_id, "sweep")
    assert (after.info.status, after.info.end_time) == (finished.info.status, finished.info.end_time)
    assert after.data.tags.get("edps.lease_owner") == finished.data.tags.get("edps.lease_owner")
    assert woken.returncode == 0 and "already complete" in woken.stdout, woken.stdout[-2000:] + woken.stderr[-3000:]
    code, printed = edps_here(["doctor", "--experiment", experiment], mlflow_server, EDPS_LEASE_SECONDS=LEASE)
    assert code == 0, printed


# ---- the rules of every reader, on writes made in each order (fast: no training, a sqlite store) ------------
def _tracker(client, experiment_id: str, spec, epoch: int):
    from edps_mlflow.store.experiment import index_study_run
    from edps_mlflow.store.ownership.lease import OwnedRun
    from edps_mlflow.store.write.study import StudyTracker, create_study_run

    run_id = create_study_run(client, experiment_id, spec, epoch=epoch)
    index_study_run(client, run_id)  # as its claim does
    return StudyTracker(client, experiment_id, OwnedRun(client, run_id, None, "study", epoch), None, spec.study_key)


def _reached(index: int):
    from edps_mlflow.results import TrialResult, TrialStatus

    return TrialResult(index, TrialStatus.REACHED, 40, 40, 0.05, checks=2, checks_cut_short=0, seconds=1.0)


@pytest.mark.parametrize("late", ["before the taker read the trials", "after the taker read the trials"])
def test_a_trial_finished_late_counts_once_in_every_reader_whatever_the_order(late, sqlite_store):
    """The stalled process's end of a trial lands before the taker reads the study's finished trials (the taker
    reuses it: trained once) or after (the taker trains it again: only the taker's run counts)."""
    import io

    from mlflow.entities import RunTag

    from edps_mlflow.config import StudySpec, TrialSpec
    from edps_mlflow.doctor import run_doctor
    from edps_mlflow.store.client import StoreClient
    from edps_mlflow.store.experiment import index_study_run, resolve_experiment
    from edps_mlflow.store.ownership.claim import mark_dead
    from edps_mlflow.store.read.runs import latest_finished_study, planned_trial_counts, study_runs
    from edps_mlflow.store.read.status import study_rows
    from edps_mlflow.store.read.trials import finished_trials

    client, raw = StoreClient(sqlite_store), MlflowClient(sqlite_store)
    experiment_id = resolve_experiment(client, "orders")
    spec = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64, trials=2)
    trials = [TrialSpec(spec, index, {"learning_rate": 0.1 * (index + 1)}) for index in range(2)]
    stalled = _tracker(client, experiment_id, spec, 1)
    stalled.log_study_start(spec, {}, reused=0)
    for trial in trials:
        stalled.start_trial(trial, None)
    first = stalled.finish_trial(_reached(0))
    late_run = stalled.trial_runs[1]

    def late_end() -> None:  # what the stalled process's finish_trial sends once it wakes, its check passed before
        raw.log_batch(late_run, tags=[RunTag("edps.status", "reached")])
        raw.set_terminated(late_run, "FINISHED")

    # Its lease ran out: another process marks its runs FAILED and takes the study over in a run of the next epoch.
    mark_dead(client, [late_run, stalled.study_run_id], "no heartbeat for more than the lease")
    taker = _tracker(client, experiment_id, spec, 2)
    if late.startswith("before"):
        late_end()
    reused = finished_trials(client, experiment_id, spec)
    taker.adopt(reused.values())
    taker.log_study_start(spec, {}, reused=len(reused))
    if late.startswith("after"):
        late_end()
    for trial in trials:
        if trial.trial_key not in reused:
            taker.start_trial(trial, None)
            taker.finish_trial(_reached(trial.index))
    counted = {stored.run_id for stored in finished_trials(client, experiment_id, spec).values()}
    assert first in counted and len(counted) == 2 and (late_run in counted) == late.startswith("before")
    # a sweep's plan and `edps status` count each trial once (the taker's run seen as not live: a lease of 1 ms)
    stored = study_runs(client, experiment_id, spec.workload, 0.001)
    assert planned_trial_counts(client, experiment_id, stored, [spec.study_key]) == {spec.study_key: 2}
    # The stalled process's end of its study run lands too (finish_study: the end, then its index entry): it is not
    # the study's finished run, the taker's is.
    raw.set_terminated(stalled.study_run_id, "FINISHED")
    index_study_run(client, stalled.study_run_id)
    assert latest_finished_study(client, experiment_id, spec.study_key, False) is None
    taker.finish_study()
    assert latest_finished_study(client, experiment_id, spec.study_key, False).run_id == taker.study_run_id
    assert [s.run_id for s in study_runs(client, experiment_id, spec.workload, 60) if s.finished] == [
        taker.study_run_id]
    assert sorted(row.state.value for row in study_rows("orders", 60, sqlite_store)) == ["FAILED", "FINISHED"]
    assert list(load_studies(("orders",), sqlite_store)["study_run_id"]) == [taker.study_run_id]
    out = io.StringIO()
    assert run_doctor("orders", False, out, sqlite_store) == 0, out.getvalue()
    assert f"{stalled.study_run_id}: study run FINISHED by a process after its study was taken over" in out.getvalue()
    assert (f"{late_run}: trial run FINISHED by a process after its study was taken over" in out.getvalue()) == (
        late.startswith("after")), out.getvalue()


def test_a_former_owners_end_of_a_sweep_run_neither_stops_its_owner_nor_stands(sqlite_store, monkeypatch):
    """A sweep run is resumed under a new owner token; its former owner, woken, may still send the end it had
    checked for: while the owner works, its heartbeat puts RUNNING back; after the owner ended it, doctor
    reports the rewritten end and --repair puts back the end the owner recorded."""
    import io

    from edps_mlflow.doctor import run_doctor
    from edps_mlflow.store.client import StoreClient
    from edps_mlflow.store.experiment import resolve_experiment
    from edps_mlflow.store.ownership.lease import OwnedRun
    from edps_mlflow.store.read.fence import end_tags
    from edps_mlflow.store.write.sweep import create_sweep_run

    monkeypatch.setenv("EDPS_LEASE_SECONDS", LEASE)
    client, raw = StoreClient(sqlite_store), MlflowClient(sqlite_store)
    experiment_id = resolve_experiment(client, "sweep-ends")
    former, owner = "f" * 32, "0" * 32
    run_id = create_sweep_run(client, experiment_id, "sweep", "s1", "digits-simple-cnn", former)

    def former_end(status: str) -> None:  # what OwnedRun's end sends, its check passed before the takeover
        ended = int(time.time() * 1000)
        raw.set_tag(run_id, *next(iter(end_tags(former, status, ended).items())))
        raw.set_terminated(run_id, status, end_time=ended)

    raw.set_tag(run_id, "edps.lease_owner", owner)  # the takeover (claim._take_over)
    owned = OwnedRun(client, run_id, owner, "sweep")
    owned.start_heartbeat()
    former_end("FAILED")
    deadline = time.monotonic() + 10
    while raw.get_run(run_id).info.status != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    owned.require()  # still ours: the former owner's end did not take it
    owned.finish()
    ended = raw.get_run(run_id).info.end_time
    time.sleep(0.01)
    former_end("FINISHED")
    out = io.StringIO()
    assert run_doctor("sweep-ends", False, out, sqlite_store) == 1, out.getvalue()
    assert f"{run_id}: sweep run's end was rewritten by a process that did not own it" in out.getvalue()
    out = io.StringIO()
    assert run_doctor("sweep-ends", True, out, sqlite_store) == 0, out.getvalue()
    assert raw.get_run(run_id).info.end_time == ended and raw.get_run(run_id).info.status == "FINISHED"


def test_a_study_marked_dead_by_its_sweep_still_marks_the_trial_runs_it_opened(sqlite_store):
    """An interrupted sweep marks its study run dead, maybe just after the study's process opened a trial run the
    sweep did not see: the study's own abort leaves the study run as the sweep marked it and ends that trial run
    (it once left it RUNNING, since the study run was no longer its own)."""
    from edps_mlflow.config import StudySpec
    from edps_mlflow.store.client import StoreClient
    from edps_mlflow.store.experiment import resolve_experiment
    from edps_mlflow.store.ownership.claim import mark_dead
    from edps_mlflow.store.ownership.lease import abort_guard

    client, raw = StoreClient(sqlite_store), MlflowClient(sqlite_store)
    spec = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64, trials=1)
    study = _tracker(client, resolve_experiment(client, "cancelled"), spec, 1)
    with pytest.raises(KeyboardInterrupt), abort_guard(study.owned, study.open_trial_runs):
        mark_dead(client, [study.study_run_id], "the sweep that submitted it was interrupted")
        study.trial_runs[0] = raw.create_run(study.experiment_id).info.run_id  # opened as the sweep marked
        raise KeyboardInterrupt
    assert raw.get_run(study.study_run_id).info.status == "FAILED"  # as the sweep marked it
    assert raw.get_run(study.trial_runs[0]).info.status == "KILLED"
