"""The ``edps`` command: its commands, whose options (cli_options.py) are parsed into specs, and the launcher.

    edps study --workload mnist-simple-cnn --bs 128 --data-dir ~/data/mnist --optimizer momentum
    edps sweep --batch-sizes 16..256 --sparsities 0,0.9 --pruning 'snip,random,shuffle(snip)'
    edps status; edps doctor --repair; edps workloads; edps trials --workload digits-simple-cnn --optimizer adam
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import click

from edps_mlflow import __version__
from edps_mlflow.cli_options import (LISTS, OPTIONAL_INT, ExperimentName, declared_options, spec_arguments,
                                     usage_line)
from edps_mlflow.config import StudySpec, replicate_seeds
from edps_mlflow.errors import EdpsError
from edps_mlflow.executors import get_executor
from edps_mlflow.interrupts import raise_interrupt
from edps_mlflow.mlproject import ProjectLaunch
from edps_mlflow.process_settings import (configure_process, end_with, launcher_run_id, log_note, outage_seconds,
                                          store_errors_in_one_line)
from edps_mlflow.resources import training_environment_missing
from edps_mlflow.sweep_spec import SweepOptions, SweepSpec
from edps_mlflow.uris import check_environment_store, userinfo_fault
from edps_mlflow.workloads import GoalMetric, get_workload, workload_catalog, workload_source

_REEXEC_MARK = "EDPS_TRAINING_ENVIRONMENT"
_ROOT = Path(__file__).resolve().parents[1]  # the directory that holds this package (and the MLproject)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edps")
def cli() -> None:
    """Measure steps-to-result against batch size and sparsity, tracked in MLflow."""


@cli.command()
@declared_options("study")
def study(given: SimpleNamespace) -> None:
    """Tune one (workload, optimizer, sparsity, batch size) and record its steps-to-result."""
    sweep_run, sweep_key = given.sweep_run.strip(), given.sweep_key.strip()
    if bool(sweep_run) != bool(sweep_key):
        raise EdpsError("--sweep-run and --sweep-key go together (a sweep sets both)")
    if given.replicates > 1 and (launcher_run_id() or sweep_run):
        # `mlflow run` made one run for one study, and a sweep submits each replicate as a study of its own.
        raise EdpsError("the main entry point runs one study: run the sweep entry point with -P replicates=N"
                        if launcher_run_id() else "--replicates is not an option of a sweep's study")
    spec = StudySpec.build(**spec_arguments(given))
    replicate_seeds(spec.seed, given.replicates)
    check_environment_store()  # before the data are loaded
    # Only a valid study loads torch and MLflow (seconds): a bad value is refused before.
    from edps_mlflow.replicates import run_replicates
    from edps_mlflow.study import ExecutionOptions, run_study

    options = ExecutionOptions(
        full_trials=given.full_trials, device=given.device or None, workers=given.workers, pack_size=given.pack_size,
        early_abort_evaluation=not given.full_evaluation, experiment=given.experiment,
        data_dir=given.data_dir or None, log_interval=given.log_interval or 10.0, curve_interval=given.curve_interval,
        system_metrics=given.system_metrics, accept_unverified_data=given.accept_unverified_data,
        # A sweep's study waits for a live run of its key elsewhere, as it does in the other executors.
        wait=given.wait or bool(sweep_run), parent_run_id=sweep_run or None, sweep_key=sweep_key or None)
    if given.replicates == 1:
        run_study(spec, options)  # the plain study, which says nothing of replicates
    else:
        run_replicates(spec, given.replicates, options)


@cli.command()
@declared_options("sweep")
def sweep(given: SimpleNamespace) -> None:
    """Run the grid batch sizes x sparsities x optimizers, resuming whatever is already in the store.
    With --adaptive, measure only the batch sizes that pin B_crit and the regime boundaries."""
    if not given.adaptive:
        named = [flag for flag, value in (("--target", given.target), ("--max-studies", given.max_studies),
                                          ("--budget", given.budget)) if value is not None]
        if named:
            raise EdpsError(f"{', '.join(named)} only apply to an adaptive sweep: add --adaptive")
    arguments = spec_arguments(given)
    if given.grid == "paper":
        if given.batch_sizes is not None or given.sparsities is not None:
            raise EdpsError("--grid paper sets the batch sizes and sparsities; leave out --batch-sizes and "
                            "--sparsities")
        arguments["batch_sizes"], arguments["sparsities"] = get_workload(given.workload).paper_grid()
    spec = SweepSpec.build(**arguments, replicates=given.replicates)
    check_environment_store()
    options = SweepOptions(
        experiment=given.experiment, executor=given.executor, workers=given.workers, ray_address=given.ray_address,
        device=given.device or None, data_dir=given.data_dir or None, full_trials=given.full_trials,
        log_interval=given.log_interval or 30.0, wait=given.wait, accept_unverified_data=given.accept_unverified_data,
        project=ProjectLaunch(given.backend, given.env_manager, given.backend_config))
    # Only valid values load torch and MLflow (seconds): a bad one is refused before.
    if given.adaptive:
        from edps_mlflow.adaptive import AdaptiveSettings, Budget
        from edps_mlflow.executors.base import executor_workers

        goal, factor = AdaptiveSettings.parse_target("b_crit:2" if given.target is None else given.target)
        settings = AdaptiveSettings(target=factor, max_studies=given.max_studies, goal=goal,
                                    budget=Budget.parse(given.budget) if given.budget is not None else None,
                                    width=executor_workers(get_executor(given.executor), options))
        from edps_mlflow.adaptive_sweep import AdaptiveSweepSpec, run_adaptive_sweep

        run_adaptive_sweep(AdaptiveSweepSpec(spec, settings), options)
        return
    from edps_mlflow.sweep import run_sweep

    run_sweep(spec, options)


@cli.command()
@click.option("--experiment", type=ExperimentName(), default=None,
              help="MLflow experiment name (default: $MLFLOW_EXPERIMENT_NAME, else every one with studies).")
def status(experiment: str | None) -> None:
    """The grid of each experiment (batch size x sparsity per optimizer and pruning method) from the tracking store."""
    check_environment_store()
    from edps_mlflow.status import status_text  # MLflow, pandas: seconds

    click.echo(status_text(experiment))


@cli.command()
@click.option("--experiment", type=ExperimentName(omitted="every experiment"), default=None,
              help="MLflow experiment name (default: every experiment).")
@click.option("--repair", is_flag=True, help="Mark runs left RUNNING by dead processes FAILED.")
@click.option("--full", is_flag=True,
              help="Also search every run for missing kinds and keys in experiments made by edps-mlflow, which "
                   "never writes such runs (one scan of the store's tags per search).")
def doctor(experiment: str | None, repair: bool, full: bool) -> None:
    """Check the store's invariants (leases, kinds and keys, no duplicates); exit 1 on any problem."""
    check_environment_store()
    from edps_mlflow.doctor import run_doctor  # MLflow: seconds, kept off --help

    left = run_doctor(experiment, repair, sys.stdout, full=full)
    if left:
        click.echo(f"edps doctor: {left} problem(s)", err=True)
        raise SystemExit(1)
    click.echo("edps doctor: every invariant holds")


@cli.command()
def workloads() -> None:
    """List the workloads with their goals, caps, protocol defaults and data needs: the built-in ones, then
    those of installed packages (entry points) and of $EDPS_WORKLOAD_MODULES, under where each came from."""
    catalog = workload_catalog()
    width = max(26, *(len(name) for name, _ in catalog))  # names of one's own may be longer than the built-in ones
    heading = None
    for name, item in catalog:
        # Under a heading per source: built in, an installed package (its entry point) or a module reference.
        source = "cannot be loaded" if isinstance(item, EdpsError) else workload_source(item)
        if source != heading:
            click.echo(f"{source}:")
            heading = source
        if isinstance(item, EdpsError):
            click.echo(f"  {name:<{width}} {item}")
            continue
        data = "needs --data-dir" if item.needs_data_dir else "data included"
        metric = "loss" if item.goal_metric is GoalMetric.LOSS else "error"
        click.echo(f"  {item.name:<{width}} {metric} <= {item.goal_error:<5g} cap {item.max_steps:<6} "
                   f"trials {item.default_trials:<3} check every {item.check_interval:<4} {data:<16} "
                   f"{item.description}")


# Far beyond any study; a typo such as 1e9 should be refused rather than print for hours.
MAX_TRIAL_COUNT = 100_000


@cli.command()
@click.option("--workload", required=True, help=f"Workload: {LISTS['workloads']} (`edps workloads`).")
@click.option("--optimizer", required=True, help=f"Optimizer: {LISTS['optimizers']}.")
@click.option("--count", type=OPTIONAL_INT, default="default", show_default=True,
              help="How many trials; 'default': the workload's trial count.")
@click.option("--format", "output_format", type=click.Choice(["table", "csv"]), default="table", show_default=True)
def trials(workload: str, optimizer: str, count: int | None, output_format: str) -> None:
    """The metaparameters of each trial, in the Sobol order a study trains them (no data loaded)."""
    item = get_workload(workload)
    count = item.default_trials if count is None else count
    if not 1 <= count <= MAX_TRIAL_COUNT:
        raise EdpsError(f"count must be an integer in [1, {MAX_TRIAL_COUNT}], got {count}")
    space = item.search_space(optimizer)
    integer = {d.name: d.integer for d in space.dimensions}
    points = space.points(count)
    if output_format == "csv":
        click.echo(",".join(("trial_index", *space.names)))
        for index, point in enumerate(points):
            values = (str(int(point[n])) if integer[n] else repr(point[n]) for n in space.names)
            click.echo(",".join((str(index), *values)))
        return
    widths = [max(len(n), 12) for n in space.names]
    click.echo("  ".join((f"{'trial':>5}", *(f"{n:>{w}}" for n, w in zip(space.names, widths)))))
    for index, point in enumerate(points):
        values = (f"{int(point[n]):>{w}d}" if integer[n] else f"{point[n]:>{w}.6g}"
                  for n, w in zip(space.names, widths))
        click.echo("  ".join((f"{index:>5}", *values)))


@cli.group()
def data() -> None:
    """Datasets: status and download (with the published checksums)."""


@data.command("list")
@click.option("--data-dir", default=None, help="Data directory (else $EDPS_DATA_DIR, else the user cache).")
def data_list(data_dir: str | None) -> None:
    """Every workload with its dataset's status: present, missing or corrupt."""
    from edps_mlflow.data.catalog import dataset_report  # torch: kept off --help

    rows = []
    for name, item in workload_catalog():
        if isinstance(item, EdpsError):
            rows.append((name, f"cannot be loaded: {item}"))
        elif not item.needs_data_dir:
            rows.append((item.name, item.dataset, "present",
                         "loaded by the workload itself (no files in the data directory)"))
        else:
            report = dataset_report(item.dataset, data_dir)
            rows.append((item.name, item.dataset, report.status.value, f"{report.directory}: {report.detail}"))
    # Columns as wide as their longest entry (a workload of one's own may have a long name); the last one free.
    widths = [max((len(row[i]) for row in rows if len(row) > i + 1), default=0) for i in range(3)]
    for row in rows:
        click.echo(" ".join(f"{cell:<{width}}" for cell, width in zip(row[:-1], widths)) + " " + row[-1])


@data.command("download")
@click.argument("name")
@click.option("--data-dir", default=None, help="Data directory (else $EDPS_DATA_DIR, else the user cache).")
def data_download(name: str, data_dir: str | None) -> None:
    """Fetch a dataset (mnist, fashion-mnist, cifar10, tiny-shakespeare, or a workload name) and verify its
    published checksums."""
    from edps_mlflow.data.catalog import SOURCES, download, get_source  # torch: kept off --help

    if name not in SOURCES:
        try:
            item = get_workload(name)
        except EdpsError:
            item = None
        if item is not None and not item.needs_data_dir:
            click.echo(f"{item.name} needs no download: it loads its data itself")
            return
        name = item.dataset if item is not None else name
    if name not in SOURCES:
        raise EdpsError(f"unknown dataset {name!r}; known datasets: {', '.join(SOURCES)} (or a workload name)")
    directory = download(get_source(name), data_dir, report=click.echo)
    click.echo(f"{name}: ready in {directory}")


# The re-executed launcher imports nothing from the working directory: ``python -c`` puts it first on the import
# path, so it is removed first, unless PYTHONSAFEPATH (Python >= 3.11) kept it off and the first entry is PYTHONPATH's.
_LAUNCHER = ("import sys; getattr(sys.flags, 'safe_path', False) or sys.path.pop(0); "
             "from edps_mlflow.cli import main; main()")


def _own_source_path(python_path: str) -> str:
    """PYTHONPATH of the re-executed process and its workers: the directory that holds this package first,
    unless the import path finds it past its first entry (the one PYTHONSAFEPATH leaves out: the working
    directory under ``python -m``, as ``mlflow run`` starts us in the project directory)."""
    root = str(_ROOT)
    if any(os.path.realpath(entry or os.curdir) == root for entry in sys.path[1:]):
        return python_path
    return os.pathsep.join((root, python_path)) if python_path else root


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, and the allocator settings of the training processes."""
    args = list(sys.argv[1:] if argv is None else argv)
    missing = training_environment_missing(os.environ)
    if args[:1] in (["study"], ["sweep"]) and missing and not os.environ.get(_REEXEC_MARK):
        # The allocator settings are read when a process starts: start again with them. PYTHONSAFEPATH: no process
        # of ours (nor a multiprocessing worker, started with ``python -c``) imports from the working directory.
        environment = {**os.environ, **missing, _REEXEC_MARK: "1", "PYTHONSAFEPATH": "1",
                       "PYTHONPATH": _own_source_path(os.environ.get("PYTHONPATH", ""))}
        os.execve(sys.executable, [sys.executable, "-c", _LAUNCHER, *args], environment)
    configure_process()
    # SIGTERM (`mlflow run` cancelled, a job scheduler) ends a study as Ctrl-C does: runs KILLED. Both wait for a
    # store call in flight: raised inside it, the interrupt could leave a sqlite lock that refuses the KILLED marks.
    signal.signal(signal.SIGTERM, raise_interrupt)
    signal.signal(signal.SIGINT, raise_interrupt)
    with store_errors_in_one_line("edps"):
        try:
            outage_seconds()  # a bad setting is refused before any work, not when the store first fails
            cli.main(args=args, prog_name="edps", standalone_mode=False)
        except click.exceptions.Abort:
            click.echo("edps: interrupted", err=True)
            sys.exit(130)
        except KeyboardInterrupt:
            click.echo("edps: interrupted; open runs were marked KILLED. Run the same command again to resume: "
                       "finished trials and studies are reused, nothing is trained twice", err=True)
            sys.exit(130)
        except click.UsageError as error:
            message = usage_line(error, bool(launcher_run_id()) and (_ROOT / "MLproject").is_file())
            click.echo(f"edps: error: {message}", err=True)
            _mark_launcher_run(message)
            sys.exit(2)
        except EdpsError as error:
            click.echo(f"edps: error: {error}{log_note()}", err=True)
            if not error.ends_at_once:  # a store that did not answer is not asked again
                _mark_launcher_run(str(error))
            end_with(error, own_process=argv is None)


def _mark_launcher_run(message: str) -> None:
    """Under ``mlflow run`` the run exists before we start: say on it why the study was refused."""
    run_id = launcher_run_id()
    if run_id and userinfo_fault(os.environ.get("MLFLOW_TRACKING_URI", "")) is None:  # a refused URI: no connection
        from edps_mlflow.store.ownership.claim import mark_refused  # MLflow: only under mlflow run

        mark_refused(run_id, message)


if __name__ == "__main__":
    main()
