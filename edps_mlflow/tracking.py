"""Every MLflow write of the training side, and everything a study leaves in the store.

The names of tags, params, metrics and artifacts live in ``names.py``; this module decides what is
written under them: the study run with its params, tags, summary metrics and artifacts (``study.json``,
``trials.csv``), the nested trial runs with their curves and masks, and the sweep run.

Runs are created with their identifying tags (kind, key) in the same call, so no run of ours exists
without them. Numbers that users filter on are metrics as well as params/tags, because MLflow compares
params and tags only as strings. Metrics go out with ``log_batch``, one request per trial per check.

This module imports neither torch nor the engine.
"""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import random
import re
import shutil
import sqlite3
import tempfile
import threading
import time
import urllib.parse
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, NamedTuple, TypeVar

import pandas as pd
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from edps_mlflow import __version__
from edps_mlflow import names as n
from edps_mlflow import provenance
from edps_mlflow.config import StudySpec, TrialSpec, content_key
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string
from edps_mlflow.interrupts import store_call
from edps_mlflow.results import (
    Check,
    ProbedTrials,
    StudyOutcome,
    TrialOutcome,
    TrialResult,
    TrialStatus,
    encode_trial_outcomes,
    trial_steps_lower_bound,
)
from edps_mlflow.study_index import MAX_TAG_VALUE, entry_of
from edps_mlflow.uris import explain_store_error, quiet_links_with_credentials, redact_uri


if TYPE_CHECKING:
    from edps_mlflow.pruning import Mask

_BATCH_LIMIT = 1000  # metrics per log_batch call (MLflow's limit; 100 params and 100 tags)


def sparsity_tag(sparsity: float) -> str:
    return repr(float(sparsity))


def study_family(spec: StudySpec) -> str:
    """Everything of a study but its trial count: trials of such studies can be shared."""
    return content_key({"kind": "study-family", **{k: v for k, v in spec.key_fields().items() if k != "trials"}})


def trial_families(spec: StudySpec) -> list[str]:
    """The study families of the trial runs a study creates: its training study's (StudySpec.training_spec),
    and for a study that probes only its best trial, the all-trials study's (its probed re-run)."""
    families = [study_family(spec.training_spec)]
    if spec.probes_best_only:
        families.append(study_family(spec.probe_spec))
    return list(dict.fromkeys(families))


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---- the store -----------------------------------------------------------------------------------
def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """The URI given, else what MLflow resolves now (the environment, else its default local store),
    made explicit so that worker processes and other machines write to the same store."""
    if tracking_uri:
        return tracking_uri
    from mlflow.tracking import get_tracking_uri

    return get_tracking_uri()


def ui_link(tracking_uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """Where to look in the MLflow UI, in its machine-learning view: the run, else the experiment's runs.

    A store reached over HTTP serves the UI itself; for a local store the line says how to start one.
    """
    # Without the view parameter MLflow 3 opens a run under its GenAI "Evaluations" pages.
    page = (f"#/experiments/{experiment_id}/runs/{run_id}" if run_id
            else f"#/experiments/{experiment_id}/runs") + "?workflowType=machine_learning"
    if not run_id:
        # The experiment's study runs (under their sweep runs), not its newest runs: the UI loads 100 runs at a
        # time, newest first, which in a sweep of many studies are the trials of one study (docs/tracking.md).
        page += "&searchFilter=" + urllib.parse.quote(filter_string(tags={n.TAG_KIND: n.KIND_STUDY}), safe="")
    if tracking_uri.startswith(("http://", "https://")):
        return f"MLflow UI: {redact_uri(tracking_uri).rstrip('/')}/{page}"
    return f"MLflow UI (start it with `mlflow ui --backend-store-uri {redact_uri(tracking_uri)}`): " \
           f"http://127.0.0.1:5000/{page}"


def uri_error(uri: str, error: BaseException) -> EdpsError:
    """Any error about the store ``uri`` as one line, without the credentials of any URI in it."""
    return EdpsError(describe_store_error(uri, error))


# Our processes give up on an unreachable server within about half a minute (MLflow's own defaults
# retry for minutes); a user's own setting wins. MLflow reads these at every request.
HTTP_CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# Errors that pass: a busy sqlite file, a server restarting or overloaded, a dropped connection.
_TRANSIENT_MARKERS = ("database is locked", "database table is locked", "connection reset", "connection aborted",
                      "connection refused", "max retries exceeded", "remote end closed", "timed out",
                      "temporarily unavailable", "too many requests", "internal server error", "bad gateway",
                      "service unavailable", "gateway timeout", "status code 500", "status code 502",
                      "status code 503", "status code 504", "too many 500 error", "too many 502 error",
                      "too many 503 error", "too many 504 error")
STORE_ATTEMPTS = 5  # tries per store call in the middle of work; about a minute with MLflow's own retries
_T = TypeVar("_T")


def apply_client_defaults() -> None:
    for name, value in HTTP_CLIENT_DEFAULTS.items():
        os.environ.setdefault(name, value)


def is_transient(error: BaseException) -> bool:
    """Whether a store error is worth another try (a blip), not a real answer."""
    text = str(error).lower()
    return any(marker in text for marker in _TRANSIENT_MARKERS)


def call_store(action: Callable[[], _T], attempts: int = STORE_ATTEMPTS) -> _T:
    """``action()``, tried again with bounded, jittered backoff while it fails transiently."""
    for attempt in range(attempts):
        try:
            with store_call():  # a SIGTERM waits for the call's end: no transaction left open
                return action()
        except (MlflowException, OSError) as error:
            if attempt == attempts - 1 or not is_transient(error):
                raise
            time.sleep(min(8.0, 0.5 * 2 ** attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


class StoreClient:
    """An MlflowClient whose every call survives transient store errors (see :func:`call_store`).

    A retried write may land twice when the first try succeeded unseen: metric points and tags
    are then written twice with the same values, which changes nothing that we read.
    """

    def __init__(self, tracking_uri: str) -> None:
        self._client = MlflowClient(tracking_uri)
        self.tracking_uri = tracking_uri

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def retried(*args: Any, **kwargs: Any) -> Any:
            return call_store(lambda: attribute(*args, **kwargs))

        return retried


def connect(tracking_uri: str | None = None) -> StoreClient:
    """A client of the store, resolved once (see :func:`resolve_tracking_uri`), retrying blips.

    MLflow refuses an unknown scheme (``foo://``) or a retired backend when the client is made, and
    a missing database driver surfaces as an ImportError: each becomes the one line the user sees.
    """
    apply_client_defaults()
    uri = resolve_tracking_uri(tracking_uri)
    quiet_links_with_credentials(uri)
    try:
        return StoreClient(uri)
    except (MlflowException, ImportError) as error:
        raise uri_error(uri, error) from None


def open_store(tracking_uri: str | None = None) -> StoreClient:
    """The store, checked once at the start of a command: created safely when new, reachable, usable;
    else one line naming it."""
    uri = resolve_tracking_uri(tracking_uri)
    quiet_links_with_credentials(uri)
    apply_client_defaults()
    # Before any client: making an MlflowClient of a sqlite store already creates and migrates it, which
    # initialise_store does safely (under a lock, in a temporary file moved into place).
    try:
        created = initialise_store(uri)
    except (MlflowException, OSError, ImportError) as error:
        raise uri_error(uri, error) from None
    if created is not None:
        # A typo in the URI would otherwise train into a store nobody will look at.
        print(f"created a new tracking store at {created} (none was there; if you expected one, check "
              "MLFLOW_TRACKING_URI)", flush=True)
    return connect(uri)


def describe_store_error(uri: str, error: BaseException) -> str:
    """The one line a user sees for a store error: the store (without secrets) and the first line."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    # Redacted before it is cut: a cut through a password would leave its start unrecognised.
    first = redact_uri(first, str(uri))
    if len(first) > 300:
        first = first[:300] + "..."
    return f"tracking store {redact_uri(str(uri))}: {explain_store_error(first)}"


_STORE_LIBRARIES = ("mlflow", "requests", "urllib3", "sqlalchemy", "sqlite3", "psycopg2", "psycopg")


def store_error_line(error: BaseException, tracking_uri: str | None = None) -> str | None:
    """The one line for an error raised by the tracking store or its client libraries; None for others."""
    if type(error).__module__.split(".")[0] not in _STORE_LIBRARIES:
        return None
    return describe_store_error(tracking_uri or resolve_tracking_uri(), error)


def store_error(client: Any, error: MlflowException) -> EdpsError:
    """An MLflow error as the one line the user sees, naming the store without its secrets."""
    return uri_error(str(client.tracking_uri), error)


@contextmanager
def store_errors(client: Any) -> Iterator[None]:
    """Turn an MLflow error inside the block into the one line the user sees."""
    try:
        yield
    except MlflowException as error:
        raise store_error(client, error) from None


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = tracking_uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def _schema_head() -> str:
    # MLflow's newest schema revision (the alembic head of the MLflow installed here).
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def _sqlite_schema(path: Path) -> tuple[set[str], str | None]:
    """(table names, alembic revision) of a sqlite file, read without writing to it."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=20)
    try:
        tables = {row[0] for row in connection.execute("select name from sqlite_master where type = 'table'")}
        revision = None
        if "alembic_version" in tables:
            row = connection.execute("select version_num from alembic_version").fetchone()
            revision = row[0] if row else None
        return tables, revision
    finally:
        connection.close()


def _unusable_store(path: Path, uri: str) -> str | None:
    """Why the sqlite file at ``path`` cannot be used as it is, or None when it is fully migrated."""
    try:
        tables, revision = _sqlite_schema(path)
    except sqlite3.DatabaseError as error:
        return f"{path} is not a usable sqlite database ({error}); move it away"
    head = _schema_head()
    if revision == head and "runs" in tables and "experiments" in tables:
        return None
    holds_runs = "runs" in tables
    state = ("is empty" if not tables else f"has a half-migrated MLflow schema (revision {revision or 'none'}, "
             f"expected {head})")
    repair = (f"back it up and run `mlflow db upgrade {redact_uri(uri)}`" if holds_runs and revision
              else "it holds no usable runs: remove it (and its -journal/-wal files) and run again")
    return f"tracking store {redact_uri(uri)} {state}, probably left by a process killed while creating it; {repair}"


_SETTLE_SECONDS = 10.0  # a file another process is still migrating changes within this time


@contextmanager
def _quiet_loggers(*names: str) -> Iterator[None]:
    """Only warnings and errors from these loggers inside the block."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def initialise_store(tracking_uri: str) -> Path | None:
    """Make sure the store exists and has MLflow's full schema before anything else opens it.

    MLflow migrates a new database in place, one step at a time (many seconds on a loaded machine):
    several processes doing that at once crash ("duplicate column name"), and a process killed
    half-way leaves a file that no later process can open. So a new sqlite store is built in a
    temporary file beside the target, under a file lock, and moved into place in one step: the
    target either does not exist or is complete. Other stores (servers, PostgreSQL) are touched once.
    Returns the path of the sqlite file when this call created it, else None.
    """
    path = sqlite_path(tracking_uri)
    if path is None:
        # One try, bounded by MLflow's own HTTP retries: an unreachable server fails fast at start.
        MlflowClient(tracking_uri).search_experiments(max_results=1)
        return None
    path = path.resolve()
    if path.exists() and path.stat().st_size > 0:
        problem = _settled_problem(path, tracking_uri)
        if problem:
            raise EdpsError(problem)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        try:
            if path.exists():
                problem = _settled_problem(path, tracking_uri)
                if problem:
                    raise EdpsError(problem)
                return None
            # Builders hold the lock while they build: any temporary file left here is a dead one's.
            for leftover in path.parent.glob(f".{path.name}.*.new*"):
                leftover.unlink(missing_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new")
            try:
                # MLflow creates and migrates the schema here. Its progress lines ("Creating initial
                # MLflow database tables...") are not for the user: a refused command says one line.
                with _quiet_loggers("mlflow.store.db.utils", "alembic"):
                    builder = MlflowClient(f"sqlite:///{temporary}")
                    builder.search_experiments(max_results=1)
                _close_engine(builder)
                problem = _unusable_store(temporary, f"sqlite:///{temporary}")
                if problem:
                    raise EdpsError(problem)
                os.replace(temporary, path)
                return path
            finally:
                temporary.unlink(missing_ok=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _close_engine(client: MlflowClient) -> None:
    # The builder's connections point at the file that is about to become the store: close them.
    engine = getattr(getattr(getattr(client, "_tracking_client", None), "store", None), "engine", None)
    if engine is not None:
        engine.dispose()


def _settled_problem(path: Path, uri: str) -> str | None:
    """What is wrong with an existing sqlite store, after giving a process that is still creating it
    (``mlflow`` itself, which takes no lock of ours) time to finish: None when it is usable."""
    deadline = time.monotonic() + _SETTLE_SECONDS
    last = None
    while True:
        problem = _unusable_store(path, uri)
        if problem is None:
            return None
        stat = path.stat()
        state = (stat.st_size, stat.st_mtime_ns)
        if state != last:
            last, deadline = state, time.monotonic() + _SETTLE_SECONDS
        elif time.monotonic() > deadline:
            return problem
        time.sleep(0.5)


def resolve_experiment(client: StoreClient, name: str) -> str:
    """The id of the experiment ``name``, created when it does not exist yet."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.lifecycle_stage != "active":
            raise EdpsError(f"experiment {name!r} is deleted; restore it or choose another name")
        return experiment.experiment_id
    try:
        experiment_id = client.create_experiment(name, artifact_location=artifact_location_for(str(client.tracking_uri),
                                                                                             name),
                                                 tags={n.MLFLOW_NOTE: EXPERIMENT_DESCRIPTION})
    except MlflowException:
        # Another process created it in the meantime.
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id
    # Made with its experiment, the study index holds every study run of it (study_index.py).
    make_index_run(client, experiment_id, complete=True)
    return experiment_id


def artifact_location_for(tracking_uri: str, experiment_name: str) -> str | None:
    """For a sqlite store, a folder next to the database file (``<db stem>-artifacts/<experiment>``), so
    that two stores used from one working directory never mix their artifacts; otherwise the store's
    default (None)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    database = Path(tracking_uri[len("sqlite:///"):])
    if not database.is_absolute():
        database = Path.cwd() / database
    folder = re.sub(r"[^A-Za-z0-9_.-]+", "_", experiment_name).strip("._") or "experiment"
    return (database.parent / f"{database.stem}-artifacts" / folder).as_uri()


def experiment_name_for(workload: str, requested: str | None) -> str:
    """``--experiment``, else ``MLFLOW_EXPERIMENT_NAME``, else the workload's default experiment."""
    return requested or os.environ.get("MLFLOW_EXPERIMENT_NAME") or n.default_experiment(workload)


# ---- leases ---------------------------------------------------------------------------------
LEASE_VARIABLE = "EDPS_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 120.0
_HEARTBEAT_EVERY = 20.0  # seconds between renewals at most; a sixth of the lease when that is shorter


def lease_seconds() -> float:
    """How long a run stays live after its last heartbeat (``EDPS_LEASE_SECONDS``, default 120)."""
    text = os.environ.get(LEASE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_LEASE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value == value and 1.0 <= value <= 86_400.0):
        raise EdpsError(f"{LEASE_VARIABLE} must be a number of seconds between 1 and 86400, got {text!r}")
    return value


def heartbeat_tags() -> dict[str, str]:
    return {n.TAG_HEARTBEAT: f"{time.time():.3f}"}


class Heartbeat:
    """Renews the lease of one run from a daemon thread with its own client, until stopped.

    A failed renewal is tried again at the next beat: the lease is several beats long, so one blip
    of the store does not let another process take the run over.
    """

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        self.run_id = run_id
        self._client = MlflowClient(tracking_uri)
        self._stop = threading.Event()
        self._every = min(_HEARTBEAT_EVERY, lease_seconds() / 6)
        self._thread = threading.Thread(target=self._beat, name=f"edps-heartbeat-{run_id[:8]}", daemon=True)

    def start(self) -> "Heartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._every + 30)

    def _beat(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._client.set_tag(self.run_id, n.TAG_HEARTBEAT, heartbeat_tags()[n.TAG_HEARTBEAT])
            except Exception:  # noqa: BLE001 - the next beat tries again; the lease absorbs misses
                pass


def require_still_ours(client: StoreClient, run_id: str) -> None:
    """Refuse to finish a run that another process marked FAILED after our lease ran out (this
    process was stalled longer than the lease): its work has been taken over."""
    run = client.get_run(run_id)
    if run.info.status != RunStatus.to_string(RunStatus.RUNNING):
        raise EdpsError(f"run {run_id} lost its lease (marked {run.info.status} by another process while this "
                        f"one was stalled); its work was taken over: raise {LEASE_VARIABLE} on loaded machines")


def mark_dead(client: StoreClient, run_ids: list[str], reason: str) -> None:
    """Mark runs whose owner is gone FAILED, saying why (several processes may do this at once)."""
    for run_id in run_ids:
        _log_batch(client, run_id, tags={n.TAG_ERROR: reason})
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
        if client.get_run(run_id).data.tags.get(n.TAG_KIND) == n.KIND_STUDY:
            index_study_run(client, run_id)  # its entry may say RUNNING, or be missing (study_index.py)


def yield_run(client: StoreClient, run_id: str, winner_run_id: str, keep_kind: bool = True) -> None:
    """Give up our run because ``winner_run_id`` (live, same key, earlier) trains it: FAILED, tagged.

    ``keep_kind=False`` also removes the kind tag, for the run that ``mlflow run`` made: MLflow
    marks it FINISHED when we exit 0, and it must not then count as a finished study.
    """
    _log_batch(client, run_id, tags={n.TAG_YIELDED_TO: winner_run_id,
                                     n.TAG_ERROR: f"gave way to the earlier live run {winner_run_id} of the same key"})
    study = client.get_run(run_id).data.tags.get(n.TAG_KIND) == n.KIND_STUDY
    if not keep_kind:
        client.delete_tag(run_id, n.TAG_KIND)
    client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
    if study:
        index_study_run(client, run_id)


# ---- names of runs ---------------------------------------------------------------------------
# Run names put what varies first, so that they still read when the UI truncates them.
_SHORT = {"learning_rate": "lr", "momentum": "m", "decay_steps": "decay", "end_learning_rate_factor": "end"}


def study_run_name(spec: StudySpec) -> str:
    """``bs=16 sp=0.9 sgd digits-simple-cnn``."""
    return f"bs={spec.batch_size} sp={spec.sparsity:g} {spec.optimizer.value} {spec.workload}"


def trial_run_name(trial: TrialSpec, outcome: str | None = None) -> str:
    """``t001 reached@400 lr=0.1 bs=16 sp=0.9``: the UI's run-name column shows about 20 characters, so
    the name leads with what tells a study's trials apart (the index) and how it ended (the reached trial
    stays findable by ``reached``), then its metaparameters, then the study (the same for every sibling)."""
    values = " ".join(f"{_SHORT.get(k, k)}={v:.3g}" for k, v in trial.metaparameters.items())
    study = f"bs={trial.study.batch_size} sp={trial.study.sparsity:g}"
    probed = "probed" if trial.study.probes else None
    return " ".join(part for part in (f"t{trial.index:03d}", outcome, probed, values, study) if part)


def trial_outcome(result: TrialResult) -> str:
    if result.status is TrialStatus.REACHED:
        return f"reached@{result.steps_to_result}"
    return result.status.value.replace("_", " ")


def _display(value: Any) -> str:
    """A param as people read it: floats without binary noise (0.1, not 0.10000000000000006), tuples as lists."""
    if isinstance(value, float):
        return f"{value:.12g}"
    if isinstance(value, (tuple, list)):
        return ",".join(_display(v) for v in value)
    return str(value)


def study_description(spec: StudySpec, outcome: StudyOutcome, probed: ProbedTrials | None = None) -> str:
    """The study run's description (Markdown, shown on its page)."""
    best = outcome.best_record()
    result = (f"**steps-to-result {outcome.steps_to_result}** (trial {best.trial.index}: "
              + ", ".join(f"{k} {v:.4g}" for k, v in best.trial.metaparameters.items()) + ")"
              if best else "**no trial reached the goal**")
    counts = ", ".join(f"{outcome.count(status)} {status.value.replace('_', ' ')}" for status in TrialStatus)
    return (f"{spec.workload}, {spec.optimizer.value}, batch size {spec.batch_size}, sparsity {spec.sparsity:g}: "
            f"{result}.\n\n{len(outcome.records)} trials ({counts}; {outcome.reused} reused from earlier runs). "
            f"Goal: validation error <= {spec.goal_error:g}, checked every {spec.check_interval} steps; "
            f"cap {spec.max_steps} steps. Each trial is a nested run; `trials.csv` lists them all."
            + (f"\n\n{probed.sentence()}" if probed else ""))


EXPERIMENT_DESCRIPTION = (
    "Steps-to-result against batch size and sparsity, measured by edps-mlflow. A **sweep** run (optional) is "
    "the parent of its **study** runs; a study tunes one (workload, optimizer, sparsity, batch size) with "
    "quasi-random **trial** runs nested under it, and its `steps_to_result` is the fewest steps any trial "
    "needed to reach the goal. Switch the UI to *Model training* to see the runs; filter with "
    "`tags.edps.kind = 'study'` for the grid. `edps-analyze report --log-to-mlflow` adds an analysis run.")


def provenance_tags(launched_by_mlflow: bool = False) -> dict[str, str]:
    """Who ran what code: MLflow's context tags (user, source, git commit) and the code version. A run
    that `mlflow run` created already has its own source tags; only the code version is added then."""
    code = provenance.code_version()
    tags = {n.TAG_CODE_VERSION: code.label, n.TAG_GIT_DIRTY: str(code.dirty).lower()}
    if not launched_by_mlflow:
        tags.update({n.MLFLOW_USER: provenance.user(), n.MLFLOW_SOURCE_NAME: provenance.command_line(),
                     n.MLFLOW_SOURCE_TYPE: "LOCAL"})
        if code.commit:
            tags[n.MLFLOW_GIT_COMMIT] = code.commit
    return tags


def _study_tags(spec: StudySpec) -> dict[str, str]:
    return {n.TAG_KIND: n.KIND_STUDY, n.TAG_STUDY_KEY: spec.study_key, n.TAG_STUDY_FAMILY: study_family(spec),
            n.TAG_WORKLOAD: spec.workload, n.TAG_OPTIMIZER: spec.optimizer.value,
            n.TAG_SPARSITY: sparsity_tag(spec.sparsity), n.TAG_BATCH_SIZE: str(spec.batch_size),
            n.TAG_VERSION: __version__, n.TAG_RESULT_KEY: spec.result_key,
            n.TAG_TRIAL_FAMILIES: ",".join(trial_families(spec))}


def trial_outcomes_tag(outcome: StudyOutcome) -> str | None:
    """The tag edps.trial_outcomes of a study (results.encode_trial_outcomes); None when it exceeds MLflow's
    limit on a tag (some thousand trials: the analysis then reads the study's trials.csv)."""
    text = encode_trial_outcomes(TrialOutcome(r.trial.index, r.status, r.steps_to_result, r.steps_trained)
                                 for r in outcome.records.values())
    return text if len(text) <= MAX_TAG_VALUE else None


# ---- what a study leaves in the store ---------------------------------------------------------
def trials_table(outcome: StudyOutcome) -> pd.DataFrame:
    """``trials.csv``: one row per trial of the study (trained here or reused)."""
    rows = []
    for record in outcome.records.values():
        rows.append({
            "trial_index": record.trial.index, "trial_key": record.trial.trial_key, "status": record.status.value,
            "steps_to_result": record.steps_to_result, "steps_trained": record.steps_trained,
            "best_validation_error": record.best_validation_error,
            **{name: value for name, value in record.trial.metaparameters.items()},
            "init_seed": record.trial.init_seed, "run_id": record.run_id, "reused": record.reused,
            "seconds": round(record.seconds, 3), "seconds_per_step": record.seconds_per_step,
            "pack_size": record.pack_size, "device": record.device,
        })
    return pd.DataFrame(rows).astype({"steps_to_result": "Int64"})


def study_metrics(outcome: StudyOutcome) -> dict[str, float]:
    """The study run's summary metrics."""
    # The result first: the run page lists metrics in the order they were first logged, and only the
    # identifying ones (batch size, sparsity, goal; logged at the start) come before it.
    metrics: dict[str, float] = {}
    if outcome.steps_to_result is not None:
        metrics[n.METRIC_STEPS_TO_RESULT] = outcome.steps_to_result
    metrics.update({n.trials_metric(status.value): outcome.count(status) for status in TrialStatus})
    metrics.update({n.METRIC_TRIALS_TOTAL: len(outcome.records), n.METRIC_TRIALS_REUSED: outcome.reused,
                    n.METRIC_TRIALS_TRAINED: outcome.trained, n.METRIC_STUDY_SECONDS: outcome.seconds,
                    n.METRIC_PROBE_SECONDS: sum(r.probe_seconds for r in outcome.records.values()),
                    n.METRIC_STUDY_TRIAL_STEPS: outcome.trial_steps})
    lower_bound = trial_steps_lower_bound(outcome.records)
    metrics[n.METRIC_STUDY_TRIAL_STEPS_LOWER_BOUND] = lower_bound
    if lower_bound > 0:  # nothing trained, or nothing needed: no ratio
        metrics[n.METRIC_STUDY_TRIAL_STEPS_RATIO] = outcome.trial_steps / lower_bound
    best = outcome.best_record()
    metrics.update({n.METRIC_BEST_PREFIX + k: v for k, v in (best.trial.metaparameters if best else {}).items()})
    if best is not None and best.seconds_per_step is not None:
        # The study's time per step is its best trial's: the one whose steps make steps-to-result.
        metrics[n.METRIC_SECONDS_PER_STEP] = best.seconds_per_step
        if best.pack_size is not None:
            metrics[n.METRIC_PACK_SIZE] = best.pack_size
    return metrics


def study_json(spec: StudySpec, outcome: StudyOutcome, run_settings: dict[str, Any],
               allowed_errors: int, probed: ProbedTrials | None = None,
               model_size: tuple[int, int] | None = None) -> dict[str, Any]:
    """``study.json``: the study, its result and how it was run, in one document."""
    best = outcome.best_record()
    return {
        **({"probed_trials": {"mode": probed.mode, "best_trial_index": probed.best_trial_index,
                              "best_probe_run_id": probed.best_probe_run_id, "reused": probed.reused}}
           if probed else {}),
        "version": __version__, "study_key": spec.study_key, "spec": spec.key_fields(),
        "steps_to_result": outcome.steps_to_result,
        "best_trial": None if best is None else {"trial_index": best.trial.index, "run_id": best.run_id,
                                                  "metaparameters": best.trial.metaparameters,
                                                  "seconds_per_step": best.seconds_per_step,
                                                  "pack_size": best.pack_size, "device": best.device},
        "model": None if model_size is None else {"parameters": model_size[0], "parameter_bytes": model_size[1]},
        "counts": {status.value: outcome.count(status) for status in TrialStatus},
        "reused": outcome.reused, "trained": outcome.trained, "trial_steps": outcome.trial_steps,
        "trial_steps_lower_bound": trial_steps_lower_bound(outcome.records),
        "seconds": outcome.seconds, "execution": run_settings, "allowed_validation_errors": allowed_errors,
    }


class StudyTracker:
    """The study run and its nested trial runs. Only this class writes to MLflow during a study."""

    def __init__(self, client: StoreClient, experiment_id: str, study_run_id: str, created_run: bool,
                 sweep_key: str | None) -> None:
        self.client = client
        self.experiment_id = experiment_id
        self.study_run_id = study_run_id
        self.created_run = created_run
        self.sweep_key = sweep_key
        self.trial_runs: dict[int, str] = {}
        self.trial_specs: dict[int, TrialSpec] = {}
        self.trial_runs_finished = 0  # METRIC_TRIAL_RUNS_FINISHED: the trial runs this study run finished
        self._finished = False  # the study run is FINISHED: nothing may change its state any more
        self._monitor: Any = None
        self._scratch = Path(tempfile.mkdtemp(prefix="edps-artifacts-"))

    # ---- opening and closing -------------------------------------------------------------
    @classmethod
    def create(cls, client: StoreClient, experiment_id: str, spec: StudySpec, parent_run_id: str | None = None,
               sweep_key: str | None = None, launcher_run_id: str | None = None) -> "StudyTracker":
        """The study run, with its kind, keys and a fresh heartbeat from its first moment: the run
        that ``mlflow run`` made for us (``launcher_run_id``), else a new run; nested under
        ``parent_run_id`` when given (a sweep's study, in its process or submitted as a project run)."""
        tags = {**_study_tags(spec), **heartbeat_tags(), n.MLFLOW_RUN_NAME: study_run_name(spec)}
        if sweep_key:
            tags[n.TAG_SWEEP_KEY] = sweep_key
        if parent_run_id:
            tags[n.MLFLOW_PARENT_RUN_ID] = parent_run_id
        try:
            if launcher_run_id:
                _log_batch(client, launcher_run_id, tags={**tags, **provenance_tags(launched_by_mlflow=True)})
                index_study_run(client, launcher_run_id)
                return cls(client, experiment_id, launcher_run_id, False, sweep_key)
            tags.update(provenance_tags())
            run = client.create_run(experiment_id, tags=tags)
            # In the index from its first moment (RUNNING: readers look at it in the store until it ends).
            index_study_run(client, run.info.run_id)
            return cls(client, experiment_id, run.info.run_id, True, sweep_key)
        except MlflowException as error:
            raise store_error(client, error) from None

    def artifact_location(self) -> str:
        """Where this study's artifacts go (the experiment's artifact location, credentials hidden)."""
        return redact_uri(self.client.get_experiment(self.experiment_id).artifact_location)

    def start_system_metrics(self) -> None:
        """CPU, memory (and GPU, with nvidia-ml-py) of this machine on the study run every 10 s, until it ends."""
        try:
            import psutil  # noqa: F401  (MLflow's monitor needs it)
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
        except ImportError:
            raise EdpsError("--system-metrics needs psutil: pip install psutil") from None
        self._monitor = SystemMetricsMonitor(self.study_run_id, tracking_uri=str(self.client.tracking_uri))
        self._monitor.start()

    def log_datasets(self, name: str, splits: dict[str, tuple[Any, Any]]) -> None:
        """The study's data as MLflow datasets (with a digest of the arrays), one per split: context ->
        (images, labels) as numpy arrays."""
        from mlflow.data.numpy_dataset import from_numpy
        from mlflow.entities import DatasetInput, InputTag

        inputs = [DatasetInput(from_numpy(images, targets=labels, name=f"{name} {context}")._to_mlflow_entity(),
                               tags=[InputTag(n.MLFLOW_DATA_CONTEXT, context)])
                  for context, (images, labels) in splits.items()]
        for attempt in range(3):
            try:
                self.client.log_inputs(self.study_run_id, datasets=inputs)
                return
            except Exception as error:  # noqa: BLE001  (the store's own integrity error, from its driver)
                # Studies started at once record the same dataset (same name and digest) in one
                # experiment: the store's unique constraint lets one insert it; the others then find it.
                if attempt == 2 or "unique" not in str(error).lower():
                    raise
                time.sleep(0.2 * (attempt + 1))
    def start_heartbeat(self) -> None:
        self._heartbeat = Heartbeat(str(self.client.tracking_uri), self.study_run_id).start()

    def stop_heartbeat(self) -> None:
        heartbeat = getattr(self, "_heartbeat", None)
        if heartbeat is not None:
            heartbeat.stop()

    def log_study_start(self, spec: StudySpec, settings: dict[str, Any], reused: int) -> None:
        params = {n.PARAM_SPEC_PREFIX + k: v for k, v in spec.key_fields().items()}
        # Execution settings are tags, not params: a resumed study may run with other settings.
        tags = {n.TAG_RUN_SETTING_PREFIX + k: str(v) for k, v in settings.items()}
        tags.update(_study_tags(spec))
        tags.update({n.TAG_STOPPING: n.STOPPING_FULL_TRIALS if settings.get("full_trials") else n.STOPPING_EXACT,
                     n.TAG_REUSED: str(reused)})
        if self.sweep_key:
            tags[n.TAG_SWEEP_KEY] = self.sweep_key
        metrics = {n.METRIC_BATCH_SIZE: spec.batch_size, n.METRIC_SPARSITY: spec.sparsity,
                   n.METRIC_GOAL_ERROR: spec.goal_error, n.METRIC_TRIAL_RUNS_FINISHED: self.trial_runs_finished}
        self._log(self.study_run_id, params=params, tags=tags, metrics=metrics)

    def record_outcome(self, spec: StudySpec, outcome: StudyOutcome, run_settings: dict[str, Any],
                       allowed_errors: int, probed: ProbedTrials | None = None,
                       model_size: tuple[int, int] | None = None) -> None:
        """The study's summary metrics, the best trial's metaparameters (and the device its time per step
        was measured on), which trials probed, the network's size ``(parameters, bytes)`` and the two
        artifacts."""
        best = outcome.best_record()
        params: dict[str, Any] = {n.PARAM_BEST_PREFIX + k: v
                                  for k, v in (best.trial.metaparameters if best else {}).items()}
        metrics = study_metrics(outcome)
        if best is not None and best.seconds_per_step is not None and best.device is not None:
            params[n.PARAM_TIMING_DEVICE] = best.device
        if model_size is not None:
            metrics.update({n.METRIC_MODEL_PARAMETERS: model_size[0], n.METRIC_MODEL_PARAMETER_BYTES: model_size[1]})
        tags = {n.MLFLOW_NOTE: study_description(spec, outcome, probed)}
        outcomes = trial_outcomes_tag(outcome)
        if outcomes is not None:
            tags[n.TAG_TRIAL_OUTCOMES] = outcomes
        if probed is not None:
            tags[n.TAG_PROBED_TRIALS] = probed.mode
            if probed.best_probe_run_id:
                tags[n.TAG_BEST_PROBE_RUN] = probed.best_probe_run_id
            if probed.probe_seconds:
                metrics[n.METRIC_PROBE_SECONDS] += probed.probe_seconds  # the best trial's probed run
        self._log(self.study_run_id, params=params, metrics=metrics, tags=tags)
        buffer = io.StringIO()
        trials_table(outcome).to_csv(buffer, index=False)
        (self._scratch / n.ARTIFACT_TRIALS_CSV).write_text(buffer.getvalue())
        (self._scratch / n.ARTIFACT_STUDY_JSON).write_text(
            json.dumps(study_json(spec, outcome, run_settings, allowed_errors, probed, model_size), indent=2,
                       sort_keys=True))
        self.client.log_artifact(self.study_run_id, str(self._scratch / n.ARTIFACT_TRIALS_CSV))
        self.client.log_artifact(self.study_run_id, str(self._scratch / n.ARTIFACT_STUDY_JSON))

    def finish_study(self) -> None:
        self.stop_heartbeat()
        require_still_ours(self.client, self.study_run_id)
        self.client.set_terminated(self.study_run_id, RunStatus.to_string(RunStatus.FINISHED))
        self._finished = True
        self.close()
        # After FINISHED, never before: an entry claims only what the store holds (study_index.py).
        index_study_run(self.client, self.study_run_id)

    def abort(self, interrupted: bool) -> None:
        """Leave nothing RUNNING: open trial runs and the study run become KILLED (interrupt) or FAILED."""
        self.stop_heartbeat()
        name = RunStatus.to_string(RunStatus.KILLED if interrupted else RunStatus.FAILED)
        # A study interrupted after it finished (while it indexes itself) stays FINISHED: its index entry says so.
        for run_id in [*self.trial_runs.values(), *([] if self._finished else [self.study_run_id])]:
            try:
                self.client.set_terminated(run_id, name)
            except MlflowException:
                pass
        if not self._finished:
            index_study_run(self.client, self.study_run_id)
        self.trial_runs.clear()
        self.close()

    def close(self) -> None:
        """Stop the system-metrics monitor and remove the scratch folder (every artifact is in the store)."""
        if self._monitor is not None:
            self._monitor.finish()
            self._monitor = None
        shutil.rmtree(self._scratch, ignore_errors=True)

    # ---- trials ----------------------------------------------------------------------------
    def start_trial(self, trial: TrialSpec, mask: Mask | None) -> None:
        """Create the nested trial run; ``mask`` is None for a trial superseded before it was pruned."""
        spec = trial.study
        tags = {n.TAG_KIND: n.KIND_TRIAL, n.TAG_TRIAL_KEY: trial.trial_key, n.TAG_STUDY_KEY: spec.study_key,
                n.TAG_STUDY_FAMILY: study_family(spec), n.TAG_WORKLOAD: spec.workload,
                n.TAG_OPTIMIZER: spec.optimizer.value, n.TAG_SPARSITY: sparsity_tag(spec.sparsity),
                n.TAG_BATCH_SIZE: str(spec.batch_size), n.TAG_VERSION: __version__}
        if self.sweep_key:
            tags[n.TAG_SWEEP_KEY] = self.sweep_key
        run = self.client.create_run(self.experiment_id, tags={
            **tags, **provenance_tags(), n.MLFLOW_PARENT_RUN_ID: self.study_run_id,
            n.MLFLOW_RUN_NAME: trial_run_name(trial)})
        run_id = run.info.run_id
        self.trial_runs[trial.index] = run_id
        self.trial_specs[trial.index] = trial
        params = {**trial.metaparameters, n.PARAM_SEED: trial.init_seed, n.PARAM_TRIAL_INDEX: trial.index,
                  n.PARAM_BATCH_SIZE: spec.batch_size, n.PARAM_SPARSITY: spec.sparsity,
                  n.PARAM_OPTIMIZER: spec.optimizer.value, n.PARAM_WORKLOAD: spec.workload}
        metrics = {n.METRIC_HP_PREFIX + k: v for k, v in trial.metaparameters.items()}
        metrics.update({n.METRIC_BATCH_SIZE: spec.batch_size, n.METRIC_SPARSITY: spec.sparsity})
        self._log(run_id, params=params, metrics=metrics)
        if mask is None:
            return
        mask_dir = self._scratch / f"trial-{trial.index}" / n.ARTIFACT_MASK_DIR
        for path in mask.save(mask_dir, n.ARTIFACT_MASK_FILE, n.ARTIFACT_MASK_SUMMARY):
            self.client.log_artifact(run_id, str(path), artifact_path=n.ARTIFACT_MASK_DIR)
        shutil.rmtree(mask_dir.parent, ignore_errors=True)

    def log_check(self, trial_index: int, check: Check) -> None:
        metrics = {n.METRIC_TRAIN_LOSS: check.train_loss, n.METRIC_LEARNING_RATE: check.learning_rate}
        if check.validation_error is not None:
            metrics[n.METRIC_VALIDATION_ERROR] = check.validation_error
        self._log(self.trial_runs[trial_index], metrics=metrics, step=check.step)

    def log_probe(self, trial_index: int, step: int, values: dict[str, float]) -> None:
        finite = {k: v for k, v in values.items() if v == v and abs(v) != float("inf")}
        if finite:
            self._log(self.trial_runs[trial_index], metrics=finite, step=step)

    def finish_trial(self, result: TrialResult, device: str | None = None) -> str:
        """End a trial's run with its outcome, and its training seconds per step on ``device`` when it
        trained a step."""
        run_id = self.trial_runs.pop(result.index)
        metrics: dict[str, float] = {n.METRIC_STEPS_TRAINED: result.steps_trained,
                                     n.METRIC_CHECKS_CUT_SHORT: result.checks_cut_short,
                                     n.METRIC_TRIAL_SECONDS: result.seconds}
        params: dict[str, Any] = {}
        if result.seconds_per_step is not None:
            metrics.update({n.METRIC_SECONDS_PER_STEP: result.seconds_per_step, n.METRIC_PACK_SIZE: result.pack_size})
            if device is not None:
                params[n.PARAM_DEVICE] = device
        if result.probe_seconds:
            metrics[n.METRIC_PROBE_SECONDS] = result.probe_seconds
        if result.steps_to_result is not None:
            metrics[n.METRIC_STEPS_TO_RESULT] = result.steps_to_result
        if result.best_validation_error is not None:
            metrics[n.METRIC_BEST_VALIDATION_ERROR] = result.best_validation_error
        tags = {n.TAG_STATUS: result.status.value}
        if result.index in self.trial_specs:
            tags[n.MLFLOW_RUN_NAME] = trial_run_name(self.trial_specs.pop(result.index), trial_outcome(result))
        # Step 0: the UI charts a metric whose latest step is 0 as a bar (a value), one at a later step as
        # a line, which for a single value is a lone dot.
        self._log(run_id, params=params, metrics=metrics, tags=tags)
        self.client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
        # Counted after the trial run is FINISHED: a kill in between leaves the count short, never long, and
        # readers trust it only once the study run is FINISHED.
        self.trial_runs_finished += 1
        self._log(self.study_run_id, metrics={n.METRIC_TRIAL_RUNS_FINISHED: self.trial_runs_finished})
        return run_id

    # ---- plumbing --------------------------------------------------------------------------
    def _log(self, run_id: str, params: dict[str, Any] | None = None, tags: dict[str, str] | None = None,
             metrics: dict[str, float] | None = None, step: int = 0) -> None:
        _log_batch(self.client, run_id, params=params, tags=tags, metrics=metrics, step=step)


# ---- the study index (study_index.py) ---------------------------------------------------------
INDEX_DESCRIPTION = (
    "The study index of this experiment: one tag `edps.index.<run id>` per study run, holding that run's "
    "state, edps tags, params and metrics, so that `edps status`, sweeps, `edps doctor` and `edps-analyze` read "
    "this run instead of searching every study run. Each study writes its entry when it starts and when it "
    "ends; do not delete or rename it (`edps doctor --repair` rebuilds it from the study runs).")


def make_index_run(client: StoreClient, experiment_id: str, complete: bool) -> str:
    """A new index run of the experiment; ``complete``: every study run of the experiment will be in it."""
    run = client.create_run(experiment_id, tags={
        n.TAG_KIND: n.KIND_STUDY_INDEX, n.TAG_VERSION: __version__, n.MLFLOW_RUN_NAME: n.INDEX_RUN_NAME,
        n.MLFLOW_NOTE: INDEX_DESCRIPTION, n.TAG_INDEX_COMPLETE: "true" if complete else "false"})
    # FINISHED at once: nothing renews a lease on it, and tags can still be written to a finished run.
    client.set_terminated(run.info.run_id, RunStatus.to_string(RunStatus.FINISHED))
    return run.info.run_id


def index_run_id(client: StoreClient, experiment_id: str, own_run_id: str | None = None) -> str:
    """The experiment's index run (the earliest, when two processes made one at the same moment), made when
    there is none: complete when the experiment holds no study run but ``own_run_id`` (one search by tag,
    once per experiment)."""
    found = [r for r in client.search_runs([experiment_id], filter_string(run_name=n.INDEX_RUN_NAME), max_results=100)
             if r.data.tags.get(n.TAG_KIND) == n.KIND_STUDY_INDEX]
    if found:
        return min(found, key=lambda r: (r.info.start_time or 0, r.info.run_id)).info.run_id
    studies = client.search_runs([experiment_id], filter_string(tags={n.TAG_KIND: n.KIND_STUDY}), max_results=2)
    return make_index_run(client, experiment_id, complete={r.info.run_id for r in studies} <= {own_run_id})


def index_study_run(client: StoreClient, run_id: str) -> bool:
    """Write a study run's entry in its experiment's study index, from the run as the store holds it now
    (study_index.py); False when it does not fit a tag, or the store failed. Best effort: a study run whose
    entry is missing or stale is read from the store (a RUNNING one), so a store error here fails nothing."""
    try:
        run = client.get_run(run_id)
        entry = entry_of(run)
        if entry is None:
            return False
        client.set_tag(index_run_id(client, run.info.experiment_id, run_id), n.TAG_INDEX_PREFIX + run_id, entry)
        return True
    except MlflowException:
        return False


def complete_index(client: StoreClient, experiment_id: str, run_ids: list[str]) -> int:
    """Index these study runs (all those of the experiment without an entry: doctor --repair) and say that
    the index is complete; the number indexed."""
    indexed = sum(index_study_run(client, run_id) for run_id in run_ids)
    if indexed == len(run_ids):
        client.set_tag(index_run_id(client, experiment_id), n.TAG_INDEX_COMPLETE, "true")
    return indexed


def record_doctor_check(client: StoreClient, experiment_id: str, checked_until: int | None,
                        recheck: list[str]) -> None:
    """What the next ``edps doctor`` of the experiment need not read again: every run that started or ended
    before ``checked_until`` (ms) was checked, and the runs of the problems found are to be looked at again
    (None: nothing of that kind; the next check reads every run). Best effort: a store that refuses the
    write gets a full check next time."""
    try:
        client.set_experiment_tag(experiment_id, n.EXPERIMENT_TAG_CHECKED_UNTIL,
                                  "" if checked_until is None else str(checked_until))
        client.set_experiment_tag(experiment_id, n.EXPERIMENT_TAG_RECHECK, ",".join(recheck))
    except MlflowException:
        pass


class LauncherRun(NamedTuple):
    """The run that ``mlflow run`` made for this process (``MLFLOW_RUN_ID``)."""

    run_id: str
    experiment_name: str
    submitted: bool  # a sweep submitted it and tagged it as this study's run already (--executor mlflow-project)


def launcher_run(client: StoreClient, study_key: str | None = None) -> LauncherRun | None:
    """The run that ``mlflow run`` made for this process (``MLFLOW_RUN_ID``), if any: our runs go to
    that run's experiment.

    Honoured only while it is RUNNING and still empty (no kind of ours), or, for a study
    (``study_key``), while it is the run a sweep submitted for that very study: any other run (a
    finished study, another study's run) is never reopened; that is one line to the user.
    """
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        return None
    try:
        run = client.get_run(run_id)
    except MlflowException as error:
        raise EdpsError(f"MLFLOW_RUN_ID={run_id}: {describe_store_error(str(client.tracking_uri), error)}") from None
    tags = run.data.tags
    kind = tags.get(n.TAG_KIND)
    running = run.info.status == RunStatus.to_string(RunStatus.RUNNING)
    submitted = bool(kind == n.KIND_STUDY and tags.get(n.TAG_SUBMITTED_BY) and study_key)
    if submitted and running and tags.get(n.TAG_STUDY_KEY) != study_key:
        raise EdpsError(f"MLFLOW_RUN_ID={run_id} was submitted for study {tags.get(n.TAG_STUDY_KEY, '')[:12]}, but "
                        f"these parameters and data make study {study_key[:12]}: the sweep and this process see "
                        f"different data or code")
    if not running or (kind and not submitted):
        what = f"a {kind} run" if kind else "not a new run"
        raise EdpsError(f"MLFLOW_RUN_ID={run_id} is {run.info.status} and {what}: only the empty RUNNING run that "
                        f"`mlflow run` creates is used; unset MLFLOW_RUN_ID to start a new run")
    return LauncherRun(run_id, client.get_experiment(run.info.experiment_id).name, submitted)


def claim_submitted_run(client: StoreClient, run_id: str, spec: StudySpec, sweep_run_id: str, sweep_key: str) -> None:
    """Make the run that MLflow Projects just created for a sweep's study that study's run: its kind,
    keys, parent and a fresh heartbeat, before its entry point starts (seconds to minutes later), so
    that a resumed sweep or another process sees the study as taken from this moment on."""
    tags = {**_study_tags(spec), **heartbeat_tags(), n.MLFLOW_RUN_NAME: study_run_name(spec),
            n.MLFLOW_PARENT_RUN_ID: sweep_run_id, n.TAG_SWEEP_KEY: sweep_key, n.TAG_SUBMITTED_BY: sweep_run_id}
    _log_batch(client, run_id, tags=tags)
    index_study_run(client, run_id)


def renew_heartbeat(client: StoreClient, run_id: str) -> None:
    """One heartbeat on a run (a sweep keeps its submitted runs live until their entry point beats itself)."""
    client.set_tag(run_id, n.TAG_HEARTBEAT, heartbeat_tags()[n.TAG_HEARTBEAT])


def log_launch_log(client: StoreClient, run_id: str, path: Path) -> None:
    """The output of a submitted run as its artifact ``mlflow-run.log`` (one try: the log also stays on disk)."""
    with tempfile.TemporaryDirectory(prefix="edps-launch-log-") as folder:
        copy = Path(folder) / n.ARTIFACT_LAUNCH_LOG
        shutil.copyfile(path, copy)
        client.log_artifact(run_id, str(copy))


def mark_refused(run_id: str, message: str) -> None:
    """Record why a study was refused on the run that ``mlflow run`` created before we started.

    MLflow creates that run before the entry point runs and marks it FAILED when we exit non-zero;
    deleting it would make ``mlflow run`` itself crash, so it stays, FAILED, with the reason as a tag.
    """
    try:
        client = MlflowClient()
        run = client.get_run(run_id)
        # Only the launcher's own new run: a finished study named by mistake keeps its tags.
        if run.info.status == RunStatus.to_string(RunStatus.RUNNING) and n.TAG_KIND not in run.data.tags:
            client.set_tag(run_id, n.TAG_ERROR, message[:5000])
    except MlflowException:
        pass


class SweepTracker:
    """The sweep run: the parent of the sweep's study runs."""

    def __init__(self, client: StoreClient, experiment_id: str, run_id: str) -> None:
        self.client, self.experiment_id, self.run_id = client, experiment_id, run_id
        self._heartbeat: Heartbeat | None = None

    @staticmethod
    def _tags(sweep_key: str, workload: str) -> dict[str, str]:
        return {n.TAG_KIND: n.KIND_SWEEP, n.TAG_SWEEP_KEY: sweep_key, n.TAG_WORKLOAD: workload,
                n.TAG_VERSION: __version__}

    @classmethod
    def create(cls, client: StoreClient, experiment_id: str, name: str, sweep_key: str, workload: str,
               launcher_run_id: str | None = None) -> "SweepTracker":
        """A new sweep run (or the run ``mlflow run`` made for us), live from its first moment."""
        tags = {**cls._tags(sweep_key, workload), **heartbeat_tags(), n.MLFLOW_RUN_NAME: name}
        try:
            if launcher_run_id:
                _log_batch(client, launcher_run_id, tags={**tags, **provenance_tags(launched_by_mlflow=True)})
                return cls(client, experiment_id, launcher_run_id)
            return cls(client, experiment_id,
                       client.create_run(experiment_id, tags={**tags, **provenance_tags()}).info.run_id)
        except MlflowException as error:
            raise store_error(client, error) from None

    @classmethod
    def take_over(cls, client: StoreClient, experiment_id: str, run_id: str, sweep_key: str,
                  workload: str) -> "SweepTracker | None":
        """Continue an earlier sweep run whose owner is gone (a resumed sweep); None when another
        process took it over at the same moment (the last owner token written wins)."""
        token = uuid.uuid4().hex
        try:
            client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            _log_batch(client, run_id, tags={**cls._tags(sweep_key, workload), **heartbeat_tags(),
                                             n.TAG_LEASE_OWNER: token})
            # A rival that read the run as free before our write writes its token after ours: wait
            # longer than such a read-then-write takes, then see whose token stayed.
            time.sleep(min(3.0, lease_seconds() / 4))
            if client.get_run(run_id).data.tags.get(n.TAG_LEASE_OWNER) != token:
                return None
        except MlflowException as error:
            raise store_error(client, error) from None
        return cls(client, experiment_id, run_id)

    def start_heartbeat(self) -> None:
        self._heartbeat = Heartbeat(str(self.client.tracking_uri), self.run_id).start()

    def stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()

    def log_start(self, params: dict[str, Any], plan: dict[str, int]) -> None:
        existing = self.client.get_run(self.run_id).data.params
        # A resumed sweep keeps its params; only new ones are written (MLflow forbids changing one).
        new_params = {n.PARAM_SWEEP_PREFIX + k: str(v) for k, v in params.items()
                      if n.PARAM_SWEEP_PREFIX + k not in existing}
        _log_batch(self.client, self.run_id, params=new_params,
                   metrics={n.METRIC_PLAN_PREFIX + k: v for k, v in plan.items()})

    def log_table(self, name: str, text: str, tags: dict[str, str] | None = None,
                  metrics: dict[str, float] | None = None) -> None:
        """A table artifact (e.g. the adaptive sweep's decisions) on the sweep run, with tags and metrics
        that summarise it; written again (replaced) when a resumed sweep knows more."""
        directory = Path(tempfile.mkdtemp(prefix="edps-sweep-"))
        try:
            (directory / name).write_text(text)
            _log_batch(self.client, self.run_id, tags=tags, metrics=metrics)
            self.client.log_artifact(self.run_id, str(directory / name))
        except MlflowException as error:
            raise store_error(self.client, error) from None
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def finish(self, studies_done: int, studies_with_result: int, seconds: float, description: str = "") -> None:
        _log_batch(self.client, self.run_id, metrics={
            n.METRIC_STUDIES_DONE: studies_done, n.METRIC_STUDIES_WITH_RESULT: studies_with_result,
            n.METRIC_SWEEP_SECONDS: seconds}, tags={n.MLFLOW_NOTE: description[:20_000]} if description else None)
        self.stop_heartbeat()
        require_still_ours(self.client, self.run_id)
        self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))

    def abort(self, interrupted: bool) -> None:
        self.stop_heartbeat()
        try:
            self.client.set_terminated(self.run_id, RunStatus.to_string(
                RunStatus.KILLED if interrupted else RunStatus.FAILED))
        except MlflowException:
            pass


def _log_batch(client: StoreClient, run_id: str, params: dict[str, Any] | None = None,
               tags: dict[str, str] | None = None, metrics: dict[str, float] | None = None, step: int = 0) -> None:
    timestamp = _now_ms()
    metric_list = [Metric(k, float(v), timestamp, step) for k, v in (metrics or {}).items()]
    param_list = [Param(k, _display(v)) for k, v in (params or {}).items()]
    tag_list = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
    # MLflow's limits per call: 1,000 metrics, 100 params, 100 tags.
    while metric_list or param_list or tag_list:
        client.log_batch(run_id, metrics=metric_list[:_BATCH_LIMIT], params=param_list[:100], tags=tag_list[:100])
        metric_list, param_list, tag_list = metric_list[_BATCH_LIMIT:], param_list[100:], tag_list[100:]
