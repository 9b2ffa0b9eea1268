"""Bad input is refused before torch or MLflow is imported (their imports alone take tens of seconds on
a loaded machine), and an unknown option a user would guess is answered with the option meant."""

from __future__ import annotations

import json
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

from edps_mlflow.cli import main
from edps_mlflow.experiment_names import MAX_EXPERIMENT_NAME_LENGTH, experiment_name_problem

from conftest import REPO, clean_environment

REFUSED = [
    (["study", "--bs", "0"], "batch size must be a positive integer"),
    (["study", "--sparsity", "1.5"], "sparsity must be in [0, 1)"),
    (["study", "--workload", "imagenet"], "unknown workload 'imagenet'"),
    (["study", "--batch_size", "64"], "did you mean --bs?"),
    (["sweep", "--sparsities", "2"], "sparsity must be in [0, 1), got 2"),
    (["sweep", "--batch-sizes", "16,16"], "batch sizes repeat a value"),
    (["sweep", "--device", "gpu"], "unknown device 'gpu'; use cpu or cuda"),
    (["sweep", "--executor", "local", "--env-manager", "uv"], "are options of --executor mlflow-project"),
    (["study", "--optimizer", "sgd", "--search-coordinates", "invariant"], "optimizer sgd has no batch-invariant"),
    (["sweep", "--optimizers", "adam,momentum", "--search-coordinates", "invariant"],
     "optimizer momentum has no batch-invariant coordinates"),
]

# Runs each command in one fresh interpreter, as the re-executed launcher does (no second re-exec), and
# reports what each printed and which heavy modules were imported by the end.
_PROBE = """
import contextlib, io, json, sys
from edps_mlflow.cli import main
results = []
for arguments in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(arguments)
            code = 0
        except SystemExit as end:
            code = end.code
    results.append({"code": code, "stderr": err.getvalue()})
print(json.dumps({"results": results, "heavy": [m for m in ("torch", "mlflow") if m in sys.modules]}))
"""


def test_bad_input_is_refused_before_torch_or_mlflow_is_imported(tmp_path):
    commands = [["--help"], ["study", "--help"], *(arguments for arguments, _ in REFUSED)]
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(commands)], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, env=clean_environment(PYTHONPATH=str(REPO), EDPS_TRAINING_ENVIRONMENT="1",
                                           MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    assert probe.returncode == 0, probe.stderr[-3000:]
    report = json.loads(probe.stdout)
    help_results, refused = report["results"][:2], report["results"][2:]
    assert [r["code"] for r in help_results] == [0, 0]
    for (arguments, message), result in zip(REFUSED, refused):
        lines = result["stderr"].strip().splitlines()
        assert result["code"] == 2 and len(lines) == 1, (arguments, result)
        assert lines[0].startswith("edps: error: ") and message in lines[0], (arguments, lines)
    assert report["heavy"] == []
    assert not (tmp_path / "mlflow.db").exists()


HINTS = [
    (["study", "--batch_size", "64"], "no such option --batch_size: did you mean --bs?"),
    (["study", "--batch-size", "64"], "did you mean --bs?"),
    (["study", "--batch", "64"], "did you mean --bs?"),
    (["study", "--max_steps", "100"], "no such option --max_steps: did you mean --max-steps?"),
    (["study", "--pack_size", "2"], "did you mean --pack-size?"),
    (["study", "--sparsities", "0.5"], "did you mean --sparsity?"),
    (["sweep", "--batch_size", "64"], "did you mean --batch-sizes?"),
    (["sweep", "--bs", "64"], "did you mean --batch-sizes?"),
    (["sweep", "--sparsity", "0.5"], "did you mean --sparsities?"),
    (["study", "--lr", "0.1"], "no such option --lr: the learning rate is tuned, not set: each trial of a study"),
    (["sweep", "--learning_rate", "0.1"], "the learning rate is tuned, not set"),
    # a name nobody would guess keeps click's own suggestion
    (["study", "--frobnicate", "1"], "No such option '--frobnicate'"),
]


@pytest.mark.parametrize("arguments,message", HINTS)
def test_an_unknown_option_a_user_would_guess_gets_the_option_meant(arguments, message, monkeypatch, capsys):
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")  # no re-exec: we run in this process
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(arguments)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("edps: error: ") and message in lines[0], lines[0]


def test_under_mlflow_run_the_hint_names_the_mlproject_parameter(sqlite_store, monkeypatch, capsys):
    """`mlflow run . -P batch_size=64` appends ``--batch_size 64`` to the main entry point's command;
    the answer is the MLproject's parameter, and the run MLflow made says why it failed."""
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")
    client = MlflowClient(sqlite_store)
    run = client.create_run(client.create_experiment("launcher"))
    monkeypatch.setenv("MLFLOW_RUN_ID", run.info.run_id)
    capsys.readouterr()  # MLflow's lines about creating the store
    for arguments, message in [
            (["study", "--batch_size", "64"], "did you mean --bs (under mlflow run: -P bs=...)?"),
            (["study", "--pack_size", "2"], "did you mean --pack-size (not a parameter of the MLproject's main "
                                            "entry point)?"),
            # `-P replicates=3` on the main entry point, which has no such parameter: MLflow appends the option.
            (["study", "--replicates", "3"], "the main entry point runs one study: run the sweep entry point with "
                                             "-P replicates=N"),
            (["sweep", "--batch_size", "64"], "did you mean --batch-sizes (under mlflow run: -P batch_sizes=...)?")]:
        with pytest.raises(SystemExit) as exit_info:
            main(arguments)
        lines = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(lines) == 1 and message in lines[0], lines
    assert "did you mean --batch-sizes" in client.get_run(run.info.run_id).data.tags["edps.error"]


# ---- experiment names: refused before any store is created or opened -------------------------------------
LONG_NAME = "e" * 600
EDPS = "from edps_mlflow.cli import main; main()"
ANALYZE = "from analysis.cli import main; main()"
BAD_EXPERIMENTS = [
    # (program, arguments, extra environment, what the line says)
    (EDPS, ["study", "--experiment", LONG_NAME], {}, "must be at most 256 characters"),
    (EDPS, ["study", "--experiment", "edps/a\nb"], {}, "must not hold a control character"),
    (EDPS, ["sweep", "--experiment", "tab\there"], {}, "character 4 is '\\t'"),
    (EDPS, ["study"], {"MLFLOW_EXPERIMENT_NAME": "edps/a\nb"}, "(the value of $MLFLOW_EXPERIMENT_NAME)"),
    (EDPS, ["sweep"], {"MLFLOW_EXPERIMENT_NAME": LONG_NAME}, "must be at most 256 characters"),
    (EDPS, ["status", "--experiment", "a\rb"], {}, "must not hold a control character"),
    (EDPS, ["doctor", "--experiment", LONG_NAME], {}, "must be at most 256 characters"),
    (ANALYZE, ["table", "--experiment", LONG_NAME], {}, "must be at most 256 characters"),
    (ANALYZE, ["fit", "--experiment", "edps/*", "--experiment", "x\x1b[2J"], {}, "character 2 is '\\x1b'"),
]


@pytest.mark.parametrize("program,arguments,environment,message", BAD_EXPERIMENTS,
                         ids=[f"{'edps' if p == EDPS else 'analyze'}-{a[0]}-{i}"
                              for i, (p, a, _, _) in enumerate(BAD_EXPERIMENTS)])
def test_a_bad_experiment_name_is_refused_before_any_store_exists(program, arguments, environment, message,
                                                                  tmp_path):
    """The tester's cases: a 600-character name was refused only after the store was created, a newline
    was accepted. The real command in its own process (study and sweep start again with the training
    environment first, as they do for a user), a sqlite store that does not exist: it still does not."""
    store = tmp_path / "mlflow.db"
    result = subprocess.run([sys.executable, "-c", program, *arguments], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120,
                            env=clean_environment(PYTHONPATH=str(REPO), MLFLOW_TRACKING_URI=f"sqlite:///{store}",
                                                  **environment))
    lines = result.stderr.strip().splitlines()
    prefix = "edps: error: " if program == EDPS else "edps-analyze: error: "
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(prefix + "Invalid value for '--experiment': ") and message in lines[0], lines
    assert len(lines[0]) < 300  # the name is not printed back whole
    assert not store.exists() and list(tmp_path.iterdir()) == []


def test_the_experiment_name_rule():
    assert experiment_name_problem("edps/digits-simple-cnn") is None
    assert experiment_name_problem("edps/*") is None and experiment_name_problem("it's [a] \"test\"*") is None
    assert experiment_name_problem("é" * MAX_EXPERIMENT_NAME_LENGTH) is None
    assert "at most 256" in experiment_name_problem("é" * (MAX_EXPERIMENT_NAME_LENGTH + 1))
    for name in ("", " ", "\t"):
        assert experiment_name_problem(name) == "must not be empty"
    for character in ("\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "\u2029"):
        assert "control character" in experiment_name_problem(f"a{character}b"), ascii(character)


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=300))
def test_a_name_is_refused_exactly_when_it_is_blank_too_long_or_holds_a_control_character(name):
    control = any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in name)
    refused = not name.strip() or len(name) > MAX_EXPERIMENT_NAME_LENGTH or control
    assert (experiment_name_problem(name) is not None) == refused
