"""The ``edps`` command: click options, parsed into specs; no logic of its own.

    edps study --bs 256
    edps study --workload mnist-simple-cnn --bs 128 --data-dir ~/data/mnist --optimizer momentum
    edps sweep --batch-sizes 2..1024 --sparsities 0,0.5,0.9
    edps sweep --batch-sizes 16..256 --sparsities 0,0.9 --pruning 'snip,random,shuffle(snip)'
    edps status --experiment edps/digits-simple-cnn
    edps doctor --experiment edps/digits-simple-cnn --repair
    edps workloads
    edps study --workload mypackage.workloads:TOY --bs 64 --optimizer adam
    edps data list
    edps data download mnist
"""

from __future__ import annotations

import math
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import click

from edps_mlflow import __version__
from edps_mlflow.errors import EdpsError
from edps_mlflow.executors import executor_names
from edps_mlflow.interrupts import raise_interrupt
from edps_mlflow.process_settings import (collect_less_often, configure_process, launcher_run_id, log_note,
                                          skip_shutdown_collection)
from edps_mlflow.resources import training_environment_missing

_REEXEC_MARK = "EDPS_TRAINING_ENVIRONMENT"
_DEFAULT_WORDS = ("", "default", "workload", "none")


# ---- option types ------------------------------------------------------------------------------
class _OptionalNumber(click.ParamType):
    """A finite number, or 'default' (None: the workload's value); integral when ``integer``."""

    def __init__(self, integer: bool) -> None:
        self.integer = integer
        self.name = "integer|default" if integer else "number|default"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | float | None:
        if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        if text.lower() in _DEFAULT_WORDS:
            return None
        try:
            number = float(text)
        except ValueError:
            self.fail(f"must be a number or 'default', got {text!r}", param, ctx)
        if not math.isfinite(number):
            self.fail(f"must be a finite number or 'default', got {text!r}", param, ctx)
        if not self.integer:
            return number
        if number != int(number):
            self.fail(f"must be an integer or 'default', got {text!r}", param, ctx)
        return int(number)


class _BatchSizes(click.ParamType):
    """``2..1024`` (the powers of two in between), ``16,64,256``, or empty (the workload's range)."""

    name = "batch sizes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...] | None:
        if value is None or isinstance(value, tuple):
            return value
        text = str(value).strip()
        if not text or text.lower() in _DEFAULT_WORDS:
            return None
        try:
            if ".." in text:
                low, high = (int(part) for part in text.split("..", 1))
                if low < 1 or high < low or low & (low - 1) or high & (high - 1):
                    raise ValueError
                return tuple(2 ** e for e in range(low.bit_length() - 1, high.bit_length()))
            return tuple(int(part) for part in text.split(","))
        except ValueError:
            self.fail(f"must be a list like 16,64,256 or a power-of-two range like 2..1024, got {text!r}", param, ctx)


class _NumberList(click.ParamType):
    """Comma-separated finite numbers, or 'default' (None)."""

    name = "numbers"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[float, ...] | None:
        if value is None or isinstance(value, tuple):
            return value
        # 'default' (the MLproject's spelling) means the default; an empty list is a mistake.
        if str(value).strip() and str(value).strip().lower() in _DEFAULT_WORDS:
            return None
        try:
            numbers = tuple(float(part) for part in str(value).split(","))
        except ValueError:
            self.fail(f"must be a comma-separated list of numbers, got {value!r}", param, ctx)
        if not all(math.isfinite(n) for n in numbers):
            self.fail(f"must hold finite numbers, got {value!r}", param, ctx)
        return numbers


class _FiniteRange(click.FloatRange):
    """click's FloatRange lets nan through (every comparison with nan is false): this one does not."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"must be a finite number, got {value!r}", param, ctx)
        return number


class _ExperimentName(click.ParamType):
    """An experiment name by experiment_names' rule, checked before any store is touched: not empty (empty
    would silently mean ``omitted``), not longer than a store holds, no control character. When the value
    came from the option's environment variable, the error says so."""

    name = "name"

    def __init__(self, omitted: str = "the default experiment") -> None:
        self.omitted = omitted

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from edps_mlflow.experiment_names import experiment_name_problem

        text = str(value)
        problem = experiment_name_problem(text)
        if problem is not None:
            if not text.strip():
                problem += f" (leave the option out for {self.omitted})"
            variable = getattr(param, "envvar", None)
            if isinstance(variable, str) and os.environ.get(variable) == text:
                problem += f" (the value of ${variable})"
            self.fail(problem, param, ctx)
        return text


OPTIONAL_INT, OPTIONAL_FLOAT = _OptionalNumber(integer=True), _OptionalNumber(integer=False)


class _OptionalCount(click.IntRange):
    """A positive integer, or 'default' (None), the MLproject's spelling of "leave it out"."""

    def __init__(self) -> None:
        super().__init__(min=1)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if isinstance(value, str) and value.strip().lower() == "default":
            return None
        return super().convert(value, param, ctx)


OPTIONAL_COUNT = _OptionalCount()


def _options(*decorators: Callable) -> Callable[[Callable], Callable]:
    """Several click options as one decorator (applied in the order listed)."""
    def apply(command: Callable) -> Callable:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command
    return apply


# The options that `edps study` and `edps sweep` share, and what they mean.
protocol_options = _options(
    click.option("--workload", default="digits-simple-cnn", show_default=True,
                 help="Workload name (see `edps workloads`), or package.module:NAME for a workload of your own "
                      "(docs/workloads.md)."),
    click.option("--trials", type=OPTIONAL_INT, default="default", show_default=True,
                 help="Quasi-random trials per study (Sobol order); 'default': the workload's."),
    click.option("--goal-error", type=OPTIONAL_FLOAT, default="default", show_default=True,
                 help="Goal validation error (of a loss-goal workload: the validation loss to reach); 'default': the "
                      "workload's."),
    click.option("--max-steps", type=OPTIONAL_INT, default="default", show_default=True,
                 help="Step cap; 'default': the workload's."),
    click.option("--check-interval", type=OPTIONAL_INT, default="default", show_default=True,
                 help="Steps between validation checks; 'default': the workload's."),
    click.option("--seed", type=int, default=0, show_default=True, help="Study seed (data order and trial seeds)."),
    click.option("--full-trials", type=click.BOOL, default=False, show_default=True,
                 help="true: run every trial to its own end instead of exact early stopping (same result)."),
    click.option("--data-dir", default=None, help="Dataset directory (else $EDPS_DATA_DIR, else the user cache)."),
    # The variable is read here so that its value meets the same rule, before any store is created.
    click.option("--experiment", type=_ExperimentName(), default=None, envvar="MLFLOW_EXPERIMENT_NAME",
                 help="MLflow experiment (else $MLFLOW_EXPERIMENT_NAME, else edps/<workload>)."),
    click.option("--log-interval", type=_FiniteRange(min=0.1, max=86_400), default=None,
                 help="Seconds between progress lines when not on a terminal (default: 10 for a study, 30 for a sweep)."),
    click.option("--probes", default="", help="Measurements during training: lipschitz, noise_scale (comma-separated)."),
    click.option("--probe-interval", type=OPTIONAL_INT, default="default", show_default=True,
                 help="Steps between probe calls; 'default': the workload's (the paper's workloads: 1,000)."),
    click.option("--probe-trials", type=click.Choice(["best", "all"]), default="best", show_default=True,
                 help="Which trials probe, each along its whole run: best (the study runs without probes, then "
                      "trains its best trial again with them) or all (every trial, each to its goal or the cap)."),
    click.option("--allow-tf32", type=click.BOOL, default=False, show_default=True,
                 help="true: TF32 matmuls and convolutions on GPUs that have them (default: full FP32, as the "
                      "paper; part of the study key)."),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edps")
def cli() -> None:
    """Measure steps-to-result against batch size and sparsity, tracked in MLflow."""


@cli.command()
@click.option("--bs", "batch_size", type=int, default=256, show_default=True, help="Batch size.")
@click.option("--optimizer", default="sgd", show_default=True, help="sgd, momentum, nesterov, adam or adamw.")
@click.option("--sparsity", type=float, default=0.0, show_default=True,
              help="Fraction pruned at initialisation (by --pruning), in [0, 1).")
@click.option("--pruning", default="snip", show_default=True,
              help="Pruning method at initialisation: snip, random, random-erk, magnitude, grasp, synflow, or "
                   "shuffle(<method>) (docs/pruning.md).")
@protocol_options
@click.option("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available).")
@click.option("--workers", type=OPTIONAL_COUNT, default=None,
              help="Worker processes on CPU (default: one per core).")
@click.option("--pack-size", type=click.IntRange(min=1), default=None,
              help="Trials trained in lockstep (default: per device and batch size).")
@click.option("--full-evaluation", is_flag=True, help="Always evaluate the whole validation split (no early abort).")
@click.option("--system-metrics", is_flag=True, help="Log CPU, memory (and GPU) use on the study run (needs psutil).")
@click.option("--curve-interval", type=OPTIONAL_INT, default="default", show_default=True,
              help="Steps between full validation passes that draw each trial's validation-error curve "
                   "(rounded to a multiple of the check interval); 'default': every check on small validation "
                   "splits, else every 10th.")
@click.option("--wait", is_flag=True,
              help="When another live process runs this study, wait for it (or take over when it dies).")
# Set by `edps sweep --executor mlflow-project` through the MLproject: the study is that sweep's child.
@click.option("--sweep-run", default="", hidden=True, help="The sweep run that submitted this study.")
@click.option("--sweep-key", default="", hidden=True, help="The key of that sweep.")
def study(batch_size: int, optimizer: str, sparsity: float, pruning: str, workload: str, trials: int | None,
          goal_error: float | None, max_steps: int | None, check_interval: int | None, seed: int, full_trials: bool,
          data_dir: str | None, experiment: str | None, log_interval: float, probes: str,
          probe_interval: int | None, probe_trials: str, allow_tf32: bool, device: str | None, workers: int | None,
          pack_size: int | None, full_evaluation: bool, system_metrics: bool, curve_interval: int | None, wait: bool,
          sweep_run: str, sweep_key: str) -> None:
    """Tune one (workload, optimizer, sparsity, batch size) and record its steps-to-result."""
    from edps_mlflow.config import StudySpec, parse_probes

    if bool(sweep_run.strip()) != bool(sweep_key.strip()):
        raise EdpsError("--sweep-run and --sweep-key go together (a sweep sets both)")
    spec = StudySpec.build(workload, optimizer, sparsity, batch_size, trials, goal_error, max_steps, check_interval,
                           seed, parse_probes(probes), probe_interval, allow_tf32, probe_trials, pruning)
    # Only a valid study loads torch and MLflow (seconds): a bad value is refused before.
    from edps_mlflow.study import ExecutionOptions, run_study

    options = ExecutionOptions(
        full_trials=full_trials, device=device or None, workers=workers, pack_size=pack_size,
        early_abort_evaluation=not full_evaluation, experiment=experiment, data_dir=data_dir or None,
        log_interval=log_interval or 10.0, curve_interval=curve_interval, system_metrics=system_metrics,
        # A sweep's study waits for a live run of its key elsewhere, as it does in the other executors.
        wait=wait or bool(sweep_run.strip()), parent_run_id=sweep_run.strip() or None,
        sweep_key=sweep_key.strip() or None)
    run_study(spec, options)


@cli.command()
@click.option("--optimizers", default="sgd", show_default=True,
              help="Comma-separated: sgd,momentum,nesterov,adam,adamw.")
@click.option("--batch-sizes", type=_BatchSizes(), default=None,
              help="2..1024 (powers of two) or 16,64,256; default 2..largest that fits the training split.")
@click.option("--sparsities", type=_NumberList(), default=None, help="Comma-separated, each in [0, 1); default 0.")
@click.option("--pruning", "prunings", default="snip", show_default=True,
              help="Pruning methods, comma-separated (an axis beside the sparsities): snip, random, random-erk, "
                   "magnitude, grasp, synflow, shuffle(<method>). Sparsity 0 is one dense study for them all.")
@click.option("--grid", type=click.Choice(["none", "paper"]), default="none", show_default=True,
              help="paper: the paper's sparsities (0, 0.5, 0.7, 0.9) and batch sizes 2 .. the largest that fits "
                   "the training split (instead of --batch-sizes / --sparsities).")
@protocol_options
@click.option("--executor", type=click.Choice(executor_names()), default="local", show_default=True,
              help="local: processes here; ray: Ray tasks; mlflow-project: each study a run of the MLproject "
                   "through MLflow Projects (docs/executors.md).")
@click.option("--workers", type=OPTIONAL_COUNT, default=None,
              help="Local: study processes (default one per core, or per GPU); mlflow-project: runs submitted at "
                   "once (default one per core).")
@click.option("--ray-address", default=None, help="Ray cluster address (e.g. auto); default: a local Ray instance.")
@click.option("--backend", type=click.Choice(["local", "kubernetes"]), default="local", show_default=True,
              help="mlflow-project: MLflow Projects backend of the submitted runs.")
@click.option("--backend-config", default="",
              help="mlflow-project with --backend kubernetes: JSON file with MLflow's kube-job-template-path, "
                   "repository-uri (and kube-context) and our base-image.")
@click.option("--env-manager", type=click.Choice(["local", "virtualenv", "uv", "conda"]), default="local",
              show_default=True, help="mlflow-project on the local backend: MLflow's environment of each run.")
@click.option("--device", default=None, help="cpu or cuda (default: cuda when available).")
@click.option("--wait", is_flag=True,
              help="When another live process runs this sweep, wait for it (or take over when it dies).")
@click.option("--adaptive", is_flag=True,
              help="Start at the largest batch sizes of the --batch-sizes range and walk each curve down only as far "
                   "as --target needs (a round: as many studies as --workers), or until a limit is reached.")
@click.option("--target", default=None,
              help="Adaptive: b_crit[:F] (B_crit at least xF inside the measured batch sizes; F=2 by default), "
                   "threshold (the threshold critical batch size and its bracket) or boundaries (both regime "
                   "boundaries bracketed) [default: b_crit:2].")
@click.option("--max-studies", type=int, default=None, help="Adaptive: stop after this many studies.")
@click.option("--budget", default=None,
              help="Adaptive: stop when the measured studies' trial-steps (e.g. 2e6steps) or this command's wall "
                   "clock (e.g. 90s, 30m, 2h) is spent; checked before each round.")
def sweep(optimizers: str, batch_sizes: tuple[int, ...] | None, sparsities: tuple[float, ...] | None, prunings: str,
          grid: str, workload: str,
          trials: int | None, goal_error: float | None, max_steps: int | None, check_interval: int | None, seed: int,
          full_trials: bool, data_dir: str | None, experiment: str | None, log_interval: float, probes: str,
          probe_interval: int | None, probe_trials: str, allow_tf32: bool, executor: str, workers: int | None,
          ray_address: str | None, backend: str, backend_config: str, env_manager: str, device: str | None,
          wait: bool, adaptive: bool, target: str | None, max_studies: int | None, budget: str | None) -> None:
    """Run the grid batch sizes x sparsities x optimizers, resuming whatever is already in the store.
    With --adaptive, measure only the batch sizes that pin B_crit and the regime boundaries."""
    from edps_mlflow.config import parse_probes
    from edps_mlflow.mlproject import ProjectLaunch
    from edps_mlflow.pruning import parse_methods
    from edps_mlflow.sweep_spec import SweepOptions, SweepSpec
    from edps_mlflow.workloads import get_workload

    if not adaptive:
        given = [name for name, value in (("--target", target), ("--max-studies", max_studies),
                                          ("--budget", budget)) if value is not None]
        if given:
            raise EdpsError(f"{', '.join(given)} only apply to an adaptive sweep: add --adaptive")
    if grid == "paper":
        if batch_sizes is not None or sparsities is not None:
            raise EdpsError("--grid paper sets the batch sizes and sparsities; leave out --batch-sizes and --sparsities")
        batch_sizes, sparsities = get_workload(workload).paper_grid()
    spec = SweepSpec.build(workload, tuple(name.strip() for name in optimizers.split(",")), batch_sizes,
                           sparsities if sparsities is not None else (0.0,), trials, goal_error, max_steps,
                           check_interval, seed, parse_probes(probes), probe_interval, allow_tf32, probe_trials,
                           parse_methods(prunings))
    options = SweepOptions(
        experiment=experiment, executor=executor, workers=workers, ray_address=ray_address, device=device or None,
        data_dir=data_dir or None, full_trials=full_trials, log_interval=log_interval or 30.0, wait=wait,
        project=ProjectLaunch(backend, env_manager, backend_config))
    # Only valid values load torch and MLflow (seconds): a bad one is refused before.
    if adaptive:
        from edps_mlflow.adaptive import AdaptiveSettings, Budget
        from edps_mlflow.executors import get_executor
        from edps_mlflow.executors.base import executor_workers

        goal, factor = AdaptiveSettings.parse_target("b_crit:2" if target is None else target)
        settings = AdaptiveSettings(target=factor, max_studies=max_studies,
                                    budget=Budget.parse(budget) if budget is not None else None, goal=goal,
                                    width=executor_workers(get_executor(executor), options))
        from edps_mlflow.adaptive_sweep import AdaptiveSweepSpec, run_adaptive_sweep

        run_adaptive_sweep(AdaptiveSweepSpec(spec, settings), options)
        return
    from edps_mlflow.sweep import run_sweep

    run_sweep(spec, options)


@cli.command()
@click.option("--experiment", type=_ExperimentName(), default=None,
              help="MLflow experiment name (default: $MLFLOW_EXPERIMENT_NAME, else the store's only one with studies).")
def status(experiment: str | None) -> None:
    """The grid of an experiment (batch size x sparsity per optimizer and pruning method) from the tracking store."""
    from edps_mlflow.status import default_experiment, format_status, status_tables

    click.echo(format_status(status_tables(experiment or default_experiment())))


@cli.command()
@click.option("--experiment", type=_ExperimentName(omitted="every experiment"), default=None,
              help="MLflow experiment name (default: every experiment).")
@click.option("--repair", is_flag=True, help="Mark runs left RUNNING by dead processes FAILED.")
@click.option("--full", is_flag=True,
              help="Also search every run for missing kinds and keys in experiments made by edps-mlflow, which "
                   "never writes such runs (one scan of the store's tags per search).")
def doctor(experiment: str | None, repair: bool, full: bool) -> None:
    """Check the store's invariants (leases, kinds and keys, no duplicates); exit 1 on any problem."""
    from edps_mlflow.doctor import run_doctor

    left = run_doctor(experiment, repair, sys.stdout, full=full)
    if left:
        click.echo(f"edps doctor: {left} problem(s)", err=True)
        raise SystemExit(1)
    click.echo("edps doctor: every invariant holds")


@cli.command()
def workloads() -> None:
    """List the workloads with their goals, caps, protocol defaults and data needs: the built-in ones, then
    those of installed packages (entry points) and of $EDPS_WORKLOAD_MODULES."""
    from edps_mlflow.workloads import GoalMetric, workload_catalog

    catalog = workload_catalog()
    width = max(26, *(len(name) for name, _ in catalog))  # names of one's own may be longer than the built-in ones
    for name, item in catalog:
        if isinstance(item, EdpsError):
            click.echo(f"{name:<{width}} cannot be loaded: {item}")
            continue
        data = "needs --data-dir" if item.needs_data_dir else "built in"
        metric = "loss" if item.goal_metric is GoalMetric.LOSS else "error"
        click.echo(f"{item.name:<{width}} {metric} <= {item.goal_error:<5g} cap {item.max_steps:<6} "
                   f"trials {item.default_trials:<3} check every {item.check_interval:<4} {data:<16} "
                   f"{item.description}")


# Far beyond any study; a typo such as 1e9 should be refused rather than print for hours.
MAX_TRIAL_COUNT = 100_000


@cli.command()
@click.option("--workload", required=True, help="Workload name (see `edps workloads`).")
@click.option("--optimizer", required=True, help="sgd, momentum, nesterov, adam or adamw.")
@click.option("--count", type=OPTIONAL_INT, default="default", show_default=True,
              help="How many trials; 'default': the workload's trial count.")
@click.option("--format", "output_format", type=click.Choice(["table", "csv"]), default="table", show_default=True)
def trials(workload: str, optimizer: str, count: int | None, output_format: str) -> None:
    """The metaparameters of each trial, in the Sobol order a study trains them (no data loaded)."""
    from edps_mlflow.config import OptimizerKind
    from edps_mlflow.workloads import get_workload

    item = get_workload(workload)
    count = item.default_trials if count is None else count
    if not 1 <= count <= MAX_TRIAL_COUNT:
        raise EdpsError(f"count must be an integer in [1, {MAX_TRIAL_COUNT}], got {count}")
    space = item.search_space(OptimizerKind.parse(optimizer).value)
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
    from edps_mlflow.workloads import workload_catalog

    for name, item in workload_catalog():
        if isinstance(item, EdpsError):
            click.echo(f"{name:<26} cannot be loaded: {item}")
            continue
        if not item.needs_data_dir:
            click.echo(f"{item.name:<26} {item.dataset:<14} present   loaded by the workload itself (no files "
                       f"in the data directory)")
            continue
        report = dataset_report(item.dataset, data_dir)
        click.echo(f"{item.name:<26} {item.dataset:<14} {report.status.value:<9} {report.directory}: {report.detail}")


@data.command("download")
@click.argument("name")
@click.option("--data-dir", default=None, help="Data directory (else $EDPS_DATA_DIR, else the user cache).")
def data_download(name: str, data_dir: str | None) -> None:
    """Fetch a dataset (mnist, fashion-mnist, cifar10, tiny-shakespeare, or a workload name) and verify its
    published checksums."""
    from edps_mlflow.data.catalog import SOURCES, download, get_source
    from edps_mlflow.workloads import get_workload

    if name not in SOURCES:
        try:
            item = get_workload(name)
        except EdpsError:
            raise EdpsError(f"unknown dataset {name!r}; known datasets: {', '.join(SOURCES)} (or a workload "
                            f"name)") from None
        if not item.needs_data_dir:
            click.echo(f"{item.name} needs no download: it loads its data itself")
            return
        name = item.dataset
    if name not in SOURCES:
        raise EdpsError(f"unknown dataset {name!r}; known datasets: {', '.join(SOURCES)} (or a workload name)")
    directory = download(get_source(name), data_dir, report=click.echo)
    click.echo(f"{name}: ready in {directory}")


# The re-executed launcher imports nothing from the working directory: ``python -c`` puts it first
# on the import path, so it is removed before anything else is imported, unless PYTHONSAFEPATH
# (set for the re-exec, Python >= 3.11) kept it off, when the first entry is PYTHONPATH's and stays.
_LAUNCHER = ("import sys; getattr(sys.flags, 'safe_path', False) or sys.path.pop(0); "
             "from edps_mlflow.cli import main; main()")


def _own_source_path(python_path: str) -> str:
    """PYTHONPATH of the re-executed process (and of the workers it spawns, which inherit it): the
    directory that holds this package, by its own path, goes first unless the import path already
    finds it past its first entry. That first entry (the working directory under ``python -m``, as
    ``mlflow run`` starts us from the project directory in an environment without the project
    installed) is the one PYTHONSAFEPATH leaves out, so without this the re-executed process would
    not find the package; with it, it finds this package and nothing else of the working directory."""
    import edps_mlflow

    root = os.path.dirname(os.path.dirname(os.path.realpath(edps_mlflow.__file__)))
    if any(os.path.realpath(entry or os.curdir) == root for entry in sys.path[1:]):
        return python_path
    return os.pathsep.join((root, python_path)) if python_path else root


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, and the allocator settings of the training processes."""
    args = list(sys.argv[1:] if argv is None else argv)
    missing = training_environment_missing(os.environ)
    trains = args[:1] in (["study"], ["sweep"])
    if trains and missing and not os.environ.get(_REEXEC_MARK):
        # The allocator settings are read when a process starts: start again with them.
        # PYTHONSAFEPATH (Python >= 3.11): no process of ours puts the working directory on the import
        # path, including the worker processes that multiprocessing starts with ``python -c``, which
        # import part of the standard library before they take over our sys.path.
        environment = {**os.environ, **missing, _REEXEC_MARK: "1", "PYTHONSAFEPATH": "1",
                       "PYTHONPATH": _own_source_path(os.environ.get("PYTHONPATH", ""))}
        os.execve(sys.executable, [sys.executable, "-c", _LAUNCHER, *args], environment)
    configure_process()
    if argv is None and not trains:  # the process is the command's, and trains nothing
        collect_less_often()
    # SIGTERM (e.g. `mlflow run` cancelled, a job scheduler) ends a study like Ctrl-C: runs KILLED. Ctrl-C
    # (SIGINT) goes through the same handler, which holds the interrupt back until a tracking-store call in
    # flight ends: Python's default raises inside the call, where it can leave a sqlite transaction open
    # whose lock then refuses the very writes that mark the runs KILLED (seen on a loaded CI machine).
    signal.signal(signal.SIGTERM, raise_interrupt)
    signal.signal(signal.SIGINT, raise_interrupt)
    try:
        try:
            cli.main(args=args, prog_name="edps", standalone_mode=False)
        except click.exceptions.Abort:
            click.echo("edps: interrupted", err=True)
            sys.exit(130)
        except KeyboardInterrupt:
            click.echo("edps: interrupted; open runs were marked KILLED. Run the same command again to resume: "
                       "finished trials and studies are reused, nothing is trained twice", err=True)
            sys.exit(130)
        except click.UsageError as error:
            message = _usage_line(error)
            click.echo(f"edps: error: {message}", err=True)
            _mark_launcher_run(message)
            sys.exit(2)
        except EdpsError as error:
            click.echo(f"edps: error: {error}{log_note()}", err=True)
            _mark_launcher_run(str(error))
            sys.exit(error.exit_code)
        except Exception as error:
            line = _store_error_line(error)
            if line is None:
                raise
            click.echo(f"edps: error: {line}{log_note()}", err=True)
            sys.exit(2)
    finally:
        _restore_library_logs()
        if argv is None:  # the console entry point: the process ends with the command
            skip_shutdown_collection()


def _restore_library_logs() -> None:
    """MLflow's loggers as they were before the command routed them to its log file (store.route_library_logs),
    for a command run inside another program (a test); a command that never opened the store changed nothing."""
    store = sys.modules.get("edps_mlflow.store")
    if store is not None:
        store.restore_library_logs()


def _usage_line(error: click.UsageError) -> str:
    """click's message on one line; for an unknown option, the option a user meant (``--batch_size``,
    as `mlflow run -P batch_size=64` passes it, is ``--bs``), where click would guess by spelling."""
    if isinstance(error, click.NoSuchOption) and error.ctx is not None and error.ctx.command.name:
        from edps_mlflow.option_hints import OptionHint

        options = frozenset(name.lstrip("-") for param in error.ctx.command.params if isinstance(param, click.Option)
                            for name in (*param.opts, *param.secondary_opts))
        project = Path(__file__).resolve().parents[1] / "MLproject"
        under_mlflow_run = bool(launcher_run_id()) and project.is_file()
        hint = OptionHint(error.ctx.command.name, options, project if under_mlflow_run else None)
        line = hint.line(error.option_name)
        if line is not None:
            return line
    return error.format_message().replace("\n", " ")


def _store_error_line(error: Exception) -> str | None:
    """A tracking-store error anywhere in a command is one line naming the store, not a traceback; so is a
    file of the store's that a full or read-only disk refused (store.store_error_line)."""
    if type(error).__module__.split(".")[0] not in ("mlflow", "requests", "urllib3", "sqlalchemy") \
            and not isinstance(error, OSError):
        return None
    from edps_mlflow.store import store_error_line

    return store_error_line(error)


def _mark_launcher_run(message: str) -> None:
    """Under ``mlflow run`` the run exists before we start: say on it why the study was refused."""
    run_id = launcher_run_id()
    if run_id:
        from edps_mlflow.ownership import mark_refused

        mark_refused(run_id, message)


if __name__ == "__main__":
    main()
