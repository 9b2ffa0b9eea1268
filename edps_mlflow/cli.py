"""The ``edps`` command: parse, validate, call; no logic.

    edps study --bs 256
    edps study --workload mnist-simple-cnn --bs 128 --data-dir ~/data/mnist --optimizer momentum
    edps workloads
    edps data list
    edps data download mnist
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

import click

from edps_mlflow import __version__
from edps_mlflow.errors import EdpsError

# PERF.md: glibc's allocator maps and unmaps every large activation (1.5-1.9x at batch >= 128);
# these are read when a process starts, so the launcher re-executes itself with them set.
ALLOCATOR_ENVIRONMENT = {
    "MALLOC_MMAP_THRESHOLD_": "4294967296",
    "MALLOC_TRIM_THRESHOLD_": "68719476736",
    "MALLOC_TOP_PAD_": "1073741824",
}
_REEXEC_MARK = "EDPS_TRAINING_ENVIRONMENT"


def _optional_float(value: str, name: str) -> float | None:
    if value.strip().lower() in ("", "default", "workload", "none"):
        return None
    try:
        return float(value)
    except ValueError:
        raise EdpsError(f"{name} must be a number or 'default', got {value!r}") from None


def _optional_int(value: str, name: str) -> int | None:
    number = _optional_float(value, name)
    if number is None:
        return None
    if number != int(number):
        raise EdpsError(f"{name} must be an integer or 'default', got {value!r}")
    return int(number)


def _parse_bool(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off", ""):
        return False
    raise EdpsError(f"{name} must be true or false, got {value!r}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edps")
def cli() -> None:
    """Measure steps-to-result against batch size and sparsity, tracked in MLflow."""


@cli.command()
@click.option("--bs", "batch_size", type=int, default=256, show_default=True, help="Batch size.")
@click.option("--workload", default="digits-simple-cnn", show_default=True, help="Workload name (see `edps workloads`).")
@click.option("--optimizer", default="sgd", show_default=True, help="sgd, momentum or nesterov.")
@click.option("--sparsity", type=float, default=0.0, show_default=True, help="Fraction pruned by SNIP, in [0, 1).")
@click.option("--trials", type=int, default=32, show_default=True, help="Quasi-random trials (Sobol order).")
@click.option("--goal-error", default="default", show_default=True, help="Goal validation error; 'default': the workload's.")
@click.option("--max-steps", default="default", show_default=True, help="Step cap; 'default': the workload's.")
@click.option("--check-interval", type=int, default=100, show_default=True, help="Steps between validation checks.")
@click.option("--seed", type=int, default=0, show_default=True, help="Study seed (data order and trial seeds).")
@click.option("--full-trials", default="false", show_default=True,
              help="true: run every trial to its own end instead of exact early stopping (same result).")
@click.option("--data-dir", default=None, help="Dataset directory (else $EDPS_DATA_DIR, else the user cache).")
@click.option("--experiment", default=None, help="MLflow experiment (else $MLFLOW_EXPERIMENT_NAME, else edps/<workload>/<optimizer>).")
@click.option("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available).")
@click.option("--workers", type=int, default=None, help="Worker processes on CPU (default: one per core).")
@click.option("--pack-size", type=int, default=None, help="Trials trained in lockstep (default: per device and batch size).")
@click.option("--full-evaluation", is_flag=True, help="Always evaluate the whole validation split (no early abort).")
@click.option("--log-interval", type=float, default=10.0, show_default=True, help="Seconds between progress lines when not on a terminal.")
@click.option("--probes", default="", help="Measurements during training: lipschitz, noise_scale (comma-separated).")
@click.option("--probe-interval", type=int, default=1000, show_default=True, help="Steps between probe calls.")
def study(batch_size: int, workload: str, optimizer: str, sparsity: float, trials: int, goal_error: str,
          max_steps: str, check_interval: int, seed: int, full_trials: str, data_dir: str | None,
          experiment: str | None, device: str | None, workers: int | None, pack_size: int | None,
          full_evaluation: bool, log_interval: float, probes: str, probe_interval: int) -> None:
    """Tune one (workload, optimizer, sparsity, batch size) and record its steps-to-result."""
    from edps_mlflow.config import OptimizerKind, StudySpec
    from edps_mlflow.probes import parse_probes
    from edps_mlflow.study import ExecutionOptions, run_study
    from edps_mlflow.workloads import get_workload

    spec_workload = get_workload(workload)
    kind = OptimizerKind.parse(optimizer)
    goal = _optional_float(goal_error, "goal error")
    cap = _optional_int(max_steps, "max steps")
    spec = StudySpec(
        workload=workload, optimizer=kind, sparsity=sparsity, batch_size=batch_size, trials=trials,
        goal_error=goal if goal is not None else spec_workload.goal_error,
        max_steps=cap if cap is not None else spec_workload.max_steps,
        check_interval=check_interval, seed=seed, probes=parse_probes(probes), probe_interval=probe_interval,
    )
    options = ExecutionOptions(
        full_trials=_parse_bool(full_trials, "full trials"), device=device, workers=workers,
        pack_size=pack_size, early_abort_evaluation=not full_evaluation, experiment=experiment,
        data_dir=data_dir or None, log_interval=log_interval,
    )
    run_study(spec, options)


@cli.command()
@click.option("--workload", default="digits-simple-cnn", show_default=True, help="Workload name.")
@click.option("--optimizers", default="sgd", show_default=True, help="Comma-separated: sgd,momentum,nesterov.")
@click.option("--batch-sizes", default=None, help="2..1024 (powers of two) or 16,64,256; default 2..largest <= train size.")
@click.option("--sparsities", default="0", show_default=True, help="Comma-separated, each in [0, 1).")
@click.option("--trials", type=int, default=32, show_default=True, help="Trials per study.")
@click.option("--goal-error", default="default", show_default=True, help="Goal validation error; 'default': the workload's.")
@click.option("--max-steps", default="default", show_default=True, help="Step cap; 'default': the workload's.")
@click.option("--check-interval", type=int, default=100, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--full-trials", default="false", show_default=True, help="true: every trial runs to its own end.")
@click.option("--data-dir", default=None, help="Data directory (else $EDPS_DATA_DIR, else the user cache).")
@click.option("--experiment", default=None, help="MLflow experiment (else $MLFLOW_EXPERIMENT_NAME, else edps/<workload>).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--workers", type=int, default=None, help="Local: study processes (default one per core, or per GPU).")
@click.option("--ray-address", default=None, help="Ray cluster address (e.g. auto); default: a local Ray instance.")
@click.option("--device", default=None, help="cpu or cuda (default: cuda when available).")
@click.option("--log-interval", type=float, default=10.0, show_default=True, help="Seconds between progress lines.")
@click.option("--probes", default="", help="Measurements during training: lipschitz, noise_scale (comma-separated).")
@click.option("--probe-interval", type=int, default=1000, show_default=True, help="Steps between probe calls.")
def sweep(workload: str, optimizers: str, batch_sizes: str | None, sparsities: str, trials: int, goal_error: str,
          max_steps: str, check_interval: int, seed: int, full_trials: str, data_dir: str | None,
          experiment: str | None, executor: str, workers: int | None, ray_address: str | None, device: str | None,
          log_interval: float, probes: str, probe_interval: int) -> None:
    """Run the grid batch sizes x sparsities x optimizers, resuming whatever is already in the store."""
    from edps_mlflow.config import OptimizerKind
    from edps_mlflow.probes import parse_probes
    from edps_mlflow.sweep import SweepOptions, SweepSpec, parse_batch_sizes, parse_numbers, run_sweep
    from edps_mlflow.workloads import get_workload

    item = get_workload(workload)
    kinds = tuple(OptimizerKind.parse(name.strip()) for name in optimizers.split(","))
    goal = _optional_float(goal_error, "goal error")
    cap = _optional_int(max_steps, "max steps")
    if workers is not None and workers < 1:
        raise EdpsError(f"workers must be a positive integer, got {workers}")
    if device not in (None, "cpu", "cuda"):
        raise EdpsError(f"sweep device must be cpu or cuda, got {device!r}")
    train_size = item.load_data(data_dir or None).train_size
    spec = SweepSpec(
        workload=workload, optimizers=kinds, batch_sizes=parse_batch_sizes(batch_sizes, train_size),
        sparsities=parse_numbers(sparsities, "sparsities"), trials=trials,
        goal_error=goal if goal is not None else item.goal_error,
        max_steps=cap if cap is not None else item.max_steps, check_interval=check_interval, seed=seed,
        probes=parse_probes(probes), probe_interval=probe_interval)
    run_sweep(spec, SweepOptions(
        experiment=experiment, executor=executor, workers=workers, ray_address=ray_address, device=device,
        data_dir=data_dir or None, full_trials=_parse_bool(full_trials, "full trials"), log_interval=log_interval))


@cli.command()
@click.option("--experiment", required=True, help="MLflow experiment name.")
def status(experiment: str) -> None:
    """The grid of an experiment (batch size x sparsity per optimizer) from the tracking store."""
    from edps_mlflow.status import format_status, status_tables

    click.echo(format_status(status_tables(experiment)))


@cli.command()
def workloads() -> None:
    """List the workloads with their goals, caps and data needs."""
    from edps_mlflow.workloads import WORKLOADS

    for item in WORKLOADS.values():
        data = "needs --data-dir" if item.needs_data_dir else "built in"
        click.echo(f"{item.name:<22} goal {item.goal_error:<5g} cap {item.max_steps:<6} {data:<16} {item.description}")


# Trials listed when --count is not given; the number of trials a study runs by default.
DEFAULT_TRIAL_COUNT = 32
# Far beyond any study; a typo such as 1e9 should be refused rather than print for hours.
MAX_TRIAL_COUNT = 100_000


@cli.command()
@click.option("--workload", required=True, help="Workload name (see `edps workloads`).")
@click.option("--optimizer", required=True, help="sgd, momentum or nesterov.")
@click.option("--count", type=int, default=DEFAULT_TRIAL_COUNT, show_default=True, help="How many trials.")
@click.option("--format", "output_format", type=click.Choice(["table", "csv"]), default="table", show_default=True)
def trials(workload: str, optimizer: str, count: int, output_format: str) -> None:
    """The metaparameters of each trial, in the Sobol order a study trains them (no data loaded)."""
    from edps_mlflow.config import OptimizerKind

    if not 1 <= count <= MAX_TRIAL_COUNT:
        raise EdpsError(f"count must be an integer in [1, {MAX_TRIAL_COUNT}], got {count}")
    kind = OptimizerKind.parse(optimizer)
    # The registry module imports torch (for its model factories), the search spaces sit beside them.
    from edps_mlflow.workloads import get_workload

    space = get_workload(workload).search_space(kind.value)
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
        values = (f"{int(point[n]):>{w}d}" if integer[n] else f"{point[n]:>{w}.6g}" for n, w in zip(space.names, widths))
        click.echo("  ".join((f"{index:>5}", *values)))


@cli.group()
def data() -> None:
    """Datasets: status and download (with the published checksums)."""


@data.command("list")
@click.option("--data-dir", default=None, help="Data directory (else $EDPS_DATA_DIR, else the user cache).")
def data_list(data_dir: str | None) -> None:
    """Every workload with its dataset's status: present, missing or corrupt."""
    from edps_mlflow.data.catalog import dataset_report
    from edps_mlflow.workloads import WORKLOADS

    for item in WORKLOADS.values():
        if not item.needs_data_dir:
            click.echo(f"{item.name:<26} {item.dataset:<14} present   bundled with scikit-learn")
            continue
        report = dataset_report(item.dataset, data_dir)
        click.echo(f"{item.name:<26} {item.dataset:<14} {report.status.value:<9} {report.directory}: {report.detail}")


@data.command("download")
@click.argument("name")
@click.option("--data-dir", default=None, help="Data directory (else $EDPS_DATA_DIR, else the user cache).")
def data_download(name: str, data_dir: str | None) -> None:
    """Fetch a dataset (mnist, fashion-mnist, cifar10, or a workload name) and verify its checksums."""
    from edps_mlflow.data.catalog import SOURCES, download, get_source
    from edps_mlflow.workloads import WORKLOADS

    if name in WORKLOADS:
        if not WORKLOADS[name].needs_data_dir:
            click.echo(f"{name} needs no download: its data are bundled")
            return
        name = WORKLOADS[name].dataset
    if name not in SOURCES:
        raise EdpsError(f"unknown dataset {name!r}; known datasets: {', '.join(SOURCES)} (or a workload name)")
    directory = download(get_source(name), data_dir, report=click.echo)
    click.echo(f"{name}: ready in {directory}")


def _training_environment_missing() -> dict[str, str]:
    missing = {k: v for k, v in ALLOCATOR_ENVIRONMENT.items() if k not in os.environ}
    if "OMP_NUM_THREADS" not in os.environ:
        # Set before torch is imported; the engine sets the real count per process.
        missing["OMP_NUM_THREADS"] = "1"
    return missing


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, and the allocator settings of PERF.md for training."""
    args = list(sys.argv[1:] if argv is None else argv)
    missing = _training_environment_missing()
    if args[:1] in (["study"], ["sweep"]) and missing and not os.environ.get(_REEXEC_MARK):
        environment = {**os.environ, **missing, _REEXEC_MARK: "1"}
        os.execve(sys.executable, [sys.executable, "-m", "edps_mlflow.cli", *args], environment)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        cli.main(args=args, prog_name="edps", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("edps: interrupted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("edps: interrupted; open runs were marked KILLED", err=True)
        sys.exit(130)
    except click.UsageError as error:
        click.echo(f"edps: error: {error.format_message()}", err=True)
        sys.exit(2)
    except EdpsError as error:
        click.echo(f"edps: error: {error}", err=True)
        _mark_launcher_run(str(error))
        sys.exit(2)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM (e.g. `mlflow run` cancelled, a job scheduler) ends a study like Ctrl-C: runs KILLED.
    raise KeyboardInterrupt


def _mark_launcher_run(message: str) -> None:
    """Under ``mlflow run`` the run exists before we start: say on it why the study was refused."""
    if os.environ.get("MLFLOW_RUN_ID"):
        from edps_mlflow.tracking import mark_refused

        mark_refused(os.environ["MLFLOW_RUN_ID"], message)


if __name__ == "__main__":
    main()
