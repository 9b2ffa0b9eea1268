"""The registry at the paper's scale: every command that reads the store, timed on stores of about 15,000
and 150,000 trial runs, on sqlite and on PostgreSQL. Prints figures; not a test.

    python bench/registry.py                                   # both sizes, both backends (about an hour)
    python bench/registry.py --sizes 15000 --backends sqlite   # one store
    python bench/registry.py --template /tmp/edps-template     # reuse a trained template (see below)

How a store is built. One small real digits sweep is trained with the project itself (``edps sweep``,
3 batch sizes x 2 sparsities, 6 trials, a sqlite store: about 3 minutes here), unless ``--template`` names
the folder of an earlier one. Its runs are then copied at the SQL level (rows of runs, tags, params,
metrics, latest_metrics, the study runs' dataset inputs; artifact URIs point at the template's files) into
the experiment ``edps/digits-simple-cnn`` of a new store, once per study of the grid below, with every key,
tag, param and metric that names the study or the trial recomputed by the project's own functions
(StudySpec, SweepSpec, TrialSpec, study_family, the workload's Sobol points and data fingerprint). So
``edps sweep --grid paper --optimizers sgd,momentum,nesterov --trials 100`` finds the store complete and
``edps doctor`` finds nothing wrong, as on a store that the project wrote itself. SQL copies are for this
benchmark only: the product writes through MLflow's client.

The grid: the paper's grid on digits (sgd, momentum, nesterov x sparsity 0, 0.5, 0.7, 0.9 x batch sizes
2..1024), 100 trials a study, repeated with seeds 0, 1, 2, ... (the same experiment, as a lab repeats a
sweep) until the size is reached; the last seed's sweeps cover what is left, one sweep per optimizer. 15,000
trial runs are 150 study runs; 150,000 are 1,500. The small store is the first part of the large one: one
store per backend is built once and grown, and copied at each smaller size (sqlite's backup, pg_dump) so that
the sizes can be measured in turn.

PostgreSQL: a private server (initdb + pg_ctl in a temporary folder, as the ``postgres`` user when this
runs as root; nothing needs to be set up) on a free port, reached with a ``postgresql+psycopg2://`` URI;
VACUUM ANALYZE after each build, as its autovacuum would have done on a store that grew over weeks. sqlite:
the file as MLflow makes it.

Each command runs in a fresh process, as a user types it, ``--repeats`` times on each store, the stores in
turn (small, large, small, large, ...): this machine's speed drifts by a fifth within minutes, and measured
one size after the other a command's ratio moved with it. Shown: the run of median wall time (wall seconds,
CPU seconds and maximum resident memory of that process; the database server's own CPU is in the wall time
only) with the range of wall times, and the median over the pairs of runs of the larger store's wall time
over the smaller's. ``doctor`` is the first check of the experiment (what it remembered of an earlier check is
forgotten before each run: it searches the store by tag for runs without their kind or key); ``doctor again``
is a later check when no run was made since (it reads the runs made since the previous check, and the copies
carry times in the past). ``import mlflow`` is not a command of ours but the machine's pace: a fresh Python
importing MLflow, which every command does first. The targets at the largest size: 5 s for every read, 15 s for
the report (``TARGET_SECONDS``); a run over its target is marked OVER.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edps_mlflow import names as n  # noqa: E402
from edps_mlflow.config import StudySpec, TrialSpec, study_family, trial_families  # noqa: E402
from edps_mlflow.curves import CurveId  # noqa: E402
from edps_mlflow.descriptions import pruning_params, study_run_name, study_tags, trial_run_name  # noqa: E402
from edps_mlflow.results import TrialOutcome as Outcome  # noqa: E402
from edps_mlflow.results import TrialStatus, encode_trial_outcomes  # noqa: E402
from edps_mlflow.store.index import RunDataView, RunInfoView, RunView, entry_of  # noqa: E402
from edps_mlflow.sweep_spec import SweepSpec  # noqa: E402
from edps_mlflow.workloads import get_workload  # noqa: E402

WORKLOAD = "digits-simple-cnn"
EXPERIMENT = n.default_experiment(WORKLOAD)
OPTIMIZERS = ("sgd", "momentum", "nesterov")
TRIALS = 100
TEMPLATE_SWEEP = ["sweep", "--batch-sizes", "16,64,256", "--sparsities", "0,0.9", "--optimizers", "sgd",
                  "--trials", "6", "--goal-error", "0.06", "--max-steps", "600", "--check-interval", "20",
                  "--experiment", "template", "--log-interval", "30"]
EDPS = [sys.executable, "-c", "from edps_mlflow.cli import main; main()"]
ANALYZE = [sys.executable, "-c", "from analysis.cli import main; main()"]


# ---- the template: a real sweep ----------------------------------------------------------------
def train_template(folder: Path) -> Path:
    database = folder / "mlflow.db"
    if database.exists():
        return database
    folder.mkdir(parents=True, exist_ok=True)
    print(f"training the template sweep in {folder} (a few minutes)", flush=True)
    done = subprocess.run([*EDPS, *TEMPLATE_SWEEP], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": f"sqlite:///{database}"})
    if done.returncode != 0:
        raise SystemExit(f"the template sweep failed:\n{done.stderr[-3000:]}")
    return database


@dataclass
class TemplateRun:
    row: dict[str, Any]
    tags: dict[str, str]
    params: dict[str, str]
    latest: list[dict[str, Any]]
    history: list[dict[str, Any]]
    inputs: list[tuple[dict[str, Any], list[dict[str, Any]]]] = field(default_factory=list)
    trials: list["TemplateRun"] = field(default_factory=list)

    @property
    def kind(self) -> str | None:
        return self.tags.get(n.TAG_KIND)

    def metric(self, name: str) -> float | None:
        return next((m["value"] for m in self.latest if m["key"] == name), None)


@dataclass
class Template:
    sweep: TemplateRun
    studies: list[TemplateRun]  # with their trial runs, by trial index
    datasets: list[dict[str, Any]]
    columns: dict[str, list[str]]


TABLES = ("runs", "tags", "params", "latest_metrics", "metrics", "inputs", "input_tags", "datasets")


def load_template(database: Path) -> Template:
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    connection.row_factory = sqlite3.Row
    columns = {t: [r["name"] for r in connection.execute(f"pragma table_info({t})")] for t in TABLES}

    def rows(sql: str, *args: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in connection.execute(sql, args)]

    runs: dict[str, TemplateRun] = {}
    for row in rows("select * from runs where status = 'FINISHED'"):
        run_id = row["run_uuid"]
        runs[run_id] = TemplateRun(
            row, {r["key"]: r["value"] for r in rows("select * from tags where run_uuid = ?", run_id)},
            {r["key"]: r["value"] for r in rows("select * from params where run_uuid = ?", run_id)},
            rows("select * from latest_metrics where run_uuid = ?", run_id),
            rows("select * from metrics where run_uuid = ?", run_id))
        for link in rows("select * from inputs where destination_id = ?", run_id):
            tags = rows("select * from input_tags where input_uuid = ?", link["input_uuid"])
            runs[run_id].inputs.append((link, tags))
    sweeps = [r for r in runs.values() if r.kind == n.KIND_SWEEP]
    studies = [r for r in runs.values() if r.kind == n.KIND_STUDY]
    if len(sweeps) != 1 or not studies:
        raise SystemExit(f"{database}: expected one finished sweep run with its study runs")
    for study in studies:
        study.trials = sorted((r for r in runs.values() if r.kind == n.KIND_TRIAL
                               and r.tags.get(n.MLFLOW_PARENT_RUN_ID) == study.row["run_uuid"]),
                              key=lambda r: int(r.params[n.PARAM_TRIAL_INDEX]))
    datasets = rows("select * from datasets")
    connection.close()
    return Template(sweeps[0], studies, datasets, columns)


# ---- the grid ------------------------------------------------------------------------------------
def planned_sweeps(trial_runs: int, fingerprint: str) -> list[SweepSpec]:
    """The sweeps of a store of about ``trial_runs`` trial runs: the paper grid per seed, then what is left
    of the last seed, one sweep per optimizer (a sweep is a product grid)."""
    batch_sizes, sparsities = get_workload(WORKLOAD).paper_grid()
    per_curve = len(batch_sizes) * TRIALS
    curves_left = round(trial_runs / per_curve)
    sweeps, seed = [], 0
    while curves_left > 0:
        if curves_left >= len(OPTIMIZERS) * len(sparsities):
            groups = [(OPTIMIZERS, sparsities)]
            curves_left -= len(OPTIMIZERS) * len(sparsities)
        else:
            groups = []
            for optimizer in OPTIMIZERS:
                take = sparsities[:min(curves_left, len(sparsities))]
                if take:
                    groups.append(((optimizer,), take))
                    curves_left -= len(take)
        for optimizers, chosen in groups:
            spec = SweepSpec.build(WORKLOAD, optimizers, batch_sizes, chosen, trials=TRIALS, seed=seed)
            sweeps.append(replace(spec, protocol=replace(spec.protocol, data_fingerprint=fingerprint)))
        seed += 1
    return sweeps


# ---- where rows go -----------------------------------------------------------------------------------
class Sink:
    """Rows into the tables of a store, in batches."""

    def __init__(self, columns: dict[str, list[str]]) -> None:
        self.columns = columns
        self.pending: dict[str, list[tuple]] = {t: [] for t in TABLES}

    def add(self, table: str, row: dict[str, Any]) -> None:
        self.pending[table].append(tuple(row.get(c) for c in self.columns[table]))

    def flush(self) -> None:
        for table in TABLES:
            if self.pending[table]:
                self.write(table, self.pending[table])
                self.pending[table] = []

    def write(self, table: str, rows: list[tuple]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SqliteSink(Sink):
    def __init__(self, path: Path, columns: dict[str, list[str]]) -> None:
        super().__init__(columns)
        self.connection = sqlite3.connect(path, timeout=60)
        self.connection.execute("pragma synchronous = off")  # the benchmark's own writes: no fsync needed

    def write(self, table: str, rows: list[tuple]) -> None:
        marks = ", ".join("?" for _ in self.columns[table])
        names = ", ".join(f'"{c}"' for c in self.columns[table])
        with self.connection:
            self.connection.executemany(f"insert into {table} ({names}) values ({marks})", rows)

    def close(self) -> None:
        self.connection.close()


class PostgresSink(Sink):
    def __init__(self, dsn: str, columns: dict[str, list[str]]) -> None:
        import psycopg2

        super().__init__(columns)
        self.connection = psycopg2.connect(dsn)

    def write(self, table: str, rows: list[tuple]) -> None:
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        for row in rows:
            writer.writerow(["\\N" if v is None else v for v in row])
        buffer.seek(0)
        names = ", ".join(f'"{c}"' for c in self.columns[table])
        with self.connection.cursor() as cursor:
            cursor.copy_expert(f"copy {table} ({names}) from stdin with (format csv, null '\\N')", buffer)
        self.connection.commit()

    def analyze(self) -> None:
        """VACUUM ANALYZE, as autovacuum does to a table after inserts (PostgreSQL 13 and later): on a store
        that grew over weeks it has long been done; right after a bulk copy it is not, and autovacuum then
        runs during the first commands measured, on the same two cores, and the first reads set the hint
        bits of every new row."""
        self.connection.autocommit = True
        with self.connection.cursor() as cursor:
            cursor.execute("vacuum analyze")
        self.connection.autocommit = False

    def close(self) -> None:
        self.connection.close()


# ---- the copies ------------------------------------------------------------------------------------
def _display(value: Any) -> str:
    # As the store writes params (store.display_value): floats without binary noise, tuples as lists.
    if isinstance(value, float):
        return f"{value:.12g}"
    if isinstance(value, (tuple, list)):
        return ",".join(_display(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class TrialOutcome:
    index: int
    status: str
    steps_to_result: int | None
    steps_trained: int


class Replicator:
    """Study runs (with their trial runs) and sweep runs of the grid, as copies of the template's runs."""

    def __init__(self, template: Template, sink: Sink, experiment_id: int, started_ms: int) -> None:
        self.template, self.sink, self.experiment_id = template, sink, experiment_id
        self.clock = started_ms
        self.datasets = {}
        self.workload = get_workload(WORKLOAD)
        # Template studies that reached the goal, by batch size: every curve gets points with a result.
        reached = [s for s in template.studies if s.metric(n.METRIC_STEPS_TO_RESULT) is not None]
        self.by_batch = sorted(reached or template.studies, key=lambda s: int(s.tags[n.TAG_BATCH_SIZE]))
        self.trial_runs = 0
        self.study_keys: set[str] = set()

    def prepare_experiment(self, index_run_id: str) -> None:
        """The experiment's datasets; its study index run (made with the experiment) takes the entries."""
        self.index_run_id = index_run_id
        for dataset in self.template.datasets:
            copy = {**dataset, "dataset_uuid": uuid.uuid4().hex, "experiment_id": self.experiment_id}
            self.datasets[dataset["dataset_uuid"]] = copy["dataset_uuid"]
            self.sink.add("datasets", copy)

    def _template_study(self, spec: StudySpec) -> TemplateRun:
        import math

        return min(self.by_batch, key=lambda s: (abs(math.log2(int(s.tags[n.TAG_BATCH_SIZE])) -
                                                     math.log2(spec.batch_size)), int(s.tags[n.TAG_BATCH_SIZE])))

    def _run(self, source: TemplateRun, run_id: str, start: int, name: str, tags: dict[str, str],
             params: dict[str, str], metrics: dict[str, float], end: int | None = None,
             drop: tuple[str, ...] = ()) -> RunView:
        """One run copied from ``source``: its rows with ``tags``, ``params`` and ``metrics`` replaced or added
        (a replaced metric keeps one point), the metrics named in ``drop`` (or starting with one of them) left
        out; metric timestamps keep their offsets from the run's start. Returns the run as written."""
        offset = start - int(source.row["start_time"])
        if end is None:
            end = int(source.row["end_time"] or source.row["start_time"]) + offset
        self.sink.add("runs", {**source.row, "run_uuid": run_id, "name": name, "start_time": start, "end_time": end,
                               "experiment_id": self.experiment_id})
        all_tags = {**source.tags, **tags, n.MLFLOW_RUN_NAME: name}
        for key, value in all_tags.items():
            self.sink.add("tags", {"key": key, "value": value, "run_uuid": run_id})
        all_params = {**source.params, **params}
        for key, value in all_params.items():
            self.sink.add("params", {"key": key, "value": value, "run_uuid": run_id})
        latest = {}
        for row in source.history:
            if not (drop and row["key"].startswith(drop)) and row["key"] not in metrics:
                self.sink.add("metrics", {**row, "timestamp": int(row["timestamp"]) + offset, "run_uuid": run_id})
        for row in source.latest:
            if not (drop and row["key"].startswith(drop)) and row["key"] not in metrics:
                latest[row["key"]] = row["value"]
                self.sink.add("latest_metrics", {**row, "timestamp": int(row["timestamp"]) + offset,
                                                 "run_uuid": run_id})
        for key, value in metrics.items():
            point = {"key": key, "value": value, "timestamp": end, "step": 0, "is_nan": 0, "run_uuid": run_id}
            latest[key] = value
            self.sink.add("latest_metrics", point)
            self.sink.add("metrics", point)
        for link, input_tags in source.inputs:
            input_uuid = uuid.uuid4().hex
            self.sink.add("inputs", {**link, "input_uuid": input_uuid, "destination_id": run_id,
                                     "source_id": self.datasets.get(link["source_id"], link["source_id"])})
            for tag in input_tags:
                self.sink.add("input_tags", {**tag, "input_uuid": input_uuid})
        return RunView(RunInfoView(run_id, str(self.experiment_id), source.row["status"], start, end),
                       RunDataView(all_tags, all_params, latest))

    def study(self, spec: StudySpec, sweep_run_id: str, sweep_key: str) -> dict[str, Any]:
        """A study run of ``spec`` and its trial runs, FINISHED, under the sweep run."""
        source = self._template_study(spec)
        study_run_id = uuid.uuid4().hex
        start = self.clock
        trained = spec.training_spec
        points = self.workload.search_space(spec.optimizer).points(spec.trials)
        outcomes: list[TrialOutcome] = []
        trial_start = start + 500
        last_end = trial_start
        for index, point in enumerate(points):
            copied = source.trials[index % len(source.trials)]
            trial = TrialSpec(trained, index, point)
            status = copied.tags[n.TAG_STATUS]
            steps = copied.metric(n.METRIC_STEPS_TO_RESULT)
            outcome = TrialOutcome(index, status, int(steps) if steps is not None else None,
                                   int(copied.metric(n.METRIC_STEPS_TRAINED) or 0))
            outcomes.append(outcome)
            words = f"reached@{outcome.steps_to_result}" if status == "reached" else status.replace("_", " ")
            tags = {n.TAG_TRIAL_KEY: trial.trial_key, n.TAG_STUDY_KEY: trained.study_key,
                    n.TAG_STUDY_FAMILY: study_family(trained), **CurveId.of(spec).tags(),
                    n.TAG_BATCH_SIZE: str(spec.batch_size), n.TAG_SWEEP_KEY: sweep_key, n.MLFLOW_PARENT_RUN_ID: study_run_id,
                    f"{n.TAG_EPOCH_PREFIX}1": trained.study_key}  # the template's trial runs carry epoch 1 of theirs
            params = {k: v for k, v in copied.params.items() if k not in self._metaparameter_names(copied)}
            params.update({k: _display(v) for k, v in point.items()})
            params.update({n.PARAM_SEED: str(trial.init_seed), n.PARAM_TRIAL_INDEX: str(index),
                           n.PARAM_BATCH_SIZE: str(spec.batch_size), n.PARAM_SPARSITY: _display(spec.sparsity),
                           n.PARAM_OPTIMIZER: spec.optimizer, **pruning_params(spec)})
            end = self._run(copied, uuid.uuid4().hex, trial_start + index * 20, trial_run_name(trial, words), tags,
                            params, {}, drop=(n.METRIC_HP_PREFIX,)).info.end_time
            last_end = max(last_end, end)
            self.trial_runs += 1
        reached = [o for o in outcomes if o.status == "reached"]
        best = min(reached, key=lambda o: (o.steps_to_result, o.index)) if reached else None
        best_point = points[best.index] if best else {}
        tags = {**study_tags(spec), n.TAG_SWEEP_KEY: sweep_key, n.MLFLOW_PARENT_RUN_ID: sweep_run_id}
        tags.update(self._derived_study_tags(spec, outcomes))
        params = {k: v for k, v in source.params.items()
                  if not k.startswith((n.PARAM_SPEC_PREFIX, n.PARAM_BEST_PREFIX))}
        params.update({n.PARAM_SPEC_PREFIX + k: _display(v) for k, v in spec.key_fields().items()})
        params.update({n.PARAM_BEST_PREFIX + k: _display(v) for k, v in best_point.items()})
        params.update(pruning_params(spec))
        metrics: dict[str, float] = {n.METRIC_BATCH_SIZE: spec.batch_size, n.METRIC_SPARSITY: spec.sparsity,
                                     n.METRIC_TRIALS_TOTAL: len(outcomes), n.METRIC_TRIALS_TRAINED: len(outcomes),
                                     n.METRIC_TRIALS_REUSED: 0}
        for status in ("reached", "not_reached", "diverged", "superseded"):
            metrics[n.trials_metric(status)] = sum(1 for o in outcomes if o.status == status)
        metrics.update({n.METRIC_BEST_PREFIX + k: float(v) for k, v in best_point.items()})
        metrics.update(self._derived_study_metrics(outcomes))
        if best is not None:
            metrics[n.METRIC_STEPS_TO_RESULT] = best.steps_to_result
        # The template's result and best point give way to the copy's (written from ``metrics``).
        drop = (n.METRIC_BEST_PREFIX, n.METRIC_STEPS_TO_RESULT)
        run = self._run(source, study_run_id, start, study_run_name(spec), tags, params, metrics, end=last_end + 1000,
                        drop=drop)
        # Its entry in the study index, as the study writes it once it is FINISHED (store.index_study_run;
        # the entry it wrote when it started is replaced by this one).
        entry = entry_of(run)
        if entry is None:
            raise SystemExit(f"the index entry of study {spec.study_key[:12]} does not fit a tag")
        self.sink.add("tags", {"key": n.TAG_INDEX_PREFIX + study_run_id, "value": entry, "run_uuid": self.index_run_id})
        self.clock = last_end + 2000
        return {"spec": spec, "run_id": study_run_id, "steps": best.steps_to_result if best else None}

    @staticmethod
    def _metaparameter_names(run: TemplateRun) -> set[str]:
        return {k[len(n.METRIC_HP_PREFIX):] for k in (m["key"] for m in run.latest) if k.startswith(n.METRIC_HP_PREFIX)}

    @staticmethod
    def _derived_study_tags(spec: StudySpec, outcomes: list[TrialOutcome]) -> dict[str, str]:
        """The tags a study writes about its trials, as the project derives them."""
        return {n.TAG_TRIAL_FAMILIES: ",".join(trial_families(spec)),
                n.TAG_TRIAL_OUTCOMES: encode_trial_outcomes(
                    Outcome(o.index, TrialStatus(o.status), o.steps_to_result, o.steps_trained) for o in outcomes)}

    @staticmethod
    def _derived_study_metrics(outcomes: list[TrialOutcome]) -> dict[str, float]:
        """The metrics a study writes about its trials: every trial run of the copy was finished by it."""
        return {n.METRIC_TRIAL_RUNS_FINISHED: len(outcomes)}

    def sweep(self, spec: SweepSpec) -> None:
        """The sweep run of ``spec`` with its studies, FINISHED."""
        sweep_run_id = uuid.uuid4().hex
        start = self.clock
        self.clock += 1000
        # A study already in the store (the same study of a smaller store's last sweep) is not made twice.
        studies = [self.study(study, sweep_run_id, spec.sweep_key) for study in spec.studies()
                   if study.study_key not in self.study_keys]
        self.study_keys.update(study["spec"].study_key for study in studies)
        source = self.template.sweep
        params = {k: v for k, v in source.params.items() if not k.startswith(n.PARAM_SWEEP_PREFIX)}
        params.update({n.PARAM_SWEEP_PREFIX + k: _display(v) for k, v in
                       {**spec.params(), "full_trials": False}.items()})
        metrics = {n.METRIC_STUDIES_DONE: len(studies),
                   n.METRIC_STUDIES_WITH_RESULT: sum(1 for s in studies if s["steps"] is not None)}
        # Its owner's end, as a sweep records it under its owner token (the template's token, this copy's time).
        token = source.tags.get(n.TAG_LEASE_OWNER, "")
        self._run(source, sweep_run_id, start, f"sweep {spec.workload} {len(studies)} studies",
                  {n.TAG_SWEEP_KEY: spec.sweep_key, n.TAG_END_PREFIX + token: f"FINISHED {self.clock}",
                   **{n.TAG_PLAN_PREFIX + k: str(v) for k, v in
                      {"studies": len(studies), "done": 0, "partial": 0, "todo": len(studies)}.items()}}, params,
                  metrics, end=self.clock)
        self.clock += 1000


# ---- stores --------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_postgres_user(command: list[str]) -> list[str]:
    # initdb and the server refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _pg_binary(name: str) -> str:
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (folder / name).exists():
            return str(folder / name)
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"PostgreSQL's {name} is not installed")
    return found


@contextmanager
def postgres_server(folder: Path) -> Iterator[str]:
    """A private PostgreSQL server in ``folder`` for the time of the block; yields its psycopg2 DSN."""
    data = folder / "pgdata"
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")
    subprocess.run(_as_postgres_user([_pg_binary("initdb"), "-D", str(data), "-A", "trust", "-U", user]),
                   check=True, capture_output=True)
    port = _free_port()
    subprocess.run(_as_postgres_user([_pg_binary("pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w",
                                      "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"]),
                   check=True, capture_output=True)
    try:
        subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(port), "-U", user, "-d", "postgres", "-q", "-c",
                        "create database edps"], check=True, capture_output=True)
        yield f"postgresql://{user}@127.0.0.1:{port}/edps"
    finally:
        subprocess.run(_as_postgres_user([_pg_binary("pg_ctl"), "-D", str(data), "-m", "fast", "stop"]),
                       capture_output=True)


def prepare_store(uri: str) -> tuple[int, str]:
    """The store's schema and the experiment with its study index run, made by the project as any command
    makes them; their ids."""
    from edps_mlflow.store.client import open_store
    from edps_mlflow.store.experiment import index_run_id, resolve_experiment

    client = open_store(uri)
    experiment_id = resolve_experiment(client, EXPERIMENT)
    index = index_run_id(client, experiment_id)
    engine = getattr(getattr(getattr(client, "_client", None), "_tracking_client", None), "store", None)
    if getattr(engine, "engine", None) is not None:
        engine.engine.dispose()
    return int(experiment_id), index


def forget_doctor_checks(uri: str, experiment_id: int) -> None:
    """As if doctor had never checked the experiment (its next check is a first one)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    tags = client.get_experiment(str(experiment_id)).tags
    for name in (n.EXPERIMENT_TAG_CHECKED_UNTIL, n.EXPERIMENT_TAG_RECHECK):
        if name in tags:
            client.delete_experiment_tag(str(experiment_id), name)


def snapshot(backend: str, folder: Path, uri: str, size: int) -> str:
    """A copy of the store as it is now (its smaller size), to measure beside the larger store it grows into:
    each command then runs on the two in turn, so that the machine's drift during the run (a fifth of a
    command's time within minutes here) falls on both alike. Returns the copy's URI."""
    if backend == "sqlite":
        target = folder / f"mlflow-{size}.db"
        source, copy = sqlite3.connect(uri.removeprefix("sqlite:///")), sqlite3.connect(target)
        try:
            source.backup(copy)
        finally:
            source.close()
            copy.close()
        return f"sqlite:///{target}"
    from urllib.parse import urlsplit

    parts = urlsplit(uri.replace("postgresql+psycopg2://", "postgresql://"))
    server = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port), "-U", parts.username or "postgres"]
    name = f"edps_{size}"
    subprocess.run(["psql", *server, "-d", "postgres", "-q", "-c", f"create database {name}"], check=True,
                   capture_output=True)
    dump = subprocess.Popen([_pg_binary("pg_dump"), *server, parts.path.lstrip("/")], stdout=subprocess.PIPE)
    subprocess.run(["psql", *server, "-d", name, "-q"], stdin=dump.stdout, check=True, capture_output=True)
    if dump.wait() != 0:
        raise SystemExit(f"pg_dump of the {size:,}-run store failed")
    subprocess.run(["psql", *server, "-d", name, "-q", "-c", "vacuum analyze"], check=True, capture_output=True)
    return uri.rsplit("/", 1)[0] + f"/{name}"


# ---- the commands ------------------------------------------------------------------------------------
COMMANDS: dict[str, list[str]] = {
    # Not a command of ours: the machine's pace. This machine's speed drifts by half within the hour; every
    # command below pays this import (and SQLAlchemy's), so its row says how fast the machine ran meanwhile.
    "import mlflow": [sys.executable, "-c", "import mlflow"],
    "status": [*EDPS, "status", "--experiment", EXPERIMENT],
    "sweep plan": [*EDPS, "sweep", "--grid", "paper", "--optimizers", ",".join(OPTIMIZERS), "--trials", str(TRIALS),
                   "--experiment", EXPERIMENT],
    "doctor": [*EDPS, "doctor", "--experiment", EXPERIMENT],
    # Doctor's next check reads only the runs made since the previous one (docs/reliability.md).
    "doctor again": [*EDPS, "doctor", "--experiment", EXPERIMENT],
    "analyze table": [*ANALYZE, "table", "--experiment", EXPERIMENT],
    "analyze fit": [*ANALYZE, "fit", "--experiment", EXPERIMENT],
    "analyze report": [*ANALYZE, "report", "--experiment", EXPERIMENT, "--output", "report.html"],
}
# The wall seconds a command may take at 150,000 trial runs: a read (status, a sweep's plan, doctor, table, fit)
# answers within 5 s; the report, drawn once per sweep, within 15 s. The machine's pace has none.
TARGET_SECONDS = {"import mlflow": None, "analyze report": 15.0}
DEFAULT_TARGET_SECONDS = 5.0


def target_seconds(name: str) -> float | None:
    return TARGET_SECONDS.get(name, DEFAULT_TARGET_SECONDS)


@dataclass(frozen=True)
class Measured:
    wall: float
    cpu: float
    rss_mb: float
    code: int | None  # None: timed out
    last_line: str
    walls: tuple[float, ...] = ()  # every repeat's wall time, when the command ran more than once


# Runs the command and writes its CPU seconds and maximum resident memory (KB) to a file. Linux carries a
# process's resident maximum over exec into the new program, so a child forked from this (large) process
# would report this process's size; the command is a child of this small one instead.
_MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(f"{usage.ru_utime + usage.ru_stime} {usage.ru_maxrss}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def measure(command: list[str], uri: str, folder: Path, timeout: float) -> Measured:
    """One command in a fresh process: its wall time, CPU time and maximum resident memory."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    environment.update({"PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": uri})
    usage_file = folder / "usage.txt"
    usage_file.unlink(missing_ok=True)
    started = time.perf_counter()
    with open(folder / "stdout.txt", "w") as out, open(folder / "stderr.txt", "w") as err:
        process = subprocess.Popen([sys.executable, "-S", "-c", _MEASURE, str(usage_file), *command], cwd=folder,
                                   env=environment, stdout=out, stderr=err, start_new_session=True)
        try:
            code: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            code = None
    wall = time.perf_counter() - started
    cpu, rss_kb = (float(v) for v in usage_file.read_text().split()) if usage_file.exists() else (math.nan, math.nan)
    if code is None:
        return Measured(wall, cpu, rss_kb / 1024, None, f"did not finish in {timeout:.0f} s")
    text = ((folder / "stderr.txt").read_text() if code else "") or (folder / "stdout.txt").read_text()
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return Measured(wall, cpu, rss_kb / 1024, code, lines[-1] if lines else "")


# ---- the MLflow UI ------------------------------------------------------------------------------------
def check_ui(uri: str, experiment_id: int, folder: Path) -> None:
    """The MLflow UI over the store, in headless Chromium: the experiment as it opens by default, the experiment
    link that edps prints (its study runs), and a study run's page (its trial runs among its child runs). Prints
    what each page shows and how long it took; screenshots in ``folder``."""
    import re
    import urllib.request

    from edps_mlflow.store.client import StoreClient, ui_link
    from edps_mlflow.store.read.runs import study_runs

    chromium = shutil.which("chromium")
    if chromium is None:
        print("the UI check needs Debian's chromium (apt-get install chromium)")
        return
    port = _free_port()
    log = open(folder / "ui-server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1", "--backend-store-uri", uri], stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("mlflow server did not start for the UI check")
                time.sleep(1)
        study = study_runs(StoreClient(uri), str(experiment_id), WORKLOAD, 60.0)[0]
        pages = {"experiment, default view": f"{url}/#/experiments/{experiment_id}/runs?workflowType=machine_learning",
                 "experiment link edps prints": ui_link(url, str(experiment_id)).split(": ", 1)[1],
                 "a study run": ui_link(url, str(experiment_id), study.run_id).split(": ", 1)[1]}
        for number, (name, page) in enumerate(pages.items()):
            started = time.perf_counter()
            flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--virtual-time-budget=60000", "--window-size=1600,1000"]
            dom = subprocess.run([*flags, f"--user-data-dir={folder / f'profile-{number}'}", "--dump-dom", page],
                                 capture_output=True, text=True, timeout=600).stdout
            seconds = time.perf_counter() - started
            subprocess.run([*flags, f"--user-data-dir={folder / f'profile-{number}-shot'}",
                            f"--screenshot={folder / f'ui-{number}.png'}", page], capture_output=True, timeout=600)
            rows = re.findall(r"(bs=\d+ sp=[\d.]+ [a-z]+ digits-simple-cnn|sweep digits-simple-cnn \d+ studies|"
                              r"t\d{3} [a-z@0-9 ]+lr=[0-9.]+|edps study index)", dom)
            children = re.search(r">Child runs<(.*?)</div></div>", dom, re.S)
            trials = len(re.findall(r"t\d{3} ", re.sub(r"<[^>]+>", " ", children.group(1)))) if children else 0
            print(f"  UI, {name}: {seconds:.0f} s to render; runs named on the page: {len(rows)} "
                  f"(first: {', '.join(dict.fromkeys(rows))[:160]}); 'Load more': {'Load more' in dom}"
                  + (f"; child runs listed: {trials}" if name == "a study run" else "")
                  + f"; screenshot {folder / f'ui-{number}.png'}", flush=True)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
        log.close()


def _cell(result: Measured | None) -> str:
    if result is None:
        return "-"
    if result.code is None:
        return f"> {result.wall:.0f} s (stopped)"
    figures = f"{result.wall:.1f} / {result.cpu:.1f} / {result.rss_mb:.0f}"
    if len(result.walls) > 1:
        figures += f" ({min(result.walls):.1f}-{max(result.walls):.1f})"
    return figures if result.code == 0 else f"{figures} exit {result.code}"


def summarised(runs: list[Measured]) -> Measured:
    """The run of median wall time among ``runs`` of one command, with every run's wall time; the first
    failure or timeout as it is."""
    failed = [r for r in runs if r.code != 0]
    if failed:
        return failed[0]
    median = sorted(runs, key=lambda r: r.wall)[len(runs) // 2]
    return replace(median, walls=tuple(r.wall for r in runs))


def paired_ratio(smaller: list[Measured], larger: list[Measured]) -> float | None:
    """The median, over the runs made in turn, of the larger store's wall time over the smaller's."""
    pairs = [b.wall / a.wall for a, b in zip(smaller, larger) if a.code == 0 and b.code == 0]
    return sorted(pairs)[len(pairs) // 2] if pairs and len(smaller) == len(larger) else None


# ---- main --------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="15000,150000", help="trial runs per store, smallest first")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--commands", default=",".join(COMMANDS), help=f"of: {', '.join(COMMANDS)}")
    parser.add_argument("--template", default=None, help="folder of a trained template (trained there if missing)")
    parser.add_argument("--work", default=None, help="folder for the stores (default: a temporary one, removed)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a command may take")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each command on each store, the stores in turn; the run of median wall "
                             "time is shown, with the range")
    parser.add_argument("--ui", action="store_true",
                        help="also open the MLflow UI over the largest sqlite store in headless Chromium")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    commands = [c.strip() for c in args.commands.split(",")]
    unknown = [c for c in commands if c not in COMMANDS]
    if unknown:
        raise SystemExit(f"unknown command(s) {unknown}; known: {', '.join(COMMANDS)}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="edps-bench-registry-"))
    work.mkdir(parents=True, exist_ok=True)
    template_folder = Path(args.template) if args.template else work / "template"
    template = load_template(train_template(template_folder))
    fingerprint = get_workload(WORKLOAD).data_fingerprint(None)
    paper_grid_key = planned_sweeps(len(OPTIMIZERS) * 4 * 10 * TRIALS, fingerprint)[0].sweep_key
    results: dict[tuple[str, int, str], Measured] = {}
    ratios: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, int], tuple[int, int]] = {}
    try:
        for backend in [b.strip() for b in args.backends.split(",")]:
            folder = work / backend
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            with _store(backend, folder) as (uri, sink_factory):
                experiment_id, index_run = prepare_store(uri)
                sink = sink_factory(template.columns)
                replicator = Replicator(template, sink, experiment_id, int(time.time() * 1000) - 90 * 86_400_000)
                replicator.prepare_experiment(index_run)
                built: list[SweepSpec] = []
                stores: dict[int, str] = {}  # size -> the URI of the store of that size
                plan_possible: dict[int, bool] = {}
                for size in sizes:
                    started = time.perf_counter()
                    for spec in planned_sweeps(size, fingerprint):
                        if any(spec.sweep_key == b.sweep_key for b in built):
                            continue
                        replicator.sweep(spec)
                        sink.flush()
                        built.append(spec)
                    studies = len(replicator.study_keys)
                    if isinstance(sink, PostgresSink):
                        sink.analyze()
                    counts[(backend, size)] = (replicator.trial_runs, studies)
                    # the paper grid not all in the store yet: the sweep would train
                    plan_possible[size] = any(b.sweep_key == paper_grid_key for b in built)
                    stores[size] = uri if size == sizes[-1] else snapshot(backend, folder, uri, size)
                    print(f"{backend}: {replicator.trial_runs:,} trial runs and {studies:,} study runs built in "
                          f"{time.perf_counter() - started:.0f} s", flush=True)
                sink.close()
                # What was written reaches the disk before anything is timed: a store in daily use is not in
                # the middle of writing gigabytes back (that took the first commands' CPU and disk).
                os.sync()
                for size in sizes:
                    (folder / f"commands-{size}").mkdir()
                    forget_doctor_checks(stores[size], experiment_id)
                for name in commands:
                    runs: dict[int, list[Measured]] = {size: [] for size in sizes}
                    for _ in range(args.repeats):  # the sizes in turn, so that drift falls on each alike
                        for size in sizes:
                            if name == "sweep plan" and not plan_possible[size]:
                                continue
                            if name == "doctor":  # each run a first check
                                forget_doctor_checks(stores[size], experiment_id)
                            runs[size].append(measure(COMMANDS[name], stores[size], folder / f"commands-{size}",
                                                      args.timeout))
                    for size in sizes:
                        if runs[size]:
                            result = results[(backend, size, name)] = summarised(runs[size])
                            print(f"  {size:>7,} {name:15s} {_cell(result):>28s}   {result.last_line[:100]}",
                                  flush=True)
                    ratio = paired_ratio(runs[sizes[0]], runs[sizes[-1]])
                    if ratio is not None:
                        ratios[(backend, name)] = ratio
                if args.ui and backend == "sqlite":
                    check_ui(uri, experiment_id, folder)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    _print_table(results, ratios, counts, sizes, commands)


@contextmanager
def _store(backend: str, folder: Path) -> Iterator[tuple[str, Any]]:
    if backend == "sqlite":
        database = folder / "mlflow.db"
        yield f"sqlite:///{database}", lambda columns: SqliteSink(database, columns)
    elif backend == "postgresql":
        with postgres_server(folder / "postgres") as dsn:
            yield dsn.replace("postgresql://", "postgresql+psycopg2://"), lambda columns: PostgresSink(dsn, columns)
    else:
        raise SystemExit(f"unknown backend {backend!r}: sqlite or postgresql")


def _print_table(results: dict[tuple[str, int, str], Measured], ratios: dict[tuple[str, str], float],
                 counts: dict[tuple[str, int], tuple[int, int]], sizes: list[int], commands: list[str]) -> None:
    print("\nwall s / CPU s / max RSS MB of each command in a fresh process (the run of median wall time, the "
          "range of wall times in parentheses); ratio: the median over the runs made in turn on the largest and "
          "the smallest store of the larger's wall time over the smaller's; target: the most wall seconds a "
          "command may take at the largest size (OVER: its median run took longer)")
    for backend in sorted({b for b, _ in counts}):
        header = [f"{counts[(backend, s)][0]:,} trial runs ({counts[(backend, s)][1]:,} studies)" for s in sizes
                  if (backend, s) in counts]
        print(f"\n{backend}")
        print(f"| command | {' | '.join(header)} | ratio | target |")
        print("|---|" + "---|" * len(header) + "---|---|")
        for name in commands:
            cells = [_cell(results.get((backend, s, name))) for s in sizes if (backend, s) in counts]
            ratio = f"{ratios[(backend, name)]:.2f}" if (backend, name) in ratios and len(sizes) > 1 else "-"
            target, largest = target_seconds(name), results.get((backend, sizes[-1], name))
            over = target is not None and largest is not None and (largest.code is None or largest.wall > target)
            target_cell = "-" if target is None else f"{target:.0f} s" + (" OVER" if over else "")
            print(f"| {name} | {' | '.join(cells)} | {ratio} | {target_cell} |")


if __name__ == "__main__":
    main()
