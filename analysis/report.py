"""Text renderings of the analysis tables, and the one-file report (Markdown or HTML)."""

from __future__ import annotations

import base64
import html
import math
import textwrap
from pathlib import Path

import pandas as pd

from analysis.bootstrap import interval_basis_warning
from analysis.intervals import HOW_TO_GET_ONE, NO_FIT_INTERVALS, some_points_words
from analysis.regimes import CURVE_KEYS, PROTOCOL_KEYS, family_columns, point_table
from analysis.timing import TIME_COLUMNS, duration_words
from edps_mlflow import descriptions
from edps_mlflow.parameterization import Parameterization


# The width the text tables wrap their columns to, their notes and certainty lines too.
TERMINAL_WIDTH = 100


def _number(value: object, digits: int = 3) -> str:
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    # Whole numbers as integers (steps, batch sizes), and from 100 on rounded to one (1236, never 1.24e+03),
    # but not the 24 digits of a practically unbounded end.
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and 1 <= abs(value) < 1e7):
        return str(int(value))
    if isinstance(value, float) and 100 <= abs(value) < 1e7 and digits <= 4:
        return str(round(value))
    return f"{value:.{digits}g}"


SP = Parameterization.SP.value  # the paper's, which curve names leave unsaid


def curve_words(sparsity: float, pruning: str, several_methods: bool, parameterization: str = SP) -> str:
    """``sparsity 0.9``, or ``sparsity 0.9 random`` beside other methods (the dense curve names none), then
    ``supar`` for a curve under SμPar (sp's, the paper's, names none)."""
    return f"sparsity {sparsity:g}" + (f" {pruning}" if several_methods and sparsity > 0 else "") + \
        (f" {parameterization}" if parameterization not in (SP, None) and pd.notna(parameterization) else "")


def several_methods(table: pd.DataFrame) -> bool:
    """Whether ``table``'s pruned curves come from more than one pruning method."""
    return "pruning" in table.columns and table.loc[table["sparsity"] > 0, "pruning"].nunique() > 1


def any_supar(table: pd.DataFrame) -> bool:
    """Whether ``table`` holds a curve under SμPar (its tables then name each curve's parameterisation)."""
    return "parameterization" in table.columns and bool((table["parameterization"].fillna(SP) != SP).any())


def steps_grids(table: pd.DataFrame, repeats: int = 0, seed: int = 0) -> dict[tuple[str, str], pd.DataFrame]:
    """Per (workload, optimizer): each point's steps-to-result (the point rule over its replicates; with its 95%
    interval where ``repeats`` > 0 and it has enough replicates), batch size down, sparsity (and method) across;
    a column per goal too, easiest first, where the studies differ in goal (a ladder is a row per rung)."""
    points = point_table(table, repeats, seed).sort_values("steps_to_result", na_position="last")
    points["cell"] = [with_interval(row, "steps_to_result") for _, row in points.iterrows()]
    grids = {}
    for (workload, optimizer), group in points.groupby(["workload", "optimizer"], sort=True):
        goals = ["goal"] if "goal" in group.columns and group["goal"].nunique() > 1 else []
        # the fewest steps of the curves (protocols) that share a cell, as the sort put them first
        grid = group.pivot_table(index="batch_size", columns=goals + ["sparsity", "pruning", "parameterization"],
                                 values="cell", aggfunc="first", dropna=False).dropna(axis=1, how="all")
        grid = grid.reindex(sorted(group["batch_size"].unique()))
        if goals:  # easiest first: the largest goal, for an error as for a loss
            grid = grid[sorted(grid.columns, key=lambda c: (-c[0], *c[1:]))]
        several = several_methods(group)
        grid.columns = [(f"goal {c[0]:g} " if goals else "") + curve_words(*c[-3:-1], several, c[-1])
                        for c in grid.columns]
        grid.index.name = "batch size"
        grids[(workload, optimizer)] = grid.fillna("-")
    return grids


# Under a grid with brackets: why a bracket may lie below its value.
BRACKETS_NOTE = ("Brackets: 95% intervals over the point's replicates, each result placed within its check interval "
                 "(s - c + 1 .. s); the value is the recorded step, the top of that range, so a bracket may lie below "
                 "its value.")


def grid_note(grid: pd.DataFrame) -> str:
    """BRACKETS_NOTE where ``grid`` shows an interval, else nothing."""
    return BRACKETS_NOTE if grid.astype(str).apply(lambda column: column.str.contains(r"\[")).any().any() else ""


def _present(value: object) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def with_interval(row: pd.Series, name: str) -> str:
    """``value [low, high]``; the value alone where there is no interval or its ends read alike (never
    ``[x, x]``: more digits first, then none)."""
    value = _number(row.get(name))
    low, high = row.get(f"{name}_low"), row.get(f"{name}_high")
    if not (_present(low) and _present(high)):
        return value
    # A resample's fit can put an end a billionth of the value from zero (B_crit 1.5e-21): that is zero.
    scale = abs(float(row.get(name))) if _present(row.get(name)) else 0.0
    low, high = (0.0 if abs(float(end)) < 1e-9 * scale else end for end in (low, high))
    for digits in (3, 5, 8):
        ends = _number(low, digits), _number(high, digits)
        if ends[0] != ends[1]:
            return f"{value} [{ends[0]}, {ends[1]}]"
    return value


def threshold_words(row: pd.Series | dict) -> str:
    """The measured threshold critical batch size, with Merrill et al.'s bracket (the largest passing and the
    smallest failing batch size) and its interval: ``16 (16..32) [8, 32]``; ``>1024`` when none failed; where
    the check interval leaves it undecided, ``undecided at check interval 25: between 16 and 32``."""
    value, failing = row.get("b_crit_threshold"), row.get("perfect_scaling_end")
    if value is None or pd.isna(value):
        return "-"
    if row.get("b_crit_threshold_decided") is False or row.get("b_crit_threshold_decided") == 0:
        return (f"undecided at check interval {_number(row.get('check_interval'))}: between "
                f"{_number(row.get('b_crit_threshold_censored_low'))} and "
                f"{_number(row.get('b_crit_threshold_censored_high'))}")
    value = _number(value)
    bracket = f"{value}..{_number(failing)}" if failing is not None and pd.notna(failing) else f">{value}"
    return with_interval(row, "b_crit_threshold").replace(value, f"{value} ({bracket})", 1)


def end_words(row: pd.Series | dict) -> str:
    """perfect_scaling_end with its interval, or, where the check interval leaves the first failing batch size
    undecided, ``undecided at check interval 25: 32 or 64`` (``beyond 128``: none fails at the optimistic end)."""
    low, high = row.get("perfect_scaling_end_censored_low"), row.get("perfect_scaling_end_censored_high")
    decided = row.get("b_crit_threshold_decided")
    if decided is None or pd.isna(decided) or bool(decided) or not _present(low) or low == high:
        return with_interval(row, "perfect_scaling_end")
    later = _number(high) if _present(high) else "beyond the largest batch size"
    return f"undecided at check interval {_number(row.get('check_interval'))}: {_number(low)} or {later}"


def hyperbola_applies(row: pd.Series | dict) -> bool:
    """False where the fit's note says the hyperbola does not describe the curve or leaves B_crit undetermined:
    its B_crit (and what is computed from it) is then no answer, shown ``n/a`` with the note saying why."""
    note = str(row.get("note", "") or "")
    return not any(flag in note for flag in ("steps rise", "far outside"))


def _fitted(row: pd.Series | dict, name: str) -> str:
    return with_interval(row, name) if hyperbola_applies(row) else "n/a"


def fit_summary(fits: pd.DataFrame) -> pd.DataFrame:
    """The fit table for people: values with their 95% intervals in brackets; ``n/a`` for a B_crit the
    hyperbola does not give (:func:`hyperbola_applies`)."""
    rows = []
    several, supar = several_methods(fits), any_supar(fits)
    goals = "goal" in fits.columns and fits["goal"].notna().any()
    for _, row in fits.iterrows():
        rows.append({
            "workload": row["workload"], "optimizer": row["optimizer"], "sparsity": f"{row['sparsity']:g}",
            **({"pruning": row["pruning"] if row["sparsity"] > 0 else "-"} if several else {}),
            **({"parameterization": row["parameterization"]} if supar else {}),
            **({"goal": _number(row["goal"])} if goals else {}),
            "points": row["points"], "S_min": with_interval(row, "s_min"), "B_crit": _fitted(row, "b_crit"),
            "E_min (examples)": _fitted(row, "e_min"),
            "R^2 (log)": f"{row['r2_log']:.3f}" if pd.notna(row.get("r2_log")) else "-",
            "perfect_scaling_end": end_words(row),
            "maximal_parallelism_start": with_interval(row, "maximal_parallelism_start"),
            "B_crit threshold (passes..fails)": threshold_words(row),
            "B_crit threshold, fit": _fitted(row, "b_crit_threshold_fit"),
            "note": row.get("note", "") or "",
        })
    return pd.DataFrame(rows)


def goal_summary(goals: pd.DataFrame) -> pd.DataFrame:
    """The goal table for people: values with their 95% intervals in brackets (E_min's from the same resamples
    as S_min's and B_crit's: each resample's own S_min B_crit)."""
    several, supar = several_methods(goals), any_supar(goals)
    family = [c for c in family_columns(goals)[len(CURVE_KEYS):] if goals[c].nunique(dropna=False) > 1]
    rows = [{"workload": row["workload"], "optimizer": row["optimizer"], "sparsity": f"{row['sparsity']:g}",
             **({"pruning": row["pruning"] if row["sparsity"] > 0 else "-"} if several else {}),
             **({"parameterization": row["parameterization"]} if supar else {}),
             **{column: _number(row[column]) for column in family},
             "goal": f"{row['goal']:g}" + (f" ({row['goal_metric']})" if pd.notna(row["goal_metric"]) else ""),
             "points": row["points"], "S_min": with_interval(row, "s_min"), "B_crit": _fitted(row, "b_crit"),
             "E_min (examples)": _fitted(row, "e_min"),
             "B_crit threshold (passes..fails)": threshold_words(row),
             "B_crit threshold, fit": _fitted(row, "b_crit_threshold_fit"), "note": row.get("note") or ""}
            for _, row in goals.iterrows()]
    return pd.DataFrame(rows)


def time_summary(table: pd.DataFrame, fastest: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The time-to-result tables for people (the fastest batch sizes, every row), each time in a readable unit."""
    keys = [c for c in table.columns if c not in TIME_COLUMNS]
    head = [c for c in keys if c in ("workload", "optimizer", "sparsity")] + \
        [c for c in keys if c not in ("workload", "optimizer", "sparsity") and table[c].nunique(dropna=False) > 1]

    def curve(frame: pd.DataFrame) -> dict[str, pd.Series]:
        return {c: frame[c].map(lambda v: f"{v:g}" if isinstance(v, float) else str(v)) for c in head}

    summary = pd.DataFrame({
        **curve(fastest), "devices": fastest["devices"], "fastest batch size": fastest["batch_size"].map(_number),
        "per-device batch": fastest["per_device_batch"].map(_number),
        "time to result": fastest["hours"].map(duration_words),
        "speed-up over 1 device": fastest["speedup_over_one_device"].map(_number), "note": fastest["note"]})
    rows = pd.DataFrame({
        **curve(table), "batch size": table["batch_size"], "devices": table["devices"],
        "per-device batch": table["per_device_batch"], "steps": table["steps_to_result"].map(_number),
        "compute s/step": table["compute_seconds_per_step"].map(_number),
        "all-reduce s/step": table["allreduce_seconds_per_step"].map(_number),
        "time to result": table["hours"].map(duration_words), "note": table["note"]})
    return summary, rows


def _curve_name(row: pd.Series, varying: list[str], several: bool) -> str:
    return " ".join([str(row["workload"]), str(row["optimizer"]),
                     curve_words(row["sparsity"], row.get("pruning", ""), several, row.get("parameterization", SP))]
                    + [f"{column} {_number(row[column])}" for column in varying])


def _intervals_words(row: pd.Series) -> str:
    basis = row.get("interval_basis")
    lost = f"; {NO_FIT_INTERVALS}" if NO_FIT_INTERVALS in str(row.get("note") or "") else ""
    if basis == "replicates":
        return f"intervals over replicates, {int(row['interval_replicates'])} or more at every fitted point{lost}"
    if basis == "replicates at some points":
        return some_points_words(row.get("note")) + lost
    if basis == "complete trials":
        text = (f"intervals over the complete trials of {int(row['interval_studies'])} studies (fewer than 3 "
                f"replicates at some point)")
        warning = interval_basis_warning(row)
        return text + (f"; {warning}" if warning else "") + lost
    note = str(row.get("note") or "")
    if "no intervals: " in note:  # the reason, to the end of what would give them
        start = note.index("no intervals: ")
        return note[start:note.index(HOW_TO_GET_ONE, start) + len(HOW_TO_GET_ONE)]
    return "no fit, so no intervals" if pd.isna(row.get("s_min")) else "no intervals: none asked for (--bootstrap 0)"


def _threshold_certainty(row: pd.Series) -> str:
    decided = row.get("b_crit_threshold_decided")
    if pd.isna(row.get("b_crit_threshold")):
        return ""
    if decided is None or pd.isna(decided):
        return "the check interval is unknown, so the threshold's censoring is not carried"
    if bool(decided):
        return f"the threshold critical batch size is decided at check interval {_number(row['check_interval'])}"
    return next(part for part in str(row.get("note") or "").split("; ") if "undecided at check interval" in part)


def certainty_lines(fits: pd.DataFrame) -> list[str]:
    """Per curve: what its intervals rest on (replicates and how many, complete trials, or none and why) and
    whether its threshold critical batch size is decided at its check interval."""
    if not len(fits):
        return []
    several = several_methods(fits)
    varying = [c for c in fits.columns if c in PROTOCOL_KEYS and fits[c].nunique(dropna=False) > 1]
    return [f"{_curve_name(row, varying, several)}: "
            + "; ".join(part for part in (_intervals_words(row), _threshold_certainty(row)) if part) + "."
            for _, row in fits.iterrows()]


def numbered_notes(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``frame`` with its note column as the numbers of its notes, and the notes: each part of a note (parts
    are joined by '; ') once, numbered in order of appearance."""
    numbers: dict[str, int] = {}
    references = []
    for note in frame["note"]:
        parts: list[str] = []
        for part in str(note or "").split("; "):
            if parts and part == HOW_TO_GET_ONE:  # the remedy stays with the reason it answers
                parts[-1] += "; " + part
            elif part not in ("", "-"):
                parts.append(part)
        references.append(", ".join(map(str, sorted(numbers.setdefault(part, len(numbers) + 1) for part in parts)))
                          or "-")
    return frame.drop(columns=["note"]).assign(notes=references), list(numbers)


def wrapped(text: str, first: str = "", rest: str = "", width: int = TERMINAL_WIDTH) -> str:
    """``text`` wrapped to ``width`` columns after the prefix ``first`` (``rest`` on the lines after)."""
    return textwrap.fill(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)


def terminal_tables(summary: pd.DataFrame, width: int = TERMINAL_WIDTH) -> str:
    """A fit or goal table for people, for a terminal: a table per workload and optimizer under their names, rows
    named by the curve's columns (those before points), the columns wrapped to ``width`` (the names repeated),
    the notes numbered below it."""
    by, blocks = ["workload", "optimizer"], []
    curve = [c for c in summary.columns[:list(summary.columns).index("points")] if c not in by]
    for key, group in summary.groupby(by, sort=False):
        table, notes = numbered_notes(group.drop(columns=by).set_index(curve))
        text = table.drop(columns=[] if notes else ["notes"]).to_string(line_width=width)
        lines = [" / ".join(map(str, key)), *(line.rstrip() for line in text.splitlines())]
        lines += ["notes:"] * bool(notes) + [wrapped(note, f"{i:>3}. ", "     ", width)
                                             for i, note in enumerate(notes, 1)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def markdown_table(frame: pd.DataFrame, index: bool = False) -> str:
    frame = frame.reset_index() if index else frame
    return descriptions.markdown_table(frame.columns, frame.astype(str).itertuples(index=False))


def html_table(frame: pd.DataFrame) -> str:
    """``frame``'s cells, already formatted as in Markdown, as an HTML table."""
    # A long name may break after its underscores (maximal_parallelism_start), a short one stays whole.
    head = "".join(f"<th>{html.escape(str(column)).replace('_', '_<wbr>')}</th>" for column in frame.columns)
    # Values with their intervals stay on one line; sentences wrap (the style sheet's class words).
    body = "\n".join("<tr>" + "".join(f"<td{' class=words' if len(str(cell)) > 24 else ''}>"
                                       f"{html.escape(str(cell))}</td>" for cell in row) + "</tr>"
                     for row in frame.itertuples(index=False, name=None))
    return f"<table border='1' class='dataframe'>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>"


def _images(report: Path, title: str, files: list[Path], width: str) -> list[str]:
    """The PNG ``files`` as the report shows them: Markdown links relative to it, or HTML images inline (the
    page renders alone, downloaded or in MLflow's artifact viewer, which resolves no relative links)."""
    pngs = [p for p in files if p.suffix == ".png"]
    if report.suffix.lower() in (".html", ".htm"):
        return [f"<img alt='{html.escape(title)}' src='data:image/png;base64,"
                f"{base64.b64encode(p.read_bytes()).decode('ascii')}' style='max-width:{width}'>" for p in pngs]
    return [f"![{title}]({p.relative_to(report.parent) if p.is_relative_to(report.parent) else p})" for p in pngs]


def _intro(source: str, tolerance: float) -> str:
    return (f"Steps-to-result against batch size, from {source}. Fits: S(B) = S_min (1 + B_crit / B) in log "
            f"space; boundaries with a {tolerance:.0%} tolerance: perfect_scaling_end is the first measured batch "
            f"size whose steps exceed ideal linear scaling from the smallest batch size by more than the "
            f"tolerance (perfect scaling holds below it); maximal_parallelism_start is the first batch size from "
            f"which steps stay within the tolerance of the largest batch size's. The critical batch size in "
            f"the threshold form (Zhang et al. 2025): the largest measured batch size whose steps stay within "
            f"the tolerance of ideal linear scaling, in parentheses the largest passing and smallest failing batch "
            f"size (Merrill et al. 2025), and the fitted hyperbola's value of it, (1 + tolerance) B_0 + tolerance "
            f"B_crit. Brackets: 95% bootstrap intervals over replicates or complete trials, as the first section "
            f"says per curve; an interval whose resamples all agree is left out, never shown with equal ends.")


Section = tuple[str, pd.DataFrame, list[Path]]  # a title, a table and its figures


def _html_with_notes(table: pd.DataFrame) -> str:
    """``table`` in HTML, its note column (if any) as numbers with the notes in a numbered list below it."""
    table, notes = numbered_notes(table) if "note" in table.columns else (table, [])
    items = "".join(f"<li>{html.escape(note)}</li>" for note in notes)
    return html_table(table) + (f"<p>Notes:</p><ol>{items}</ol>" if notes else "")


def _markdown_with_notes(table: pd.DataFrame) -> list[str]:
    """``table`` in Markdown, its note column (if any) as numbers with the notes numbered below it."""
    table, notes = numbered_notes(table) if "note" in table.columns else (table, [])
    return [markdown_table(table), "", *(["Notes:", "", *(f"{i}. {note}" for i, note in enumerate(notes, 1)), ""]
                                         if notes else [])]


def write_report(path: Path, grids: dict[tuple[str, str], pd.DataFrame], fits: pd.DataFrame, source: str,
                 tolerance: float, figures: dict[tuple[str, str], list[Path]], extra: list[Section] = ()) -> Path:
    """The one-file report (.md or .html): per (workload, optimizer) its figures, grid and fits; then ``extra``."""
    summary = fit_summary(fits)
    intro, certainty = _intro(source, tolerance), certainty_lines(fits)
    curves = [(f"{workload}, {optimizer}", figures.get((workload, optimizer), []), grid,
               summary[(summary["workload"] == workload) & (summary["optimizer"] == optimizer)])
              for (workload, optimizer), grid in grids.items()]
    if path.suffix.lower() in (".html", ".htm"):
        parts = ["<!doctype html><html><head><meta charset='utf-8'><title>edps-analyze report</title>",
                 "<style>body{font-family:sans-serif;max-width:70em;margin:auto}table{border-collapse:collapse}"
                 "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td{white-space:nowrap}"
                 "td.words{white-space:normal;min-width:10em}</style></head><body>",
                 "<h1>Steps-to-result report</h1>", f"<p>{html.escape(intro)}</p>"]
        if certainty:
            parts += ["<h2>How sure each answer is</h2><ul>",
                      *(f"<li>{html.escape(line)}</li>" for line in certainty), "</ul>"]
        for title, files, grid, fit in curves:
            note = grid_note(grid)
            parts += [f"<h2>{html.escape(title)}</h2>", *_images(path, title, files, "100%"),
                      "<h3>Steps to result</h3>" + grid.to_html() + (f"<p>{html.escape(note)}</p>" if note else ""),
                      "<h3>Fits</h3>" + _html_with_notes(fit.drop(columns=["workload", "optimizer"]))]
        for title, table, files in extra:
            parts += [f"<h2>{html.escape(title)}</h2>" + _html_with_notes(table.map(_number)),
                      *_images(path, title, files, "80%")]
        parts.append("</body></html>")
    else:
        parts = ["# Steps-to-result report", "", intro, ""] + (
            ["## How sure each answer is", "", *(f"- {line}" for line in certainty), ""] if certainty else [])
        for title, files, grid, fit in curves:
            parts += [f"## {title}", "", *_images(path, title, files, "100%"), "", "### Steps to result", "",
                      markdown_table(grid, index=True), "", *([grid_note(grid), ""] if grid_note(grid) else []),
                      "### Fits", "", *_markdown_with_notes(fit)]
        for title, table, files in extra:
            parts += [f"## {title}", "", *_markdown_with_notes(table.map(_number)), *_images(path, title, files, "80%"),
                      ""]
    path.write_text("\n".join(parts))
    return path
