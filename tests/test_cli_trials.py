"""`edps trials`: each trial's metaparameters in Sobol order, through the real entry point."""

import csv
import io

import pytest

from edps_mlflow.search import sobol_points

from conftest import run_edps


def test_csv_lists_the_cifar10_nesterov_trials(tmp_path):
    result = run_edps(["trials", "--workload", "cifar10-resnet8", "--optimizer", "nesterov", "--count", "8",
                       "--format", "csv"], cwd=tmp_path, EDPS_DATA_DIR=str(tmp_path / "no-data-here"))
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert list(rows[0]) == ["trial_index", "learning_rate", "momentum", "decay_steps", "end_learning_rate_factor"]
    assert [int(r["trial_index"]) for r in rows] == list(range(8))
    units = sobol_points(8, 4)
    for row, unit in zip(rows, units):
        assert float(row["learning_rate"]) == pytest.approx(10 ** (-4 + 4 * unit[0]), rel=1e-12)
        assert 1 - float(row["momentum"]) == pytest.approx(10 ** (-4 + 3 * unit[1]), rel=1e-9)
        assert row["decay_steps"] == str(int(30_000 + 30_000 * unit[2]))
        assert float(row["end_learning_rate_factor"]) == pytest.approx(10 ** (-4 + 3 * unit[3]), rel=1e-12)
    assert rows[1]["decay_steps"] == "52500"
    assert float(rows[1]["end_learning_rate_factor"]) == pytest.approx(0.000562, rel=1e-3)
    assert not (tmp_path / "no-data-here").exists()


def test_table_defaults_to_the_workloads_trial_count(tmp_path):
    from edps_mlflow.workloads import get_workload

    result = run_edps(["trials", "--workload", "digits-simple-cnn", "--optimizer", "sgd"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["trial", "learning_rate"]
    assert len(lines) == 1 + get_workload("digits-simple-cnn").default_trials
    assert lines[1].split() == ["0", "0.01"] and lines[2].split() == ["1", "0.1"] and lines[3].split() == ["2", "0.001"]


@pytest.mark.parametrize("arguments,message", [
    (["--workload", "imagenet", "--optimizer", "sgd"], "unknown workload 'imagenet'"),
    (["--workload", "digits-simple-cnn", "--optimizer", "lbfgs"], "unknown optimizer 'lbfgs'"),
    (["--workload", "digits-simple-cnn", "--optimizer", "sgd", "--count", "0"], "count must be an integer in [1, 100000]"),
    (["--workload", "digits-simple-cnn", "--optimizer", "sgd", "--count", "100001"], "got 100001"),
    (["--workload", "digits-simple-cnn", "--optimizer", "sgd", "--format", "json"], "Invalid value for '--format'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, arguments, message):
    result = run_edps(["trials", *arguments], cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edps: error: ") and message in lines[0], result.stderr
    assert result.stdout == ""
