"""`edps-analyze tuning` (issue 42 item 3): the best learning rate against batch size per curve, its log-log slope in
perfect scaling with an interval over replicates, and the sparse curves' best learning rate relative to the dense
one's under each parameterization; on synthetic study tables of known answers, and once on a real store."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from analysis.cli import main
from analysis.tuning import log_slope, ratio_lines, slope_table, sparsity_ratios, tuning_input, tuning_points, tuning_text
from analysis.tuning_plot import tuning_figure

from conftest import built_once
from test_analysis_goals import _build
from test_analysis_inputs import run, write

SIZES = (2, 4, 8, 16, 32, 64, 128)
KNEE = 32  # steps halve with every doubling up to here, then stay: perfect_scaling_end is 64


def _curve(sparsity: float = 0.0, lr_factor: float = 1.0, seeds: int = 1, jitter: float = 0.0, **extra) -> list[dict]:
    """A curve of perfect scaling up to KNEE, flat after it; its best learning rate proportional to B up to KNEE
    (slope 1), flat after it; each seed's learning rate off by a factor of up to ``jitter``."""
    rng = np.random.default_rng(int(sparsity * 10) + seeds)
    return [{"workload": "w", "optimizer": "sgd", "sparsity": sparsity, "pruning": "snip", "batch_size": b,
             "seed": seed, "steps_to_result": 4096.0 / min(b, KNEE),
             "best_learning_rate": lr_factor * 0.01 * min(b, KNEE) * np.exp(rng.uniform(-jitter, jitter)),
             **extra} for b in SIZES for seed in range(seeds)]


def _analysed(rows: list[dict], repeats: int = 100) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    table = tuning_input(pd.DataFrame(rows))
    points = tuning_points(table)
    return points, slope_table(table, points, repeats=repeats), sparsity_ratios(table, points, repeats)


def test_slope_one_is_recovered_in_perfect_scaling_and_ratio_one_where_sparse_equals_dense():
    points, slopes, ratios = _analysed(_curve(0.0) + _curve(0.5))
    assert "parameterization" not in pd.DataFrame(_curve()).columns and set(points["parameterization"]) == {"sp"}
    assert list(slopes["perfect_scaling_end"]) == [64.0, 64.0] and list(slopes["regime_points"]) == [5, 5]
    assert np.allclose(slopes["slope"], 1.0) and (slopes["slope_all"] < 0.9).all()  # the flat end pulls it down
    assert "no slope interval: the fewest replicates at a point is 1" in slopes["note"].iloc[0]
    assert np.allclose(ratios["relative_to_dense"], 1.0) and set(ratios["reference"]) == {"dense sp"}
    line = ratio_lines(ratios)[0]
    assert "span a factor 1" in line and "no interval where a point has fewer" in line


def test_replicates_give_a_slope_interval_and_a_point_is_their_geometric_mean():
    points, slopes, _ = _analysed(_curve(0.0, seeds=3, jitter=0.1), repeats=200)
    row = slopes.iloc[0]
    assert row["interval_basis"] == "replicates" and row["slope_low"] < row["slope"] < row["slope_high"]
    assert row["slope_low"] < 1.0 < row["slope_high"] and row["slope_high"] - row["slope_low"] < 0.3
    table = pd.DataFrame(_curve(0.0, seeds=3, jitter=0.1))
    first = table[table["batch_size"] == 2]["best_learning_rate"]
    assert np.isclose(points["best_learning_rate"].iloc[0], np.exp(np.log(first).mean()))
    assert points["best_learning_rate_min"].iloc[0] == first.min()


def test_a_replicate_that_did_not_reach_is_left_out_and_half_lose_the_point():
    rows = _curve(0.0, seeds=3)
    for row in rows:
        if row["batch_size"] == 2 and row["seed"] == 0:
            row.update(steps_to_result=np.nan, best_learning_rate=5.0)  # a best trial that did not reach
        if row["batch_size"] == 4 and row["seed"] < 2:
            row["steps_to_result"] = np.nan
    points, _, _ = _analysed(rows)
    assert np.isclose(points["best_learning_rate"].iloc[0], 0.02) and np.isnan(points["best_learning_rate"].iloc[1])


def test_parameterizations_are_curves_of_their_own_and_borrow_the_dense_sp_reference():
    rows = (_curve(0.0, parameterization="sp") + _curve(0.5, 0.5, parameterization="sp")
            + _curve(0.5, 1.0, parameterization="supar"))
    points, slopes, ratios = _analysed(rows)
    assert len(slopes) == 3 and set(slopes["parameterization"]) == {"sp", "supar"}
    by = ratios.groupby("parameterization")["relative_to_dense"]
    assert np.allclose(by.get_group("sp"), 0.5) and np.allclose(by.get_group("supar"), 1.0)
    lines = ratio_lines(ratios)
    assert lines[0].startswith("sp: ") and "span a factor 2" in lines[0]
    assert lines[1].startswith("supar: ") and "the dense reference is the sp curve" in lines[1]
    text = tuning_text("test", points, slopes, ratios)
    assert "sparsity 0.5 supar" in text and max(map(len, text.splitlines())) <= 100


def test_fewer_than_three_points_in_the_regime_give_no_slope_and_say_so():
    rows = [row for row in _curve(0.0) if row["batch_size"] in (16, 32, 64, 128)]
    _, slopes, _ = _analysed(rows)
    assert np.isnan(slopes["slope"].iloc[0]) and slopes["regime_points"].iloc[0] == 2
    assert "no slope: 2 point(s) lie in the perfect-scaling regime (batch sizes below 64)" in slopes["note"].iloc[0]


def test_the_command_prints_writes_csv_and_json_and_draws_the_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "studies.csv", pd.DataFrame(_curve(0.0, seeds=3, jitter=0.1)
                                                       + _curve(0.5, 2.0, seeds=3, jitter=0.1)).to_csv(index=False))
    assert run(["tuning", "--csv", path, "--out-dir", "figures"], capsys) == (0, "")
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == ["best_learning_rate.png",
                                                                       "best_learning_rate.svg"]
    main(["tuning", "--csv", path, "--bootstrap", "50"])
    text = capsys.readouterr().out
    assert "w / sgd: learning rate" in text and max(map(len, text.splitlines())) <= 100
    assert re.search(r"0\.5: 2\.\d+x \[1\.\d+, 2\.\d+\]", " ".join(text.split())), text  # mean ratio, interval
    main(["tuning", "--csv", path, "--format", "json", "--bootstrap", "0"])
    records = json.loads(capsys.readouterr().out)
    assert len(records) == 2 * len(SIZES) and {"slope", "relative_to_dense", "parameterization"} <= set(records[0])


def test_a_figure_of_two_parameterizations_has_a_panel_each(tmp_path):
    points, slopes, _ = _analysed(_curve(0.0, parameterization="sp") + _curve(0.5, parameterization="supar"))
    paths = tuning_figure(points, slopes, tmp_path, ("png",))
    assert [p.name for p in paths] == ["best_learning_rate.png"] and paths[0].stat().st_size > 10_000


@pytest.mark.parametrize("change,message", [
    (lambda t: t.drop(columns=["best_learning_rate"]), "the studies have no best learning rate"),
    (lambda t: t.assign(best_learning_rate=np.nan), "the studies have no best learning rate"),
    (lambda t: t[t["batch_size"] == 8], "every curve has one batch size only (8)"),
])
def test_refusals_are_one_line(change, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "studies.csv", change(pd.DataFrame(_curve(0.0))).to_csv(index=False))
    code, line = run(["tuning", "--csv", path], capsys)
    assert code == 2 and message in line


@pytest.mark.slow
def test_on_a_real_store(tmp_path_factory, capsys):
    uri = built_once(tmp_path_factory, "goal-ladder-store", _build)["uri"]
    assert run(["tuning", "--tracking-uri", uri, "--experiment", "edps/digits-simple-cnn"], capsys) == (0, "")
    main(["tuning", "--tracking-uri", uri, "--format", "json"])
    records = json.loads(capsys.readouterr().out)
    assert records and all(r["best_learning_rate"] is None or r["best_learning_rate"] > 0 for r in records)


def test_each_pruning_method_is_its_own_sparse_curve_against_one_dense_curve():
    rows = _curve(0.0) + _curve(0.5, 0.5) + [{**row, "pruning": "random"} for row in _curve(0.5, 2.0)]
    _, _, ratios = _analysed(rows, repeats=0)
    line = ratio_lines(ratios)[0]
    assert "0.5 random: 2x" in line and "0.5 snip: 0.5x" in line and "span a factor 4" in line


def test_a_flat_learning_rate_has_slope_zero_and_the_ratios_go_by_batch_size():
    """Equal best learning rates give a slope of exactly 0 (not a float residue printed as -2.95e-15), and the
    ratio grid lists batch sizes in order even where the curves cover different ones."""
    assert log_slope(np.array([8.0, 32.0, 128.0]), np.array([0.1, 0.1, 0.1])) == 0.0
    # A curve at some batch sizes (random-erk, listed first) beside one at all of them.
    some = [row for row in _curve(0.5, pruning="random-erk") if row["batch_size"] in (8, 32, 128)]
    points, slopes, ratios = _analysed(_curve(0.0) + some + _curve(0.5))
    grid = tuning_text("a table", points, slopes, ratios).split("relative to the dense curve's\n")[1]
    sizes = [int(line.split()[0]) for line in grid.splitlines()[2:] if line.split() and line.split()[0].isdigit()]
    assert sizes == sorted(sizes) and set(sizes) >= {8, 32, 128}
