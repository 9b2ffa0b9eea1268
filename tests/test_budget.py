"""Tuning-budget curves (edps-analyze budget): the order statistics of an n-trial subset against every subset
enumerated, superseded trials bounded both ways, replicates averaged, B_crit against n and where it settles, the
command on a CSV pair and on a store filled by a real sweep, and its refusals."""

from __future__ import annotations

import io
import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis.budget import (budget_fits, budget_points, minimum_distribution, settled_from, summarise,
                             trial_steps)
from analysis.cli import main
from analysis.fits import fit_hyperbola

from conftest import built_once
from test_analysis_goals import _build as build_ladder
from test_analysis_inputs import folder, run, write  # noqa: F401 (a fixture)

INF = math.inf


def brute_force(replicates: list[list[float]], n: int) -> dict[str, float]:
    """P(reach), the expectation and the lower median of the best of every n-subset of each replicate's steps,
    every subset of every replicate weighed alike (the replicates have as many trials)."""
    minima = sorted(min(subset) for steps in replicates for subset in itertools.combinations(steps, n))
    reach = sum(math.isfinite(m) for m in minima) / len(minima)
    return {"p_reach": reach, "expected_steps": float(np.mean(minima)) if all(map(math.isfinite, minima)) else
            math.nan, "median_steps": minima[math.ceil(len(minima) / 2) - 1] if reach > 0.5 else math.nan}


def assert_matches(found: dict[str, float], expected: dict[str, float]) -> None:
    for name, value in expected.items():
        assert found[name] == pytest.approx(value, nan_ok=True), name


def trials_table(rows: list[tuple[str, float | None, float]], key: str = "s") -> pd.DataFrame:
    return pd.DataFrame([{"study_key": key, "trial_index": i, "status": status, "steps_to_result": steps,
                          "steps_trained": trained} for i, (status, steps, trained) in enumerate(rows)])


@pytest.mark.parametrize("steps", [[300, 100, 200, 100, 500], [400, INF, 100, INF, 250, INF], [INF, INF, 50],
                                   [INF, INF, INF]])
def test_the_best_of_n_trials_is_every_subset_enumerated(steps):
    for n in range(1, len(steps) + 1):
        assert_matches(summarise([minimum_distribution(np.array(steps), n)]), brute_force([steps], n))


def test_unreached_and_diverged_trials_never_reach_and_superseded_ones_are_bounded():
    trials = trials_table([("reached", 400, 400), ("not_reached", None, 1000), ("diverged", None, 60),
                           ("superseded", None, 400), ("superseded", None, 250), ("superseded", None, 980),
                           ("reached", None, 300)])
    found = trial_steps(trials, check_interval=100, max_steps=1000)
    # early: the next check after it stopped (the last check is max_steps); a reaching trial without steps: never
    assert list(found["early"]) == [400, INF, INF, 500, 300, 1000, INF]
    assert list(found["never"]) == [400, INF, INF, INF, INF, INF, INF]
    assert list(trial_steps(trials)["early"][3:6]) == [401, 251, 981]  # no check interval known: steps_trained + 1
    rng = np.random.default_rng(0)
    for n in range(1, len(trials) + 1):
        bounds = {s: summarise([minimum_distribution(found[s], n)]) for s in ("early", "never")}
        for scenario, values in found.items():
            assert_matches(bounds[scenario], brute_force([list(values)], n))
        # any steps the superseded trials might have reached at lie between the two scenarios
        for _ in range(5):
            truth = np.where(np.isinf(found["never"]) & np.isfinite(found["early"]),
                             np.where(rng.random(len(trials)) < 0.5, found["early"] * rng.uniform(1, 3), INF),
                             found["never"])
            actual = summarise([minimum_distribution(truth, n)])
            assert bounds["never"]["p_reach"] <= actual["p_reach"] <= bounds["early"]["p_reach"]
            for name in ("expected_steps", "median_steps"):
                low, high = bounds["early"][name], bounds["never"][name]
                if math.isfinite(actual[name]):
                    assert low <= actual[name] and (math.isnan(high) or actual[name] <= high)
                else:
                    assert math.isnan(high)


def _study(key: str, batch_size: int, seed: int = 0, **more) -> dict:
    return {"workload": "w", "optimizer": "sgd", "sparsity": 0.0, "batch_size": batch_size, "seed": seed,
            "steps_to_result": 1.0, "study_key": key, "check_interval": 10, **more}


def test_replicates_are_averaged_as_distributions():
    studies = pd.DataFrame([_study("a", 32, 0), _study("b", 32, 1)])
    steps = {"a": [100, INF, 300, 50], "b": [INF, 200, INF, 400]}
    trials = pd.concat([trials_table([("reached", s, s) if math.isfinite(s) else ("not_reached", None, 500)
                                      for s in values], key) for key, values in steps.items()])
    points = budget_points(studies, trials)
    assert list(points["n"]) == [1, 2, 3, 4] and set(points["replicates"]) == {2} and set(points["trials"]) == {4}
    for _, row in points.iterrows():
        expected = brute_force(list(steps.values()), int(row["n"]))
        single = [brute_force([values], int(row["n"])) for values in steps.values()]
        assert row["p_reach_early"] == pytest.approx(np.mean([s["p_reach"] for s in single]))
        for name, value in expected.items():
            assert row[f"{name}_early"] == pytest.approx(value, nan_ok=True)
            assert row[f"{name}_never"] == pytest.approx(value, nan_ok=True)  # nothing superseded: exact


def test_settled_from_is_the_first_n_from_which_every_b_crit_stays_within():
    assert settled_from(np.array([100.0, 50, 95, 108, 100]), 0.1) == 3
    assert settled_from(np.array([100.0, 50, 95, 120, 100]), 0.1) == 5
    assert settled_from(np.array([99.0, 101, 100]), 0.1) == 1
    assert settled_from(np.array([np.nan, 100, 100]), 0.1) == 2
    assert math.isnan(settled_from(np.array([100.0, np.nan]), 0.1))


def synthetic_curves(s_min: float = 1000.0, b_crit: float = 256.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two curves on the hyperbola at their best trial, whose other trials are slower by factors that grow with the
    batch size on the pruned curve (a small budget then inflates its large batch sizes) and alike on the dense."""
    studies, trials = [], []
    for sparsity, spread in ((0.0, lambda b: 1.0), (0.5, lambda b: b / 32.0)):
        for batch_size in (32, 64, 128, 256, 512, 1024):
            key = f"{sparsity}-{batch_size}"
            best = s_min * (1 + b_crit / batch_size)
            studies.append(_study(key, batch_size, sparsity=sparsity))
            trials.append(trials_table([("reached", best * (1 + f * spread(batch_size)), 0) for f in
                                        (0.0, 0.2, 0.6, 1.0)] + [("not_reached", None, 5000)], key))
    return pd.DataFrame(studies), pd.concat(trials, ignore_index=True)


def test_b_crit_against_n_on_synthetic_curves():
    studies, trials = synthetic_curves()
    fits = budget_fits(budget_points(studies, trials), within=0.1)
    assert list(fits["n"].unique()) == [1, 2, 3, 4, 5] and set(fits["batch_sizes"]) == {6}
    dense, pruned = (fits[fits["sparsity"] == s].set_index("n") for s in (0.0, 0.5))
    # At every trial each study's best is on the hyperbola; the dense curve's slower trials scale every batch
    # size alike, so its B_crit is the same at every n where the median is defined.
    assert dense.loc[5, "b_crit_early"] == pytest.approx(256.0, rel=1e-6)
    assert pruned.loc[5, "b_crit_early"] == pytest.approx(256.0, rel=1e-6)
    # one trial reaches with probability 4/5: the median is defined from n = 1
    assert dense["b_crit_early"].to_numpy() == pytest.approx(256.0, rel=1e-6)
    assert dense["settled_early"].iloc[0] == 1 and dense["settled_never"].iloc[0] == 1
    # the pruned curve's small budgets inflate its large batch sizes most, so B_crit is off until the median
    # study of n trials holds the best one: from n = 3 (of 5, the best is among 3 with probability 6/10)
    assert pruned.loc[3:, "b_crit_early"].to_numpy() == pytest.approx(256.0, rel=1e-6)
    assert abs(pruned.loc[2, "b_crit_early"] / 256 - 1) > 0.1 and pruned["settled_early"].iloc[0] == 3
    median = budget_points(studies, trials).query("sparsity == 0.5 and n == 3")
    assert pruned.loc[3, "b_crit_early"] == pytest.approx(
        fit_hyperbola(median["batch_size"].to_numpy(), median["median_steps_early"].to_numpy()).b_crit)


def analyze(argv: list[str], capsys) -> str:
    """What a command that succeeds prints on standard output (a failure ends it with SystemExit)."""
    main(argv)
    return capsys.readouterr().out


def test_the_command_on_a_csv_pair(folder, capsys):
    studies, trials = synthetic_curves()
    trials.loc[trials.index[1], ["status", "steps_to_result", "steps_trained"]] = ["superseded", np.nan, 1100]
    steps = write(folder, "steps.csv", studies.to_csv(index=False))
    outcomes = write(folder, "trials.csv", trials.to_csv(index=False))
    rows = pd.DataFrame(json.loads(analyze(["budget", "--csv", steps, "--trials-csv", outcomes, "--format", "json",
                                            "--out-dir", str(folder / "figures"), "--sparsity", "0"], capsys)))
    assert set(rows["sparsity"]) == {0.0} and len(rows) == 6 * 5
    first = rows[rows["batch_size"] == 32].set_index("n")
    assert first.loc[1, "superseded"] == 1 and first.loc[1, "p_reach_early"] > first.loc[1, "p_reach_never"]
    assert {"b_crit_early", "b_crit_never", "settled_early", "settled_never"} <= set(rows.columns)
    assert (folder / "figures" / "budget.png").stat().st_size > 1000
    text = analyze(["budget", "--csv", steps, "--trials-csv", outcomes, "--within", "0.2"], capsys)
    assert "1 trials superseded: values early..never" in text and "B_crit within 0.2 of its value at n = 5" in text
    assert "sparsity 0.5" in text and (folder / "figures" / "budget.svg").exists()


@pytest.mark.parametrize("arguments, message", [
    ([], "give --trials-csv"),
    (["--trials-csv", "{other}"], "none of its study_key values matches"),
    (["--trials-csv", "{trials}", "--within", "0"], "--within"),
    (["--trials-csv", "{trials}", "--within", "1"], "--within"),
    (["--trials-csv", "{trials}", "--within", "nan"], "--within"),
    (["--trials-csv", "{short}"], "has 4 of its 5 trials in the trials table: a tuning budget needs them all")])
def test_refusals(folder, capsys, arguments, message):
    studies, trials = synthetic_curves()
    studies["trials_total"] = 5
    paths = {"trials": write(folder, "trials.csv", trials.to_csv(index=False)),
             "short": write(folder, "short.csv", trials.drop(index=trials.index[0]).to_csv(index=False)),
             "other": write(folder, "other.csv", trials.assign(study_key="elsewhere").to_csv(index=False))}
    steps = write(folder, "steps.csv", studies.to_csv(index=False))
    code, line = run(["budget", "--csv", steps, *[a.format(**paths) for a in arguments]], capsys)
    assert code == 2 and message in line
    assert not (folder / "figures").exists()


@pytest.mark.slow
def test_the_command_on_a_store_filled_by_real_studies(tmp_path_factory, tmp_path, capsys):
    """On the goal ladder's store (built once per session for the goal tests): real trials, superseded ones among
    them; with every trial, each point is its study's own result in both scenarios (a superseded trial stopped
    one check before the best reaching step, so even early it reaches no sooner)."""
    uri = built_once(tmp_path_factory, "goal-ladder-store", build_ladder)["uri"]
    table = pd.read_csv(io.StringIO(analyze(["budget", "--tracking-uri", uri, "--format", "csv",
                                             "--out-dir", str(tmp_path / "figures")], capsys)))
    assert set(table["batch_size"]) == {32, 64, 128} and set(table["goal"]) == {0.3, 0.2, 0.1}
    assert (table["replicates"] == 1).all() and set(table["n"]) == {1, 2, 3} and table["superseded"].any()
    studies = pd.read_csv(io.StringIO(analyze(["export", "--tracking-uri", uri], capsys)))
    every = table[table["n"] == 3].merge(studies, on=["goal", "batch_size"])
    assert len(every) == 9
    for scenario in ("early", "never"):
        assert every[f"median_steps_{scenario}"].to_numpy() == pytest.approx(
            every["steps_to_result"].to_numpy(), nan_ok=True)
    assert (table["p_reach_early"] >= table["p_reach_never"]).all()
    assert (tmp_path / "figures" / "budget.png").exists()


def test_a_curve_without_a_protocol_value_keeps_its_columns_apart():
    studies, trials = synthetic_curves()
    studies["goal"] = np.where(studies["sparsity"] == 0, 0.1, np.nan)  # the pruned curve's goal unknown
    studies["trials_total"] = 5
    points = budget_points(studies, trials)
    assert set(points["trials_total"]) == {5} and points.groupby("sparsity")["goal"].first().isna().tolist() == [
        False, True]


def test_a_b_crit_far_outside_the_batch_sizes_is_not_said_to_settle():
    # The digits goal ladder's easy rung (goal 0.2): median steps 40, 60, 40 at batch sizes 16, 32, 64 fit
    # B_crit 3e-21, which the budget printed at every n and said settled from n = 3; fit says "not determined".
    studies = pd.DataFrame([_study(f"k{b}", b) for b in (16, 32, 64)])
    trials = pd.concat([trials_table([("reached", s, s)], f"k{b}") for b, s in ((16, 40), (32, 60), (64, 40))])
    fits = budget_fits(budget_points(studies, trials), within=0.1)
    assert math.isnan(fits["b_crit_early"].iloc[-1]) and math.isnan(fits["settled_early"].iloc[0])
