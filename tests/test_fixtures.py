"""The shared fixtures keep their promises: a copied store is one the commands accept as it is, and what a
test changes in this process is put back before the next test (by the block the autouse fixture puts around
every test)."""

import os
from pathlib import Path

import torch
from mlflow.tracking import MlflowClient

from edps_mlflow.store.client import open_store

from conftest import TEST_THREADS, fresh_store, process_state_kept


def test_a_copied_store_is_accepted_as_it_is_and_keeps_its_artifacts_beside_it(tmp_path):
    database = tmp_path / "store" / "mlflow.db"
    uri = fresh_store(database)
    before = database.stat()
    client = open_store(uri)  # what every command does first: a store it had to rebuild would be a new file
    assert database.stat().st_ino == before.st_ino
    assert not list(database.parent.glob(".mlflow.db.*")), "no temporary store was built"
    experiment_id = client.create_experiment("copied")
    assert [e.name for e in MlflowClient(uri).search_experiments()] == ["copied", "Default"]
    artifacts = MlflowClient(uri).get_experiment("0").artifact_location
    assert Path(artifacts) == database.parent / "mlruns" / "0", "the Default experiment's artifacts stay by the copy"
    assert MlflowClient(uri).get_experiment(experiment_id).lifecycle_stage == "active"


def _state() -> dict[str, object]:
    environment = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    return {"environment": environment, "cwd": os.getcwd(), "threads": torch.get_num_threads(),
            "flushes_denormals": torch.tensor([1e-40]).mul(1.0).item() == 0.0,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32, "default_dtype": torch.get_default_dtype()}


def test_what_a_test_changes_in_the_process_is_put_back(tmp_path):
    # One test, not a pair relying on their order: under xdist two tests of a file may run on two workers.
    # The autouse fixture is exactly this block around each test.
    before = _state()
    assert before["threads"] == TEST_THREADS and not before["flushes_denormals"]
    with process_state_kept():
        os.environ["EDPS_FIXTURE_PROBE"] = "set by a test"
        os.environ.pop("PATH")
        os.chdir(tmp_path)
        torch.set_num_threads(TEST_THREADS + 1)
        torch.set_flush_denormal(True)  # as training in this process does
        torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
        torch.set_default_dtype(torch.float64)
        assert _state() != before
    assert _state() == before
