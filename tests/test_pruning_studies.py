"""Pruning methods through the whole tool: studies that log their method and what it prunes, scores computed once
and reused by the next study of the grid, `edps status` with a grid per method, and `edps-analyze
compare-pruning` on the store; bad method names refused in one line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from analysis.cli import cli as analyze
from analysis.load import load_studies
from edps_mlflow import names as n
from edps_mlflow.cli import main
from edps_mlflow.config import StudySpec
from edps_mlflow.status import format_status, status_tables
from edps_mlflow.study import ExecutionOptions, run_study

EXPERIMENT = "methods"


def _spec(sparsity: float, batch_size: int, pruning: str = "snip") -> StudySpec:
    # A goal every trial meets at its first check: the costs here are the store's and the scores', not training.
    return StudySpec.build("digits-simple-cnn", "sgd", sparsity, batch_size, trials=2, max_steps=40, goal_error=0.6,
                           pruning=pruning)


@pytest.mark.slow
def test_studies_log_their_method_reuse_its_scores_and_are_compared(sqlite_store, tmp_path, monkeypatch):
    monkeypatch.setenv("EDPS_SCORE_CACHE", str(tmp_path / "scores"))
    options = ExecutionOptions(workers=1, experiment=EXPERIMENT, log_interval=600.0)
    out = io.StringIO()
    for spec in (_spec(0.0, 64), _spec(0.9, 64, "grasp"), _spec(0.9, 128, "shuffle(grasp)")):
        run_study(spec, options, out=out)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("pruning scores")]
    # Each study prunes the trials it trains (a trial the study's best step rules out before its turn is not
    # pruned at all): the grasp study computes, the shuffle of its masks at another batch size finds them kept.
    assert lines[0].startswith("pruning scores (grasp): ") and " 0 from the score cache" in lines[0], lines
    assert lines[1].startswith("pruning scores (shuffle(grasp)): 0 computed, ") and len(lines) == 2, lines

    client = MlflowClient(sqlite_store)
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    studies = {(r.data.tags[n.TAG_PRUNING], r.data.tags[n.TAG_SPARSITY], r.data.tags[n.TAG_BATCH_SIZE]): r
               for r in client.search_runs([experiment_id], "tags.`edps.kind` = 'study'")}
    assert set(studies) == {("snip", "0.0", "64"), ("grasp", "0.9", "64"), ("shuffle(grasp)", "0.9", "128")}
    later = studies[("shuffle(grasp)", "0.9", "128")]
    assert later.data.params[n.PARAM_PRUNING] == "shuffle(grasp)"
    assert later.data.params[n.PARAM_PRUNING_PRUNES] == "weights"
    assert later.data.params["spec.pruning"] == "shuffle(grasp)"
    assert "spec.pruning" not in studies[("snip", "0.0", "64")].data.params
    assert later.data.tags[n.MLFLOW_RUN_NAME].startswith("bs=128 sp=0.9 shuffle(grasp) sgd")
    assert studies[("snip", "0.0", "64")].data.params[n.PARAM_PRUNING_PRUNES] == "weights and biases"
    document = json.loads(Path(client.download_artifacts(later.info.run_id, n.ARTIFACT_STUDY_JSON, str(tmp_path)))
                          .read_text())
    assert document["pruning"]["method"] == "shuffle(grasp)" and document["pruning"]["prunes"] == "weights"
    scores = document["pruning"]["scores"]
    assert scores["cached"] >= 1 and scores["computed"] == 0 and scores["seconds_saved"] > 0
    assert later.data.metrics[n.METRIC_PRUNING_SECONDS_SAVED] == scores["seconds_saved"]
    trials = client.search_runs([experiment_id], f"tags.`{n.TAG_STUDY_KEY}` = '{later.data.tags[n.TAG_STUDY_KEY]}'"
                                                 f" and tags.`edps.kind` = 'trial'")
    # (A trial superseded before its turn was never pruned: it has no scores to speak of.)
    assert {t.data.params.get(n.PARAM_PRUNING_SCORES) for t in trials} - {None} == {"cached"}
    assert {t.data.tags[n.TAG_PRUNING] for t in trials} == {"shuffle(grasp)"}

    # edps status: a grid per method, each with the dense column.
    tables = status_tables(EXPERIMENT, sqlite_store)
    assert set(tables) == {("digits-simple-cnn", "sgd", m, "sp") for m in ("grasp", "shuffle(grasp)")}
    assert list(tables[("digits-simple-cnn", "sgd", "grasp", "sp")].columns) == ["sparsity 0", "sparsity 0.9"]
    assert "digits-simple-cnn / sgd / pruned by shuffle(grasp):" in format_status(tables)

    # The analysis: a curve per (method, sparsity), and the comparison against the dense curve.
    table = load_studies((EXPERIMENT,), sqlite_store)
    assert sorted(set(zip(table["sparsity"], table["pruning"]))) == [(0.0, "snip"), (0.9, "grasp"),
                                                                    (0.9, "shuffle(grasp)")]
    result = CliRunner().invoke(analyze, ["compare-pruning", "--tracking-uri", sqlite_store, "--experiment", EXPERIMENT,
                                          "--out-dir", str(tmp_path / "figures"), "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    assert "shuffle(grasp)" in result.output and "steps / dense" in result.output
    assert (tmp_path / "figures" / "pruning_digits-simple-cnn_sgd_sp0.9.png").is_file()


@pytest.mark.parametrize("arguments,message", [
    (["study", "--sparsity", "0.9", "--pruning", "snp"], "unknown pruning method 'snp'; known methods: snip, random"),
    (["sweep", "--batch-sizes", "16", "--pruning", "snip,grasp,snip"], "pruning methods repeat a value: snip"),
    (["sweep", "--batch-sizes", "16", "--pruning", "shuffle(magic)"], "unknown pruning method 'shuffle(magic)'"),
])
def test_a_bad_method_is_refused_in_one_line(arguments, message, sqlite_uri, monkeypatch, capsys):
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")  # no re-exec: we run in this process
    with pytest.raises(SystemExit) as exit_info:
        main(arguments)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edps: error: ") and message in lines[0], lines
    assert not Path(sqlite_uri.removeprefix("sqlite:///")).exists()
