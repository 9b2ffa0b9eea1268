"""``edps-analyze``: tables, fits, figures and reports from the tracking store or a CSV; it never trains.

    edps-analyze fit    --experiment edps/digits-simple-cnn --format json
    edps-analyze report --experiment edps/digits-simple-cnn --output report.html --log-to-mlflow
    edps-analyze fit    --csv steps.csv --trials-csv trials.csv
    edps-analyze time   --experiment 'edps/*' --devices 1,2,4,8      # docs/analysis.md lists every command
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click
import pandas as pd

from analysis.budget import budget_fits, budget_points, budget_text
from analysis.csv_io import TRIAL_COLUMNS, csv_text, read_csv, write_csv
from analysis.load import load_best_trial_probes, load_probe_values, load_studies, load_trials
from analysis.probes import lipschitz_by_study, lipschitz_table, lipschitz_verdict, noise_scale_table
from analysis.pruning_methods import intervals_footnote, summary_for_people
from analysis.regimes import fit_table, point_table, sparsity_comparison, with_curve_axes
from analysis.report import (TERMINAL_WIDTH, certainty_lines, fit_summary, grid_note, markdown_table, steps_grids,
                             terminal_tables, with_interval, wrapped, write_report)
from analysis.timing import (DEFAULT_BANDWIDTH_GB_S, DEFAULT_DEVICES, DEFAULT_LATENCY_US, GIGABYTE, MICROSECOND,
                             CostModel, parse_devices)
from edps_mlflow import names as n
from edps_mlflow.cli_options import ExperimentName, FiniteRange
from edps_mlflow.errors import EdpsError
from edps_mlflow.process_settings import configure_process, end_with, log_note, store_errors_in_one_line
from edps_mlflow.uris import require_encoded_userinfo


def _devices(ctx: click.Context, param: click.Parameter, text: str) -> tuple[int, ...]:
    """Device counts: positive integers separated by commas (``1,2,4,8``)."""
    try:
        return parse_devices(text)
    except EdpsError as error:
        raise click.BadParameter(str(error).replace("--devices ", ""), ctx, param) from None


def _tracking_uri(uri: str | None) -> str | None:
    """The store given, else the environment's, refused before any work when its user information is not
    validly percent-encoded."""
    require_encoded_userinfo(uri or os.environ.get("MLFLOW_TRACKING_URI", ""))
    return uri


def _output(ctx: click.Context, param: click.Parameter, output: str | None) -> str | None:
    """An output file refused before any work when its folder does not exist: a typo makes no folders."""
    if output and not Path(output).expanduser().absolute().parent.is_dir():
        raise EdpsError(f"cannot write {output}: no folder {Path(output).parent}")
    return output


def _options(*options: Callable) -> Callable:
    """One decorator for several click options, in the order given."""
    return lambda command: functools.reduce(lambda wrapped, option: option(wrapped), reversed(options), command)


_STORE = _options(
    click.option("--tracking-uri", default=None, callback=lambda ctx, param, uri: _tracking_uri(uri),
                 help="Tracking store (default: as training: $MLFLOW_TRACKING_URI, else ./mlflow.db)."),
    # Names and patterns by the rule `edps` applies to the names it creates: refused before any store is opened.
    click.option("--experiment", "experiments", multiple=True, metavar="NAME|PATTERN",
                 type=ExperimentName(omitted="every experiment with study runs"),
                 help="Experiment name or glob pattern (repeatable; default: every experiment with study runs)."))
_SOURCE = _options(
    _STORE,
    click.option("--csv", "csv_path", default=None, type=click.Path(), help="Read the study table from CSV instead."),
    click.option("--workload", default=None, help="Only this workload."),
    click.option("--optimizer", default=None, help="Only this optimizer."),
    click.option("--sparsity", "sparsities", multiple=True, type=FiniteRange(min=0, max=1, max_open=True),
                 help="Only these sparsities (repeatable)."))
# A regime tolerance is a fraction such as 0.2 (20%); 10 (1000%) would make every curve one regime.
_TOLERANCE = click.option(
    "--tolerance", type=FiniteRange(min=0, max=10, min_open=True, max_open=True), default=0.2, show_default=True,
    help="Tolerance of the regime boundaries and of the threshold critical batch size (0.2 = 20%, Zhang et al.'s).")
_RESAMPLES = _options(
    # 100,000 resamples are far more than a 95% interval needs; more would only hang the command.
    click.option("--bootstrap", type=click.IntRange(0, 100_000), default=200, show_default=True,
                 help="Bootstrap resamples (0: no intervals)."),
    click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True, help="Bootstrap seed."))
_FIT = _options(
    _TOLERANCE,
    _RESAMPLES,
    click.option("--trials-csv", default=None, type=click.Path(), help="Per-trial outcomes for intervals with --csv."))
_COST = _options(
    click.option("--devices", "device_counts", metavar="DEVICES", callback=_devices, show_default=True,
                 default=",".join(map(str, DEFAULT_DEVICES)), help="Device counts N to project data parallelism over."),
    click.option("--bandwidth", type=FiniteRange(min=0, min_open=True), default=DEFAULT_BANDWIDTH_GB_S,
                 show_default=True, help="Interconnect bandwidth per device in GB/s (10^9 bytes per second)."),
    click.option("--latency", type=FiniteRange(min=0), default=DEFAULT_LATENCY_US, show_default=True,
                 help="Latency of one all-reduce message in microseconds."))


def _format(*choices: str, **attributes: Any) -> Callable:
    return click.option("--format", "output_format", type=click.Choice(choices), default=choices[0], **attributes)


def _load(tracking_uri: str | None, experiments: tuple[str, ...], csv_path: str | None, workload: str | None,
          optimizer: str | None, sparsities: tuple[float, ...]) -> tuple[pd.DataFrame, str]:
    """The study table, filtered, and where it came from in words."""
    if csv_path:
        table, source = read_csv(csv_path), f"CSV {csv_path}"
        if experiments and table.get("experiment", pd.Series(dtype=object)).isna().all():
            raise EdpsError(f"--experiment with --csv filters the table's experiment column, which {csv_path} lacks")
        if experiments:  # names and patterns as they select a store's experiments
            table = table[[any(fnmatch.fnmatchcase(str(e), p) for p in experiments) for e in table["experiment"]]]
    else:
        table = load_studies(experiments, tracking_uri)
        read = ", ".join(sorted(table["experiment"].dropna().unique()))
        source = f"experiment(s) {', '.join(experiments)}" if experiments else "every experiment with study runs"
        if read and read != ", ".join(experiments):  # a pattern (or no name) says which experiments it found
            source += f" ({read})"
    # Filtered here, in pandas: MLflow compares params and tags only as strings.
    if workload:
        table = table[table["workload"] == workload]
    if optimizer:
        table = table[table["optimizer"] == optimizer]
    if sparsities:
        table = table[table["sparsity"].round(6).isin([round(s, 6) for s in sparsities])]
    if table.empty:
        raise EdpsError("no studies left after the filters")
    return table.reset_index(drop=True), source


def _fits(studies: pd.DataFrame, tracking_uri, trials_csv, bootstrap, seed, tolerance) -> pd.DataFrame:
    """The fit table, with intervals from the trials of a CSV or of the store when ``bootstrap`` asks for them."""
    trials = None
    if bootstrap > 0 and trials_csv:
        trials = read_csv(trials_csv, columns=TRIAL_COLUMNS)
        if "study_key" not in studies.columns or studies["study_key"].isna().all():
            raise EdpsError("--trials-csv needs a study_key column in the study table to match trials to studies")
        if not trials["study_key"].isin(set(studies["study_key"].dropna())).any():
            raise EdpsError(f"{trials_csv}: none of its study_key values matches a study of the study table")
    elif bootstrap > 0 and studies["study_run_id"].notna().any():
        trials = load_trials(studies, tracking_uri)
    return fit_table(studies, trials, tolerance, bootstrap, seed)


def _emit(frame: pd.DataFrame, output_format: str, human: str) -> None:
    if output_format == "csv":
        click.echo(csv_text(frame), nl=False)
    elif output_format == "json":
        click.echo(json.dumps(json.loads(frame.to_json(orient="records")), indent=2))
    else:
        click.echo(human)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Analyse steps-to-result measurements: regimes, fits, figures, reports."""


@cli.command()
@_SOURCE
@_RESAMPLES
@_format("table", "csv", "json")
def table(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, bootstrap, seed,
          output_format) -> None:
    """The steps-to-result grid (batch size x sparsity) per workload and optimizer: each point by the point rule
    over its replicates, with its 95% interval where it has 3 replicates or more (csv/json: the study table)."""
    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    human = "\n\n".join(f"{w} / {o}\n{grid.to_string(line_width=TERMINAL_WIDTH)}"
                        + (f"\n{wrapped(grid_note(grid))}" if grid_note(grid) else "")
                        for (w, o), grid in steps_grids(studies, bootstrap, seed).items())
    _emit(studies, output_format, human)


@cli.command()
@_SOURCE
@_FIT
@_format("table", "csv", "json")
@click.option("--log-to-mlflow", is_flag=True, help="Record the fit table on an analysis run.")
def fit(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, tolerance, bootstrap, seed, trials_csv,
        output_format, log_to_mlflow) -> None:
    """S_min, B_crit, the regime boundaries and the threshold critical batch size (measured, with its bracket, and
    fitted) per curve, with bootstrap intervals."""
    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    fits = _fits(studies, tracking_uri, trials_csv, bootstrap, seed, tolerance)
    sure = "\n".join(["How sure each answer is:", *(wrapped(line, "- ", "  ") for line in certainty_lines(fits))])
    _emit(fits, output_format, f"{sure}\n\n{terminal_tables(fit_summary(fits))}")
    if log_to_mlflow:
        _publish(tracking_uri, experiments, studies, {"fit": fits}, [],
                 {"tolerance": tolerance, "bootstrap": bootstrap, "seed": seed})


def _figures(studies: pd.DataFrame, directory: Path, tolerance: float, fits: pd.DataFrame | None = None,
             formats: tuple[str, ...] = ("png", "svg"), resamples: tuple[int, int] = (200, 0)
             ) -> dict[tuple[str, str], list[Path]]:
    """Per (workload, optimizer), the files of its steps figure and its sparsity comparison."""
    from analysis.plots import comparison_figures, steps_figure

    comparison = sparsity_comparison(studies, *resamples)
    return {(w, o): steps_figure(group, w, o, directory, tolerance, fits, formats, resamples) + comparison_figures(
                comparison[(comparison["workload"] == w) & (comparison["optimizer"] == o)], w, o, directory, formats)
            for (w, o), group in studies.groupby(["workload", "optimizer"], sort=True)}


@cli.command()
@_SOURCE
@click.option("--out-dir", default="figures", show_default=True, type=click.Path(), help="Where figures go.")
@_TOLERANCE
@click.option("--log-to-mlflow", is_flag=True, help="Record the figures on an analysis run.")
def plot(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, out_dir, tolerance,
         log_to_mlflow) -> None:
    """Figures (PNG and SVG): steps against batch size, normalised curves, cost of sparsity. The fits drawn are
    those of the fit table (`edps-analyze fit`, without intervals: `report` draws them with theirs)."""
    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    paths = [p for files in _figures(studies, Path(out_dir), tolerance).values() for p in files]
    for path in paths:
        click.echo(str(path))
    if log_to_mlflow:
        _publish(tracking_uri, experiments, studies, {}, paths, {"tolerance": tolerance})


@cli.command()
@_SOURCE
@_FIT
@_COST
@click.option("--output", default="report.md", show_default=True, type=click.Path(), callback=_output,
              help="Report file: .md for Markdown, .html for HTML; figures go beside it.")
@click.option("--svg", is_flag=True,
              help="Also write each figure as SVG beside its PNG (vector, for print; the report shows the PNGs).")
@click.option("--log-to-mlflow", is_flag=True, help="Record the report, tables and figures on an analysis run.")
def report(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, tolerance, bootstrap, seed,
           trials_csv, device_counts, bandwidth, latency, output, svg, log_to_mlflow) -> None:
    """One report file with the grids, the fits, time to result and the figures (PNG; --svg: SVG too)."""
    from analysis.sections import goal_sections, probe_sections, pruning_sections, time_sections, tuning_sections

    path = Path(output)
    if path.suffix.lower() not in (".md", ".html", ".htm"):
        raise EdpsError(f"report output must end in .md or .html, got {output!r}")
    model = CostModel(bandwidth * GIGABYTE, latency * MICROSECOND, device_counts)
    formats = ("png", "svg") if svg else ("png",)
    studies, source = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    fits = _fits(studies, tracking_uri, trials_csv, bootstrap, seed, tolerance)  # input checked before any write
    directory = path.parent / f"{path.stem}_figures"
    figures = _figures(studies, directory, tolerance, fits, formats, (bootstrap, seed))
    against, goal_tables = goal_sections(studies, fits, directory, formats)
    pruning, pruning_tables = pruning_sections(studies, fits, tolerance, directory, formats)
    times, time_tables = time_sections(studies, model, directory, formats)
    tuned, tuning_tables = tuning_sections(studies, tolerance, bootstrap, seed, directory, formats)
    probes, probe_tables = probe_sections(experiments, tracking_uri, fits, directory, formats) \
        if not csv_path else ([], {})
    write_report(path, steps_grids(studies, bootstrap, seed), fits, source, tolerance, figures,
                 against + pruning + tuned + times + probes)
    click.echo(f"report written to {path}")
    if log_to_mlflow:
        files = [path] + [p for paths in figures.values() for p in paths] + [
            p for _, _, paths in against + pruning + tuned + times + probes for p in paths]
        _publish(tracking_uri, experiments, studies,
                 {"fit": fits, "studies": studies, "points": point_table(studies, bootstrap, seed),
                  "sparsity_comparison": sparsity_comparison(studies, bootstrap, seed),
                  **goal_tables, **pruning_tables, **tuning_tables, **time_tables, **probe_tables}, files,
                 {"tolerance": tolerance, "bootstrap": bootstrap, "seed": seed,
                  "devices": ",".join(map(str, device_counts)), "bandwidth_gb_s": bandwidth, "latency_us": latency})


@cli.command("compare-pruning")
@_SOURCE
@_FIT
@click.option("--out-dir", default="figures", show_default=True, type=click.Path(), help="Where figures go.")
@_format("table", "csv", "json")
def compare_pruning(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, tolerance, bootstrap, seed,
                    trials_csv, out_dir, output_format) -> None:
    """Per sparsity, each pruning method against the dense network: its steps relative to dense at every batch
    size, S_min and B_crit with intervals, whether its normalised curve has the dense one's shape, its steps
    over its shuffle's; a figure per (workload, optimizer, sparsity)."""
    from analysis.sections import compare_pruning as compared

    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    studies = with_curve_axes(studies)
    if not (studies["sparsity"] == 0.0).any() or not (studies["sparsity"] > 0).any():
        raise EdpsError("compare-pruning needs the dense curve (sparsity 0) and at least one pruned curve; "
                        "measure both, e.g. edps sweep --sparsities 0,0.9 --pruning snip,random")
    fits = _fits(studies, tracking_uri, trials_csv, bootstrap, seed, tolerance)
    _, summary, paths = compared(studies, fits, tolerance, Path(out_dir))
    footnote = intervals_footnote(summary)
    human = summary_for_people(summary).to_string(index=False, line_width=TERMINAL_WIDTH) + (
        f"\n{footnote}" if footnote else "")
    ratios = sparsity_comparison(studies, bootstrap, seed)
    ratios = ratios[ratios["sparsity"] > 0].assign(cell=lambda t: [with_interval(row, "relative_to_dense")
                                                                   for _, row in t.iterrows()])
    columns = ["pruning", *(["parameterization"] if ratios["parameterization"].nunique() > 1 else [])]
    human += ("\n\nsteps relative to dense, per batch size (95% intervals where both points have 3 replicates or "
              "more):\n" + ratios.pivot_table(index=["optimizer", "sparsity", "batch_size"], columns=columns,
                                             values="cell", aggfunc="first").fillna("-").to_string(
                                                 line_width=TERMINAL_WIDTH))
    human += "\n\nfigures:\n" + "\n".join(str(p) for p in paths if p.suffix == ".png")
    _emit(summary, output_format, human)


@cli.command()
@_SOURCE
@_FIT
@click.option("--out-dir", default="figures", show_default=True, type=click.Path(), help="Where figures go.")
@_format("table", "csv", "json")
def goals(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, tolerance, bootstrap, seed, trials_csv,
          out_dir, output_format) -> None:
    """Against the goal: S_min, B_crit, E_min = S_min B_crit and the threshold critical batch size (measured and
    fitted) with their intervals, per family of curves measured at two or more goals (a goal ladder, or studies
    of several goals); a figure per (workload, optimizer)."""
    from analysis.report import goal_summary
    from analysis.sections import against_goal

    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    if with_curve_axes(studies).get("goal", pd.Series(dtype=float)).dropna().nunique() < 2:
        raise EdpsError("the studies have fewer than two goals: measure a goal ladder (edps study or edps sweep "
                        "with --goals, e.g. --goals 0.2,0.1,0.05), or give a CSV with a goal column")
    table, paths = against_goal(studies, _fits(studies, tracking_uri, trials_csv, bootstrap, seed, tolerance),
                                Path(out_dir))
    if table.empty:
        raise EdpsError("no family of curves (workload, optimizer, sparsity, pruning method, protocol) has "
                        "two or more goals")
    _emit(table, output_format, terminal_tables(goal_summary(table)))
    for path in paths:
        click.echo(str(path), err=True)


@cli.command("time")
@_SOURCE
@_COST
@_format("table", "markdown", "csv", "json",
         help="table/markdown: the fastest batch size per device count, then every row; csv/json: every row.")
@click.option("--out-dir", default="figures", show_default=True, type=click.Path(),
              help="Where the figures (hours against batch size, one line per device count) go.")
def time_to_result(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, device_counts, bandwidth,
                   latency, output_format, out_dir) -> None:
    """Time to result in hours per batch size on the measured device, projected over N devices (data
    parallelism with a ring all-reduce), and the fastest batch size for each N (docs/time-to-result.md)."""
    from analysis.sections import time_results

    model = CostModel(bandwidth * GIGABYTE, latency * MICROSECOND, device_counts)
    studies, source = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    table, _, summary, rows, paths = time_results(studies, model, Path(out_dir))
    render = markdown_table if output_format == "markdown" else lambda frame: frame.to_string(index=False)
    _emit(table, output_format, f"Time to result from {source}; one device: as measured; more: {model.describe()}"
          f"\n\nFastest batch size per number of devices:\n{render(summary)}\n\nEvery batch size:\n{render(rows)}")
    for path in paths:
        click.echo(str(path), err=True)


@cli.command()
@_SOURCE
@_TOLERANCE
@_RESAMPLES
@_format("table", "csv", "json")
@click.option("--out-dir", default=None, type=click.Path(), help="Also draw the best learning rate against "
                                                                     "batch size here (PNG and SVG).")
def tuning(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, tolerance, bootstrap, seed,
           output_format, out_dir) -> None:
    """What the tuning found: per curve the best learning rate (and each other tuned metaparameter) against batch
    size, its log-log slope in perfect scaling with a 95% interval over replicates, and per batch size each sparse
    curve's best learning rate relative to the dense one's under each parameterization (csv/json: a row per
    point, its curve's slopes and its ratio to dense)."""
    from analysis.tuning import sparsity_ratios, slope_table, tuning_input, tuning_points, tuning_text

    studies, source = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    studies = tuning_input(studies)
    points = tuning_points(studies)
    slopes = slope_table(studies, points, tolerance, bootstrap, seed)
    ratios = sparsity_ratios(studies, points, bootstrap, seed)
    table = points.merge(slopes.drop(columns=["points"]), how="left").merge(
        ratios.drop(columns=["best_learning_rate"]), how="left")
    _emit(table, output_format, tuning_text(source, points, slopes, ratios))
    if out_dir:
        from analysis.tuning_plot import tuning_figure

        for path in tuning_figure(points, slopes, Path(out_dir)):
            click.echo(str(path), err=True)


@cli.command()
@_SOURCE
@click.option("--output", default=None, type=click.Path(), callback=_output,
              help="CSV file (default: standard output).")
def export(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, output) -> None:
    """The study table as CSV (the columns that --csv reads back)."""
    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    text = write_csv(studies, output)
    click.echo(text if output is None else f"{len(studies)} studies written to {output}\n", nl=False)


def _numbers(frame: pd.DataFrame) -> str:
    return frame.to_string(index=False, float_format=lambda v: f"{v:.4g}")


@cli.command()
@_STORE
@_format("table", "csv", "json")
@click.option("--out-dir", default=None, type=click.Path(), help="Also draw the constant against sparsity here.")
def lipschitz(tracking_uri, experiments, output_format, out_dir) -> None:
    """The Lipschitz constant of the gradient along each study's best trial's run, per sparsity and batch
    size, as the paper measures it (studies run with --probes lipschitz)."""
    by_study = lipschitz_by_study(load_best_trial_probes(experiments, n.METRIC_PROBE_LIPSCHITZ, tracking_uri))
    summary = lipschitz_table(by_study)
    human = f"{_numbers(by_study)}\n\nper sparsity:\n{_numbers(summary)}\n" + "\n".join(lipschitz_verdict(summary))
    _emit(by_study, output_format, human)
    if out_dir:
        from analysis.plots import lipschitz_figure

        for path in lipschitz_figure(by_study, Path(out_dir)):
            click.echo(str(path), err=True)


@cli.command("noise-scale")
@_STORE
@_format("table", "csv", "json")
def noise_scale(tracking_uri, experiments, output_format) -> None:
    """The measured noise scale B_simple beside the fitted critical batch size B_crit, per sparsity."""
    latest = load_probe_values(experiments, n.METRIC_PROBE_NOISE_SCALE, tracking_uri)
    try:
        fits = fit_table(load_studies(experiments, tracking_uri), None, repeats=0)
    except EdpsError:
        fits = None
    summary = noise_scale_table(latest, fits)
    _emit(summary, output_format, _numbers(summary))


@cli.command()
@_SOURCE
@click.option("--trials-csv", default=None, type=click.Path(), help="Per-trial outcomes (needed with --csv).")
@click.option("--within", type=FiniteRange(min=0, max=1, min_open=True, max_open=True), default=0.1,
              show_default=True, help="B_crit has settled from the n where it stays within this fraction of its "
                                      "value at n = N.")
@click.option("--out-dir", default="figures", show_default=True, type=click.Path(), help="Where the figure goes.")
@_format("table", "csv", "json")
def budget(tracking_uri, experiments, csv_path, workload, optimizer, sparsities, trials_csv, within, out_dir,
           output_format) -> None:
    """Tuning-budget curves: per point and n = 1..N, P(reach) and the expected and median steps-to-result of a
    study of n of its N trials (bounds where trials were superseded), and B_crit against n."""
    from analysis.budget_plot import budget_figure

    if csv_path and not trials_csv:
        raise EdpsError("budget needs the trials of the --csv studies: give --trials-csv")
    studies, _ = _load(tracking_uri, experiments, csv_path, workload, optimizer, sparsities)
    if trials_csv:
        trials = read_csv(trials_csv, columns=TRIAL_COLUMNS)
        if not trials["study_key"].astype(str).isin(set(studies["study_key"].dropna().astype(str))).any():
            raise EdpsError(f"{trials_csv}: none of its study_key values matches a study of the study table")
    else:
        trials = load_trials(studies, tracking_uri)
    points = budget_points(studies, trials)
    fits = budget_fits(points, within)
    _emit(points.merge(fits, how="left"), output_format, budget_text(points, fits, within))
    for path in budget_figure(points, fits, within, Path(out_dir)):
        click.echo(str(path), err=True)


def _publish(tracking_uri, experiments, studies, tables, files, settings=None) -> None:
    from analysis.publish import log_analysis
    from edps_mlflow.store.client import resolve_tracking_uri, ui_link

    # The analysis run goes next to its studies: their experiment when they share one.
    used = list(studies["experiment"].dropna().unique())
    experiment = used[0] if len(used) == 1 else next(
        (e for e in experiments if not any(c in e for c in "*?[")), "edps/analysis")
    # The names asked for; with none, the experiments the studies were read from.
    settings = {**(settings or {}), "experiments": ",".join(experiments) or ",".join(sorted(map(str, used)))}
    # MLflow prints links when a run ends; standard output stays clean for csv/json consumers.
    with contextlib.redirect_stdout(sys.stderr):
        argv = (click.get_current_context().find_root().obj or {}).get("argv")  # for the run's Source
        run_id, experiment_id = log_analysis(tracking_uri, experiment, studies, tables, files, settings, argv)
    click.echo(f"analysis logged to MLflow run {run_id} in experiment {experiment!r}", err=True)
    click.echo(ui_link(resolve_tracking_uri(tracking_uri), experiment_id, run_id, charts=True), err=True)


def main(argv: list[str] | None = None) -> None:
    arguments = list(sys.argv[1:] if argv is None else argv)
    configure_process(program="edps-analyze")
    with store_errors_in_one_line("edps-analyze"):
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
            end_with(error, own_process=argv is None)


if __name__ == "__main__":
    main()
