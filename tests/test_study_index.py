"""The study index (store/index.py): readers of every study see each study run once, from entries that never
claim more than the store holds; a complete index is read with searches on run attributes only (a search on
a tag's value scans the tags of every run in the store); doctor finds a trial trained twice by two study
runs of one family without reading the other families' trial runs. Real sqlite stores, real MLflow writes."""

from __future__ import annotations

import io
import time

import pytest
from mlflow.entities import Metric, RunStatus
from mlflow.tracking import MlflowClient

from edps_mlflow import names as n
from edps_mlflow.config import StudySpec, study_family, trial_families
from edps_mlflow.doctor import run_doctor
from edps_mlflow.store import index as study_index
from edps_mlflow.store.client import StoreClient, searcher
from edps_mlflow.store.index import RunDataView, RunInfoView, RunView, entry_of
from edps_mlflow.store.ownership.lease import OwnedRun
from edps_mlflow.store.read.doctor import CLOCK_MARGIN_MS, doctor_read
from edps_mlflow.store.read.runs import keyed_runs, study_runs, trial_runs_finished
from edps_mlflow.store.experiment import index_study_run, resolve_experiment
from edps_mlflow.store.write.study import StudyTracker, create_study_run
from conftest import run_edps

FINISHED, FAILED = RunStatus.to_string(RunStatus.FINISHED), RunStatus.to_string(RunStatus.FAILED)


def _spec(batch_size: int) -> StudySpec:
    return StudySpec.build("digits-simple-cnn", "sgd", 0.0, batch_size, trials=2)


def _study(client: StoreClient, experiment_id: str, spec: StudySpec) -> StudyTracker:
    """A study run as a study makes it (create_study_run, then its claim indexes it), owned by this process (no
    lease renewal)."""
    run_id = create_study_run(client, experiment_id, spec, epoch=1)
    index_study_run(client, run_id)
    return StudyTracker(client, experiment_id, OwnedRun(client, run_id, None, f"study {spec.batch_size}"), None,
                        spec.study_key)


def _abort(tracker: StudyTracker, interrupted: bool) -> None:
    """What the abort guard does when a study fails (KILLED on an interrupt, FAILED on an error)."""
    tracker.owned.abort(interrupted, list(tracker.trial_runs.values()))
    tracker.close()


def _recording(client: StoreClient, experiment_id: str) -> tuple[study_index.Search, list[str]]:
    """The store's search of the experiment, recording every filter it sends to the store."""
    sent: list[str] = []
    search = searcher(client, [experiment_id])

    def recorded(conditions: str, deleted: bool, most: int | None):
        sent.append(conditions)
        return search.runs(conditions, deleted, most)

    return study_index.Search(search.experiment_ids, recorded), sent


def _keys(runs) -> dict[str, str]:
    return {run.info.run_id: run.info.status for run in runs}


def test_readers_see_each_study_run_once_and_a_complete_index_is_read_by_run_attributes(sqlite_store):
    client = StoreClient(sqlite_store)
    experiment_id = resolve_experiment(client, "index-test")  # made with it: a complete index
    done = _study(client, experiment_id, _spec(16))
    done.finish_study()
    live = _study(client, experiment_id, _spec(32))
    # Ended by another hand (MLflow Projects, a kill after the change): its entry still says RUNNING.
    ended = _study(client, experiment_id, _spec(64))
    client.set_terminated(ended.study_run_id, FAILED)
    deleted = _study(client, experiment_id, _spec(128))
    deleted.finish_study()
    client.delete_run(deleted.study_run_id)
    # An entry is a snapshot of the finished run: the reader takes the index's copy, not the store's.
    client.set_tag(done.study_run_id, n.TAG_BATCH_SIZE, "999")

    search, sent = _recording(client, experiment_id)
    runs = study_index.study_runs(search)
    assert _keys(runs) == {done.study_run_id: FINISHED, live.study_run_id: "RUNNING", ended.study_run_id: FAILED}
    assert next(r for r in runs if r.info.run_id == done.study_run_id).data.tags[n.TAG_BATCH_SIZE] == "16"
    assert all(run.indexed for run in runs)
    # MLflow searches a run's name as a tag: the index run is found by its start time instead.
    assert sent and not [conditions for conditions in sent if "tags." in conditions or "run_name" in conditions], sent
    # The one deleted run is among the deleted runs listed without a filter: the only search by id is that of
    # the entries that say RUNNING (live and ended).
    assert sent[-1] == "" and len([conditions for conditions in sent if "run_id" in conditions]) == 1, sent
    # The sweep's plan reads the same: one run per study, the finished one done.
    stored = {s.study_key: s for s in study_runs(client, experiment_id, "digits-simple-cnn", 60.0)}
    assert stored[_spec(16).study_key].finished and stored[_spec(32).study_key].live
    assert _spec(128).study_key not in stored
    for tracker in (live, ended):
        tracker.close()


def test_many_deleted_runs_are_looked_up_by_id(sqlite_store, monkeypatch):
    """Beyond DELETED_LISTED deleted runs in the experiment, the indexed study runs are looked up among the
    deleted ones by id: a deleted study run is left out as before, and the deleted runs are not all read."""
    client = StoreClient(sqlite_store)
    experiment_id = resolve_experiment(client, "many-deleted")
    kept = _study(client, experiment_id, _spec(16))
    kept.finish_study()
    gone = _study(client, experiment_id, _spec(32))
    gone.finish_study()
    client.delete_run(gone.study_run_id)
    for _ in range(3):  # a user's deleted runs, not studies
        client.delete_run(client.create_run(experiment_id).info.run_id)
    monkeypatch.setattr(study_index, "DELETED_LISTED", 2)
    search, sent = _recording(client, experiment_id)
    assert set(_keys(study_index.study_runs(search))) == {kept.study_run_id}
    assert [conditions for conditions in sent if "run_id" in conditions], sent
    assert study_index.deleted_among(search, [kept.study_run_id, gone.study_run_id]) == {gone.study_run_id}
    monkeypatch.setattr(study_index, "DELETED_LISTED", 100)
    assert study_index.deleted_among(search, [kept.study_run_id, gone.study_run_id]) == {gone.study_run_id}
    assert study_index.deleted_among(search, []) == set()


def test_an_entry_never_claims_more_than_the_store_holds(sqlite_store):
    client = StoreClient(sqlite_store)
    experiment_id = resolve_experiment(client, "entries")
    tracker = _study(client, experiment_id, _spec(16))
    index = study_index.index_runs(searcher(client, [experiment_id]))[0]
    entry = study_index.view_of_entry(study_index.entries(index)[tracker.study_run_id], tracker.study_run_id)
    assert entry.info.status == "RUNNING"  # written when it started: readers look it up in the store
    _abort(tracker, interrupted=True)
    index = study_index.index_runs(searcher(client, [experiment_id]))[0]
    entry = study_index.view_of_entry(study_index.entries(index)[tracker.study_run_id], tracker.study_run_id)
    assert entry.info.status == "KILLED" == client.get_run(tracker.study_run_id).info.status
    # An entry too long for a tag drops the trial outcomes first, and is not written at all when that is not enough.
    view = RunView(RunInfoView("r1", "1", FINISHED, 1, 2),
                   RunDataView({n.TAG_KIND: n.KIND_STUDY, n.TAG_TRIAL_OUTCOMES: "v1 " + "0:r1@1 " * 2000}, {}, {}))
    shorter = study_index.view_of_entry(entry_of(view), "r1")
    assert n.TAG_TRIAL_OUTCOMES not in shorter.data.tags and shorter.data.tags[n.TAG_KIND] == n.KIND_STUDY
    huge = RunView(view.info, RunDataView({}, {"p": "x" * 9000}, {}))
    assert entry_of(huge) is None


def test_an_incomplete_index_is_read_with_the_study_runs_and_repair_completes_it(sqlite_store, tmp_path):
    client = StoreClient(sqlite_store)
    raw = MlflowClient(sqlite_store)
    experiment_id = raw.create_experiment("old-store")  # not made by edps: no index
    old = raw.create_run(experiment_id, tags={n.TAG_KIND: n.KIND_STUDY, n.TAG_STUDY_KEY: "old-key",
                                              n.TAG_WORKLOAD: "digits-simple-cnn"}).info.run_id
    raw.set_terminated(old, FINISHED)
    new = _study(client, experiment_id, _spec(16))  # makes an index, not complete: old is not in it
    new.finish_study()
    search, sent = _recording(client, experiment_id)
    assert set(_keys(study_index.study_runs(search))) == {old, new.study_run_id}
    assert [conditions for conditions in sent if "tags." in conditions], "an incomplete index searches by tag"

    out = io.StringIO()
    assert run_doctor("old-store", False, out, sqlite_store) == 0
    assert "the study index is not complete" in out.getvalue(), out.getvalue()
    # An experiment of no studies (MLflow's Default in a store that README's sweep made) has nothing to index.
    raw.create_experiment("no-studies")
    out = io.StringIO()
    assert run_doctor("no-studies", False, out, sqlite_store) == 0
    assert "the study index is not complete" not in out.getvalue(), out.getvalue()
    out = io.StringIO()
    assert run_doctor("old-store", True, out, sqlite_store) == 0
    assert "repaired: 1 study runs added to the study index; it is complete" in out.getvalue(), out.getvalue()
    search, sent = _recording(client, experiment_id)
    assert set(_keys(study_index.study_runs(search))) == {old, new.study_run_id}
    assert not [conditions for conditions in sent if "tags." in conditions], sent


def test_an_index_run_made_when_it_was_created_is_found_by_its_name_and_each_experiment_keeps_its_own_index(
        sqlite_store):
    client = StoreClient(sqlite_store)
    raw = MlflowClient(sqlite_store)
    # An experiment whose index run an earlier version made: started when it was made, found by its name.
    earlier = raw.create_experiment("index-made-earlier")
    index = raw.create_run(earlier, tags={n.TAG_KIND: n.KIND_STUDY_INDEX, n.MLFLOW_RUN_NAME: n.INDEX_RUN_NAME,
                                          n.TAG_INDEX_COMPLETE: "true"}).info.run_id
    assert raw.get_run(index).info.start_time > n.INDEX_START_TIME
    first = _study(client, earlier, _spec(16))
    first.finish_study()
    assert n.TAG_INDEX_PREFIX + first.study_run_id in raw.get_run(index).data.tags  # written to that index run
    # An experiment made now, with its index run at the epoch, and a study run written after it.
    current = resolve_experiment(client, "index-made-now")
    second = _study(client, current, _spec(32))
    second.finish_study()
    # A study run in an experiment without an index run (made by hand): searched by its tags.
    bare = raw.create_experiment("no-index")
    by_hand = raw.create_run(bare, tags={n.TAG_KIND: n.KIND_STUDY, n.TAG_STUDY_KEY: "by-hand"}).info.run_id
    raw.set_terminated(by_hand, FINISHED)

    search, sent = _recording(client, earlier)
    assert [run.info.run_id for run in study_index.index_runs(search)] == [index]
    assert set(_keys(study_index.study_runs(search))) == {first.study_run_id}
    # Over all three: each experiment's study runs, though one of them has a complete index at the epoch.
    both = searcher(client, [earlier, current, bare])
    assert {str(run.info.experiment_id) for run in study_index.index_runs(both)} == {earlier, current}
    assert set(_keys(study_index.study_runs(both))) == {first.study_run_id, second.study_run_id, by_hand}
    search, sent = _recording(client, current)
    assert set(_keys(study_index.study_runs(search))) == {second.study_run_id}
    assert not [conditions for conditions in sent if "run_name" in conditions or "tags." in conditions], sent


def _trial(client: MlflowClient, experiment_id: str, parent: str, family: str, trial_key: str) -> str:
    run_id = client.create_run(experiment_id, tags={
        n.TAG_KIND: n.KIND_TRIAL, n.TAG_TRIAL_KEY: trial_key, n.TAG_STUDY_KEY: f"study-of-{family}",
        n.TAG_STUDY_FAMILY: family, n.MLFLOW_PARENT_RUN_ID: parent, n.TAG_VERSION: "0.1.0"}).info.run_id
    client.set_terminated(run_id, FINISHED)
    return run_id


def test_doctor_finds_a_trial_trained_twice_by_two_study_runs_of_a_family_and_reads_no_other_trial_runs(
        sqlite_store):
    client = StoreClient(sqlite_store)
    raw = MlflowClient(sqlite_store)
    experiment_id = resolve_experiment(client, "twice")
    spec = _spec(16)
    family = study_family(spec)
    assert trial_families(spec) == [family]
    # A study run killed after it finished trial t, and its resume, which trained t again: both FINISHED.
    killed = _study(client, experiment_id, spec)
    first = _trial(raw, experiment_id, killed.study_run_id, family, "t")
    _abort(killed, interrupted=True)
    resumed = _study(client, experiment_id, spec)
    second = _trial(raw, experiment_id, resumed.study_run_id, family, "t")
    raw.log_batch(resumed.study_run_id, metrics=[Metric(n.METRIC_TRIAL_RUNS_FINISHED, 1, int(time.time() * 1000), 0)])
    resumed.finish_study()
    # Another family with one study run that finished its three trials: nothing there can be trained twice.
    other = _study(client, experiment_id, _spec(64))
    others = [_trial(raw, experiment_id, other.study_run_id, study_family(_spec(64)), f"u{i}") for i in range(3)]
    raw.log_batch(other.study_run_id, metrics=[Metric(n.METRIC_TRIAL_RUNS_FINISHED, 3, int(time.time() * 1000), 0)])
    other.finish_study()

    read = {f.run_id for f in doctor_read(client, experiment_id).facts}
    assert {first, second} <= read and not read & set(others)
    for attempt in ("first check", "later check, from the runs since and the problems found"):
        out = io.StringIO()
        assert run_doctor("twice", False, out, sqlite_store) == 1, (attempt, out.getvalue())
        lines = [line for line in out.getvalue().splitlines() if "trained twice" in line]
        assert len(lines) == 1 and first in lines[0] and second in lines[0], (attempt, out.getvalue())


def test_the_project_executor_counts_trials_from_the_study_runs(sqlite_store):
    client = StoreClient(sqlite_store)
    experiment_id = resolve_experiment(client, "progress")
    tracker = _study(client, experiment_id, _spec(16))
    MlflowClient(sqlite_store).log_batch(tracker.study_run_id, metrics=[
        Metric(n.METRIC_TRIAL_RUNS_FINISHED, 5, int(time.time() * 1000), 0)])
    assert trial_runs_finished(client, experiment_id, [tracker.study_run_id]) == {tracker.study_run_id: 5}
    _abort(tracker, interrupted=False)


def test_a_later_doctor_check_reads_the_runs_since_and_those_of_the_problems_found_before(sqlite_store):
    client = StoreClient(sqlite_store)
    raw = MlflowClient(sqlite_store)
    experiment_id = resolve_experiment(client, "later-check")
    keyless = raw.create_run(experiment_id, tags={n.TAG_KIND: n.KIND_TRIAL, n.TAG_VERSION: "0.1.0"}).info.run_id
    raw.set_terminated(keyless, FAILED)
    fine = _trial(raw, experiment_id, "some-study", study_family(_spec(16)), "t")
    assert keyless in {f.run_id for f in doctor_read(client, experiment_id).facts}  # the first check: by tag
    # As if both had been checked long ago: only the run of the problem found then is read again.
    later = int(time.time() * 1000) + 2 * CLOCK_MARGIN_MS
    read = {f.run_id for f in doctor_read(client, experiment_id, later, recheck=[keyless]).facts}
    assert keyless in read and fine not in read
    assert fine in {f.run_id for f in doctor_read(client, experiment_id, later - 3 * CLOCK_MARGIN_MS).facts}


def test_a_first_doctor_check_of_an_experiment_made_by_edps_leaves_out_the_searches_for_keyless_runs(
        sqlite_store, tmp_path):
    """Every run of ours is created with its kind and keys in one request, so in an experiment edps-mlflow
    made only a run made by hand can lack them: the first check does not scan the store's tags for such runs
    (most of its cost on a large store), says so, and ``--full`` searches for them anyway, even after an
    earlier check (a later check reads only the runs since)."""
    client = StoreClient(sqlite_store)
    raw = MlflowClient(sqlite_store)
    experiment_id = resolve_experiment(client, "made-by-edps")
    assert raw.get_experiment(experiment_id).tags[n.EXPERIMENT_TAG_CREATED_BY].startswith("edps-mlflow ")
    keyless = raw.create_run(experiment_id, tags={n.TAG_KIND: n.KIND_TRIAL, n.TAG_VERSION: "0.1.0"}).info.run_id
    raw.set_terminated(keyless, FAILED)

    out = io.StringIO()
    assert run_doctor("made-by-edps", False, out, sqlite_store) == 0, out.getvalue()
    assert keyless not in out.getvalue() and "--full searches for them" in out.getvalue(), out.getvalue()
    assert keyless not in {f.run_id for f in doctor_read(client, experiment_id, search_malformed=False).facts}
    # A later check reads the runs made since the first (this one too, made within the margin for clocks): it
    # still has not searched the older ones, and says so.
    later = io.StringIO()
    run_doctor("made-by-edps", False, later, sqlite_store)
    assert "--full searches for them" in later.getvalue(), later.getvalue()
    result = run_edps(["doctor", "--experiment", "made-by-edps", "--full"], cwd=tmp_path,
                      MLFLOW_TRACKING_URI=sqlite_store)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{keyless}: is a trial run without its key" in result.stdout, result.stdout
    repaired = io.StringIO()  # --repair checks everything too
    assert run_doctor("made-by-edps", True, repaired, sqlite_store) == 1, repaired.getvalue()
    assert f"{keyless}: is a trial run without its key" in repaired.getvalue(), repaired.getvalue()
    assert "--full searches" not in result.stdout and "all runs checked" in result.stdout, result.stdout
    later = io.StringIO()  # after a check that searched, a later check has checked every run
    assert run_doctor("made-by-edps", False, later, sqlite_store) == 1, later.getvalue()
    assert "--full searches" not in later.getvalue() and "all runs checked" in later.getvalue(), later.getvalue()
    # An experiment made by hand keeps the searches in its first check (test_faults plants every problem there).
    other = raw.create_experiment("made-by-hand")
    planted = raw.create_run(other, tags={n.TAG_KIND: n.KIND_TRIAL, n.TAG_VERSION: "0.1.0"}).info.run_id
    raw.set_terminated(planted, FAILED)
    out = io.StringIO()
    assert run_doctor("made-by-hand", False, out, sqlite_store) == 1, out.getvalue()
    assert f"{planted}: is a trial run without its key" in out.getvalue(), out.getvalue()


def test_doctor_finds_a_trial_finished_after_its_study_run_ended_from_the_study_runs_family(sqlite_store):
    client = StoreClient(sqlite_store)
    raw = MlflowClient(sqlite_store)
    experiment_id = resolve_experiment(client, "late")
    # A study run killed (its process stalled, then taken over), and the trial that the woken process finished
    # afterwards, as versions before the ownership checks could.
    stalled = _study(client, experiment_id, _spec(16))
    _abort(stalled, interrupted=True)
    time.sleep(0.01)
    late = _trial(raw, experiment_id, stalled.study_run_id, study_family(_spec(16)), "t")
    # Another family with one finished study run: its trial runs are not read.
    other = _study(client, experiment_id, _spec(64))
    others = [_trial(raw, experiment_id, other.study_run_id, study_family(_spec(64)), f"u{i}") for i in range(2)]
    raw.log_batch(other.study_run_id, metrics=[Metric(n.METRIC_TRIAL_RUNS_FINISHED, 2, int(time.time() * 1000), 0)])
    other.finish_study()

    read = {f.run_id for f in doctor_read(client, experiment_id).facts}
    assert late in read and not read & set(others)
    out = io.StringIO()
    assert run_doctor("late", False, out, sqlite_store) == 1, out.getvalue()
    assert f"{late}: trial run FINISHED after its lease was lost" in out.getvalue(), out.getvalue()


def test_a_rival_run_that_reaches_the_store_late_with_an_earlier_start_still_wins(sqlite_store):
    """A process takes its run's start time, is descheduled, and writes its run only after another process
    made its own run of the same key and looked for rivals (seen on a loaded machine: two finished runs of one
    study). The claim looks again after a moment, finds the earlier run and gives way: one run keeps the key."""
    import threading

    from edps_mlflow.descriptions import study_tags
    from edps_mlflow.errors import EdpsError
    from edps_mlflow.store.ownership.claim import ClaimRules, OnLive, claim, live_runs

    client = StoreClient(sqlite_store)
    experiment_id = resolve_experiment(client, "late-rival")
    spec = _spec(64)
    started = int(time.time() * 1000) - 5_000  # the rival's start time, taken before ours
    rival: list[str] = []

    def late_rival() -> None:
        time.sleep(0.2)  # after our first look for rivals
        tags = {**study_tags(spec), n.TAG_HEARTBEAT: f"{time.time():.3f}"}
        rival.append(client.create_run(experiment_id, start_time=started, tags=tags).info.run_id)

    def create(token: str | None, epoch: int) -> str:
        run_id = create_study_run(client, experiment_id, spec, epoch=epoch)
        threading.Thread(target=late_rival).start()
        return run_id

    rules = ClaimRules(kind=n.KIND_STUDY, key=spec.study_key, label="study 64", on_live=OnLive.REFUSE, indexed=True)
    with pytest.raises(EdpsError, match="not starting a duplicate"):
        claim(client, experiment_id, rules, create, io.StringIO())
    runs = keyed_runs(client, experiment_id, n.KIND_STUDY, spec.study_key)
    assert [r.run_id for r in live_runs(runs, 120.0)] == rival  # ours gave way


class _InterruptedOnReturn(StoreClient):
    """A real client whose run creation is interrupted as it returns: what a Ctrl-C that a store call deferred to
    its end does (the run exists in the store, and its id never reaches the caller)."""

    def create_run(self, *args, **kwargs):
        super().__getattr__("create_run")(*args, **kwargs)
        raise KeyboardInterrupt


def test_a_trial_run_whose_creation_an_interrupt_cut_off_is_marked_too(sqlite_store):
    from edps_mlflow.config import TrialSpec
    from edps_mlflow.store.ownership.lease import abort_guard

    client = StoreClient(sqlite_store)
    experiment_id = resolve_experiment(client, "cut-off")
    spec = _spec(16)
    tracker = _study(client, experiment_id, spec)
    tracker.client = _InterruptedOnReturn(sqlite_store)
    with pytest.raises(KeyboardInterrupt), abort_guard(tracker.owned, tracker.open_trial_runs, tracker.close):
        tracker.start_trial(TrialSpec(spec, 0, {"learning_rate": 0.1}), None)
    runs = client.search_runs([experiment_id], f"tags.`{n.TAG_KIND}` != 'study_index'")
    assert sorted((r.data.tags[n.TAG_KIND], r.info.status) for r in runs) == [("study", "KILLED"), ("trial", "KILLED")]
