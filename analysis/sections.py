"""The report's sections after the curves, each a title, a table and its figures (against the goal, pruning
methods against the dense network, time to result, the probes), with the tables they add to an analysis run."""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path

import pandas as pd

from analysis.load import load_best_trial_probes, load_probe_values
from analysis.plots import goals_figure, lipschitz_figure, noise_scale_figure, pruning_figure, time_figures
from analysis.probes import lipschitz_by_study, lipschitz_table, lipschitz_verdict, noise_scale_table
from analysis.pruning_methods import (comparison_keys, intervals_footnote, pruning_comparison, pruning_summary,
                                      summary_for_people)
from analysis.regimes import goal_table, with_curve_axes
from analysis.report import Section, goal_summary, time_summary
from analysis.timing import CostModel, fastest_table, time_table
from edps_mlflow import names as n
from edps_mlflow.errors import EdpsError

Tables = dict[str, pd.DataFrame]


def compare_pruning(table: pd.DataFrame, fits: pd.DataFrame, tolerance: float, directory: Path,
                    formats: tuple[str, ...] = ("png", "svg")) -> tuple[pd.DataFrame, pd.DataFrame, list[Path]]:
    """Each pruning method against the dense network: per batch size, per curve, and the figures."""
    comparison = pruning_comparison(table)
    paths = [p for w, o, s in comparison_keys(table) for p in pruning_figure(comparison, w, o, s, directory, formats)]
    return comparison, pruning_summary(table, fits, tolerance), paths


def against_goal(studies: pd.DataFrame, fits: pd.DataFrame, directory: Path,
                 formats: tuple[str, ...] = ("png", "svg")) -> tuple[pd.DataFrame, list[Path]]:
    """The goal table and its figures, one per (workload, optimizer) with a family of two or more goals."""
    goals = goal_table(fits, studies)
    pairs = goals[["workload", "optimizer"]].drop_duplicates().itertuples(index=False)
    return goals, [path for w, o in pairs for path in goals_figure(goals, w, o, directory, formats)]


def goal_sections(studies: pd.DataFrame, fits: pd.DataFrame, directory: Path,
                  formats: tuple[str, ...]) -> tuple[list[Section], Tables]:
    """S_min, B_crit, E_min and the threshold critical batch size against the goal; none without two goals."""
    goals, paths = against_goal(studies, fits, directory, formats)
    if goals.empty:
        return [], {}
    title = ("Against the goal: S_min, B_crit, E_min = S_min B_crit (McCandlish et al.'s minimum examples) and "
             "the threshold critical batch size, easiest goal first (95% bootstrap intervals)")
    return [(title, goal_summary(goals), paths)], {"goals": goals}


def pruning_sections(studies: pd.DataFrame, fits: pd.DataFrame, tolerance: float, directory: Path,
                     formats: tuple[str, ...]) -> tuple[list[Section], Tables]:
    """The comparison of pruning methods; none when every pruned curve is SNIP's."""
    table = with_curve_axes(studies)
    if set(table.loc[table["sparsity"] > 0, "pruning"]) <= {"snip"}:
        return [], {}
    comparison, summary, paths = compare_pruning(table, fits, tolerance, directory, formats)
    title = (f"Pruning methods at each sparsity, against the dense network (shape: the normalised curves agree "
             f"within {tolerance:.0%} at every batch size both measured)")
    footnote = intervals_footnote(summary)
    if footnote:
        title += f" ({footnote})"
    return [(title, summary_for_people(summary), paths)], {"pruning_summary": summary, "pruning_comparison": comparison}


def time_results(studies: pd.DataFrame, model: CostModel, directory: Path, formats: tuple[str, ...] = ("png", "svg")
                 ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame, list[Path]]:
    """The time table, the fastest batch sizes, both for people, and the time figures."""
    table = time_table(studies, model)
    fastest = fastest_table(table)
    return (table, fastest, *time_summary(table, fastest),
            time_figures(table, directory, model.describe(), formats))


def time_sections(studies: pd.DataFrame, model: CostModel, directory: Path,
                  formats: tuple[str, ...]) -> tuple[list[Section], Tables]:
    """The fastest batch sizes with the time figures, then every row; or why there is no time."""
    title = "Time to result"
    try:
        table, fastest, summary, rows, paths = time_results(studies, model, directory, formats)
    except EdpsError as error:
        return [(title, pd.DataFrame({"not available": [str(error)]}), [])], {}
    return ([(f"{title}: the fastest batch size per number of devices (one device: measured; more: "
              f"{model.describe()})", summary, paths), (f"{title}: every batch size", rows, [])],
            {"time_to_result": table, "fastest_batch_size": fastest})


def probe_sections(experiments: tuple[str, ...], tracking_uri: str | None, fits: pd.DataFrame, directory: Path,
                   formats: tuple[str, ...]) -> tuple[list[Section], Tables]:
    """The probes' summaries, when the studies logged probes."""
    sections: list[Section] = []
    tables: Tables = {}
    with suppress(EdpsError):
        by_study = lipschitz_by_study(load_best_trial_probes(experiments, n.METRIC_PROBE_LIPSCHITZ, tracking_uri))
        summary = lipschitz_table(by_study)
        tables.update(lipschitz=by_study, lipschitz_per_sparsity=summary,
                      lipschitz_verdict=pd.DataFrame({"finding": lipschitz_verdict(summary)}))
        sections += [("Lipschitz constant of the gradient along the best trial's run, per sparsity and batch size",
                      by_study, lipschitz_figure(by_study, directory, formats)),
                     ("Lipschitz constant per sparsity (over batch sizes)", summary, []),
                     ("Does the constant rise with sparsity?", tables["lipschitz_verdict"], [])]
    with suppress(EdpsError):
        latest = load_probe_values(experiments, n.METRIC_PROBE_NOISE_SCALE, tracking_uri)
        tables["noise_scale"] = noise_scale_table(latest, fits)
        sections.append(("Gradient noise scale B_simple beside the fitted B_crit", tables["noise_scale"],
                         noise_scale_figure(tables["noise_scale"], directory, formats)))
    return sections, tables


def tuning_sections(studies: pd.DataFrame, tolerance: float, repeats: int, seed: int, directory: Path,
                    formats: tuple[str, ...]) -> tuple[list[Section], Tables]:
    """The best learning rate against batch size: its slope in perfect scaling and the figure, and how it moves
    with sparsity; none where the studies have no best learning rates or no curve of two batch sizes."""
    from analysis.tuning import ratio_lines, slope_summary, slope_table, sparsity_ratios, tuning_input, tuning_points
    from analysis.tuning_plot import tuning_figure

    try:
        table = tuning_input(studies)
    except EdpsError:
        return [], {}
    points = tuning_points(table)
    slopes, ratios = slope_table(table, points, tolerance, repeats, seed), sparsity_ratios(table, points, repeats, seed)
    title = ("What the tuning found: the log-log slope of the best learning rate against batch size in perfect "
             "scaling (about 1 expected for SGD, 0.5 for Adam; 95% bootstrap intervals over replicates)")
    sections: list[Section] = [(title, slope_summary(slopes), tuning_figure(points, slopes, directory, formats))]
    if len(ratios):
        sections.append(("The best learning rate of the sparse curves relative to the dense one's",
                         pd.DataFrame({"finding": ratio_lines(ratios)}), []))
    return sections, {"tuning_points": points, "tuning_slopes": slopes, "tuning_ratios": ratios}
