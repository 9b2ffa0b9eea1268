"""The analysis: fits on synthetic curves, checked-in CSV fixtures, figures, and the CLI against a
real `mlflow server` holding studies logged by the real training code."""

import base64
import json
import math
import re
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from analysis.cli import main
from analysis.bootstrap import bootstrap, study_outcomes
from analysis.csv_io import read_csv
from analysis.fits import InsufficientData, fit_hyperbola, fit_hyperbolas, local_slopes, regime_boundaries
from analysis.regimes import fit_table, sparsity_comparison

from conftest import fresh_store, run_edps

FIXTURES = Path(__file__).parent / "fixtures"
BATCH_SIZES = 2.0 ** np.arange(1, 15)


def _synthetic(s_min: float, b_crit: float, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return s_min * (1 + b_crit / BATCH_SIZES) * np.exp(rng.normal(0, noise, len(BATCH_SIZES)))


@pytest.mark.parametrize("s_min,b_crit", [(1000.0, 256.0), (300.0, 40.0), (5000.0, 2000.0)])
def test_hyperbola_is_recovered_within_a_few_percent(s_min, b_crit):
    for seed in range(5):
        fit = fit_hyperbola(BATCH_SIZES, _synthetic(s_min, b_crit, 0.05, seed))
        assert fit.s_min == pytest.approx(s_min, rel=0.08)
        assert fit.b_crit == pytest.approx(b_crit, rel=0.12)
        assert fit.r2_log > 0.99 and fit.rmse_log < 0.1


@pytest.mark.parametrize("b_crit", [64.0, 256.0, 1024.0])
def test_boundaries_within_one_power_of_two(b_crit):
    # Exact curve: perfect scaling ends where (B + b_crit) / (2 + b_crit) > 1.2, and the plateau starts where
    # 1 + b_crit / B <= 1.2 (1 + b_crit / B_max).
    true_end = 2 ** math.ceil(math.log2(0.2 * (2 + b_crit) + 1e-9))
    b_max = BATCH_SIZES[-1]
    true_start = 2 ** math.ceil(math.log2(b_crit / (1.2 * (1 + b_crit / b_max) - 1)))
    for seed in range(5):
        bounds = regime_boundaries(BATCH_SIZES, _synthetic(1000.0, b_crit, 0.03, seed), tolerance=0.2)
        assert abs(math.log2(bounds.perfect_scaling_end) - math.log2(true_end)) <= 1
        assert abs(math.log2(bounds.maximal_parallelism_start) - math.log2(true_start)) <= 1


def test_local_slopes_go_from_minus_one_to_zero():
    slopes = [s for _, _, s in local_slopes(BATCH_SIZES, 1000 * (1 + 256 / BATCH_SIZES))]
    assert slopes[0] == pytest.approx(-1, abs=0.05) and slopes[-1] == pytest.approx(0, abs=0.05)


def test_several_studies_of_one_batch_size_give_one_slope_from_their_median_and_no_warning():
    import warnings

    batch_sizes = np.array([2.0, 4.0, 4.0, 4.0, 8.0])
    steps = np.array([400.0, 210.0, 200.0, 190.0, 100.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the 0/0 of two equal batch sizes was a RuntimeWarning on the terminal
        slopes = local_slopes(batch_sizes, steps)
    assert [(low, high) for low, high, _ in slopes] == [(2, 4), (4, 8)]
    assert slopes[0][2] == pytest.approx(-1.0) and slopes[1][2] == pytest.approx(-1.0)


def test_an_interval_that_collapsed_onto_its_estimate_contains_it():
    """Every resample alike: the basic interval, computed in log space, ends within rounding of the estimate,
    and the fit must not say that it excludes it."""
    from analysis.regimes import contains_estimate, fit_warnings

    value = 3.543
    collapsed = math.exp(2 * math.log(value) - math.log(value))
    assert contains_estimate(collapsed, value, collapsed) and not contains_estimate(3.0, value, 3.5)
    row = {"b_crit": value, "b_crit_low": collapsed * (1 + 1e-15), "b_crit_high": collapsed * (1 + 1e-15),
           "s_min": 71.87, "s_min_low": 71.87, "s_min_high": 71.87}
    notes = fit_warnings(row, BATCH_SIZES, 1000 * (1 + 256 / BATCH_SIZES))
    assert not any("does not contain" in note for note in notes), notes


def _sum_of_squares(b: np.ndarray, s: np.ndarray, s_min: float, b_crit: float) -> float:
    with np.errstate(divide="ignore"):  # a B_crit that underflowed to 0: a flat curve
        return float(np.sum((np.log(s_min) + np.logaddexp(0.0, np.log(b_crit) - np.log(b)) - np.log(s)) ** 2))


def _minpack(b: np.ndarray, s: np.ndarray) -> tuple[float, float]:
    """The reference: the same least squares by scipy's least_squares (MINPACK's Levenberg-Marquardt), from the
    same start, with the exact Jacobian."""
    from scipy.optimize import least_squares

    order = np.argsort(b)
    b, s = b[order], s[order]
    log_b, log_s = np.log(b), np.log(s)
    start = np.array([log_s[-1], np.log(max(b[0], min(b[-1], s[0] * b[0] / s[-1])))])
    result = least_squares(lambda t: t[0] + np.logaddexp(0.0, t[1] - log_b) - log_s, start, method="lm",
                           jac=lambda t: np.column_stack([np.ones_like(log_b), 1.0 / (1.0 + np.exp(log_b - t[1]))]))
    return float(np.exp(result.x[0])), float(np.exp(result.x[1]))


def test_the_fit_finds_the_minimum_that_minpack_finds():
    """fit_hyperbolas (every resample of a bootstrap fitted together; fit_hyperbola is its one-row case) against
    scipy's least_squares row by row, on noisy curves with points missing: the same sum of squares; the same
    S_min and B_crit wherever B_crit lies near the measured batch sizes, and both far beyond them where it does
    not."""
    rng = np.random.default_rng(7)
    b = BATCH_SIZES[:10]
    near = far = 0
    for _ in range(12):
        s_min, b_crit, noise = 10 ** rng.uniform(1, 4), 2 ** rng.uniform(-2, 14), rng.uniform(0.0, 0.6)
        steps = s_min * (1 + b_crit / b) * np.exp(np.abs(rng.normal(0, noise, (40, len(b)))))
        steps[rng.random(steps.shape) < 0.2] = np.inf  # a resample in which no trial of that study reached
        steps[0, 3:] = np.nan  # three points: too few for this row
        batched_s_min, batched_b_crit = fit_hyperbolas(b, steps)
        for row, batched in enumerate(zip(batched_s_min, batched_b_crit)):
            kept = np.isfinite(steps[row])
            if kept.sum() < 3:
                assert np.isnan(batched).all()
                continue
            one = _minpack(b[kept], steps[row][kept])
            assert _sum_of_squares(b[kept], steps[row][kept], *batched) == pytest.approx(
                _sum_of_squares(b[kept], steps[row][kept], *one), rel=1e-8, abs=1e-12)
            if b[0] / 100 < one[1] < b[-1] * 100:
                near += 1
                assert batched == pytest.approx(one, rel=0.01)
                assert fit_hyperbola(b[kept], steps[row][kept]).b_crit == pytest.approx(batched[1], rel=1e-6)
            else:
                far += 1
                assert not b[0] / 100 < batched[1] < b[-1] * 100
    assert near > 300 and far > 10, (near, far)
    # Curves with no finite minimum: flat (B_crit towards 0), straight (towards infinity, S_min towards 0), and
    # one that rises. Each stops short of 0 and infinity, whose logarithms the basic interval takes, with a
    # sum of squares as low as least_squares finds.
    degenerate = np.array([[100.0] * 10, 1e5 / b, [100, 90, 80, 85, 100, 120, 130, 150, 170, 200]])
    for row, batched in zip(degenerate, zip(*fit_hyperbolas(b, degenerate))):
        assert all(0 < value < np.inf for value in batched), batched
        assert _sum_of_squares(b, row, *batched) <= _sum_of_squares(b, row, *_minpack(b, row)) + 1e-9


@pytest.mark.parametrize("shape", ["straight", "flat"])
def test_a_curve_without_a_finite_minimum_gets_an_interval_that_holds_its_estimate(shape):
    """A curve that keeps scaling perfectly (S proportional to 1/B: B_crit beyond any measured batch size) or
    never does (flat), every trial reaching: B_crit is not determined, the estimate and its resamples stop
    alike, and the note says that the interval is practically unbounded, not that it misses the estimate."""
    rng = np.random.default_rng(1)
    studies, trials = [], []
    for b in BATCH_SIZES[:8]:
        steps = (1e5 / b if shape == "straight" else 100.0) * np.exp(np.abs(rng.normal(0, 0.05, 8)))
        studies.append({"workload": "w", "optimizer": "sgd", "sparsity": 0.0, "batch_size": int(b),
                        "steps_to_result": float(steps.min()), "study_key": str(int(b))})
        trials += [{"study_key": str(int(b)), "trial_index": i, "status": "reached", "steps_to_result": float(v)}
                   for i, v in enumerate(steps)]
    row = fit_table(pd.DataFrame(studies), pd.DataFrame(trials), repeats=100).iloc[0]
    assert "does not contain" not in row["note"], row["note"]
    assert "far outside" in row["note"], row["note"]


def test_a_studys_resampled_best_trial_is_drawn_from_the_distribution_of_drawing_every_trial():
    """The bootstrap draws the rank of a resample's best trial (bootstrap._resampled_minima) instead of drawing
    all its trials: each outcome as often as drawing every trial with replacement gives it."""
    from analysis.bootstrap import _resampled_minima

    rng = np.random.default_rng(3)
    repeats = 100_000
    for trials, reaching in ((100, 50), (100, 3), (5, 2), (1, 1), (4, 0), (20, 20), (6, 4)):
        steps = rng.uniform(100, 1000, trials)
        if trials == 6:
            steps[:2] = np.nan  # reached without its steps (a damaged record): counted as not reaching
        reached = np.zeros(trials, dtype=bool)
        reached[rng.choice(trials, reaching, replace=False)] = True
        pick = rng.integers(0, trials, (repeats, trials))
        every_trial = np.where(reached[pick] & np.isfinite(steps[pick]), steps[pick], np.inf).min(axis=1)
        ranked = _resampled_minima(steps[reached], trials, repeats, rng)
        assert set(np.unique(ranked)) <= set(steps[reached & np.isfinite(steps)]) | {np.inf}
        for value in np.unique(np.concatenate([every_trial, ranked]))[:5]:  # the likely outcomes
            assert np.mean(ranked == value) == pytest.approx(np.mean(every_trial == value), abs=0.01), (trials, value)


def test_the_bootstrap_resamples_every_study_of_a_curve_even_two_of_one_batch_size():
    """Two studies of each batch size in one curve (a sweep repeated with another seed, or tables merged from two
    stores): the fit uses both, and so does its bootstrap."""
    rng = np.random.default_rng(5)
    studies, trials = [], []
    for copy in range(2):
        for b in BATCH_SIZES[:8]:
            key = f"{int(b)}-{copy}"
            steps = 1000 * (1 + 256 / b) * np.exp(np.abs(rng.normal(0, 0.2, 8)))
            studies.append({"workload": "w", "optimizer": "sgd", "sparsity": 0.0, "batch_size": int(b),
                            "steps_to_result": float(steps.min()), "study_key": key})
            trials += [{"study_key": key, "trial_index": i, "status": "reached", "steps_to_result": float(v)}
                       for i, v in enumerate(steps)]
    trials[3]["status"], trials[5]["status"], trials[6]["status"] = "superseded", "not_reached", "superseded"
    trials = pd.DataFrame(trials + [{"study_key": None, "trial_index": 0, "status": "reached", "steps_to_result": 1.0}])
    # Every study's outcomes read in one pass over the table, as one study's own table gives them (a trial of no
    # study left out).
    from analysis.bootstrap import outcomes_by_study

    together = outcomes_by_study(trials)
    for key, own in trials.groupby("study_key"):
        alone = study_outcomes(own)
        assert (together[key].trials, together[key].superseded) == (alone.trials, alone.superseded)
        assert together[key].reached_steps.tolist() == alone.reached_steps.tolist()
    assert together["2-0"].superseded == 2 and len(together["2-0"].reached_steps) == 5
    # A point per batch size (its two studies by the point rule); a study with superseded trials is no sample
    # of itself under resampling, so the curve gets no interval and the note says why ...
    fits = fit_table(pd.DataFrame(studies), trials, repeats=50)
    assert len(fits) == 1 and fits["points"].iloc[0] == 8 and fits["interval_basis"].iloc[0] == ""
    assert "s_min_low" not in fits.columns and "1 of 16 studies had trials superseded" in fits["note"].iloc[0]
    # ... and with every trial trained to its end, every study of the curve is resampled.
    trials["status"] = trials["status"].replace("superseded", "not_reached")
    fits = fit_table(pd.DataFrame(studies), trials, repeats=50)
    assert fits["interval_studies"].iloc[0] == 16 and fits["interval_basis"].iloc[0] == "complete trials"
    assert fits["s_min_low"].iloc[0] <= fits["s_min"].iloc[0] <= fits["s_min_high"].iloc[0]


def test_too_few_points_is_said_clearly():
    with pytest.raises(InsufficientData, match="2 batch sizes with a result; a fit needs at least 3"):
        fit_hyperbola(np.array([2, 4, 8]), np.array([100, 50, np.nan]))
    table = pd.DataFrame({"workload": "w", "optimizer": "sgd", "sparsity": 0.0, "batch_size": [2, 4],
                          "steps_to_result": [100.0, 50.0], "study_key": ["a", "b"]})
    assert fit_table(table, repeats=0)["note"].iloc[0].startswith("no fit: 2 batch sizes")


def test_bootstrap_intervals_cover_the_truth_in_most_repetitions():
    s_min, b_crit, covered = 1000.0, 256.0, {"s_min": 0, "b_crit": 0}
    repetitions = 12
    for repetition in range(repetitions):
        rng = np.random.default_rng(100 + repetition)
        trials, minima = {}, []
        for b in BATCH_SIZES:
            steps = s_min * (1 + b_crit / b) * np.exp(np.abs(rng.normal(0, 0.3, 16)))
            trials[int(b)] = pd.DataFrame({"status": "reached", "steps_to_result": steps})
            minima.append(steps.min())
        estimate = fit_hyperbola(BATCH_SIZES, np.array(minima))
        intervals = bootstrap([(b, study_outcomes(t)) for b, t in trials.items()], repeats=150, seed=repetition,
                              estimate=estimate)
        covered["s_min"] += intervals["s_min"].low <= s_min <= intervals["s_min"].high
        covered["b_crit"] += intervals["b_crit"].low <= b_crit <= intervals["b_crit"].high
    assert covered["s_min"] >= 0.6 * repetitions and covered["b_crit"] >= 0.6 * repetitions, covered


def test_checked_in_fixture_fit_and_sparsity_comparison():
    table = read_csv(FIXTURES / "synthetic_steps.csv")
    trials = read_csv(FIXTURES / "synthetic_trials.csv", columns=("study_key", "trial_index", "status",
                                                                     "steps_to_result", "steps_trained"))
    fits = fit_table(table, trials, repeats=100).set_index("sparsity")
    truth = {0.0: (900.0, 300.0), 0.5: (1300.0, 300.0), 0.9: (2600.0, 400.0)}
    for sparsity, (s_min, b_crit) in truth.items():
        assert fits.loc[sparsity, "s_min"] == pytest.approx(s_min, rel=0.08)
        assert fits.loc[sparsity, "b_crit"] == pytest.approx(b_crit, rel=0.15)
        assert fits.loc[sparsity, "s_min_low"] <= fits.loc[sparsity, "s_min"] <= fits.loc[sparsity, "s_min_high"]
    comparison = sparsity_comparison(table)
    dense = comparison[comparison["sparsity"] == 0.0]
    assert np.allclose(dense["relative_to_dense"], 1.0)
    sparse = comparison[comparison["sparsity"] == 0.9]
    assert (sparse["relative_to_dense"] > 1.5).all()  # sparse networks need more steps at every batch size
    assert sparse.sort_values("batch_size")["normalised_by_first"].iloc[0] == 1.0


def test_sparsity_comparison_of_a_curve_that_reached_nothing():
    """A newcomer's first tiny studies may reach nothing: the comparison says NaN, it does not crash."""
    table = read_csv(FIXTURES / "synthetic_steps.csv")
    sparse = table["sparsity"] == 0.9
    table["steps_to_result"] = table["steps_to_result"].astype(object)
    table.loc[sparse, "steps_to_result"] = None
    comparison = sparsity_comparison(table)
    rows = comparison[comparison["sparsity"] == 0.9]
    assert len(rows) == sparse.sum() and rows["relative_to_dense"].isna().all()
    assert rows["normalised_by_first"].isna().all()
    dense = comparison[comparison["sparsity"] == 0.0]
    assert np.allclose(dense["relative_to_dense"], 1.0)


@pytest.mark.parametrize("fixture,message", [
    ("bad_types.csv", "column batch_size must be numeric; row 4 has 'sixteen'"),
    ("missing_column.csv", "lacks the column(s) steps_to_result"),
    ("nonexistent.csv", "no such CSV file"),
])
def test_bad_csv_is_refused_in_one_line(fixture, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--csv", str(FIXTURES / fixture)])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_unreachable_server_and_unknown_experiment(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["table", "--tracking-uri", "http://127.0.0.1:9", "--experiment", "x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err  # MLflow's retries give up, or the store's first-answer bound ends them first
    assert "cannot reach the tracking store http://127.0.0.1:9" in err or \
        "tracking store http://127.0.0.1:9 did not answer within" in err, err
    uri = fresh_store(tmp_path / "empty.db")
    MlflowClient(uri).create_experiment("empty")
    for name, message in (("nope", "no experiment matches 'nope'"), ("empty", "hold no finished study runs")):
        with pytest.raises(SystemExit):
            main(["table", "--tracking-uri", uri, "--experiment", name])
        assert message in capsys.readouterr().err


def _valid_png(path: Path) -> bool:
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return False
    width, height = struct.unpack(">II", data[16:24])
    return width > 300 and height > 200


def test_report_and_figures_from_fixtures(tmp_path, capsys):
    main(["report", "--csv", str(FIXTURES / "synthetic_steps.csv"), "--trials-csv",
          str(FIXTURES / "synthetic_trials.csv"), "--bootstrap", "50", "--output", str(tmp_path / "report.html")])
    figures = sorted((tmp_path / "report_figures").iterdir())
    assert {p.suffix for p in figures} == {".png"}  # what the report shows; SVGs with --svg
    for path in figures:
        assert _valid_png(path)
    page = (tmp_path / "report.html").read_text()
    assert "S_min" in page
    # Self-contained: every image is inline data that decodes to the PNG written beside it, and no
    # element points at a relative file.
    sources = re.findall(r"<img[^>]*\ssrc='([^']*)'", page)
    assert sources and all(src.startswith("data:image/png;base64,") for src in sources)
    assert not re.search(r"\s(src|href)='(?!data:)", page)
    steps_png = (tmp_path / "report_figures" / "steps_synthetic_momentum.png").read_bytes()
    assert any(base64.b64decode(src.split(",", 1)[1]) == steps_png for src in sources)
    main(["report", "--csv", str(FIXTURES / "synthetic_steps.csv"), "--bootstrap", "0",
          "--output", str(tmp_path / "report.md")])
    assert "| batch size |" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_cli_against_a_server_with_real_studies(mlflow_server, tmp_path, capsys):
    experiment = "analysis-test"
    result = run_edps(["sweep", "--batch-sizes", "8,32,128", "--sparsities", "0,0.5", "--trials", "3",
                       "--goal-error", "0.06", "--max-steps", "1500", "--experiment", experiment],
                      cwd=tmp_path, MLFLOW_TRACKING_URI=mlflow_server)
    assert result.returncode == 0, result.stderr[-3000:]
    main(["table", "--tracking-uri", mlflow_server, "--experiment", experiment, "--format", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 6 and {r["batch_size"] for r in rows} == {8, 32, 128}
    main(["fit", "--tracking-uri", mlflow_server, "--experiment", "analysis-*", "--bootstrap", "50",
          "--format", "csv", "--log-to-mlflow"])
    out = capsys.readouterr().out
    fits = pd.read_csv(__import__("io").StringIO(out))
    assert set(fits["sparsity"]) == {0.0, 0.5} and fits["s_min"].notna().all()
    # the trials came from the study runs' trials.csv: intervals where they are complete, else the note says why
    for _, row in fits.iterrows():
        assert (row["interval_basis"] == "complete trials" and pd.notna(row.get("s_min_low"))) or (
            pd.isna(row["interval_basis"]) and "no intervals: " in row["note"])
    main(["report", "--tracking-uri", mlflow_server, "--experiment", experiment, "--bootstrap", "20",
          "--output", str(tmp_path / "report.md"), "--log-to-mlflow"])
    client = MlflowClient(mlflow_server)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    analyses = client.search_runs([experiment_id], "tags.`edps.kind` = 'analysis'")
    assert len(analyses) == 2
    latest = max(analyses, key=lambda r: r.info.start_time)
    assert latest.data.tags["edps.analysis.study_count"] == "6"
    artifacts = {a.path for a in client.list_artifacts(latest.info.run_id)}
    assert {"report.md", "fit.csv", "figures", "used_study_runs.txt"} <= artifacts
    figures = {a.path for a in client.list_artifacts(latest.info.run_id, "figures")}
    assert "figures/steps_digits-simple-cnn_sgd.png" in figures
    # The analysis run summarises: its settings, a metric per fitted quantity, a description, a name
    # saying what it analysed, and it sits under the sweep that measured the studies.
    assert latest.data.params["tolerance"] == "0.2" and latest.data.params["bootstrap"] == "20"
    assert latest.data.params["experiments"] == experiment
    for sparsity in ("0", "0.5"):
        for quantity in ("s_min", "b_crit", "r2_log"):
            assert f"fit/sgd/sp{sparsity}/{quantity}" in latest.data.metrics
    fitted = fits.set_index("sparsity")
    assert latest.data.metrics["fit/sgd/sp0.5/s_min"] == pytest.approx(fitted.loc[0.5, "s_min"])
    assert "S_min" in latest.data.tags["mlflow.note.content"]
    assert latest.data.tags["mlflow.runName"] == "analysis digits-simple-cnn sgd 6 studies"
    sweep = client.search_runs([experiment_id], "tags.`edps.kind` = 'sweep'")[0]
    assert latest.data.tags["mlflow.parentRunId"] == sweep.info.run_id
    assert f"#/experiments/{experiment_id}/runs/{latest.info.run_id}" in capsys.readouterr().err
    # Who ran what: the command as typed (the server's URI has no credentials to redact), the user, the code.
    assert latest.data.tags["mlflow.source.name"].startswith(f"edps-analyze report --tracking-uri {mlflow_server} ")
    assert latest.data.tags["mlflow.user"] and latest.data.tags["mlflow.source.git.commit"]
    # No experiment named: every experiment with study runs, this one among them.
    main(["table", "--tracking-uri", mlflow_server, "--format", "json"])
    assert experiment in {r["experiment"] for r in json.loads(capsys.readouterr().out)}


@pytest.mark.slow
def test_probe_commands_on_studies_with_probes(tmp_path, capsys):
    uri = fresh_store(tmp_path / "mlflow.db")
    result = run_edps(["sweep", "--batch-sizes", "32,64,128", "--sparsities", "0,0.9", "--trials", "2",
                       "--goal-error", "0.2", "--max-steps", "300", "--probes", "lipschitz,noise_scale",
                       "--probe-interval", "100", "--check-interval", "100", "--experiment", "probes"],
                      cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    assert result.returncode == 0, result.stderr[-3000:]
    main(["lipschitz", "--tracking-uri", uri, "--experiment", "probes", "--format", "json",
          "--out-dir", str(tmp_path / "figures")])
    rows = json.loads(capsys.readouterr().out)
    # One row per study whose best trial reached the goal after a probe step: the constant along that run.
    assert {r["sparsity"] for r in rows} == {0.0, 0.9} and {r["batch_size"] for r in rows} <= {32, 64, 128}
    assert all(0 < r["lipschitz_median"] <= r["lipschitz_max"] and r["trials_used"] == 1 for r in rows)
    assert _valid_png(tmp_path / "figures" / "lipschitz.png")
    main(["noise-scale", "--tracking-uri", uri, "--experiment", "probes"])
    out = capsys.readouterr().out
    assert "b_simple_median" in out and "b_crit" in out and len(out.strip().splitlines()) == 3
    client = MlflowClient(uri)
    studies = client.search_runs([client.get_experiment_by_name("probes").experiment_id],
                                 "tags.`edps.kind` = 'study'")
    probed = [s for s in studies if "edps.best_probe_run" in s.data.tags]
    assert probed and all(s.data.metrics["probe/seconds"] > 0 for s in probed)
    # The analysis run carries the probe tables and the noise-scale figure too.
    main(["report", "--tracking-uri", uri, "--experiment", "probes", "--bootstrap", "0",
          "--output", str(tmp_path / "report.html"), "--log-to-mlflow"])
    analysis = client.search_runs([client.get_experiment_by_name("probes").experiment_id],
                                  "tags.`edps.kind` = 'analysis'")[0]
    artifacts = {a.path for a in client.list_artifacts(analysis.info.run_id)}
    assert {"noise_scale.csv", "lipschitz.csv"} <= artifacts
    figures = {a.path for a in client.list_artifacts(analysis.info.run_id, "figures")}
    assert {"figures/noise_scale.png", "figures/lipschitz.png"} <= figures


def test_an_interval_that_reaches_zero_is_named_so_not_printed_at_1e_minus_22():
    """Seen on the SμPar digits store: a resample flat from the smallest batch size fits B_crit 3.86e-22."""
    from analysis.regimes import _interval_warnings

    notes = _interval_warnings({"b_crit": 5.49, "b_crit_low": 3.86e-22, "b_crit_high": 19.6})
    assert notes == ["the b_crit interval reaches 0 (0 .. 19.6): these points cannot tell it from 0"]
    assert _interval_warnings({"b_crit": 5.49, "b_crit_low": 0.01, "b_crit_high": 19.6}) == [
        "the b_crit interval is practically unbounded (0.01 .. 19.6)"]
