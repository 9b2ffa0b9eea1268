"""Bad input: one clear line on stderr, a non-zero exit, no traceback, nothing in the tracking store."""

from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from edps_mlflow.cli import main

from conftest import fresh_store, run_edps

CASES = [
    (["--bs", "0"], "batch size must be a positive integer"),
    (["--bs", "-4"], "batch size must be a positive integer"),
    (["--bs", "5000"], "exceeds the 1618 training examples"),
    (["--sparsity", "1.0"], "sparsity must be in [0, 1)"),
    (["--sparsity", "-0.1"], "sparsity must be in [0, 1)"),
    (["--goal-error", "1.5"], "goal error must be in (0, 1)"),
    (["--goal-error", "0"], "goal error must be in (0, 1)"),
    (["--goal-error", "abc"], "'--goal-error': must be a number or 'default', got 'abc'"),
    (["--workload", "imagenet"], "unknown workload 'imagenet'; known workloads: cifar10-resnet8, digits-simple-cnn, fashion-mnist-simple-cnn, mnist-simple-cnn"),
    (["--optimizer", "lbfgs"], "unknown optimizer 'lbfgs'; known optimizers: sgd, momentum, nesterov, adam, adamw, lion"),
    (["--full-trials", "maybe"], "'maybe' is not a valid boolean"),
    (["--bs", "abc"], "'abc' is not a valid integer"),
    (["--trials", "0"], "trials must be a positive integer"),
    (["--max-steps", "10"], "max steps (10) must be at least the check interval (20)"),
    (["--device", "cuda:0"], "no CUDA device is available"),
    # Goal ladders: refused in one line whatever is wrong with them.
    (["--goals", ""], "an empty goal ladder"),
    (["--goals", " "], "an empty goal ladder"),
    (["--goals", "0.2,1.5"], "goal error must be in (0, 1), got 1.5"),
    (["--goals", "0.1,-1"], "goal error must be in (0, 1), got -1"),
    (["--goals", "0.05,0.1"], "goals must go from the easiest to the hardest"),
    (["--goals", "0.1,0.1"], "goal 0.1 is repeated in the ladder"),
    (["--goals", "0.1,0.05", "--goal-error", "0.07"], "is not the ladder's hardest goal (0.05): give --goals alone"),
    (["--goals", "2.5,1.5"], "(digits-simple-cnn sets a validation error rate, not a loss)"),
    (["--goals", "0.1,abc"], "'--goals'"),
    (["--goals", "0.1,nan"], "'--goals'"),
    # Replicates: seeds --seed .. --seed + R - 1, each a study of its own.
    (["--replicates", "0"], "'--replicates': 0 is not in the range x>=1"),
    (["--replicates", "-2"], "'--replicates': -2 is not in the range x>=1"),
    (["--seed", "4294967295", "--replicates", "2"], "--seed 4294967295 with --replicates 2 passes the largest seed"),
    (["--replicates", "2", "--sweep-run", "r", "--sweep-key", "k"], "--replicates is not an option of a sweep's study"),
]


def _runs_in_store(uri: str) -> int:
    client = MlflowClient(uri)
    experiments = client.search_experiments(view_type=ViewType.ALL)
    return sum(len(client.search_runs([e.experiment_id], run_view_type=ViewType.ALL)) for e in experiments)


@pytest.mark.parametrize("arguments,message", CASES)
def test_bad_input_is_refused_in_one_line(arguments, message, sqlite_uri, monkeypatch, capsys):
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")  # no re-exec: we run in this process
    if arguments[:1] == ["--device"]:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit) as exit_info:
        main(["study", *arguments])
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("edps: error: ") and message in lines[0], lines[0]
    db = Path(sqlite_uri.removeprefix("sqlite:///"))
    assert not db.exists() or _runs_in_store(sqlite_uri) == 0


SWEEP_CASES = [
    (["--batch-sizes", "3..64"], "power-of-two range"),
    (["--batch-sizes", "16,abc"], "'--batch-sizes': must be a list like 16,64,256"),
    (["--batch-sizes", "16,16"], "batch sizes repeat a value"),
    (["--batch-sizes", "4096"], "batch size 4096 exceeds the 1618 training examples"),
    (["--sparsities", "0,1.5"], "sparsity must be in [0, 1), got 1.5"),
    (["--optimizers", "sgd,lbfgs"], "unknown optimizer 'lbfgs'"),
    (["--executor", "spark"], "'spark' is not one of 'local', 'ray'"),
    (["--workers", "0"], "'--workers': 0 is not in the range x>=1"),
    (["--replicates", "0"], "'--replicates': 0 is not in the range x>=1"),
    (["--seed", "4294967290", "--replicates", "7"], "--seed 4294967290 with --replicates 7 passes the largest seed"),
]


@pytest.mark.parametrize("arguments,message", SWEEP_CASES)
def test_bad_sweep_input_is_refused_in_one_line(arguments, message, sqlite_uri, monkeypatch, capsys):
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "--batch-sizes", "16", *arguments] if arguments[0] != "--batch-sizes" else ["sweep", *arguments])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edps: error: ") and message in lines[0], lines
    db = Path(sqlite_uri.removeprefix("sqlite:///"))
    assert not db.exists() or _runs_in_store(sqlite_uri) == 0


def test_status_of_an_unknown_experiment(sqlite_uri, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["status", "--experiment", "nothing-here"])
    assert exit_info.value.code == 2
    # status reads; it does not create the store that the URI names
    assert "no tracking store at" in capsys.readouterr().err
    assert not Path(sqlite_uri.removeprefix("sqlite:///")).exists()
    fresh_store(Path(sqlite_uri.removeprefix("sqlite:///")))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["status", "--experiment", "nothing-here"])
    assert exit_info.value.code == 2
    assert "no experiment named 'nothing-here'" in capsys.readouterr().err


def test_missing_data_directory_is_refused_by_the_real_command(tmp_path):
    """The console entry point in a real process (it re-executes itself with the allocator settings)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    missing = tmp_path / "no-mnist-here"
    result = run_edps(["study", "--workload", "mnist-simple-cnn", "--data-dir", str(missing), "--bs", "128"],
                      cwd=tmp_path, MLFLOW_TRACKING_URI=uri)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0] and "train-images-idx3-ubyte" in lines[0]
    assert not (tmp_path / "mlflow.db").exists() or _runs_in_store(uri) == 0


def test_help_and_workloads(capsys):
    main(["workloads"])
    out = capsys.readouterr().out
    assert "digits-simple-cnn" in out and "mnist-simple-cnn" in out


def test_status_shows_the_only_experiment_with_studies_or_each_of_several_under_its_name(sqlite_store, capsys):
    client = MlflowClient(sqlite_store)
    tags = {"edps.kind": "study", "edps.workload": "digits-simple-cnn", "edps.optimizer": "sgd",
            "edps.sparsity": "0.0", "edps.batch_size": "64", "edps.study_key": "k"}
    first = client.create_experiment("first")
    client.create_experiment("no-studies")
    client.set_terminated(client.create_run(first, tags=tags).info.run_id)
    main(["status"])
    alone = capsys.readouterr().out
    assert alone.startswith("digits-simple-cnn / sgd: steps-to-result")  # one experiment: no title above it
    # README's steps: the first `mlflow run` study lands in Default, the sweep in its own experiment
    second = client.create_run(client.create_experiment("second"), tags={**tags, "edps.batch_size": "128"})
    client.set_terminated(second.info.run_id)
    main(["status"])
    out = capsys.readouterr().out
    assert "no-studies" not in out
    first_part, second_part = out.split("\n\nexperiment 'second'\n")
    assert first_part == "experiment 'first'\n" + alone.rstrip("\n")
    assert second_part.startswith("digits-simple-cnn / sgd: steps-to-result")
    assert "\n128 " in second_part and "\n64 " not in second_part and "\n64 " in first_part
    main(["status", "--experiment", "second"])  # --experiment still narrows to one
    assert capsys.readouterr().out == second_part


def test_status_tells_a_running_study_from_an_abandoned_one(sqlite_store, capsys, monkeypatch):
    import time

    client = MlflowClient(sqlite_store)
    experiment = client.create_experiment("leases")
    base = {"edps.kind": "study", "edps.workload": "digits-simple-cnn", "edps.optimizer": "sgd",
            "edps.sparsity": "0.0"}
    client.create_run(experiment, tags={**base, "edps.batch_size": "64", "edps.study_key": "a",
                                        "edps.heartbeat": str(time.time())})
    client.create_run(experiment, tags={**base, "edps.batch_size": "128", "edps.study_key": "b",
                                        "edps.heartbeat": str(time.time() - 3600)})
    main(["status", "--experiment", "leases"])
    out = capsys.readouterr().out
    row = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert "(running)" in row["64"] and "(stopped, rerun to resume)" in row["128"]
