"""The paper's protocol as defaults: budgets and check intervals per workload, the paper's grid, FP32."""

import pytest
import torch

from edps_mlflow.cli import main
from edps_mlflow.config import StudySpec
from edps_mlflow.resources import configure_training_process
from edps_mlflow.sweep import SweepSpec
from edps_mlflow.workloads import WORKLOADS, get_workload


@pytest.mark.parametrize("name", ["mnist-simple-cnn", "fashion-mnist-simple-cnn", "cifar10-resnet8"])
def test_paper_workloads_default_to_the_originals_budget(name):
    spec = StudySpec.build(name, "sgd", 0.0, 128)
    assert (spec.trials, spec.check_interval) == (100, 100)
    assert (spec.goal_error, spec.max_steps) == (get_workload(name).goal_error, get_workload(name).max_steps)


def test_paper_grid_spans_the_training_split():
    batch_sizes, sparsities = get_workload("mnist-simple-cnn").paper_grid()
    assert sparsities == (0.0, 0.5, 0.7, 0.9)
    assert batch_sizes[0] == 2 and batch_sizes[-1] == 32_768 and len(batch_sizes) == 15
    assert get_workload("digits-simple-cnn").paper_grid()[0][-1] == 1024
    spec = SweepSpec.build("cifar10-resnet8", ("sgd",), *get_workload("cifar10-resnet8").paper_grid())
    assert len(spec.studies()) == 15 * 4 and max(s.batch_size for s in spec.studies()) == 32_768
    for workload in WORKLOADS.values():
        assert workload.largest_batch_size() <= workload.train_size < 2 * workload.largest_batch_size()


def test_paper_grid_refuses_an_explicit_grid(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("EDPS_TRAINING_ENVIRONMENT", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "--grid", "paper", "--sparsities", "0,0.5"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["edps: error: --grid paper sets the batch sizes and sparsities; leave out --batch-sizes and "
                     "--sparsities"]
    assert not (tmp_path / "mlflow.db").exists()


def test_tf32_is_off_unless_asked_for_and_is_part_of_the_key():
    dense = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64)
    tf32 = StudySpec.build("digits-simple-cnn", "sgd", 0.0, 64, allow_tf32=True)
    assert "allow_tf32" not in dense.key_fields() and tf32.key_fields()["allow_tf32"] is True
    assert dense.study_key != tf32.study_key
    previous = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's own default for convolutions
        configure_training_process("cpu", torch.get_num_threads())
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        configure_training_process("cpu", torch.get_num_threads(), allow_tf32=True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


def test_the_digits_protocol_is_the_one_whose_curve_shape_was_measured():
    """bench/digits_shape.py measured that the digits curves fall to a plateau with exactly this protocol (minutes
    of CPU, so the suite does not run it): change any of these and run it again (docs/digits-workload.md)."""
    spec = StudySpec.build("digits-simple-cnn", "sgd", 0.9, 64)
    assert (spec.goal_error, spec.max_steps, spec.check_interval, spec.trials) == (0.03, 5000, 20, 32)
