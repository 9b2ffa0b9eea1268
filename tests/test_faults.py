"""Faults on purpose: SIGKILL at random moments, the same study several times at once, concurrent sweeps,
a tracking server that goes away (concurrent first use of a new store: tests/test_store_plugin.py). Real
processes, real signals, the digits workload."""

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

from conftest import REPO, clean_environment, edps_here, run_edps
from edps_mlflow.errors import EdpsError

EDPS = [sys.executable, "-c", "from edps_mlflow.cli import main; main()"]
SMALL_STUDY = ["study", "--trials", "1", "--goal-error", "0.06", "--max-steps", "200", "--check-interval", "20",
               "--workers", "1", "--log-interval", "5"]
# Builds the store as every edps command does, then stops (no torch: a kill lands in initialisation).
INITIALISE = "import sys; from edps_mlflow.store.client import open_store; open_store(sys.argv[1])"


def _popen(args: list[str], cwd: Path, **environment: str) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=cwd, env=clean_environment(PYTHONPATH=str(REPO), **environment),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.slow
def test_sigkill_during_initialisation_leaves_a_usable_store(tmp_path):
    rng = random.Random(os.getpid())
    moments = []
    rounds = 3  # two kills at random moments of the migration, one before it begins
    for number in range(rounds):
        database = tmp_path / f"store-{number}" / "mlflow.db"
        database.parent.mkdir()
        uri = f"sqlite:///{database}"
        victim = _popen([sys.executable, "-c", INITIALISE, uri], tmp_path)
        # Wait for the migration to begin (its temporary file appears), then kill at a random moment
        # of it (it takes several seconds here); the last round kills before it begins.
        started = time.monotonic()
        while number < rounds - 1 and not list(database.parent.glob(".mlflow.db.*")) and victim.poll() is None:
            assert time.monotonic() - started < 120
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 4.0) if number < rounds - 1 else 0.5)
        building = bool(list(database.parent.glob(".mlflow.db.*")))
        os.killpg(victim.pid, signal.SIGKILL)
        victim.communicate()
        moments.append((round(time.monotonic() - started, 2), "mid-migration" if building else
                        ("store complete" if database.exists() else "before the migration")))
        # Killed at any moment: no store, or a complete one; never a half-migrated file in its place.
        after = _popen([sys.executable, "-c", INITIALISE, uri], tmp_path)
        _, stderr = after.communicate(timeout=120)
        assert after.returncode == 0, (moments[-1], stderr[-1500:])
        assert not list(database.parent.glob(".mlflow.db.*")), "a killed builder's temporary file is removed"
        assert MlflowClient(uri).search_experiments()
    # And a real command on the last of them.
    done = run_edps([*SMALL_STUDY, "--bs", "64", "--experiment", "after-kill"], cwd=tmp_path,
                    MLFLOW_TRACKING_URI=uri, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    print(f"killed during initialisation (seconds after start, state): {moments}; each store usable afterwards")


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


@pytest.mark.slow
def test_the_same_study_three_times_at_once_trains_once(tmp_path):
    """Two plain studies and one with --wait, started together: one trains, a plain loser stops with
    one line, the waiting one ends with the winner's result. Nothing is trained twice."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*EDPS, *SMALL_STUDY, "--trials", "2", "--bs", "32", "--experiment", "same-study"]
    processes = [_popen([*args, *extra], tmp_path, MLFLOW_TRACKING_URI=uri) for extra in ([], [], ["--wait"])]
    outputs = [p.communicate(timeout=300) for p in processes]
    codes = [p.returncode for p in processes]
    # The waiting one always ends well. A plain one ends well when it trained (it won) or started after
    # the winner finished ("already done"), and stops with one line while another run is live: when the
    # waiting one wins, both plain ones stop.
    assert codes[2] == 0, outputs[2][1][-2000:]
    assert set(codes) <= {0, 2}, [(c, err[-800:]) for c, (_, err) in zip(codes, outputs, strict=True)]
    for code, (_, stderr) in zip(codes, outputs, strict=True):
        if code == 2:  # one error line; a wait for the new store's creation lock may have been said before it
            lines = [line for line in stderr.strip().splitlines() if not line.startswith("edps-mlflow: waiting up to")]
            assert len(lines) == 1 and "live run" in stderr and "--wait" in stderr, stderr
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("same-study").experiment_id
    runs = client.search_runs([experiment_id])
    studies = [r for r in runs if r.data.tags.get("edps.kind") == "study" and r.info.status == "FINISHED"]
    trials = [r.data.tags["edps.trial_key"] for r in runs if r.data.tags.get("edps.kind") == "trial"]
    assert len(studies) == 1 and len(trials) == len(set(trials)) == 2
    assert all(r.info.status != "RUNNING" for r in runs)
    steps = studies[0].data.metrics.get("steps_to_result")
    waited = outputs[2][0]
    assert f"steps_to_result = {int(steps)}" in waited if steps is not None else True
    code, printed = edps_here(["doctor", "--experiment", "same-study"], uri)
    assert code == 0, printed


def test_mlflow_run_id_of_a_finished_study_is_refused(sqlite_store):
    """`mlflow run` hands its run to the study through MLFLOW_RUN_ID; the id of a finished study's run (a
    stale variable, a copied command line) is refused in one line and the finished run is left as it was.
    In this process (the refusal is the CLI's, not a process boundary's)."""
    code, printed = edps_here([*SMALL_STUDY, "--bs", "64", "--experiment", "launcher"], sqlite_store)
    assert code == 0, printed[-2000:]
    client = MlflowClient(sqlite_store)
    experiment_id = client.get_experiment_by_name("launcher").experiment_id
    study = client.search_runs([experiment_id], "tags.`edps.kind` = 'study'")[0]
    code, printed = edps_here([*SMALL_STUDY, "--bs", "128", "--experiment", "launcher"], sqlite_store,
                              MLFLOW_RUN_ID=study.info.run_id)
    assert code == 2
    assert printed.strip().count("\n") == 0 and "MLFLOW_RUN_ID" in printed, printed
    after = client.get_run(study.info.run_id)
    assert after.info.status == "FINISHED" and "edps.error" not in after.data.tags


def test_an_unreachable_server_fails_fast_with_one_line(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    result = run_edps(["status", "--experiment", "x"], cwd=tmp_path, timeout=120,
                      MLFLOW_TRACKING_URI=f"http://user:secret@127.0.0.1:{port}")
    seconds = time.monotonic() - started
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "secret" not in lines[0], result.stderr
    assert seconds < 40, seconds
    print(f"unreachable server: failed in {seconds:.1f} s")


def test_doctor_reports_each_broken_invariant_and_repairs_expired_runs(sqlite_store, tmp_path):
    client = MlflowClient(sqlite_store)
    experiment_id = client.create_experiment("doctor-test")
    old = f"{time.time() - 3600:.3f}"
    dead_study = client.create_run(experiment_id, tags={"edps.kind": "study", "edps.study_key": "k1",
                                                        "edps.heartbeat": old}).info.run_id
    orphan_trial = client.create_run(experiment_id, tags={"edps.kind": "trial", "edps.trial_key": "t0",
                                                          "edps.study_key": "k1",
                                                          "mlflow.parentRunId": dead_study}).info.run_id
    keyless = client.create_run(experiment_id, tags={"edps.kind": "trial", "edps.version": "0.1.0"}).info.run_id
    client.set_terminated(keyless, "FAILED")
    for _ in range(2):  # one trial trained twice, as older versions could
        run = client.create_run(experiment_id, tags={"edps.kind": "trial", "edps.trial_key": "t1",
                                                     "edps.study_key": "k2"})
        client.set_terminated(run.info.run_id, "FINISHED")
    live_study = client.create_run(experiment_id, tags={"edps.kind": "study", "edps.study_key": "k3",
                                                        "edps.heartbeat": f"{time.time() + 600:.3f}"})
    # What a process stalled past its lease wrote when it woke, as versions before the ownership checks did:
    # a trial finished after its study run had been ended by the process that took the study over ...
    taken_over = client.create_run(experiment_id, tags={"edps.kind": "study", "edps.study_key": "k4"}).info.run_id
    client.set_terminated(taken_over, "FAILED")
    time.sleep(0.01)
    late_trial = client.create_run(experiment_id, tags={"edps.kind": "trial", "edps.trial_key": "t2",
                                                        "edps.study_key": "k4",
                                                        "mlflow.parentRunId": taken_over}).info.run_id
    client.set_terminated(late_trial, "FINISHED")
    # ... a trial that the other process had marked FAILED, flipped to FINISHED (its study ended later) ...
    flipped_parent = client.create_run(experiment_id, tags={"edps.kind": "study", "edps.study_key": "k5"}).info.run_id
    flipped_trial = client.create_run(experiment_id, tags={
        "edps.kind": "trial", "edps.trial_key": "t3", "edps.study_key": "k5", "mlflow.parentRunId": flipped_parent,
        "edps.error": "no heartbeat for more than the lease of 30 s: its process is gone"}).info.run_id
    client.set_terminated(flipped_trial, "FINISHED")
    client.set_terminated(flipped_parent, "FAILED")
    # ... and a sweep run that another process finished, overwritten FAILED by the stalled one's abort.
    overwritten_sweep = client.create_run(experiment_id, tags={"edps.kind": "sweep", "edps.sweep_key": "s1"}).info.run_id
    client.log_metric(overwritten_sweep, "studies/done", 4)
    client.set_terminated(overwritten_sweep, "FAILED")
    result = run_edps(["doctor", "--experiment", "doctor-test"], cwd=tmp_path, MLFLOW_TRACKING_URI=sqlite_store)
    assert result.returncode == 1, result.stdout + result.stderr
    # Problems only: not the summary line, nor the line that says the study index is not complete (these runs
    # were made by hand, not by edps, which makes an experiment with its index).
    lines = [line for line in result.stdout.splitlines()
             if not line.endswith("runs checked") and "the study index is not complete" not in line]
    assert len(lines) == 7, result.stdout
    assert any(dead_study in line and "owner is gone" in line for line in lines)
    assert any(orphan_trial in line and "owner is gone" in line for line in lines)
    assert any("without its key" in line for line in lines)
    assert any("t1: 2 FINISHED trial runs" in line for line in lines)
    assert any(late_trial in line and "after its lease was lost" in line for line in lines)
    assert any(flipped_trial in line and "after its lease was lost" in line for line in lines)
    assert any(overwritten_sweep in line and "finished its grid" in line for line in lines)
    repaired = run_edps(["doctor", "--experiment", "doctor-test", "--repair"], cwd=tmp_path,
                        MLFLOW_TRACKING_URI=sqlite_store)
    assert repaired.returncode == 1, repaired.stdout
    assert repaired.stdout.count("marked FAILED (owner gone)") == 2, repaired.stdout
    assert repaired.stdout.count("marked FAILED (finished after its lease was lost)") == 2, repaired.stdout
    assert repaired.stdout.count("marked FINISHED (it had finished its grid)") == 1, repaired.stdout
    # A second check reads only the runs made since the first, and those of the problems it found: the same
    # problems are still reported (and the study index, completed by --repair, is not mentioned any more).
    again = run_edps(["doctor", "--experiment", "doctor-test"], cwd=tmp_path, MLFLOW_TRACKING_URI=sqlite_store)
    assert again.returncode == 1 and "the study index is not complete" not in again.stdout, again.stdout
    assert "without its key" in again.stdout and "t1: 2 FINISHED trial runs" in again.stdout, again.stdout
    assert client.get_run(dead_study).info.status == "FAILED"
    assert client.get_run(orphan_trial).info.status == "FAILED"
    assert client.get_run(live_study.info.run_id).info.status == "RUNNING"  # a live lease is left alone
    assert client.get_run(late_trial).info.status == client.get_run(flipped_trial).info.status == "FAILED"
    assert client.get_run(overwritten_sweep).info.status == "FINISHED"


def test_doctor_repair_says_that_a_runs_owner_exited(sqlite_store, tmp_path):
    """A study run whose owner process on this machine exited, its heartbeat still fresh, is repaired with that
    reason, as the next command marks it (before: "no heartbeat for more than the lease", which was not so)."""
    owner = subprocess.run([sys.executable, "-c", "from edps_mlflow.store.ownership.owner import owner_tag; "
                            "print(owner_tag())"], env=clean_environment(PYTHONPATH=str(REPO)), capture_output=True,
                           text=True, check=True).stdout.strip()
    client = MlflowClient(sqlite_store)
    experiment_id = client.create_experiment("doctor-owner")
    run_id = client.create_run(experiment_id, tags={"edps.kind": "study", "edps.study_key": "k1",
                                                    "edps.heartbeat": f"{time.time():.3f}",
                                                    "edps.owner_process": owner}).info.run_id
    result = run_edps(["doctor", "--experiment", "doctor-owner", "--repair"], cwd=tmp_path,
                      MLFLOW_TRACKING_URI=sqlite_store)
    run = client.get_run(run_id)
    assert run.info.status == "FAILED", result.stdout + result.stderr
    assert "exited" in run.data.tags["edps.error"], run.data.tags["edps.error"]


def test_transient_store_errors_are_retried_and_others_are_not(monkeypatch, capsys):
    """A locked store is tried STORE_ATTEMPTS times; an unreachable one up to EDPS_OUTAGE_SECONDS (on a clock that
    the sleeps advance), said once on one line."""
    from mlflow.exceptions import MlflowException

    from edps_mlflow.store import client as store

    clock = [0.0]
    monkeypatch.setattr(store.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    monkeypatch.setattr(store.time, "monotonic", lambda: clock[0])
    monkeypatch.setenv("EDPS_OUTAGE_SECONDS", "30")
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise MlflowException("(sqlite3.OperationalError) database is locked")
        return "ok"

    assert store.call_store(flaky) == "ok" and len(calls) == 3
    with pytest.raises(MlflowException):
        store.call_store(lambda: (_ for _ in ()).throw(MlflowException("RESOURCE_DOES_NOT_EXIST: no run")))
    always, clock[0] = [], 0.0
    with pytest.raises(EdpsError, match=r"unreachable for 30 s, longer than EDPS_OUTAGE_SECONDS=30 \(set it higher "
                       r"to wait longer\): API request failed: Max retries exceeded with url$"):  # our words
        store.call_store(lambda: always.append(1) or (_ for _ in ()).throw(
            MlflowException("API request failed: Max retries exceeded with url")), uri="http://127.0.0.1:1")
    assert clock[0] == 30 and len(always) > store.STORE_ATTEMPTS  # the pauses end at the bound
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("waiting for tracking store ") and "up to 30 s" in said[0], said
    locked = []
    with pytest.raises(MlflowException):
        store.call_store(lambda: locked.append(1) or (_ for _ in ()).throw(MlflowException("database is locked")))
    assert len(locked) == store.STORE_ATTEMPTS
    once = []
    with pytest.raises(MlflowException):  # the last try after a failure (an abort): never waits
        store.call_store(lambda: once.append(1) or (_ for _ in ()).throw(MlflowException("connection refused")), 1)
    assert len(once) == 1


def test_keys_include_the_data_fingerprint():
    from dataclasses import replace

    import torch

    from edps_mlflow.config import StudySpec, TrialSpec
    from edps_mlflow.data.fingerprint import splits_fingerprint
    from edps_mlflow.workloads import get_workload

    started = time.perf_counter()
    data = get_workload("digits-simple-cnn").load_data(None)
    fingerprint = splits_fingerprint(data)
    assert time.perf_counter() - started < 5 and fingerprint == splits_fingerprint(data)
    changed = replace(data, train_labels=torch.roll(data.train_labels, 1))
    assert splits_fingerprint(changed) != fingerprint
    spec = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64, trials=2)
    with_data = replace(spec, data_fingerprint=fingerprint)
    other_data = replace(spec, data_fingerprint=splits_fingerprint(changed))
    assert len({spec.study_key, with_data.study_key, other_data.study_key}) == 3
    point = {"learning_rate": 0.1}
    assert TrialSpec(with_data, 0, point).trial_key != TrialSpec(other_data, 0, point).trial_key
    assert "data_fingerprint" not in spec.key_fields()  # runs made before fingerprints keep their keys


def test_fingerprints_of_data_files_are_cached_per_file_set(tmp_path, monkeypatch):
    from edps_mlflow.data.fingerprint import cached_fingerprint, splits_fingerprint
    from edps_mlflow.workloads import get_workload

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data = get_workload("digits-simple-cnn").load_data(None)
    source = tmp_path / "train.bin"
    source.write_bytes(b"one")
    loads = []

    def load():
        loads.append(1)
        return data

    first = cached_fingerprint([source], load)
    assert first == splits_fingerprint(data) and cached_fingerprint([source], load) == first and len(loads) == 1
    source.write_bytes(b"other")  # another size (and mtime): loaded and hashed again
    cached_fingerprint([source], load)
    assert len(loads) == 2
    # Another workload may split the same files differently: its own entry.
    halved = type(data)(data.train_images[:10], data.train_labels[:10], data.validation_images,
                        data.validation_labels)
    assert cached_fingerprint([source], lambda: halved, "another-workload") == splits_fingerprint(halved) != first
    assert cached_fingerprint([source], load) == first and len(loads) == 2
    # The bundled digits: cached by their file, so a sweep plans without loading them (or torch).
    digits = get_workload("digits-simple-cnn")
    assert digits.data_fingerprint(None) == splits_fingerprint(data) == digits.data_fingerprint(None)
    assert len(list((tmp_path / "cache").rglob("*.txt"))) == 4  # two file sets, another workload, the digits
