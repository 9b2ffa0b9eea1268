"""``edps-analyze``: tables, fits, figures and reports from the tracking store or a CSV. It never trains.

    edps-analyze table                      (every experiment with study runs)
    edps-analyze table  --experiment edps/digits-simple-cnn
    edps-analyze fit    --experiment edps/digits-simple-cnn --format json
    edps-analyze plot   --experiment 'edps/*' --out-dir figures
    edps-analyze report --experiment edps/digits-simple-cnn --output report.html --log-to-mlflow
    edps-analyze export --experiment edps/digits-simple-cnn --output steps.csv
    edps-analyze fit    --csv steps.csv [--trials-csv trials.csv]
    edps-analyze lipschitz   --experiment edps/digits-simple-cnn/sgd
    edps-analyze noise-scale --experiment edps/digits-simple-cnn
    edps-analyze time   --experiment edps/digits-simple-cnn --devices 1,2,4,8 --bandwidth 10 --latency 10
    edps-analyze compare-pruning --experiment edps/digits-simple-cnn --out-dir figures
"""

from __future__ import annotations

import functools
import json
import math
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

import click
import pandas as pd

from analysis import forked
from analysis.filenames import FIGURE_FORMATS
from edps_mlflow import names as n
from edps_mlflow.errors import EdpsError
from edps_mlflow.process_settings import (collect_less_often, configure_process, log_note, pause_collection,
                                          resume_collection, skip_shutdown_collection)


class _Finite(click.FloatRange):
    """A finite number in a range (click's FloatRange lets nan through: nan compares false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"must be a finite number, got {value!r}", param, ctx)
        return number


class _Experiment(click.ParamType):
    """An experiment name or glob pattern, by the rule ``edps`` applies to the names it creates
    (edps_mlflow.experiment_names): refused in one line before any store is opened."""

    name = "name|pattern"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from edps_mlflow.experiment_names import experiment_name_problem

        text = str(value)
        problem = experiment_name_problem(text)
        if problem is not None:
            if not text.strip():
                problem += " (leave the option out for every experiment with study runs)"
            self.fail(problem, param, ctx)
        return text


EXPERIMENT = _Experiment()

# A regime tolerance is a fraction such as 0.2 (20%); 10 (1000%) would make every curve one regime.
TOLERANCE = _Finite(min=0, max=10, min_open=True, max_open=True)
SEED = click.IntRange(0, 2**32 - 1)  # what numpy's generators take as a plain seed
# 100,000 resamples are already far more than a 95% interval needs; more would only hang the command.
BOOTSTRAP = click.IntRange(0, 100_000)
# What the figures' processes import as they start (matplotlib with them): the report never draws here.
PLOTTING_MODULES = ("analysis.plots",)


def _source_options(command: Callable) -> Callable:
    @click.option("--tracking-uri", default=None, help="Tracking store (default: as training: $MLFLOW_TRACKING_URI, else ./mlflow.db).")
    @click.option("--experiment", "experiments", multiple=True, type=EXPERIMENT,
                  help="Experiment name or glob pattern (repeatable; default: every experiment with study runs).")
    @click.option("--csv", "csv_path", default=None, type=click.Path(), help="Read the study table from CSV instead.")
    @click.option("--workload", default=None, help="Only this workload.")
    @click.option("--optimizer", default=None, help="Only this optimizer.")
    @click.option("--sparsity", "sparsities", multiple=True, type=_Finite(min=0, max=1, max_open=True),
                  help="Only these sparsities (repeatable).")
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return command(*args, **kwargs)

    return wrapper


def _load(tracking_uri: str | None, experiments: tuple[str, ...], csv_path: str | None, workload: str | None,
          optimizer: str | None, sparsities: tuple[float, ...]) -> tuple[pd.DataFrame, str]:
    from analysis.load import load_studies, read_csv

    if csv_path:
        table, source = read_csv(csv_path), f"CSV {csv_path}"
    else:
        table = load_studies(experiments, tracking_uri)
        read = ", ".join(sorted(table["experiment"].dropna().unique()))
        # A pattern (or no name) says which experiments it found.
        source = (f"experiment(s) {', '.join(experiments)}" if experiments else "every experiment with study runs")
        if read and read != ", ".join(experiments):
            source += f" ({read})"
    # Numbers are filtered here, in pandas: MLflow compares params and tags only as strings.
    if workload:
        table = table[table["workload"] == workload]
    if optimizer:
        table = table[table["optimizer"] == optimizer]
    if sparsities:
        table = table[table["sparsity"].round(6).isin([round(s, 6) for s in sparsities])]
    if table.empty:
        raise EdpsError("no studies left after the filters")
    resume_collection()
    return table.reset_index(drop=True), source


def _trials(table: pd.DataFrame, tracking_uri: str | None, trials_csv: str | None, bootstrap: int) -> pd.DataFrame | None:
    from analysis.load import TRIAL_COLUMNS, load_trials, read_csv

    if bootstrap <= 0:
        return None
    if trials_csv:
        trials = read_csv(trials_csv, columns=TRIAL_COLUMNS)
        if "study_key" not in table.columns or table["study_key"].isna().all():
            raise EdpsError("--trials-csv needs a study_key column in the study table to match trials to studies")
        if not trials["study_key"].isin(set(table["study_key"].dropna())).any():
            raise EdpsError(f"{trials_csv}: none of its study_key values matches a study of the study table")
        return trials
    if table["study_run_id"].notna().any():
        return load_trials(table, tracking_uri)
    return None


def _emit(frame: pd.DataFrame, output_format: str, human: str) -> None:
    if output_format == "csv":
        from analysis.load import csv_text

        click.echo(csv_text(frame), nl=False)
    elif output_format == "json":
        click.echo(json.dumps(json.loads(frame.to_json(orient="records")), indent=2))
    else:
        click.echo(human)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Analyse steps-to-result measurements: regimes, fits, figures, reports."""


@cli.command()
@_source_options
@click.option("--format", "output_format", type=click.Choice(["table", "csv", "json"]), default="table")
def table(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, output_format) -> None:
    """The steps-to-result grid (batch size x sparsity) per workload and optimizer."""
    from analysis.report import steps_grids

    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    human = "\n\n".join(f"{w} / {o}\n{grid.to_string()}" for (w, o), grid in steps_grids(studies).items())
    _emit(studies, output_format, human)


class _Devices(click.ParamType):
    """Device counts: positive integers separated by commas (``1,2,4,8``)."""

    name = "devices"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        from analysis.timing import parse_devices

        try:
            return parse_devices(str(value))
        except EdpsError as error:
            self.fail(str(error).replace("--devices ", ""), param, ctx)


def _cost_options(command: Callable) -> Callable:
    from analysis.timing import DEFAULT_BANDWIDTH_GB_S, DEFAULT_DEVICES, DEFAULT_LATENCY_US

    @click.option("--devices", "device_counts", type=_Devices(), default=",".join(map(str, DEFAULT_DEVICES)),
                  show_default=True, help="Device counts N to project data parallelism over.")
    @click.option("--bandwidth", type=_Finite(min=0, min_open=True), default=DEFAULT_BANDWIDTH_GB_S,
                  show_default=True, help="Interconnect bandwidth per device in GB/s (10^9 bytes per second).")
    @click.option("--latency", type=_Finite(min=0), default=DEFAULT_LATENCY_US, show_default=True,
                  help="Latency of one all-reduce message in microseconds.")
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return command(*args, **kwargs)

    return wrapper


def _cost_model(device_counts: tuple[int, ...], bandwidth: float, latency: float):
    from analysis.timing import GIGABYTE, MICROSECOND, CostModel

    return CostModel(bandwidth=bandwidth * GIGABYTE, latency=latency * MICROSECOND, devices=device_counts)


def _fit_options(command: Callable) -> Callable:
    @click.option("--tolerance", type=TOLERANCE, default=0.2, show_default=True,
                  help="Tolerance of the regime boundaries and of the threshold critical batch size (0.2 = 20%, "
                       "Zhang et al.'s).")
    @click.option("--bootstrap", type=BOOTSTRAP, default=200, show_default=True,
                  help="Bootstrap resamples (0: no intervals).")
    @click.option("--seed", type=SEED, default=0, show_default=True, help="Bootstrap seed.")
    @click.option("--trials-csv", default=None, type=click.Path(), help="Per-trial outcomes for intervals with --csv.")
    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return command(*args, **kwargs)

    return wrapper


def _fits(studies: pd.DataFrame, tracking_uri, trials_csv, bootstrap, seed, tolerance) -> pd.DataFrame:
    from analysis.regimes import fit_table

    return fit_table(studies, _trials(studies, tracking_uri, trials_csv, bootstrap), tolerance, bootstrap, seed)


@cli.command()
@_source_options
@_fit_options
@click.option("--format", "output_format", type=click.Choice(["table", "csv", "json"]), default="table")
@click.option("--log-to-mlflow", is_flag=True, help="Record the fit table on an analysis run.")
def fit(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, tolerance, bootstrap, seed, trials_csv,
        output_format, log_to_mlflow) -> None:
    """S_min, B_crit, the regime boundaries and the threshold critical batch size (measured, with its bracket, and
    fitted) per curve, with bootstrap intervals."""
    from analysis.report import fit_summary

    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    fits = _fits(studies, tracking_uri, trials_csv, bootstrap, seed, tolerance)
    _emit(fits, output_format, fit_summary(fits).to_string(index=False))
    if log_to_mlflow:
        _publish(tracking_uri, experiments, studies, {"fit": fits}, [],
                 {"tolerance": tolerance, "bootstrap": bootstrap, "seed": seed})


@cli.command()
@_source_options
@click.option("--out-dir", default="figures", show_default=True, type=click.Path(), help="Where figures go.")
@click.option("--tolerance", type=TOLERANCE, default=0.2, show_default=True,
              help="Tolerance of the regime boundaries and of the threshold critical batch size (0.2 = 20%, "
                   "Zhang et al.'s).")
@click.option("--log-to-mlflow", is_flag=True, help="Record the figures on an analysis run.")
def plot(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, out_dir, tolerance, log_to_mlflow) -> None:
    """Figures (PNG and SVG): steps against batch size, normalised curves, cost of sparsity. The fits drawn are
    those of the fit table (`edps-analyze fit`, without intervals: `report` draws them with theirs)."""
    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    figures = _paths(_figures(studies, Path(out_dir), tolerance))
    for path in (p for paths in figures.values() for p in paths):
        click.echo(str(path))
    if log_to_mlflow:
        _publish(tracking_uri, experiments, studies, {}, [p for paths in figures.values() for p in paths],
                 {"tolerance": tolerance})


def _figures(studies: pd.DataFrame, directory: Path, tolerance: float, fits: pd.DataFrame | None = None,
             formats: tuple[str, ...] = FIGURE_FORMATS) -> dict[tuple[str, str], list[Future]]:
    """Per (workload, optimizer), its steps figure and its sparsity comparison: drawn and written by the
    processes of analysis.forked (each given its own rows), their paths once its block has ended."""
    from analysis.regimes import sparsity_comparison

    comparison = sparsity_comparison(studies)
    figures = {}
    for (workload, optimizer), group in studies.groupby(["workload", "optimizer"], sort=True):
        compared = comparison[(comparison["workload"] == workload) & (comparison["optimizer"] == optimizer)]
        figures[(workload, optimizer)] = [
            forked.call("analysis.plots", "steps_figure", group, workload, optimizer, directory, tolerance, fits,
                        formats),
            forked.call("analysis.plots", "comparison_figures", compared, workload, optimizer, directory, formats)]
    return figures


def _paths(figures: dict[tuple[str, str], list[Future]]) -> dict[tuple[str, str], list[Path]]:
    """The paths of :func:`_figures`, once written."""
    return {key: _written(futures) for key, futures in figures.items()}


def _written(futures: list[Future]) -> list[Path]:
    """The paths that figure calls (analysis.forked.call) wrote, in their order."""
    return [path for future in futures for path in future.result()]


@cli.command()
@_source_options
@_fit_options
@_cost_options
@click.option("--output", default="report.md", show_default=True, type=click.Path(),
              help="Report file: .md for Markdown, .html for HTML; figures go beside it.")
@click.option("--svg", is_flag=True,
              help="Also write each figure as SVG beside its PNG (vector, for print; the report shows the PNGs).")
@click.option("--log-to-mlflow", is_flag=True, help="Record the report, tables and figures on an analysis run.")
def report(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, tolerance, bootstrap, seed,
           trials_csv, device_counts, bandwidth, latency, output, svg, log_to_mlflow) -> None:
    """One report file with the grids, the fits, time to result and the figures (PNG; --svg: SVG too)."""
    from analysis.regimes import fit_table, sparsity_comparison
    from analysis.report import draft_report, steps_grids

    path = Path(output)
    if path.suffix.lower() not in (".md", ".html", ".htm"):
        raise EdpsError(f"report output must end in .md or .html, got {output!r}")
    model = _cost_model(device_counts, bandwidth, latency)
    # The report shows the PNGs; an SVG of each (a third of the time spent writing them) only when asked.
    formats = ("png", "svg") if svg else ("png",)
    # The figures' processes are forked first: they import the plotting modules while this process imports
    # MLflow and reads the store. The report reads the figures' files: they are all written at the block's end.
    with forked.writing_in_parallel(preload=PLOTTING_MODULES):
        studies, source = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
        # A trials CSV is input: read and checked before anything is written. The store's trials are read once
        # the time figures are handed to the children, which draw them meanwhile.
        trials = _trials(studies, tracking_uri, trials_csv, bootstrap) if trials_csv else None
        path.parent.mkdir(parents=True, exist_ok=True)
        directory = path.parent / f"{path.stem}_figures"
        # The time figures need no fit: handed over first, they are drawn while the bootstrap runs.
        time_sections, time_tables = _time_sections(studies, model, directory, formats)
        if not trials_csv:
            trials = _trials(studies, tracking_uri, trials_csv, bootstrap)
        fits = fit_table(studies, trials, tolerance, bootstrap, seed)
        pending = _figures(studies, directory, tolerance, fits, formats)
        pruning_sections, pruning_tables = _pruning_sections(studies, fits, tolerance, directory, formats)
        probe_sections = ([] if csv_path else
                          _probe_sections(experiments, tracking_uri, fits, directory, studies, formats))
        # The text (its tables: the time table has a row per study and device count) while the figures are drawn.
        tables = ([(title, table) for title, table, _ in pruning_sections + time_sections]
                  + [(title, table) for _, title, table, _ in probe_sections])
        draft = draft_report(path, steps_grids(studies), fits, source, tolerance, tables)
    figures = _paths(pending)
    extra_files = ([paths for _, _, paths in pruning_sections]
                   + [_written(futures) for _, _, futures in time_sections]
                   + [paths for _, _, _, paths in probe_sections])
    for paths in extra_files:
        figures.setdefault(("sections", ""), []).extend(paths)
    draft.write(figures, extra_files)
    click.echo(f"report written to {path}")
    if log_to_mlflow:
        files = [path] + [p for paths in figures.values() for p in paths]
        probe_tables = {name: table for name, _, table, _ in probe_sections}
        _publish(tracking_uri, experiments, studies,
                 {"fit": fits, "studies": studies, "sparsity_comparison": sparsity_comparison(studies),
                  **pruning_tables, **time_tables, **probe_tables}, files,
                 {"tolerance": tolerance, "bootstrap": bootstrap, "seed": seed,
                  "devices": ",".join(map(str, device_counts)), "bandwidth_gb_s": bandwidth, "latency_us": latency})


@cli.command("compare-pruning")
@_source_options
@_fit_options
@click.option("--out-dir", default="figures", show_default=True, type=click.Path(), help="Where figures go.")
@click.option("--format", "output_format", type=click.Choice(["table", "csv", "json"]), default="table")
def compare_pruning(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, tolerance, bootstrap, seed,
                    trials_csv, out_dir, output_format) -> None:
    """Per sparsity, each pruning method against the dense network: its steps relative to dense at every batch
    size, S_min and B_crit with intervals, whether its normalised curve has the dense one's shape, its steps
    over its shuffle's; a figure per (workload, optimizer, sparsity)."""
    from analysis.plots import pruning_figure
    from analysis.pruning_methods import (comparison_keys, intervals_footnote, pruning_comparison, pruning_summary,
                                          summary_for_people)
    from analysis.regimes import with_curve_axes

    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    studies = with_curve_axes(studies)
    if not (studies["sparsity"] == 0.0).any() or not (studies["sparsity"] > 0).any():
        raise EdpsError("compare-pruning needs the dense curve (sparsity 0) and at least one pruned curve; "
                        "measure both, e.g. edps sweep --sparsities 0,0.9 --pruning snip,random")
    fits = _fits(studies, tracking_uri, trials_csv, bootstrap, seed, tolerance)
    comparison = pruning_comparison(studies)
    summary = pruning_summary(studies, fits, tolerance)
    paths = [p for w, o, s in comparison_keys(studies) for p in pruning_figure(comparison, w, o, s, Path(out_dir))]
    human = summary_for_people(summary).to_string(index=False)
    footnote = intervals_footnote(summary)
    if footnote:
        human += "\n" + footnote
    human += "\n\nsteps relative to dense, per batch size:\n" + comparison.pivot_table(
        index=["optimizer", "sparsity", "batch_size"], columns="pruning", values="relative_to_dense").to_string(
        float_format=lambda v: f"{v:.3g}")
    human += "\n\nfigures:\n" + "\n".join(str(p) for p in paths if p.suffix == ".png")
    _emit(summary, output_format, human)


def _pruning_sections(studies: pd.DataFrame, fits: pd.DataFrame, tolerance: float, directory: Path,
                      formats: tuple[str, ...]) -> tuple[list[tuple[str, pd.DataFrame, list[Path]]],
                                                         dict[str, pd.DataFrame]]:
    """The report's comparison of pruning methods (none when the pruned curves are all SNIP's) and its tables."""
    from analysis.regimes import with_curve_axes

    table = with_curve_axes(studies)
    if set(table.loc[table["sparsity"] > 0, "pruning"]) <= {"snip"}:
        return [], {}
    from analysis.plots import pruning_figure
    from analysis.pruning_methods import (comparison_keys, intervals_footnote, pruning_comparison, pruning_summary,
                                          summary_for_people)
    comparison = pruning_comparison(table)
    summary = pruning_summary(table, fits, tolerance)
    paths = [p for w, o, s in comparison_keys(table) for p in pruning_figure(comparison, w, o, s, directory, formats)]
    title = (f"Pruning methods at each sparsity, against the dense network (shape: the normalised curves agree "
             f"within {tolerance:.0%} at every batch size both measured)")
    footnote = intervals_footnote(summary)
    if footnote:
        title += f" ({footnote})"
    return [(title, summary_for_people(summary), paths)], {"pruning_summary": summary, "pruning_comparison": comparison}


def _time_sections(studies: pd.DataFrame, model, directory: Path, formats: tuple[str, ...]
                   ) -> tuple[list[tuple[str, pd.DataFrame, list[Future]]], dict[str, pd.DataFrame]]:
    """The report's time-to-result sections (the fastest batch size per device count with the figures, drawn
    by analysis.forked's processes, then every row) and the tables for --log-to-mlflow; one section saying
    why when the studies were not timed."""
    from analysis.report import time_summary
    from analysis.timing import fastest_table, time_table

    title = "Time to result"
    try:
        table = time_table(studies, model)
    except EdpsError as error:
        return [(title, pd.DataFrame({"not available": [str(error)]}), [])], {}
    fastest = fastest_table(table)
    summary, rows = time_summary(table, fastest)
    # a call per workload and optimizer (a figure each), so that the children draw them side by side
    paths = []
    for (workload, optimizer), curves in table.groupby(["workload", "optimizer"], sort=True):
        its_fastest = fastest[(fastest["workload"] == workload) & (fastest["optimizer"] == optimizer)]
        paths.append(forked.call("analysis.plots", "time_figures", curves, its_fastest, directory,
                                 model.describe(), formats))
    return ([(f"{title}: the fastest batch size per number of devices (one device: measured; more: "
              f"{model.describe()})", summary, paths),
             (f"{title}: every batch size", rows, [])],
            {"time_to_result": table, "fastest_batch_size": fastest})


@cli.command("time")
@_source_options
@_cost_options
@click.option("--format", "output_format", type=click.Choice(["table", "markdown", "csv", "json"]), default="table",
              help="table/markdown: the fastest batch size per device count, then every row; csv/json: every row.")
@click.option("--out-dir", default="figures", show_default=True, type=click.Path(),
              help="Where the figures (hours against batch size, one line per device count) go.")
def time_to_result(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, device_counts, bandwidth,
                   latency, output_format, out_dir) -> None:
    """Time to result in hours per batch size on the measured device, projected over N devices (data
    parallelism with a ring all-reduce), and the fastest batch size for each N (docs/time-to-result.md)."""
    from analysis.plots import time_figures
    from analysis.report import markdown_table, time_summary
    from analysis.timing import fastest_table, time_table

    model = _cost_model(device_counts, bandwidth, latency)
    studies, source = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    table = time_table(studies, model)
    fastest = fastest_table(table)
    paths = time_figures(table, fastest, Path(out_dir), model.describe())
    if output_format in ("csv", "json"):
        _emit(table, output_format, "")
    else:
        render = (markdown_table if output_format == "markdown"
                  else lambda frame: frame.to_string(index=False))
        summary, rows = time_summary(table, fastest)
        click.echo(f"Time to result from {source}; one device: as measured; more: {model.describe()}\n")
        click.echo("Fastest batch size per number of devices:\n" + render(summary) + "\n")
        click.echo("Every batch size:\n" + render(rows))
    for path in paths:
        click.echo(str(path), err=True)


@cli.command()
@_source_options
@click.option("--output", default=None, type=click.Path(), help="CSV file (default: standard output).")
def export(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, output) -> None:
    """The study table as CSV (the columns that --csv reads back)."""
    from analysis.load import write_csv

    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    text = write_csv(studies, output)
    if output is None:
        click.echo(text, nl=False)
    else:
        click.echo(f"{len(studies)} studies written to {output}")


@cli.command()
@click.option("--tracking-uri", default=None, help="Tracking store (default: as training).")
@click.option("--experiment", "experiments", multiple=True, type=EXPERIMENT,
              help="Experiment name or pattern (repeatable; default: every experiment with study runs).")
@click.option("--format", "output_format", type=click.Choice(["table", "csv", "json"]), default="table")
@click.option("--out-dir", default=None, type=click.Path(), help="Also draw the constant against sparsity here.")
def lipschitz(tracking_uri, experiments, output_format, out_dir) -> None:
    """The Lipschitz constant of the gradient along each study's best trial's run, per sparsity and batch
    size, as the paper measures it (studies run with --probes lipschitz)."""
    from analysis.load import load_best_trial_probes
    from analysis.probes import lipschitz_by_study, lipschitz_table, lipschitz_verdict

    by_study = lipschitz_by_study(load_best_trial_probes(experiments, n.METRIC_PROBE_LIPSCHITZ, tracking_uri))
    resume_collection()
    summary = lipschitz_table(by_study)
    human = (by_study.to_string(index=False, float_format=lambda v: f"{v:.4g}") + "\n\nper sparsity:\n"
             + summary.to_string(index=False, float_format=lambda v: f"{v:.4g}") + "\n"
             + "\n".join(lipschitz_verdict(summary)))
    _emit(by_study, output_format, human)
    if out_dir:
        from analysis.plots import lipschitz_figure

        for path in lipschitz_figure(by_study, Path(out_dir)):
            click.echo(str(path), err=True)


@cli.command("noise-scale")
@click.option("--tracking-uri", default=None, help="Tracking store (default: as training).")
@click.option("--experiment", "experiments", multiple=True, type=EXPERIMENT,
              help="Experiment name or pattern (repeatable; default: every experiment with study runs).")
@click.option("--format", "output_format", type=click.Choice(["table", "csv", "json"]), default="table")
def noise_scale(tracking_uri, experiments, output_format) -> None:
    """The measured noise scale B_simple beside the fitted critical batch size B_crit, per sparsity."""
    from analysis.load import load_probe_values, load_studies
    from analysis.probes import noise_scale_table
    from analysis.regimes import fit_table

    latest = load_probe_values(experiments, n.METRIC_PROBE_NOISE_SCALE, tracking_uri, history=False)
    try:
        fits = fit_table(load_studies(experiments, tracking_uri), None, repeats=0)
    except EdpsError:
        fits = None
    resume_collection()
    summary = noise_scale_table(latest, fits)
    _emit(summary, output_format, summary.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def _probe_sections(experiments, tracking_uri, fits, directory: Path, studies: pd.DataFrame,
                    formats: tuple[str, ...]) -> list[tuple[str, str, pd.DataFrame, list[Path]]]:
    """Probe summaries for the report, when the studies logged probes (else nothing)."""
    from analysis.load import load_best_trial_probes, load_probe_values, read_without_probes

    if read_without_probes(studies):  # each search below would read the study index again, to find none
        return []
    from analysis.plots import lipschitz_figure, noise_scale_figure
    from analysis.probes import lipschitz_by_study, lipschitz_table, lipschitz_verdict, noise_scale_table

    sections = []
    try:
        by_study = lipschitz_by_study(load_best_trial_probes(experiments, n.METRIC_PROBE_LIPSCHITZ, tracking_uri))
        summary = lipschitz_table(by_study)
        verdict = pd.DataFrame({"finding": lipschitz_verdict(summary)})
        sections.append(("lipschitz", "Lipschitz constant of the gradient along the best trial's run, per "
                         "sparsity and batch size", by_study, lipschitz_figure(by_study, directory, formats)))
        sections.append(("lipschitz_per_sparsity", "Lipschitz constant per sparsity (over batch sizes)", summary,
                         []))
        sections.append(("lipschitz_verdict", "Does the constant rise with sparsity?", verdict, []))
    except EdpsError:
        pass
    try:
        latest = load_probe_values(experiments, n.METRIC_PROBE_NOISE_SCALE, tracking_uri, history=False)
        table = noise_scale_table(latest, fits)
        sections.append(("noise_scale", "Gradient noise scale B_simple beside the fitted B_crit", table,
                         noise_scale_figure(table, directory, formats)))
    except EdpsError:
        pass
    return sections


def _publish(tracking_uri, experiments, studies, tables, files, settings=None) -> None:
    import contextlib

    from analysis.publish import log_analysis
    from edps_mlflow.store.client import connect, ui_link

    # The analysis run goes next to its studies: their experiment when they share one.
    used = [e for e in studies.get("experiment", pd.Series(dtype=str)).dropna().unique()]
    experiment = used[0] if len(used) == 1 else next(
        (e for e in experiments if not any(c in e for c in "*?[")), "edps/analysis")
    # The names asked for; with none, the experiments the studies were read from.
    settings = {**(settings or {}), "experiments": ",".join(experiments) or ",".join(sorted(map(str, used)))}
    # MLflow prints links when a run ends; keep standard output clean for csv/json consumers.
    with contextlib.redirect_stdout(sys.stderr):
        run_id = log_analysis(tracking_uri, experiment, studies, tables, files, settings, _command_argv())
    client = connect(tracking_uri)
    experiment_id = client.get_run(run_id).info.experiment_id
    click.echo(f"analysis logged to MLflow run {run_id} in experiment {experiment!r}", err=True)
    click.echo(ui_link(str(client.tracking_uri), experiment_id, run_id), err=True)


def _command_argv() -> list[str] | None:
    """The arguments the command was given (after the program name), for the analysis run's Source."""
    context = click.get_current_context(silent=True)
    root = context.find_root() if context is not None else None
    return (root.obj or {}).get("argv") if root is not None and isinstance(root.obj, dict) else None


def main(argv: list[str] | None = None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    configure_process(program="edps-analyze")
    if argv is None:  # the console entry point: the process is the command's
        collect_less_often()
        pause_collection()  # until the command has read the store (resume_collection)
    try:
        try:
            cli.main(args=arguments, prog_name="edps-analyze", standalone_mode=False, obj={"argv": arguments})
        except click.exceptions.Abort:
            click.echo("edps-analyze: interrupted", err=True)
            sys.exit(130)
        except click.UsageError as error:
            click.echo(f"edps-analyze: error: {' '.join(error.format_message().split())}", err=True)
            sys.exit(2)
        except EdpsError as error:
            click.echo(f"edps-analyze: error: {error}{log_note()}", err=True)
            sys.exit(2)
        except Exception as error:
            # A tracking-store error (or a full or read-only disk under the report's run) as one line.
            if type(error).__module__.split(".")[0] not in ("mlflow", "requests", "urllib3", "sqlalchemy") \
                    and not isinstance(error, OSError):
                raise
            from edps_mlflow.store.trouble import store_error_line

            line = store_error_line(error)
            if line is None:
                raise
            click.echo(f"edps-analyze: error: {line}{log_note()}", err=True)
            sys.exit(2)
    finally:
        _restore_library_logs()
        if argv is None:  # the console entry point: the process ends with the command
            skip_shutdown_collection()


def _restore_library_logs() -> None:
    """MLflow's loggers as they were before the command routed them to its log file (store.logs), for a
    command run inside another program (a test); a command that never opened the store changed nothing."""
    logs = sys.modules.get("edps_mlflow.store.logs")
    if logs is not None:
        logs.restore_library_logs()


if __name__ == "__main__":
    main()
