"""Filter strings built by one function: any tag value, with quotes, backslashes, brackets or ``*``,
finds exactly its runs in a real store, or is refused in one line when MLflow cannot express it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.entities import RunStatus
from mlflow.tracking import MlflowClient

import analysis.cli
import edps_mlflow.cli
from edps_mlflow import names as n
from edps_mlflow.errors import EdpsError
from edps_mlflow.filters import filter_string, quote_key, quote_value

from conftest import fresh_store

TRICKY = "'\"\\[]*%_?` ,=()ab"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    yield MlflowClient(fresh_store(tmp_path_factory.mktemp("filters") / "mlflow.db"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(alphabet=TRICKY, min_size=1, max_size=16))
def test_any_tag_value_finds_exactly_its_run(value, client):
    experiment = client.get_experiment_by_name("values") or client.get_experiment(client.create_experiment("values"))
    experiment_id = experiment.experiment_id
    run = client.create_run(experiment_id, tags={"edps.probe-value": value})
    try:
        conditions = filter_string(tags={"edps.probe-value": value})
    except EdpsError as error:
        assert "'" in value and '"' in value and "both a single and a double quote" in str(error)
        return
    found = client.search_runs([experiment_id], filter_string=conditions, max_results=1000)
    assert run.info.run_id in {r.info.run_id for r in found}
    assert {r.data.tags["edps.probe-value"] for r in found} == {value}


def test_filter_string_shapes():
    assert filter_string(tags={"a": "x"}, status="FINISHED") == "tags.`a` = 'x' and attributes.status = 'FINISHED'"
    assert quote_value("it's") == '"it\'s"' and quote_value('say "hi"') == "'say \"hi\"'"
    assert quote_value("back\\slash") == "'back\\slash'"
    assert filter_string(metrics_above={"probe/x": -1e300}) == "metrics.`probe/x` > -1e300"
    with pytest.raises(EdpsError):
        quote_key("a`b")
    with pytest.raises(EdpsError):
        quote_value("both ' and \"")


EXPERIMENT = "it's [a] \"test\"*"


def _study(client: MlflowClient, experiment_id: str, workload: str, batch_size: int, steps: float) -> None:
    tags = {n.TAG_KIND: n.KIND_STUDY, n.TAG_WORKLOAD: workload, n.TAG_OPTIMIZER: "sgd", n.TAG_SPARSITY: "0.0",
            n.TAG_BATCH_SIZE: str(batch_size), n.TAG_STUDY_KEY: f"key-{batch_size}"}
    study = client.create_run(experiment_id, tags=tags)
    client.log_param(study.info.run_id, n.PARAM_SPEC_TRIALS, "2")
    client.log_metric(study.info.run_id, n.METRIC_STEPS_TO_RESULT, steps)
    client.log_metric(study.info.run_id, n.METRIC_GOAL_ERROR, 0.05)
    client.set_terminated(study.info.run_id, RunStatus.to_string(RunStatus.FINISHED))
    for _ in range(2):
        trial = client.create_run(experiment_id, tags={n.TAG_KIND: n.KIND_TRIAL, n.TAG_WORKLOAD: workload,
                                                        n.TAG_STUDY_KEY: f"key-{batch_size}"})
        client.set_terminated(trial.info.run_id, RunStatus.to_string(RunStatus.FINISHED))


def test_status_and_analysis_of_an_experiment_with_quotes_brackets_and_star(tmp_path, monkeypatch, capsys):
    uri = fresh_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    client = MlflowClient(uri)
    experiment_id = client.create_experiment(EXPERIMENT)
    client.create_experiment("it's a \"test\" too")  # the glob would match this one; the exact name wins
    workload = "digits'[x]*\\"  # a tag value with a quote, brackets, a star and a backslash
    for batch_size, steps in ((16, 4000.0), (64, 1200.0), (256, 700.0)):
        _study(client, experiment_id, workload, batch_size, steps)
    capsys.readouterr()

    edps_mlflow.cli.main(["status", "--experiment", EXPERIMENT])
    out = capsys.readouterr().out
    assert workload in out and "4000" in out and "700" in out, out

    analysis.cli.main(["table", "--experiment", EXPERIMENT, "--format", "csv"])
    table = capsys.readouterr().out
    assert table.count("\n") == 4 and "digits'[x]*" in table

    # a workload tag with both kinds of quote cannot be searched for, and status never searches by a tag value
    # of the user's: it shows that study too
    _study(client, experiment_id, "both ' and \"", 32, 2000.0)
    capsys.readouterr()
    edps_mlflow.cli.main(["status", "--experiment", EXPERIMENT])
    assert "both ' and \"" in capsys.readouterr().out
